"""A Kafka-style admin client over any engine (mqstore.engine), with kafka-python's names.

    admin = KafkaAdminClient(store=store)
    admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1,
                                  topic_configs={"retention.ms": "-1"})])
    admin.create_partitions({"orders": NewPartitions(total_count=6)})
    admin.describe_topics(["orders"])   # [{"topic": "orders", "partitions": [...], ...}]
    admin.list_topics()                  # ["orders"]

There is no broker: ``store`` is an open ``MessageStore`` (or ``SegmentedStore``) in
this process, the only node (id 0) and the only replica of every partition. Where
Kafka would differ, the call raises one clear error instead of pretending:

- ``delete_topics`` raises TopicDeletionDisabledError: every topic's records share
  the CommitLog files, and recovery rebuilds a topic's ConsumeQueues from them, so a
  topic lives until retention drops its records (Kafka: delete.topic.enable=false);
- a replication factor other than 1 (or -1, "the default") or replica assignments
  raise InvalidArgumentError: one store holds one copy;
- a topic config other than retention.ms, retention.bytes, cleanup.policy=delete and
  message.timestamp.type raises InvalidArgumentError.

Each call is applied topic by topic, in the order given; a failure raises at once,
after the topics before it were created (Kafka's per-topic results, as an exception).
``validate_only=True`` checks every request and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

import attrs

from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    TopicDeletionDisabledError,
)
from mqstore.engine import Engine
from mqstore.topics import PARTITIONS_MAX, TopicConfig, check_topic_config

__all__ = [
    "KafkaAdminClient",
    "NewPartitions",
    "NewTopic",
    "TopicAlreadyExistsError",
]

NODE_ID: Final = 0  # the store is the one node; kafka-python's describe shapes name it
# Kafka topic configs this store has a field for (the value is a string, as in Kafka).
_TOPIC_CONFIGS: Final = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "cleanup_policy",
    "message.timestamp.type": "timestamp_type",
}
_INT_CONFIGS: Final = frozenset({"retention.ms", "retention.bytes"})


class TopicAlreadyExistsError(InvalidArgumentError):
    """``create_topics`` named a topic that exists (kafka-python's name)."""


class NewTopic:
    """A topic to create (kafka-python's ``kafka.admin.NewTopic``).

    Args:
        name: the topic name.
        num_partitions: its partition count; -1 takes the store's
            ``auto_create_topic_partitions`` (Kafka's num.partitions).
        replication_factor: 1 or -1; one store holds one copy.
        replica_assignments: must be empty (no brokers to assign to).
        topic_configs: Kafka config names to string values (see module docs).
    """

    def __init__(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        replica_assignments: Mapping[int, list[int]] | None = None,
        topic_configs: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignments = dict(replica_assignments or {})
        self.topic_configs = dict(topic_configs or {})

    def __repr__(self) -> str:
        return (
            f"NewTopic(name={self.name!r}, num_partitions={self.num_partitions}, "
            f"replication_factor={self.replication_factor}, "
            f"topic_configs={self.topic_configs!r})"
        )


class NewPartitions(NamedTuple):
    """A topic's new partition count (kafka-python's ``kafka.admin.NewPartitions``)."""

    total_count: int
    new_assignments: list[list[int]] | None = None


class KafkaAdminClient:
    """Creates, grows, describes and lists the topics of an engine (module docs)."""

    def __init__(self, *, store: Engine, **configs: Any) -> None:
        """``configs`` are kafka-python's connection settings (bootstrap_servers,
        client_id...): accepted and ignored, as there is no broker."""
        if not isinstance(store, Engine):
            raise InvalidTypeError("store must be an open MessageStore or SegmentedStore")
        self._store = store
        self.config = dict(configs)

    # ------------------------------------------------------------------ topics

    def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> dict[str, TopicConfig]:
        """Create the topics, in order.

        Returns:
            Each created (with ``validate_only``: validated) topic's config, by name.

        Raises:
            TopicAlreadyExistsError: a topic exists (those before it were created).
            InvalidArgumentError, InvalidTypeError: a bad name, count or config.
        """
        configs = [self._topic_config(topic) for topic in new_topics]
        names = [config.name for config in configs]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"a topic is named twice in {names}")
        existing = self._store.list_topics()
        for config in configs:
            check_topic_config(config)
            if config.name in existing:
                raise TopicAlreadyExistsError(f"topic {config.name!r} already exists")
        if validate_only:
            return {config.name: config for config in configs}
        created = {}
        for config in configs:
            created[config.name] = self._store.create_topic(
                config.name,
                config.partitions,
                timestamp_type=config.timestamp_type,
                retention_ms=config.retention_ms,
                retention_bytes=config.retention_bytes,
                cleanup_policy=config.cleanup_policy,
            )
        return created

    def _topic_config(self, topic: NewTopic) -> TopicConfig:
        """The TopicConfig a NewTopic asks for, or InvalidArgumentError."""
        if not isinstance(topic, NewTopic):
            raise InvalidTypeError(f"create_topics takes NewTopic objects, not {topic!r}")
        if topic.replication_factor not in (-1, 1):
            raise InvalidArgumentError(
                f"topic {topic.name!r}: replication_factor {topic.replication_factor}: an "
                "embedded store holds one copy (use 1 or -1)"
            )
        if topic.replica_assignments:
            raise InvalidArgumentError(f"topic {topic.name!r}: no brokers to assign replicas to")
        partitions = topic.num_partitions
        if partitions == -1:
            store_config = getattr(self._store, "config", None)
            partitions = getattr(store_config, "auto_create_topic_partitions", 1)
        settings: dict[str, Any] = {}
        for name, raw in topic.topic_configs.items():
            field = _TOPIC_CONFIGS.get(name)
            if field is None:
                raise InvalidArgumentError(
                    f"topic {topic.name!r}: config {name!r} is not supported (supported: "
                    f"{', '.join(sorted(_TOPIC_CONFIGS))})"
                )
            settings[field] = _int_config(topic.name, name, raw) if name in _INT_CONFIGS else raw
        return TopicConfig(name=topic.name, partitions=partitions, **settings)

    def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        """Always raises: this store cannot delete a topic.

        Raises:
            TopicDeletionDisabledError: every topic's records share the CommitLog
                files, and recovery rebuilds a topic's queues from them; a topic's
                records go only when retention drops them (set its retention.ms).
        """
        raise TopicDeletionDisabledError(
            f"cannot delete {sorted(topics)}: topics share the CommitLog and live until "
            "retention drops their records (give the topic a short retention_ms instead)"
        )

    def create_partitions(
        self,
        topic_partitions: Mapping[str, NewPartitions],
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> dict[str, TopicConfig]:
        """Grow each topic to ``total_count`` partitions (never shrinks).

        Raises:
            UnknownTopicError: no such topic.
            InvalidArgumentError: the count is not larger, or new_assignments given.
        """
        checked = []
        for name, request in topic_partitions.items():
            if not isinstance(request, NewPartitions):
                raise InvalidTypeError(f"create_partitions takes NewPartitions, not {request!r}")
            if request.new_assignments:
                raise InvalidArgumentError(f"topic {name!r}: no brokers to assign replicas to")
            current = self._store.describe_topic(name).partitions  # UnknownTopicError
            total = request.total_count
            if isinstance(total, bool) or not isinstance(total, int):
                raise InvalidTypeError("total_count must be an int")
            if not current < total <= PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"topic {name!r} has {current} partitions; total_count must be larger "
                    f"and at most {PARTITIONS_MAX}"
                )
            checked.append((name, total))
        if validate_only:
            return {name: self._store.describe_topic(name) for name, _ in checked}
        return {name: self._store.add_partitions(name, total) for name, total in checked}

    def describe_topics(self, topics: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """kafka-python's describe shape for each topic (all when None); the store is
        node 0, the leader and only replica of every partition. ``config`` adds the
        topic's settings with the retention in force.

        Raises:
            UnknownTopicError: a named topic does not exist.
        """
        names = sorted(self._store.list_topics()) if topics is None else list(topics)
        described = []
        for name in names:
            config = self._store.describe_topic(name)
            partitions = [
                {
                    "error_code": 0,
                    "partition": partition,
                    "leader": NODE_ID,
                    "replicas": [NODE_ID],
                    "isr": [NODE_ID],
                    "offline_replicas": [],
                }
                for partition in range(config.partitions)
            ]
            described.append(
                {
                    "error_code": 0,
                    "topic": name,
                    "is_internal": False,
                    "partitions": partitions,
                    "config": attrs.asdict(config),
                }
            )
        return described

    def list_topics(self) -> list[str]:
        """The topic names, sorted."""
        return sorted(self._store.list_topics())

    def describe_cluster(self) -> dict[str, Any]:
        """The one node this client talks to: the store itself."""
        return {"brokers": [{"node_id": NODE_ID}], "cluster_id": None, "controller_id": NODE_ID}

    def close(self) -> None:
        """Nothing to release: the store belongs to the caller."""

    def __enter__(self) -> KafkaAdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _int_config(topic: str, name: str, raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        raise InvalidArgumentError(f"topic {topic!r}: {name}={raw!r} is not an int") from None
