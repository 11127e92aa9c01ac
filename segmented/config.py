"""SegmentedConfig: the one frozen, keyword-only, validated configuration of a
SegmentedStore. Names and defaults follow Kafka's broker and topic settings
(``segment.bytes`` -> ``segment_bytes``...); units are in the names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import attrs
from attrs import validators as v

from mqstore.commitlog.errors import ConfigError

__all__ = ["SegmentedConfig"]

KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB
INT32_MAX: Final = 2**31 - 1  # index positions and relative offsets are int32
DAY_MS: Final = 24 * 3600 * 1000
TIME_MAX_MS: Final = 2**62  # any retention or roll time a store can mean
SEGMENT_BYTES_MIN: Final = 1 * KIB  # small enough for tests that roll every few batches
INDEX_MAX_BYTES_MIN: Final = 24  # two time index entries: one, plus the slot kept for the roll
MESSAGE_SIZE_MIN_BYTES: Final = 128  # a batch header (61 B) plus a small record
MESSAGE_SIZE_MAX_BYTES: Final = 256 * MIB  # one batch is encoded in memory at once
CLEANER_BUFFER_MIN_BYTES: Final = 1 * KIB  # a few keys: tests fill the map on purpose

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def _checked(*validators: _Validator) -> _Validator:
    """Run attrs validators; report a failure as ConfigError naming the field."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool):
            raise ConfigError(f"SegmentedConfig.{attribute.name}: a bool is not a number")
        for validator in validators:
            try:
                validator(instance, attribute, value)
            except (ValueError, TypeError) as error:
                raise ConfigError(f"SegmentedConfig.{attribute.name}: {error}") from None

    return check


def _int(low: int, high: int) -> _Validator:
    return _checked(v.instance_of(int), v.ge(low), v.le(high))


def _bool(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"SegmentedConfig.{attribute.name}: must be a bool, not {value!r}")


def _unlimited_or(low: int, high: int) -> _Validator:
    """-1 (unlimited, as Kafka writes it) or a value in [low, high]."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value != -1 or isinstance(value, bool):
            _int(low, high)(instance, attribute, value)

    return check


@attrs.frozen(kw_only=True)
class SegmentedConfig:
    """Settings of a segmented (Kafka-design) store.

    Attributes:
        segment_bytes: roll when the active segment would grow past this (segment.bytes).
        segment_ms: roll when the incoming batch's timestamp is this far past the first
            batch of the active segment (segment.ms; no jitter).
        index_interval_bytes: bytes of log between two offset index entries.
        index_max_bytes: preallocated size of each .index/.timeindex; roll when full.
        flush_mode: "async" (a background flush every flush_interval_ms) or "sync" (an
            append returns after fdatasync of its partition's .log, group commit).
        flush_interval_ms: period of the background flush (log.flush.interval.ms). In
            sync mode it still flushes the indexes and advances the recovery point.
        sync_flush_timeout_ms: sync mode: FlushTimeoutError after this long.
        retention_ms: delete segments whose largest timestamp is older; -1 keeps all.
        retention_bytes: delete old segments while a partition is larger; -1 off.
        retention_check_interval_ms: period of the retention job.
        file_delete_delay_ms: a deleted segment's renamed files are removed this late.
        max_message_size_bytes: the largest record batch accepted (max.message.bytes).
        recovery_point_checkpoint_interval_ms: period of writing the recovery points.
        inactive_index_maps_max: index files of inactive segments mapped at once, in
            the whole store (each costs one fd); the least recently used are unmapped.
        auto_create_topics: a write to a topic that does not exist creates it with
            auto_create_topic_partitions partitions (auto.create.topics.enable,
            num.partitions); False refuses it with UnknownTopicError.
        cleaner_enable: run the log cleaner on compacted topics (log.cleaner.enable).
        cleaner_dedupe_buffer_bytes: memory for the cleaner's key map
            (log.cleaner.dedupe.buffer.size); a full map cleans what it mapped.
        cleaner_backoff_ms: the cleaner's period, and its wait when it found nothing
            to clean (log.cleaner.backoff.ms).
    """

    segment_bytes: int = attrs.field(default=GIB, validator=_int(SEGMENT_BYTES_MIN, INT32_MAX))
    segment_ms: int = attrs.field(default=7 * DAY_MS, validator=_int(1, TIME_MAX_MS))
    index_interval_bytes: int = attrs.field(default=4 * KIB, validator=_int(0, INT32_MAX))
    index_max_bytes: int = attrs.field(
        default=10 * MIB, validator=_int(INDEX_MAX_BYTES_MIN, INT32_MAX)
    )
    flush_mode: Literal["async", "sync"] = attrs.field(
        default="async", validator=_checked(v.in_(("async", "sync")))
    )
    flush_interval_ms: int = attrs.field(default=500, validator=_int(1, 3_600_000))
    sync_flush_timeout_ms: int = attrs.field(default=5_000, validator=_int(1, 600_000))
    retention_ms: int = attrs.field(default=7 * DAY_MS, validator=_unlimited_or(0, TIME_MAX_MS))
    retention_bytes: int = attrs.field(default=-1, validator=_unlimited_or(0, 2**62))
    retention_check_interval_ms: int = attrs.field(default=300_000, validator=_int(1, DAY_MS))
    file_delete_delay_ms: int = attrs.field(default=60_000, validator=_int(0, DAY_MS))
    max_message_size_bytes: int = attrs.field(
        default=4 * MIB, validator=_int(MESSAGE_SIZE_MIN_BYTES, MESSAGE_SIZE_MAX_BYTES)
    )
    recovery_point_checkpoint_interval_ms: int = attrs.field(
        default=60_000, validator=_int(1, DAY_MS)
    )
    inactive_index_maps_max: int = attrs.field(default=1024, validator=_int(2, 100_000))
    auto_create_topics: bool = attrs.field(default=True, validator=_bool)
    auto_create_topic_partitions: int = attrs.field(default=1, validator=_int(1, 1 << 20))
    cleaner_enable: bool = attrs.field(default=True, validator=_bool)
    cleaner_dedupe_buffer_bytes: int = attrs.field(
        default=128 * MIB, validator=_int(CLEANER_BUFFER_MIN_BYTES, 64 * GIB)
    )
    cleaner_backoff_ms: int = attrs.field(default=15_000, validator=_int(1, DAY_MS))
