"""IndexFile configuration: one frozen, keyword-only, validated class.

The config shapes new files only: an existing file's slot count comes from its
header and its entry count from its size.

Default sizes: an index file covers about as many messages as a default CommitLog
file (128 MiB) holds when they are small. A small keyed record is about 128 bytes
(the 68-byte header, a short topic and key, a 40-byte body), so a file holds
128 MiB / 128 B = 1,048,576 of them: 1,048,576 entry numbers (one key each), and
RocketMQ's four entries per slot give 262,144 slots. A file is then
48 + 262,144 * 4 + 1,048,576 * 20 = 22,020,144 bytes (21 MiB), allocated in full
when the first keyed message arrives. RocketMQ's 5M slots and 20M entries (a file of
420,000,048 bytes) assume 2^30 / 20M = 54 bytes per message of a 1 GiB file; they
remain the broker profile (mqstore.config).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs
from attrs import validators as v

from mqstore.commitlog.errors import ConfigError
from mqstore.indexfile.format import file_size_bytes

__all__ = [
    "ENTRY_COUNT_BROKER",
    "ENTRY_COUNT_DEFAULT",
    "SLOT_COUNT_BROKER",
    "SLOT_COUNT_DEFAULT",
    "IndexConfig",
]

SLOT_COUNT_MAX: Final = 1 << 26  # 256 MiB of slots; far above RocketMQ's 5M default
ENTRY_COUNT_MIN: Final = 2  # entry number 0 is unused, so 2 holds one entry
ENTRY_COUNT_MAX: Final = 1 << 27  # 2.5 GiB of entries; entry numbers stay far inside i32
ENTRY_COUNT_DEFAULT: Final = 1_048_576  # 128 MiB of CommitLog / 128-byte records
SLOT_COUNT_DEFAULT: Final = ENTRY_COUNT_DEFAULT // 4  # RocketMQ's 4 entries per slot
ENTRY_COUNT_BROKER: Final = 20_000_000  # RocketMQ's maxIndexNum
SLOT_COUNT_BROKER: Final = 5_000_000  # RocketMQ's maxHashSlotNum


def _wrap(validator: Callable[[Any, attrs.Attribute[Any], Any], None]) -> Any:
    """Run an attrs validator and report its failure as a ConfigError."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        try:
            validator(instance, attribute, value)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{attribute.name}: {error}") from None

    return check


def _strict_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int:  # bool is an int subclass; a count is never a bool
        raise ConfigError(f"{attribute.name} must be an int, not {type(value).__name__}")


@attrs.frozen(kw_only=True)
class IndexConfig:
    """Settings of new index files. Defaults: 262,144 slots and 1,048,576 entries, a
    file of 21 MiB (the module docstring); RocketMQ's are 5M and 20M (420 MB).

    Attributes:
        slot_count: hash slots per file; a key's chain is ``slots[hash % slot_count]``.
        entry_count: entry numbers per file, number 0 unused, so a file holds
            ``entry_count - 1`` entries; a new file starts when one is full.
    """

    slot_count: int = attrs.field(
        default=SLOT_COUNT_DEFAULT,
        validator=[_strict_int, _wrap(v.ge(1)), _wrap(v.le(SLOT_COUNT_MAX))],
    )
    entry_count: int = attrs.field(
        default=ENTRY_COUNT_DEFAULT,
        validator=[_strict_int, _wrap(v.ge(ENTRY_COUNT_MIN)), _wrap(v.le(ENTRY_COUNT_MAX))],
    )

    @property
    def file_size_bytes(self) -> int:
        """Size of a new file (sparse on disk until written)."""
        return file_size_bytes(self.slot_count, self.entry_count)
