"""The admin APIs: DeleteTopics, CreatePartitions, DeleteRecords, DescribeConfigs.

Each runs on a read thread (mqstore.broker.handlers delegates to ``Admin``), reaches
storage through ``PartitionLog`` only, and answers every store error with Kafka's
error code for the topic, partition or resource it concerns.

What the engines can do decides the answers:

- DeleteTopics: neither engine deletes a topic (the CommitLog engine's topics share
  its files and recovery rebuilds their queues from them; the segmented engine has
  no deletion either), so an existing topic gets TOPIC_DELETION_DISABLED (73), as a
  Kafka broker with delete.topic.enable=false answers, and an unknown one
  UNKNOWN_TOPIC_OR_PARTITION.
- CreatePartitions: both engines grow a topic (``add_partitions``); never shrink.
- DeleteRecords: the segmented engine moves its log start offset (Kafka's own
  model); the CommitLog engine's queues start where retention left them and cannot
  be moved by hand, so it answers POLICY_VIOLATION (44), the code Kafka gives
  DeleteRecords on a topic whose policy forbids it.
- DescribeConfigs: a topic's settings and the broker's, under Kafka's names.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from mqstore.broker.config import BrokerConfig
from mqstore.broker.log import PartitionLog, UnsupportedByEngineError
from mqstore.broker.protocol import APIS, ErrorCode
from mqstore.commitlog.errors import (
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    StoreError,
    UnknownTopicError,
)

__all__ = ["Admin"]

log = logging.getLogger(__name__)

TOPIC_RESOURCE: Final = 2  # DescribeConfigs' resource types
BROKER_RESOURCE: Final = 4
DYNAMIC_TOPIC_CONFIG: Final = 1  # DescribeConfigs' config sources
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
HIGH_WATERMARK: Final = -1  # DeleteRecords' "up to the end"
PARTITIONS_MAX: Final = 10_000  # what CreateTopics allows too


class Admin:
    """The admin APIs over one ``PartitionLog``."""

    def __init__(self, log_: PartitionLog, config: BrokerConfig) -> None:
        self.log = log_
        self.config = config

    # ------------------------------------------------------------------ topics

    def delete_topics(self, request: Any, version: int) -> Any:
        response_class = APIS[20].response
        known = self.log.topics()
        results = []
        for name in request.topic_names or ():
            if name in known:
                code, message = ErrorCode.TOPIC_DELETION_DISABLED, "topics cannot be deleted"
            else:
                code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
            results.append(
                response_class.DeletableTopicResult(
                    name=name, error_code=code, error_message=message
                )
            )
        return response_class(version=version, throttle_time_ms=0, responses=results)

    def create_partitions(self, request: Any, version: int) -> Any:
        response_class = APIS[37].response
        results = []
        for topic in request.topics:
            code, message = self._grow(topic, bool(request.validate_only))
            results.append(
                response_class.CreatePartitionsTopicResult(
                    name=topic.name, error_code=code, error_message=message
                )
            )
        return response_class(version=version, throttle_time_ms=0, results=results)

    def _grow(self, topic: Any, validate_only: bool) -> tuple[int, str | None]:
        config = self.log.topics().get(topic.name)
        if config is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic.name!r}"
        if topic.assignments:
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "one broker: no assignments"
        if not config.partitions < topic.count <= PARTITIONS_MAX:
            message = f"topic has {config.partitions} partitions; asked for {topic.count}"
            return ErrorCode.INVALID_PARTITIONS, message
        if validate_only:
            return 0, None
        try:
            self.log.add_partitions(topic.name, topic.count)
        except StoreError as error:
            log.info("create partitions of %s refused: %s", topic.name, error)
            if isinstance(error, NotLeaderError):
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, str(error)
            return ErrorCode.INVALID_PARTITIONS, str(error)
        return 0, None

    # ------------------------------------------------------------------ records

    def delete_records(self, request: Any, version: int) -> Any:
        response_class = APIS[21].response
        topic_class = response_class.DeleteRecordsTopicResult
        partition_class = topic_class.DeleteRecordsPartitionResult
        topics = []
        for topic in request.topics:
            parts = []
            for wanted in topic.partitions:
                code, low = self._delete_before(topic.name, wanted.partition_index, wanted.offset)
                parts.append(
                    partition_class(
                        partition_index=wanted.partition_index, low_watermark=low, error_code=code
                    )
                )
            topics.append(topic_class(name=topic.name, partitions=parts))
        return response_class(version=version, throttle_time_ms=0, topics=topics)

    def _delete_before(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        try:
            end = self.log.high_watermark(topic, partition)
            if offset == HIGH_WATERMARK:
                offset = end
            if not 0 <= offset <= end:
                return ErrorCode.OFFSET_OUT_OF_RANGE, -1
            return 0, self.log.delete_records(topic, partition, offset)
        except UnsupportedByEngineError:
            return ErrorCode.POLICY_VIOLATION, -1
        except UnknownTopicError:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        except OffsetOutOfRangeError:
            return ErrorCode.OFFSET_OUT_OF_RANGE, -1
        except NotLeaderError:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        except StoreError as error:
            log.warning("delete records of %s-%d failed: %s", topic, partition, error)
            return ErrorCode.KAFKA_STORAGE_ERROR, -1

    # ------------------------------------------------------------------ configs

    def describe_configs(self, request: Any, version: int) -> Any:
        response_class = APIS[32].response
        results = [self._describe(resource, version) for resource in request.resources]
        return response_class(version=version, throttle_time_ms=0, results=results)

    def _describe(self, resource: Any, version: int) -> Any:
        result_class = APIS[32].response.DescribeConfigsResult
        entry_class = result_class.DescribeConfigsResourceResult

        def result(code: int, message: str | None, entries: list[Any]) -> Any:
            return result_class(
                error_code=code, error_message=message, resource_type=resource.resource_type,
                resource_name=resource.resource_name, configs=entries,
            )  # fmt: skip

        try:
            if resource.resource_type == TOPIC_RESOURCE:
                settings = self._topic_settings(resource.resource_name)
            elif resource.resource_type == BROKER_RESOURCE:
                if resource.resource_name not in ("", str(self.config.node_id)):
                    return result(ErrorCode.INVALID_REQUEST, "no such broker", [])
                settings = self._broker_settings()
            else:
                return result(ErrorCode.INVALID_REQUEST, "topic and broker resources only", [])
        except UnknownTopicError as error:
            return result(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(error), [])
        except InvalidArgumentError as error:
            return result(ErrorCode.INVALID_TOPIC_EXCEPTION, str(error), [])
        keys = resource.configuration_keys  # null: every setting
        entries = []
        for name, (value, source) in sorted(settings.items()):
            if keys is None or name in keys:
                entries.append(
                    entry_class(
                        name=name,
                        value=value,
                        read_only=True,
                        is_default=source == DEFAULT_CONFIG,
                        config_source=source,
                        is_sensitive=False,
                        synonyms=[],
                    )
                )
        return result(0, None, entries)

    def _topic_settings(self, name: str) -> dict[str, tuple[str, int]]:
        config = self.log.describe_topic(name)

        def source(of: str | None) -> int:
            return DYNAMIC_TOPIC_CONFIG if of == "topic" else STATIC_BROKER_CONFIG

        retention_ms = config.effective_retention_ms
        retention_bytes = config.effective_retention_bytes
        return {
            "cleanup.policy": (config.cleanup_policy, DEFAULT_CONFIG),
            "message.timestamp.type": (
                config.timestamp_type,
                DYNAMIC_TOPIC_CONFIG if config.timestamp_type != "CreateTime" else DEFAULT_CONFIG,
            ),
            "retention.ms": (
                str(-1 if retention_ms is None else retention_ms),
                source(config.effective_retention_ms_source),
            ),
            "retention.bytes": (
                str(-1 if retention_bytes is None else retention_bytes),
                source(config.effective_retention_bytes_source),
            ),
        }

    def _broker_settings(self) -> dict[str, tuple[str, int]]:
        config = self.config
        static = {
            "broker.id": config.node_id,
            "auto.create.topics.enable": str(config.auto_create_topics).lower(),
            "num.partitions": config.default_partitions,
            "socket.request.max.bytes": config.frame_bytes_max,
            "queued.max.request.bytes": config.queued_request_bytes_max,
            "max.connections": config.connections_max,
            "max.connections.per.ip": config.connections_per_address_max,
            "connections.max.idle.ms": config.idle_timeout_ms,
            "group.initial.rebalance.delay.ms": config.initial_rebalance_delay_ms,
            "group.min.session.timeout.ms": config.session_timeout_min_ms,
            "group.max.session.timeout.ms": config.session_timeout_max_ms,
            "default.replication.factor": 1,
            "delete.topic.enable": "false",
        }
        return {name: (str(value), STATIC_BROKER_CONFIG) for name, value in static.items()}
