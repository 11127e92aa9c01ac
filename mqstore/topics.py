"""Topic metadata (``<root>/topics``): partitions, timestamp type, retention, policy.

Format: one JSON document, written atomically (write ``topics.tmp``, fsync, rename,
fsync the directory)::

    {"format": "mqstore-topics", "version": 1,
     "topics": {"<name>": {"partitions": 3, "timestamp_type": "CreateTime",
                           "retention_ms": null, "retention_bytes": null,
                           "cleanup_policy": "delete", "created_ms": 1700000000000}},
     "checksum": "<xxh3_64 hex of the canonical JSON of 'topics'>"}

Load validates the format, version, checksum and every field; a file that fails is
refused with CorruptDataError (path, position 0): topic metadata is never guessed.

Every change is written before it returns, but one: a topic that ``put`` grows
(``grow``: more partitions of a topic that exists) changes in memory, and the file
follows at the next ``persist_pending``. The store calls it before the dispatch round
that makes the grown queues' first records readable, so a reader in another process
never sees a record of a partition its registry does not have yet. A crash before the
file is written loses nothing: the writer's next open registers every queue that holds
records (``CommitLogEngine._register_written_queues``: the ConsumeQueues' queues and
those recovery counted in the CommitLog). A write that fails after growing its topic
writes the registry at once: partitions never shrink, even after a crash. A registry
write that fails (a full disk) holds back no record: it is logged and retried every
round (``try_persist_pending``), and only readers in other processes wait for the new
partitions. A durable write per put that grew a topic cost 0.75-0.82 ms a put to a new
queue (docs/QUEUES.md, stop 33).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import attrs
import numpy as np

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidRecordError,
    InvalidTypeError,
    ReadOnlyStoreError,
)
from mqstore.commitlog.record import validate_topic

__all__ = [
    "KAFKA_TOPIC_CONFIGS",
    "TOPICS_NAME",
    "TopicConfig",
    "TopicRegistry",
    "check_key_sizes",
    "check_keyed",
    "check_topic_config",
    "parse_kafka_configs",
]

log = logging.getLogger(__name__)

TOPICS_NAME: Final = "topics"
FORMAT: Final = "mqstore-topics"
VERSION: Final = 1
#: How often a registry write that keeps failing is logged (try_persist_pending).
PERSIST_WARN_INTERVAL_S: Final = 10.0
PARTITIONS_MAX: Final = 1 << 20  # queue ids are int32; a million partitions is plenty
TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES: Final = ("delete", "compact", "compact,delete")  # Kafka's names
DAY_MS: Final = 86_400_000
FOREVER_MS: Final = 2**63 - 1  # Kafka's Long.MAX_VALUE: max.compaction.lag.ms's default
# Kafka topic config name -> TopicConfig field (values are strings, as in Kafka).
KAFKA_TOPIC_CONFIGS: Final = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "cleanup_policy",
    "message.timestamp.type": "timestamp_type",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "delete.retention.ms": "delete_retention_ms",
}
_INT_CONFIGS: Final = frozenset(
    {"retention.ms", "retention.bytes", "min.compaction.lag.ms", "max.compaction.lag.ms",
     "delete.retention.ms"}
)  # fmt: skip
# Compaction settings are persisted only when they differ from Kafka's defaults, so
# a topics file without compaction stays as it was.
_COMPACTION_DEFAULTS: Final = {
    "min_cleanable_dirty_ratio": 0.5,
    "min_compaction_lag_ms": 0,
    "max_compaction_lag_ms": FOREVER_MS,
    "delete_retention_ms": DAY_MS,
}


@attrs.frozen(kw_only=True)
class TopicConfig:
    """One topic's metadata, as created.

    ``retention_ms``: -1 keeps records for ever, None (left out) takes the store's
    default (``retention_hours``), else the age in ms. ``retention_bytes``: per
    partition; -1 or None, no limit. ``cleanup_policy``: "delete" (retention),
    "compact" (keep the latest record per key) or "compact,delete" (both); the
    compaction settings have Kafka's meanings and defaults (min.cleanable.dirty.ratio
    0.5, min.compaction.lag.ms 0, max.compaction.lag.ms forever, delete.retention.ms
    one day). ``describe_topic`` also fills the
    ``effective_*`` fields: the value in force and where it comes from ("topic" or
    the store setting); they are never persisted and never compared.
    """

    name: str
    partitions: int
    timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    retention_ms: int | None = None
    retention_bytes: int | None = None
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"
    created_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = FOREVER_MS
    delete_retention_ms: int = DAY_MS
    effective_retention_ms: int | None = attrs.field(default=None, eq=False)
    effective_retention_ms_source: str | None = attrs.field(default=None, eq=False)
    effective_retention_bytes: int | None = attrs.field(default=None, eq=False)
    effective_retention_bytes_source: str | None = attrs.field(default=None, eq=False)

    def to_json(self) -> dict[str, Any]:
        """The persisted fields (not the name, not the ``effective_*`` ones)."""
        data = attrs.asdict(self, filter=lambda field, _: field.name not in _DESCRIBED)
        del data["name"]
        for name, default in _COMPACTION_DEFAULTS.items():
            if data[name] == default:
                del data[name]
        return data

    @property
    def compacted(self) -> bool:
        """Whether the cleanup policy includes "compact"."""
        return self.cleanup_policy in ("compact", "compact,delete")

    @property
    def deletes(self) -> bool:
        """Whether the cleanup policy includes "delete" (retention applies)."""
        return self.cleanup_policy in ("delete", "compact,delete")

    def kafka_configs(self) -> dict[str, Any]:
        """The Kafka-named settings (``topics describe``)."""
        return {kafka: getattr(self, field) for kafka, field in KAFKA_TOPIC_CONFIGS.items()}

    def described(self, default_retention_ms: int, default_source: str) -> TopicConfig:
        """This config with its ``effective_*`` fields filled in, given the store's
        default retention (and the setting it comes from)."""
        if self.retention_ms is None:
            retention_ms, ms_source = default_retention_ms, default_source
        else:
            retention_ms, ms_source = self.retention_ms, "topic"
        if self.retention_bytes is None:
            retention_bytes, bytes_source = -1, "default"
        else:
            retention_bytes, bytes_source = self.retention_bytes, "topic"
        return attrs.evolve(
            self,
            effective_retention_ms=retention_ms,
            effective_retention_ms_source=ms_source,
            effective_retention_bytes=retention_bytes,
            effective_retention_bytes_source=bytes_source,
        )


_DESCRIBED: Final = frozenset(
    field.name for field in attrs.fields(TopicConfig) if field.name.startswith("effective_")
)


def check_topic_config(config: TopicConfig) -> None:
    """Raise InvalidArgumentError/InvalidTypeError unless every field is valid."""
    validate_topic(config.name)
    if isinstance(config.partitions, bool) or not isinstance(config.partitions, int):
        raise InvalidTypeError("partitions must be an int")
    if not 1 <= config.partitions <= PARTITIONS_MAX:
        raise InvalidArgumentError(f"partitions must be in [1, {PARTITIONS_MAX}]")
    if config.timestamp_type not in TIMESTAMP_TYPES:
        raise InvalidArgumentError(f"timestamp_type must be one of {TIMESTAMP_TYPES}")
    if config.cleanup_policy not in CLEANUP_POLICIES:
        raise InvalidArgumentError(
            f"cleanup_policy {config.cleanup_policy!r} is not one of {CLEANUP_POLICIES}"
        )
    for name in ("retention_ms", "retention_bytes"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidTypeError(f"{name} must be an int or None")
        if value is not None and value < -1:
            raise InvalidArgumentError(f"{name} must be -1 (unlimited), >= 0, or None")
    ratio = config.min_cleanable_dirty_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise InvalidTypeError("min_cleanable_dirty_ratio must be a number")
    if not 0.0 <= ratio <= 1.0:
        raise InvalidArgumentError(f"min.cleanable.dirty.ratio {ratio} is not in [0, 1]")
    for name, low in (
        ("min_compaction_lag_ms", 0), ("max_compaction_lag_ms", 1), ("delete_retention_ms", 0)
    ):  # fmt: skip
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidTypeError(f"{name} must be an int")
        if not low <= value <= FOREVER_MS:
            raise InvalidArgumentError(f"{name} {value} is not in [{low}, {FOREVER_MS}]")


def check_key_sizes(topic: str, key_sizes: Any) -> None:
    """``check_keyed`` over a batch's key sizes (-1: a null key), an int array.

    Raises:
        InvalidRecordError: a key size is -1.
    """
    missing = np.flatnonzero(np.asarray(key_sizes) < 0)
    if len(missing):
        raise InvalidRecordError(
            f"compacted topic {topic!r} cannot accept a record without a key "
            f"(record {int(missing[0])} of the batch; nothing was appended)"
        )


def check_keyed(topic: str, records: Sequence[Any]) -> None:
    """Refuse a batch holding a record without a key: ``topic`` is compacted
    (Kafka's LogValidator: "Compacted topic cannot accept message without key").

    Raises:
        InvalidRecordError: a record's ``key`` is None.
    """
    check_key_sizes(topic, [-1 if getattr(r, "key", None) is None else 0 for r in records])


def parse_kafka_configs(topic: str, configs: Mapping[str, object]) -> dict[str, Any]:
    """TopicConfig fields from Kafka-named settings (``{"cleanup.policy": "compact"}``);
    values may be strings, as Kafka's are, or already numbers.

    Raises:
        InvalidArgumentError: an unknown name or a value that does not parse.
    """
    fields: dict[str, Any] = {}
    for name, raw in configs.items():
        field = KAFKA_TOPIC_CONFIGS.get(name)
        if field is None:
            raise InvalidArgumentError(
                f"topic {topic!r}: config {name!r} is not supported (supported: "
                f"{', '.join(sorted(KAFKA_TOPIC_CONFIGS))})"
            )
        try:
            if name in _INT_CONFIGS:
                value: Any = raw if isinstance(raw, int) else int(str(raw))
            elif field == "min_cleanable_dirty_ratio":
                value = float(raw) if isinstance(raw, int | float | str) else raw
            else:
                value = raw
        except ValueError:
            raise InvalidArgumentError(f"topic {topic!r}: {name}={raw!r} is not a number") from None
        fields[field] = value
    return fields


class TopicRegistry:
    """The topics of one store, persisted in ``<root>/topics``."""

    def __init__(self, root: str, read_only: bool) -> None:
        self.path = os.path.join(root, TOPICS_NAME)
        self.read_only = read_only
        # _lock guards the dict; _write_lock orders the file's writes, each of a
        # snapshot taken under it, so that an older snapshot never lands last. A grow
        # takes only _lock: it never waits for a write.
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._topics: dict[str, TopicConfig] = {}
        self._version: tuple[int, ...] = ()  # the file's identity when loaded (refresh)
        self._grown = 0  # growths so far (see grow)
        self._written = 0  # growths the file holds
        self._warned_s = -PERSIST_WARN_INTERVAL_S  # see try_persist_pending
        self.load()

    def load(self) -> None:
        """(Re)read the file. Raises CorruptDataError if it does not validate."""
        try:
            stat = os.stat(self.path)
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return
        topics = _parse(self.path, raw)
        with self._lock:
            self._topics = topics
            self._version = _version_of(stat)

    def refresh(self) -> None:
        """Read-only stores: pick up topics a writer created since (each write is a
        new file renamed over the old one: another inode, as well as another mtime,
        which two writes within one clock tick could share)."""
        try:
            version = _version_of(os.stat(self.path))
        except FileNotFoundError:
            return
        if version != self._version:
            self.load()

    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def all(self) -> dict[str, TopicConfig]:
        return dict(self._topics)

    def put(self, config: TopicConfig) -> TopicConfig:
        """Add or replace a topic and persist the registry atomically. Partitions never
        shrink: a topic that grew meanwhile keeps its count."""
        if self.read_only:  # a caller can do this: never an assert (python -O drops it)
            raise ReadOnlyStoreError("the store is open read-only: cannot change topics")
        check_topic_config(config)
        if not config.created_ms:
            config = attrs.evolve(config, created_ms=time.time_ns() // 1_000_000)
        with self._write_lock:
            with self._lock:
                config = _not_shrunk(config, self._topics.get(config.name))
                grown = self._grown
                topics = dict(self._topics)
            topics[config.name] = config
            self._write(topics)
            self._written = grown
            with self._lock:  # published once durable; a growth during the write stays
                config = _not_shrunk(config, self._topics.get(config.name))
                self._topics = {**self._topics, config.name: config}
        return config

    def grow(self, name: str, partitions: int) -> TopicConfig:
        """Give topic ``name`` ``partitions`` partitions, in memory; the file follows
        at the next ``persist_pending`` (see the module's docstring). A topic that has
        as many already is left as it is.

        Raises:
            ReadOnlyStoreError: the store is open read-only.
            KeyError: no topic ``name`` (create it with ``put``).
            InvalidArgumentError: ``partitions`` is past PARTITIONS_MAX.
        """
        if self.read_only:
            raise ReadOnlyStoreError("the store is open read-only: cannot change topics")
        if partitions > PARTITIONS_MAX:
            raise InvalidArgumentError(f"a topic has at most {PARTITIONS_MAX} partitions")
        with self._lock:
            config = self._topics[name]
            if partitions <= config.partitions:
                return config
            grown = attrs.evolve(config, partitions=partitions)
            # In place: the key exists, so the dict's size does not change under a
            # reader copying it (all, the writers' snapshots).
            self._topics[name] = grown
            self._grown += 1
        return grown

    @property
    def pending(self) -> bool:
        """Whether a growth waits for ``persist_pending``."""
        return self._grown != self._written

    def persist_pending(self) -> None:
        """Write the file if a topic grew since the last write (atomically and
        durably, as ``put`` does); nothing otherwise (two attribute reads).

        Raises:
            OSError: the write failed (a full disk...): the growth stays pending.
        """
        if self._grown == self._written:
            return
        with self._write_lock:
            with self._lock:
                grown = self._grown
                topics = dict(self._topics)
            if grown != self._written:
                self._write(topics)
                self._written = grown

    def try_persist_pending(self) -> bool:
        """``persist_pending``, but a failed write (a full disk...) is logged, at most
        once every PERSIST_WARN_INTERVAL_S, and left pending for the next call: the
        records of the grown queues are safe without it (the module's docstring),
        and only readers in other processes wait for their partitions. Returns
        whether nothing is pending now."""
        try:
            self.persist_pending()
        except OSError as error:
            now_s = time.monotonic()
            if now_s - self._warned_s >= PERSIST_WARN_INTERVAL_S:
                self._warned_s = now_s
                log.warning(
                    "%s could not follow a topic's growth (retried; readers in other "
                    "processes do not see the new partitions until it does): %s",
                    self.path, error,
                )  # fmt: skip
            return False
        return True

    def raw(self) -> bytes:
        """The registry file's bytes as persisted (b"": no topic yet): what a leader
        sends its followers (mqstore.replication)."""
        try:
            with open(self.path, "rb") as handle:
                return handle.read()  # written by rename: always one whole version
        except FileNotFoundError:
            return b""

    def replace_from(self, raw: bytes) -> None:
        """Replace every topic with those of a registry file's bytes (a follower
        adopting its leader's topics), persisted atomically.

        Raises:
            CorruptDataError: ``raw`` does not validate; nothing changes.
            ReadOnlyStoreError: the store is open read-only.
        """
        if self.read_only:
            raise ReadOnlyStoreError("the store is open read-only: cannot change topics")
        topics = _parse("<leader's topics>", raw)
        with self._write_lock:
            self._write(topics)
            with self._lock:
                self._topics = topics
                self._written = self._grown  # a follower's topics are its leader's

    def _write(self, topics: dict[str, TopicConfig]) -> None:
        body = {name: topic.to_json() for name, topic in sorted(topics.items())}
        document = {
            "format": FORMAT,
            "version": VERSION,
            "topics": body,
            "checksum": json_checksum(body),
        }
        write_json_atomically(self.path, document)


def _version_of(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _not_shrunk(config: TopicConfig, current: TopicConfig | None) -> TopicConfig:
    """``config``, with ``current``'s partitions if it has more (they never shrink)."""
    if current is not None and current.partitions > config.partitions:
        return attrs.evolve(config, partitions=current.partitions)
    return config


def _parse(path: str, raw: bytes) -> dict[str, TopicConfig]:
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        position = getattr(error, "pos", 0) or 0
        raise CorruptDataError(path, position, f"not valid JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CorruptDataError(path, 0, "not an mqstore topics file")
    if document.get("version") != VERSION:
        raise CorruptDataError(path, 0, f"unsupported version {document.get('version')!r}")
    body = document.get("topics")
    if not isinstance(body, dict) or document.get("checksum") != json_checksum(body):
        raise CorruptDataError(path, 0, "checksum mismatch")
    topics = {}
    for name, fields in body.items():
        try:
            config = TopicConfig(name=name, **fields)
            check_topic_config(config)
        except (TypeError, ValueError) as error:
            raise CorruptDataError(path, 0, f"topic {name!r}: {error}") from None
        topics[name] = config
    return topics
