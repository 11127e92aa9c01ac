"""IndexFile configuration: one frozen, keyword-only, validated class.

The config shapes new files only: an existing file's slot count comes from its
header and its entry count from its size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs
from attrs import validators as v

from mqstore.commitlog.errors import ConfigError
from mqstore.indexfile.format import file_size_bytes

__all__ = ["IndexConfig"]

SLOT_COUNT_MAX: Final = 1 << 26  # 256 MiB of slots; far above RocketMQ's 5M default
ENTRY_COUNT_MIN: Final = 2  # entry number 0 is unused, so 2 holds one entry
ENTRY_COUNT_MAX: Final = 1 << 27  # 2.5 GiB of entries; entry numbers stay far inside i32


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
    """Settings of new index files. Defaults follow RocketMQ (5M slots, 20M entries,
    a file of about 420 MB, created sparse).

    Attributes:
        slot_count: hash slots per file; a key's chain is ``slots[hash % slot_count]``.
        entry_count: entry numbers per file, number 0 unused, so a file holds
            ``entry_count - 1`` entries; a new file starts when one is full.
    """

    slot_count: int = attrs.field(
        default=5_000_000,
        validator=[_strict_int, _wrap(v.ge(1)), _wrap(v.le(SLOT_COUNT_MAX))],
    )
    entry_count: int = attrs.field(
        default=20_000_000,
        validator=[_strict_int, _wrap(v.ge(ENTRY_COUNT_MIN)), _wrap(v.le(ENTRY_COUNT_MAX))],
    )

    @property
    def file_size_bytes(self) -> int:
        """Size of a new file (sparse on disk until written)."""
        return file_size_bytes(self.slot_count, self.entry_count)
