"""ConsumeQueue configuration: one frozen, keyword-only, validated class."""

from __future__ import annotations

from typing import Any, Final

import attrs
from attrs import validators as v

from mqstore.commitlog.errors import ConfigError

__all__ = ["ConsumeQueueConfig"]

UNITS_PER_FILE_MAX: Final = 50_000_000  # 1 GB unit files; the header stores it as a u32
OPEN_FILES_MIN: Final = 2  # one operation needs a unit file and its time file at once
OPEN_FILES_MAX: Final = 1 << 20  # far above any per-process fd limit we expect
TIME_INTERVAL_MAX: Final = 1 << 20  # a time look-up scans one block: at most 8 MiB
# A shared queue costs 8 bytes of memory per unit (its run's record indexes) and its
# time look-ups scan the whole run: 65,536 units is 512 KiB and one 512 KiB scan.
SHARED_UNITS_MAX: Final = 1 << 16


def _wrap(validator: Any) -> Any:
    """Run an attrs validator and report its failure as a ConfigError."""

    def check(instance: object, attribute: attrs.Attribute[object], value: object) -> None:
        try:
            validator(instance, attribute, value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{attribute.name}: {error}") from None

    return check


def _int_between(low: int, high: int) -> list[Any]:
    return [_wrap(v.instance_of(int)), _wrap(v.ge(low)), _wrap(v.le(high))]


@attrs.frozen(kw_only=True)
class ConsumeQueueConfig:
    """Settings of the ConsumeQueues of one store.

    Attributes:
        units_per_file: units (20 bytes each) per unit file; RocketMQ's 300,000.
        max_open_files: mapped files kept open across all queues of the store (each
            mapping holds one file descriptor); the coldest are closed beyond it.
        time_index_interval_units: N, units per block of the sparse time index; a time
            look-up scans at most one block (N timestamps) after an O(log n) search.
        shared_units_max: a queue keeps its first units in its topic's shared unit log
            (no file of its own) until it holds this many there, then graduates to
            files of its own (docs/QUEUES.md); 0: every queue has its own files from
            its first unit (units already in a shared log stay readable).
    """

    units_per_file: int = attrs.field(
        default=300_000, validator=_int_between(1, UNITS_PER_FILE_MAX)
    )
    max_open_files: int = attrs.field(
        default=4096, validator=_int_between(OPEN_FILES_MIN, OPEN_FILES_MAX)
    )
    time_index_interval_units: int = attrs.field(
        default=1024, validator=_int_between(1, TIME_INTERVAL_MAX)
    )
    shared_units_max: int = attrs.field(default=0, validator=_int_between(0, SHARED_UNITS_MAX))
