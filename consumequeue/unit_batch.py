"""Validation of the values a ConsumeQueue is given, singly or as batch columns.

Every check raises before anything is written: InvalidTypeError for a non-integer,
InvalidArgumentError for a value out of its range, so a batch is applied whole or not
at all (short of an I/O failure between files).
"""

from __future__ import annotations

from typing import Final, NoReturn

import numpy as np

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError
from mqstore.consumequeue.format import UNIT, UNIT_SIZE_BYTES

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "QUEUE_OFFSET_MAX",
    "SIZE_MAX_BYTES",
    "UnitBatch",
    "check_int",
]

INT64_MAX: Final = (1 << 63) - 1
INT64_MIN: Final = -(1 << 63)
SIZE_MAX_BYTES: Final = (1 << 31) - 1  # the unit's size field is an int32
QUEUE_OFFSET_MAX: Final = INT64_MAX // UNIT_SIZE_BYTES  # its byte position must fit an int64


class UnitBatch:
    """Validated, converted columns of a put_batch (one length, in range, in order)."""

    __slots__ = ("commitlog_offsets", "sizes", "tag_hashes", "timestamps_ms")

    def __init__(
        self,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> None:
        self.commitlog_offsets = commitlog_offsets
        self.sizes = sizes
        self.tag_hashes = tag_hashes
        self.timestamps_ms = timestamps_ms

    def __len__(self) -> int:
        return len(self.sizes)

    @classmethod
    def of(
        cls,
        commitlog_offsets: np.ndarray,
        sizes: np.ndarray,
        tag_hashes: np.ndarray,
        timestamps_ms: np.ndarray,
    ) -> UnitBatch:
        columns = {
            "commitlog_offsets": commitlog_offsets,
            "sizes": sizes,
            "tag_hashes": tag_hashes,
            "timestamps_ms": timestamps_ms,
        }
        arrays = {name: _int_column(name, value) for name, value in columns.items()}
        if len({len(array) for array in arrays.values()}) != 1:
            raise InvalidArgumentError("put_batch columns must all have the same length")
        batch = cls(**arrays)
        if len(batch):  # int64 columns: an upper bound of INT64_MAX holds by itself
            offsets = batch.commitlog_offsets
            increasing = len(batch) == 1 or bool((offsets[1:] > offsets[:-1]).all())
            lowest = int(offsets[0]) if increasing else int(offsets.min())  # one pass less
            if lowest < 0:
                _raise_outside("commitlog_offsets", 0, INT64_MAX)
            _check_column("sizes", batch.sizes, 1, SIZE_MAX_BYTES)
            if int(batch.timestamps_ms.min()) < 0:
                _raise_outside("timestamps_ms", 0, INT64_MAX)
            if not increasing:
                raise InvalidArgumentError("put_batch commitlog_offsets must strictly increase")
        batch.sizes = batch.sizes.astype(np.int32)
        return batch

    def head(self, count: int) -> UnitBatch:
        return UnitBatch(
            self.commitlog_offsets[:count],
            self.sizes[:count],
            self.tag_hashes[:count],
            self.timestamps_ms[:count],
        )

    def tail(self, start: int) -> UnitBatch:
        return UnitBatch(
            self.commitlog_offsets[start:],
            self.sizes[start:],
            self.tag_hashes[start:],
            self.timestamps_ms[start:],
        )

    def units(self, chunk: slice) -> np.ndarray:
        """The units of ``chunk`` as UNIT records (for a file written by pwrite)."""
        records = np.empty(chunk.stop - chunk.start, dtype=UNIT)
        records["commitlog_offset"] = self.commitlog_offsets[chunk]
        records["size"] = self.sizes[chunk]
        records["tag_hash"] = self.tag_hashes[chunk]
        return records

    def describe(self, position: int) -> str:
        return (
            f"(commitlog_offset={int(self.commitlog_offsets[position])}, "
            f"size={int(self.sizes[position])}, tag_hash={int(self.tag_hashes[position])})"
        )


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]`` (bool refused; numpy integers accepted)."""
    if type(value) is int and low <= value <= high:  # the common case, checked cheaply
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"{name} must be an int, not {type(value).__name__}")
    number = int(value)
    if not low <= number <= high:
        raise InvalidArgumentError(f"{name} {number} is outside [{low}, {high}]")
    return number


def _int_column(name: str, value: object) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise InvalidArgumentError(f"put_batch {name} must be a 1-D integer array")
    if array.dtype == np.uint64 and array.size and array.max() > INT64_MAX:
        raise InvalidArgumentError(f"put_batch {name} holds values above {INT64_MAX}")
    return array.astype(np.int64, copy=False)


def _check_column(name: str, array: np.ndarray, low: int, high: int) -> None:
    if int(array.min()) < low or int(array.max()) > high:
        _raise_outside(name, low, high)


def _raise_outside(name: str, low: int, high: int) -> NoReturn:
    raise InvalidArgumentError(f"put_batch {name} holds values outside [{low}, {high}]")
