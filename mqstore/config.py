"""StoreConfig: the one frozen, validated configuration of a MessageStore.

Field names are part of the public contract (tests and tools set them). Each
component gets only its own slice of it (``commitlog_config()``...).

Defaults are an embedded library's: 128 MiB CommitLog files, the next one prepared
once the current one is half written, and 21 MiB index files (262,144 slots,
1,048,576 entries: as many messages as a CommitLog file holds at about 128 bytes
each; the arithmetic is in mqstore.indexfile.config). A new store takes 128 MiB of
disk and of memory for its pre-warmed first file, plus 21 MiB of disk once a keyed
message arrives. ``StoreConfig.broker()`` is RocketMQ's broker profile
(``BROKER_PROFILE``): 1 GiB files, the next one prepared at once, index files of 5M
slots and 20M entries (420 MB): 2.4 GB of disk and 2 GiB of memory after one keyed
message (bench/defaults.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs
from attrs import validators as v

from mqstore.commitlog.config import (
    FILE_SIZE_BROKER_BYTES,
    FILE_SIZE_DEFAULT_BYTES,
    GIB,
    MIB,
    PREPARE_NEXT_PERCENT_BROKER,
    PREPARE_NEXT_PERCENT_DEFAULT,
    PREPARE_NEXT_PERCENT_MAX,
    CommitLogConfig,
)
from mqstore.commitlog.errors import ConfigError
from mqstore.indexfile.config import (
    ENTRY_COUNT_BROKER,
    ENTRY_COUNT_DEFAULT,
    SLOT_COUNT_BROKER,
    SLOT_COUNT_DEFAULT,
)

__all__ = ["BROKER_PROFILE", "PROFILES", "StoreConfig", "TimestampType"]

TimestampType = Literal["CreateTime", "LogAppendTime"]
_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def _as_config_error(*validators: _Validator) -> _Validator:
    """Run attrs validators; report a failure as ConfigError naming the field."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        for validator in validators:
            try:
                validator(instance, attribute, value)
            except (ValueError, TypeError) as error:
                raise ConfigError(f"StoreConfig.{attribute.name}: {error}") from None

    return check


def _int(low: int, high: int) -> _Validator:
    return _as_config_error(v.instance_of(int), v.ge(low), v.le(high))


def _ratio() -> _Validator:
    return _as_config_error(v.instance_of((int, float)), v.gt(0), v.le(100))


_BOOL = _as_config_error(v.instance_of(bool))


