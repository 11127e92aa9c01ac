"""Validation of single values and batch columns."""

from __future__ import annotations

import numpy as np
import pytest

from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError
from mqstore.consumequeue import UNIT
from mqstore.consumequeue.unit_batch import UnitBatch, check_int


def test_check_int() -> None:
    assert check_int("x", 5, 0, 10) == 5
    assert check_int("x", np.int32(7), 0, 10) == 7
    for bad in (True, 1.0, "1", None):
        with pytest.raises(InvalidTypeError):
            check_int("x", bad, 0, 10)
    with pytest.raises(InvalidArgumentError, match="x 11 is outside"):
        check_int("x", 11, 0, 10)


def columns(**overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "commitlog_offsets": np.array([10, 20, 30]),
        "sizes": np.array([1, 2, 3]),
        "tag_hashes": np.array([-1, 0, 1]),
        "timestamps_ms": np.array([5, 4, 6]),
    }
    values.update(overrides)
    return values


def test_batch_converts_and_slices() -> None:
    batch = UnitBatch.of(**columns(sizes=[1, 2, 3]))  # type: ignore[arg-type]
    assert len(batch) == 3
    assert batch.sizes.dtype == np.int32
    units = batch.units(slice(1, 3))
    assert units.dtype == UNIT
    assert [tuple(int(v) for v in unit.item()) for unit in units] == [(20, 2, 0), (30, 3, 1)]
    assert list(batch.tail(2).commitlog_offsets) == [30]
    assert list(batch.head(1).timestamps_ms) == [5]
    assert batch.describe(0) == "(commitlog_offset=10, size=1, tag_hash=-1)"
    assert len(UnitBatch.of(*[np.array([], dtype=np.int64)] * 4)) == 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"sizes": np.array([1, 0, 3])},
        {"sizes": np.array([1, 2**31, 3])},
        {"commitlog_offsets": np.array([10, 10, 30])},
        {"commitlog_offsets": np.array([-10, 20, 30])},
        {"timestamps_ms": np.array([5, -1, 6])},
        {"timestamps_ms": np.array([5.0, 4.0, 6.0])},
        {"tag_hashes": np.array([[1, 2, 3]])},
        {"tag_hashes": np.array([1, 2])},
        {"commitlog_offsets": np.array([10, 20, 2**64 - 1], dtype=np.uint64)},
    ],
)
def test_batch_rejects(overrides: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        UnitBatch.of(**columns(**overrides))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("offsets", "reason"),
    [
        ([-30, -20, -10], "commitlog_offsets holds values outside"),  # increasing: first
        ([10, -5, 30], "commitlog_offsets holds values outside"),  # not increasing: min
        ([10, 5, 30], "must strictly increase"),
        ([-1], "commitlog_offsets holds values outside"),
    ],
)
def test_batch_names_the_first_broken_rule(offsets: list[int], reason: str) -> None:
    """The range is read from the ends when the offsets increase (a pass less), from
    every offset when not; a range error comes before an order error, as it always did."""
    count = len(offsets)
    given = columns(
        commitlog_offsets=np.array(offsets), sizes=np.ones(count, np.int64),
        tag_hashes=np.zeros(count, np.int64), timestamps_ms=np.full(count, 5),
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match=reason):
        UnitBatch.of(**given)  # type: ignore[arg-type]
