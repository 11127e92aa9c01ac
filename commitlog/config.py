"""CommitLog configuration: one frozen, keyword-only, validated class.

Sizes are an embedded library's by default, not a broker's: 128 MiB files (RocketMQ
uses 1 GiB), and the next file prepared only once the current one is half written
(RocketMQ asks for it the moment a file starts). A fresh log costs one pre-warmed
128 MiB file of disk and memory, not two 1 GiB ones. The next file is still ready
before a writer needs it: building and pre-warming 128 MiB takes 25 to 50 ms
(bench/defaults.py); writing the second half of a file takes 67 ms even at 1 GB/s. A
writer that does outrun it waits at the roll for the build in progress. The
``*_BROKER`` values are RocketMQ's (mqstore.config's broker profile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs
from attrs import validators as v

from mqstore.commitlog.errors import ConfigError
from mqstore.commitlog.record import BLANK_SIZE, HEADER_SIZE

__all__ = [
    "FILE_SIZE_BROKER_BYTES",
    "FILE_SIZE_DEFAULT_BYTES",
    "PAGE_SIZE_BYTES",
    "PREPARE_NEXT_PERCENT_BROKER",
    "PREPARE_NEXT_PERCENT_DEFAULT",
    "CommitLogConfig",
]

PAGE_SIZE_BYTES = 4096
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
FILE_SIZE_MIN_BYTES = 64 * KIB  # small enough for tests that roll often
FILE_SIZE_MAX_BYTES = 2 * GIB - PAGE_SIZE_BYTES  # total_size of a blank record is a u32
FILE_SIZE_DEFAULT_BYTES = 128 * MIB  # an embedded store's file: see the module docstring
FILE_SIZE_BROKER_BYTES = GIB  # RocketMQ's mappedFileSizeCommitLog
# The next file is requested once this much of the current one is written; 0 asks at
# once, as RocketMQ does. At most 99: a file written to its end would find none ready.
PREPARE_NEXT_PERCENT_DEFAULT = 50
PREPARE_NEXT_PERCENT_BROKER = 0
PREPARE_NEXT_PERCENT_MAX = 99


def _check_page_multiple(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value % PAGE_SIZE_BYTES:
        raise ConfigError(f"{attribute.name} must be a multiple of {PAGE_SIZE_BYTES}, not {value}")


_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def _wrap(validator: _Validator) -> _Validator:
    """Run an attrs validator and report its failure as a ConfigError."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        try:
            validator(instance, attribute, value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{attribute.name}: {error}") from None

    return check


@attrs.frozen(kw_only=True)
class CommitLogConfig:
    """Settings of one CommitLog. Defaults follow RocketMQ's MessageStoreConfig but
    for the file size and when the next file is prepared (the module docstring)."""

    file_size_bytes: int = attrs.field(
        default=FILE_SIZE_DEFAULT_BYTES,
        validator=[
            _wrap(v.instance_of(int)),
            _wrap(v.ge(FILE_SIZE_MIN_BYTES)),
            _wrap(v.le(FILE_SIZE_MAX_BYTES)),
            _check_page_multiple,
        ],
    )
    max_message_size_bytes: int = attrs.field(
        default=4 * MIB,
        validator=[_wrap(v.instance_of(int)), _wrap(v.ge(HEADER_SIZE + 1))],
    )
    flush_mode: Literal["async", "sync"] = attrs.field(
        default="async", validator=_wrap(v.in_(("async", "sync")))
    )
    flush_interval_ms: int = attrs.field(
        default=500, validator=[_wrap(v.instance_of(int)), _wrap(v.ge(1)), _wrap(v.le(60_000))]
    )
    flush_least_pages: int = attrs.field(
        default=4, validator=[_wrap(v.instance_of(int)), _wrap(v.ge(0))]
    )
    flush_thorough_interval_ms: int = attrs.field(
        default=10_000,
        validator=[_wrap(v.instance_of(int)), _wrap(v.ge(1)), _wrap(v.le(3_600_000))],
    )
    sync_flush_timeout_ms: int = attrs.field(
        default=5_000, validator=[_wrap(v.instance_of(int)), _wrap(v.ge(1))]
    )
    prewarm: bool = attrs.field(default=True, validator=_wrap(v.instance_of(bool)))
    # Build the next file in the background before it is needed. Off: a roll
    # allocates (and pre-warms) its file itself, which the roll benchmark compares.
    preallocate_next: bool = attrs.field(default=True, validator=_wrap(v.instance_of(bool)))
    # With preallocate_next: how much of the current file is written, in percent of
    # its size, before the next one is requested (0: at once, RocketMQ's way).
    prepare_next_percent: int = attrs.field(
        default=PREPARE_NEXT_PERCENT_DEFAULT,
        validator=[
            _wrap(v.instance_of(int)),
            _wrap(v.ge(0)),
            _wrap(v.le(PREPARE_NEXT_PERCENT_MAX)),
        ],
    )
    mlock: bool = attrs.field(default=False, validator=_wrap(v.instance_of(bool)))

    @property
    def record_size_limit_bytes(self) -> int:
        """The largest record accepted: the configured maximum, capped so that the
        record and an end-of-file blank record fit in one file (small test files)."""
        return min(self.max_message_size_bytes, self.file_size_bytes - BLANK_SIZE)