@attrs.frozen(kw_only=True, init=False)
class StoreConfig:
    """Every setting of a store; units are in the names. Defaults follow RocketMQ's
    but for the sizes (the module docstring); ``broker()`` has RocketMQ's sizes too.

    Unknown settings raise ConfigError (attrs alone would raise a bare TypeError).
    The names the caller passed are kept (``explicit_settings``): opening a store
    adopts what the store recorded for every setting the caller left out
    (``mqstore.layout``). ``attrs.evolve`` passes every field, so an evolved config
    counts all of them as set.
    """

    def __init__(self, **settings: Any) -> None:
        unknown = sorted(set(settings) - _FIELD_NAMES)
        if unknown:
            raise ConfigError(f"unknown StoreConfig settings: {', '.join(unknown)}")
        self.__attrs_init__(**settings)
        object.__setattr__(self, "_explicit", frozenset(settings))

    # The names passed to __init__; not a setting (no init, no eq, no repr).
    _explicit: frozenset[str] = attrs.field(init=False, eq=False, repr=False, factory=frozenset)

    # CommitLog
    commitlog_file_size_bytes: int = attrs.field(
        default=FILE_SIZE_DEFAULT_BYTES, validator=_int(64 * 1024, 2 * GIB)
    )
    # The next CommitLog file is requested once this much of the current one is
    # written (0: at once, RocketMQ's way); prepared in the background either way.
    commitlog_prepare_next_percent: int = attrs.field(
        default=PREPARE_NEXT_PERCENT_DEFAULT, validator=_int(0, PREPARE_NEXT_PERCENT_MAX)
    )
    max_message_size_bytes: int = attrs.field(default=4 * MIB, validator=_int(128, 256 * MIB))
    flush_mode: Literal["async", "sync"] = attrs.field(
        default="async", validator=_as_config_error(v.in_(("async", "sync")))
    )
    flush_interval_ms: int = attrs.field(default=500, validator=_int(1, 60_000))
    flush_least_pages: int = attrs.field(default=4, validator=_int(0, 1 << 20))
    flush_thorough_interval_ms: int = attrs.field(default=10_000, validator=_int(1, 3_600_000))
    sync_flush_timeout_ms: int = attrs.field(default=5_000, validator=_int(1, 600_000))
    prewarm: bool = attrs.field(default=True, validator=_BOOL)
    mlock: bool = attrs.field(default=False, validator=_BOOL)
    # ConsumeQueue
    consumequeue_units_per_file: int = attrs.field(default=300_000, validator=_int(4, 50_000_000))
    # Two mapped files (units, times) per hot queue; this machine allows 20,000 open files.
    consumequeue_max_open_files: int = attrs.field(default=12_000, validator=_int(8, 16_384))
    # A queue's first units go to its topic's shared unit log until it holds this many
    # there, then to files of its own (docs/QUEUES.md): a new queue then costs no file
    # creation (3 metadata operations, 0.5-1.7 ms here) and no descriptor. 8 bytes of
    # memory per shared unit: 256 units is 2 KiB a queue, 200 MiB at 100,000 full
    # queues. 0: every queue has files of its own from its first unit.
    consumequeue_shared_units_max: int = attrs.field(default=256, validator=_int(0, 65_536))
    # IndexFile
    index_slot_count: int = attrs.field(default=SLOT_COUNT_DEFAULT, validator=_int(1, 1 << 28))
    index_entry_count: int = attrs.field(default=ENTRY_COUNT_DEFAULT, validator=_int(4, 1 << 28))
    # Dispatch and checkpoint
    dispatch_interval_ms: int = attrs.field(default=1, validator=_int(1, 1_000))
    checkpoint_interval_ms: int = attrs.field(default=1_000, validator=_int(10, 600_000))
    # ConsumeQueue and index files are synced, and the dispatched position saved, this
    # often (a power loss re-dispatches at most this much log; a killed process loses
    # nothing either way, the page cache keeps the writes).
    consumequeue_flush_interval_ms: int = attrs.field(default=10_000, validator=_int(10, 3_600_000))
    # Spool files other processes leave in <root>/inbox are appended this often
    # (mqstore.inbox): the delay before a Spark task's spooled rows become readable.
    inbox_interval_ms: int = attrs.field(default=500, validator=_int(10, 600_000))
    # A write to a topic (or, through put(), a queue) that does not exist creates it
    # (Kafka: auto.create.topics.enable; RocketMQ: autoCreateTopicEnable); False
    # refuses it with UnknownTopicError. Reads never create a topic.
    auto_create_topics: bool = attrs.field(default=True, validator=_BOOL)
    # Partitions of an auto-created topic (Kafka: num.partitions); put() to queue q
    # makes at least q + 1.
    auto_create_topic_partitions: int = attrs.field(default=1, validator=_int(1, 1 << 20))
    # Topics created implicitly by a write use this timestamp type.
    default_timestamp_type: TimestampType = attrs.field(
        default="CreateTime", validator=_as_config_error(v.in_(("CreateTime", "LogAppendTime")))
    )
    # Retention (RocketMQ: fileReservedTime 72 h; disk watermarks 75/85/90 %)
    retention_hours: float = attrs.field(
        default=72.0, validator=_as_config_error(v.instance_of((int, float)), v.ge(0))
    )
    retention_bytes: int = attrs.field(default=-1, validator=_int(-1, 1 << 62))
    retention_check_interval_ms: int = attrs.field(default=10_000, validator=_int(10, 3_600_000))
    disk_clean_ratio_percent: float = attrs.field(default=75.0, validator=_ratio())
    disk_force_ratio_percent: float = attrs.field(default=85.0, validator=_ratio())
    disk_reject_ratio_percent: float = attrs.field(default=90.0, validator=_ratio())

    def __attrs_post_init__(self) -> None:
        if not (
            self.disk_clean_ratio_percent
            <= self.disk_force_ratio_percent
            <= self.disk_reject_ratio_percent
        ):
            raise ConfigError("disk watermarks must satisfy clean <= force <= reject")
        if self.commitlog_file_size_bytes % 4096:
            raise ConfigError("StoreConfig.commitlog_file_size_bytes must be a multiple of 4096")

    @classmethod
    def broker(cls, **overrides: Any) -> StoreConfig:
        """RocketMQ's broker profile (``BROKER_PROFILE``), then ``overrides``.

        Every profile setting counts as explicit: opening a store created with other
        sizes raises ConfigError (its layout is fixed); reopen a broker-profile store
        with ``MessageStore.open(path)`` and it adopts its recorded sizes.

        Raises:
            ConfigError: an unknown or invalid setting.
        """
        return cls(**{**BROKER_PROFILE, **overrides})

    @property
    def explicit_settings(self) -> frozenset[str]:
        """The settings the caller passed (the rest are defaults)."""
        return self._explicit

    def adopting(self, recorded: Mapping[str, Any]) -> StoreConfig:
        """This config with ``recorded`` values for the settings the caller left out.

        Raises:
            ConfigError: a recorded value is invalid.
        """
        values = {name: getattr(self, name) for name in _FIELD_NAMES}
        values.update(
            (name, value) for name, value in recorded.items() if name not in self._explicit
        )
        adopted = StoreConfig(**values)
        object.__setattr__(adopted, "_explicit", self._explicit)
        assert adopted.explicit_settings == self.explicit_settings
        return adopted

    def commitlog_config(self) -> CommitLogConfig:
        return CommitLogConfig(
            file_size_bytes=self.commitlog_file_size_bytes,
            max_message_size_bytes=self.max_message_size_bytes,
            flush_mode=self.flush_mode,
            flush_interval_ms=self.flush_interval_ms,
            flush_least_pages=self.flush_least_pages,
            flush_thorough_interval_ms=self.flush_thorough_interval_ms,
            sync_flush_timeout_ms=self.sync_flush_timeout_ms,
            prewarm=self.prewarm,
            prepare_next_percent=self.commitlog_prepare_next_percent,
            mlock=self.mlock,
        )


_FIELD_NAMES = frozenset(field.name for field in attrs.fields(StoreConfig) if field.init)

#: RocketMQ's broker sizes: 1 GiB CommitLog files with the next one prepared as soon
#: as a file starts, and index files of 5M slots and 20M entries (420 MB each).
BROKER_PROFILE: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "commitlog_file_size_bytes": FILE_SIZE_BROKER_BYTES,
        "commitlog_prepare_next_percent": PREPARE_NEXT_PERCENT_BROKER,
        "index_slot_count": SLOT_COUNT_BROKER,
        "index_entry_count": ENTRY_COUNT_BROKER,
    }
)
#: Named profiles (the CLI's ``--config profile=NAME``): settings applied together.
PROFILES: Final[Mapping[str, Mapping[str, Any]]] = MappingProxyType({"broker": BROKER_PROFILE})
assert set(BROKER_PROFILE) <= _FIELD_NAMES
