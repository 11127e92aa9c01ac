"""ConsumeQueue: writes, reads, idempotence, truncation, retention, time look-up."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.consumequeue import UNIT, ConsumeQueue, ConsumeQueueStore
from mqstore.consumequeue.format import block_max_position_bytes, time_file_name, unit_file_name
from mqstore.consumequeue.queue_store import ConsumeQueueStore as _Store

StoreFactory = Callable[..., _Store]
UPF = 8  # units per file in these tests (the conftest default): files roll often


def cl_of(offset: int) -> int:
    """The commitlog offset the tests store for queue offset ``offset``."""
    return 1000 + 100 * offset


def fill(
    queue: ConsumeQueue,
    start: int,
    count: int,
    *,
    timestamps: list[int] | None = None,
    batch: bool = False,
) -> None:
    """Put units ``start .. start + count`` (size 10 + offset, tag 7 * offset)."""
    offsets = np.arange(start, start + count)
    stamps = np.array(timestamps if timestamps is not None else 1000 + offsets, dtype=np.int64)
    if batch:
        queue.put_batch(start, cl_of(offsets), 10 + offsets, 7 * offsets, stamps)  # type: ignore[arg-type]
        return
    for index, offset in enumerate(range(start, start + count)):
        queue.put(offset, cl_of(offset), 10 + offset, 7 * offset, int(stamps[index]))


HYPOTHESIS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def unit_tuple(unit: np.void) -> tuple[int, int, int]:
    return (int(unit["commitlog_offset"]), int(unit["size"]), int(unit["tag_hash"]))


# ------------------------------------------------------------------ put / get


def test_empty_queue(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    assert (queue.min_offset, queue.max_offset) == (0, 0)
    assert len(queue.get_range(0, 10)) == 0
    assert queue.offset_for_time(0) is None
    with pytest.raises(OffsetOutOfRangeError):
        queue.get(0)
    with pytest.raises(OffsetOutOfRangeError):
        queue.get_range(1, 1)


def test_put_get_across_file_boundaries(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 1)
    fill(queue, 0, 3 * UPF + 2)
    assert (queue.min_offset, queue.max_offset) == (0, 3 * UPF + 2)
    for offset in range(queue.max_offset):
        assert unit_tuple(queue.get(offset)) == (cl_of(offset), 10 + offset, offset * 7)
    assert sorted(os.listdir(queue.directory)) == sorted(
        name
        for index in range(4)
        for name in (unit_file_name(index, UPF), time_file_name(unit_file_name(index, UPF)))
    )


def test_get_returns_a_copy(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 3)
    unit = queue.get(2)
    queue.truncate(1)
    assert unit_tuple(unit) == (cl_of(2), 12, 14)


def test_get_range_stops_at_file_boundary_and_max(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 2 * UPF + 3)
    first = queue.get_range(5, 100)
    assert list(first["commitlog_offset"]) == [cl_of(offset) for offset in range(5, UPF)]
    assert len(queue.get_range(UPF, 100)) == UPF
    assert len(queue.get_range(2 * UPF, 100)) == 3
    assert len(queue.get_range(2 * UPF + 2, 100)) == 1
    assert len(queue.get_range(2 * UPF + 3, 100)) == 0
    assert len(queue.get_range(0, 0)) == 0
    assert queue.get_range(0, 2).dtype == UNIT
    with pytest.raises(OffsetOutOfRangeError):
        queue.get_range(2 * UPF + 4, 1)


def test_get_range_is_a_read_only_view(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 4)
    view = queue.get_range(0, 4)
    assert not view.flags.writeable
    assert not view.flags.owndata
    with pytest.raises(ValueError):
        view["size"][0] = 99
    fill(queue, 4, 2)  # later writes land in the same mapping
    assert queue.get_range(0, 8)["size"][5] == 15


def test_get_range_of_shared_units_reads_them_one_by_one_or_gathered(
    open_store: StoreFactory,
) -> None:
    """A few units of the shared log are read one by one, more in one gather: the
    same units either way, each a read-only array of UNIT."""
    queue = open_store(shared_units_max=64).queue("t", 0)
    fill(queue, 0, 30)
    assert not os.path.exists(queue.directory)  # no own file: every unit is shared
    for start, count in [(0, 1), (5, 12), (5, 13), (29, 1), (0, 30), (18, 100)]:
        units = queue.get_range(start, count)
        assert units.dtype == UNIT and not units.flags.writeable
        expected = [(cl_of(o), 10 + o, 7 * o) for o in range(start, min(start + count, 30))]
        assert [unit_tuple(unit) for unit in units] == expected
    assert len(queue.get_range(30, 5)) == 0
    with pytest.raises(OffsetOutOfRangeError):
        queue.get_range(31, 1)


def test_view_survives_eviction_and_close(open_store: StoreFactory) -> None:
    store = open_store(max_open_files=2)
    queue = store.queue("t", 0)
    fill(queue, 0, 5)
    view = queue.get_range(0, 5)
    for queue_id in range(1, 6):  # evicts the mapping behind ``view``
        fill(store.queue("t", queue_id), 0, 1)
    assert store.open_files <= 2
    store.close()
    assert list(view["commitlog_offset"]) == [cl_of(offset) for offset in range(5)]


def test_first_put_may_start_anywhere(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 13, 6)
    assert (queue.min_offset, queue.max_offset) == (13, 19)
    with pytest.raises(OffsetOutOfRangeError):
        queue.get(12)
    with pytest.raises(OffsetOutOfRangeError):
        queue.get_range(12, 1)
    assert unit_tuple(queue.get(13)) == (cl_of(13), 23, 91)
    reopened = open_store().queue("t", 0)
    assert (reopened.min_offset, reopened.max_offset) == (13, 19)
    assert unit_tuple(reopened.get(18)) == unit_tuple(queue.get(18))


def test_gap_raises(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 3)
    with pytest.raises(InvalidArgumentError, match="gap"):
        queue.put(4, cl_of(4), 10, 0, 0)
    with pytest.raises(InvalidArgumentError, match="gap"):
        queue.put_batch(5, np.array([cl_of(5)]), np.array([1]), np.array([0]), np.array([0]))
    assert queue.max_offset == 3


def test_a_queue_retention_emptied_resumes_past_a_gap(open_store: StoreFactory) -> None:
    """Regression (power-loss harness): retention deleted CommitLog files past the
    checkpoint's dispatched claim, durably, while the units of those files were not
    yet synced. Re-dispatch then resumes the queue at a higher offset; that gap holds
    only offsets whose records are gone, so it is allowed, and only then."""
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, UPF + 3)
    queue.correct_min_offset(cl_of(UPF + 3))  # every unit is below the log start
    assert queue.min_offset == queue.max_offset == UPF + 3
    resume = 3 * UPF + 2
    queue.put(resume, cl_of(resume), 10, 0, 0)
    assert (queue.min_offset, queue.max_offset) == (resume, resume + 1)
    assert unit_tuple(queue.get(resume))[0] == cl_of(resume)
    with pytest.raises(InvalidArgumentError, match="gap"):  # a live queue never skips
        queue.put(resume + 3, cl_of(resume + 3), 10, 0, 0)
    reopened = open_store().queue("t", 0)
    assert (reopened.min_offset, reopened.max_offset) == (resume, resume + 1)


def test_commitlog_offsets_must_increase(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 3)
    with pytest.raises(InvalidArgumentError, match="not above"):
        queue.put(3, cl_of(2), 10, 0, 0)
    with pytest.raises(InvalidArgumentError, match="strictly increase"):
        queue.put_batch(
            3, np.array([9000, 8000]), np.ones(2, int), np.zeros(2, int), np.zeros(2, int)
        )
    assert queue.max_offset == 3


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("size", 0, InvalidArgumentError),
        ("size", 2**31, InvalidArgumentError),
        ("commitlog_offset", -1, InvalidArgumentError),
        ("timestamp_ms", -1, InvalidArgumentError),
        ("tag_hash", 2**63, InvalidArgumentError),
        ("size", 1.5, InvalidTypeError),
        ("size", True, InvalidTypeError),
    ],
)
def test_put_rejects_bad_values(
    open_store: StoreFactory, field: str, value: object, error: type[Exception]
) -> None:
    queue = open_store().queue("t", 0)
    arguments: dict[str, object] = {
        "queue_offset": 0,
        "commitlog_offset": 1,
        "size": 1,
        "tag_hash": 0,
        "timestamp_ms": 0,
    }
    arguments[field] = value
    with pytest.raises(error):
        queue.put(**arguments)  # type: ignore[arg-type]
    assert queue.max_offset == 0
    assert not os.path.exists(queue.directory)


# ------------------------------------------------------------------ idempotence


def test_reput_same_unit_is_a_no_op(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, UPF + 2)
    before = queue.get_range(0, UPF).copy()
    queue.put(3, cl_of(3), 13, 21, 1003)
    fill(queue, 0, UPF + 2)  # the whole prefix again, as a re-dispatch would
    assert queue.max_offset == UPF + 2
    assert (queue.get_range(0, UPF) == before).all()


def test_conflicting_reput_raises_naming_file_and_position(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, UPF + 4)
    with pytest.raises(CorruptDataError) as caught:
        queue.put(UPF + 2, cl_of(UPF + 2) + 1, 10 + UPF + 2, 0, 0)
    assert caught.value.path == os.path.join(queue.directory, unit_file_name(1, UPF))
    assert caught.value.position == 2 * UNIT.itemsize
    assert unit_tuple(queue.get(UPF + 2)) == (cl_of(UPF + 2), 12 + UPF, (UPF + 2) * 7)


def test_conflicting_batch_writes_nothing(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 4)
    offsets = np.array([cl_of(2), cl_of(3) + 1, cl_of(4), cl_of(5)])
    sizes = np.array([12, 13, 14, 15])
    with pytest.raises(CorruptDataError):
        queue.put_batch(2, offsets, sizes, np.array([14, 21, 28, 35]), np.zeros(4, int))
    assert queue.max_offset == 4


def test_batch_overlapping_the_end_appends_the_rest(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 5)
    fill(queue, 3, 2 * UPF, batch=True)
    assert queue.max_offset == 3 + 2 * UPF
    assert [unit_tuple(queue.get(offset))[0] for offset in range(queue.max_offset)] == [
        cl_of(offset) for offset in range(3 + 2 * UPF)
    ]


def test_reput_fills_an_unwritten_slot(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 6)
    store.close()
    path = os.path.join(queue.directory, unit_file_name(0, UPF))
    with open(path, "r+b") as file:  # a lost page: unit 3 reads as unwritten
        file.seek(3 * UNIT.itemsize)
        file.write(bytes(UNIT.itemsize))
    queue = open_store().queue("t", 0)
    assert queue.max_offset == 6  # the binary search did not probe unit 3
    with pytest.raises(CorruptDataError):
        queue.get_range(0, 6)
    fill(queue, 0, 6)  # re-dispatch repairs it
    assert unit_tuple(queue.get(3)) == (cl_of(3), 13, 21)


def test_reput_repairs_timestamp_and_block_max(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 6, timestamps=[10, 20, 30, 40, 50, 60])
    assert queue.offset_for_time(55) == 5
    queue.put(4, cl_of(4), 14, 28, 99)  # same unit, a corrected timestamp
    assert list(queue.timestamps(0, 6)) == [10, 20, 30, 40, 99, 60]
    assert queue.offset_for_time(55) == 4


def test_reput_repairs_a_lost_block_max(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 6, timestamps=[10, 20, 30, 40, 50, 60])
    store.close()
    path = os.path.join(queue.directory, time_file_name(unit_file_name(0, UPF)))
    with open(path, "r+b") as file:  # the page of the block maxima was lost
        file.seek(block_max_position_bytes(UPF))
        file.write(bytes(8 * 3))
    queue = open_store().queue("t", 0)
    assert queue.offset_for_time(45) is None  # wrong, until re-dispatch repairs it
    fill(queue, 0, 6, timestamps=[10, 20, 30, 40, 50, 60])
    assert queue.offset_for_time(45) == 4


# ------------------------------------------------------------------ reopen / corruption


@pytest.mark.parametrize("count", [0, 1, UPF - 1, UPF, UPF + 1, 3 * UPF])
def test_reopen_keeps_max_offset(open_store: StoreFactory, count: int) -> None:
    store = open_store()
    fill(store.queue("t", 0), 0, count)
    store.close()
    queue = open_store().queue("t", 0)
    assert queue.max_offset == count
    fill(queue, count, 2)
    assert queue.max_offset == count + 2


def test_reopen_after_torn_file_creation(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, UPF + 1)
    queue.truncate(UPF)  # deletes file 1; now make it exist but empty, as after a crash
    fill(queue, UPF, 1)
    store.close()
    path = os.path.join(queue.directory, unit_file_name(1, UPF))
    with open(path, "r+b") as file:
        file.write(bytes(UNIT.itemsize))
    reopened = open_store().queue("t", 0)
    assert reopened.max_offset == UPF
    fill(reopened, UPF, 2)
    assert reopened.max_offset == UPF + 2


def test_wrong_file_size_is_corrupt(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 3)
    store.close()
    path = os.path.join(queue.directory, unit_file_name(0, UPF))
    os.truncate(path, UPF * UNIT.itemsize - 1)
    with pytest.raises(CorruptDataError) as caught:
        _ = open_store().queue("t", 0).max_offset
    assert caught.value.path == path


@pytest.mark.parametrize(
    ("unit", "value"),
    [(6, 1), (0, 10**9), (0, 0)],  # 6: probed by the search; 0: the run's first unit
)
def test_non_monotonic_commitlog_offsets_are_corrupt(
    open_store: StoreFactory, unit: int, value: int
) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 7)
    store.close()
    path = os.path.join(queue.directory, unit_file_name(0, UPF))
    units = np.fromfile(path, dtype=UNIT)
    units["commitlog_offset"][unit] = value
    if value == 0:
        units["size"][unit] = -5
    units.tofile(path)
    with pytest.raises(CorruptDataError) as caught:
        _ = open_store().queue("t", 0).max_offset
    assert caught.value.path == path
    assert caught.value.position % UNIT.itemsize == 0


def test_missing_middle_file_is_corrupt(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 3 * UPF)
    store.close()
    os.unlink(os.path.join(queue.directory, unit_file_name(1, UPF)))
    with pytest.raises(CorruptDataError, match="contiguous"):
        _ = open_store().queue("t", 0).max_offset


def test_missing_time_file_is_corrupt(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 3)
    store.close()
    os.unlink(os.path.join(queue.directory, time_file_name(unit_file_name(0, UPF))))
    with pytest.raises(CorruptDataError, match="missing"):
        _ = open_store().queue("t", 0).max_offset


def test_other_units_per_file_is_corrupt(open_store: StoreFactory) -> None:
    store = open_store()
    fill(store.queue("t", 0), 0, 3 * UPF)
    store.close()
    with pytest.raises(CorruptDataError):
        _ = open_store(units_per_file=16).queue("t", 0).max_offset


def test_leftover_temporary_files_are_removed(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 2)
    store.close()
    leftover = os.path.join(queue.directory, unit_file_name(1, UPF) + ".allocating")
    orphan = os.path.join(queue.directory, time_file_name(unit_file_name(5, UPF)))
    for path in (leftover, orphan):
        with open(path, "wb") as file:
            file.write(b"x")
    assert open_store().queue("t", 0).max_offset == 2
    assert not os.path.exists(leftover)
    assert not os.path.exists(orphan)


# ------------------------------------------------------------------ truncation / retention


def test_truncate_inside_a_file(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 3 * UPF)
    queue.truncate(UPF + 3)
    assert queue.max_offset == UPF + 3
    assert sorted(os.listdir(queue.directory))[-1] == time_file_name(unit_file_name(1, UPF))
    units = np.fromfile(os.path.join(queue.directory, unit_file_name(1, UPF)), dtype=UNIT)
    assert units[3:].tobytes() == bytes(5 * UNIT.itemsize)
    assert units[2]["size"] != 0
    assert list(queue.timestamps(UPF, 3)) == [1000 + UPF, 1001 + UPF, 1002 + UPF]
    fill(queue, UPF + 3, 2)  # refill with the same values: no conflict
    store.close()
    assert open_store().queue("t", 0).max_offset == UPF + 5


def test_truncate_at_a_file_boundary_deletes_the_file(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 2 * UPF + 1)
    queue.truncate(UPF)
    assert queue.max_offset == UPF
    assert len(os.listdir(queue.directory)) == 2
    queue.truncate(UPF + 5)  # beyond max: nothing to drop
    assert queue.max_offset == UPF


def test_truncate_below_every_unit_empties_the_queue(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 10, 5)
    queue.truncate(4)
    assert (queue.min_offset, queue.max_offset) == (4, 4)
    assert os.listdir(queue.directory) == []
    fill(queue, 30, 1)  # an empty queue may start anywhere again
    assert (queue.min_offset, queue.max_offset) == (30, 31)


def test_truncate_below_a_corrected_min_offset(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 6)
    queue.correct_min_offset(cl_of(4))
    queue.truncate(2)
    assert (queue.min_offset, queue.max_offset) == (2, 2)
    fill(queue, 2, 1)
    assert unit_tuple(queue.get(2))[0] == cl_of(2)


def test_truncate_clears_block_maxima_beyond(open_store: StoreFactory) -> None:
    """Stale maxima of dropped blocks must not promise timestamps that are gone."""
    queue = open_store().queue("t", 0)  # blocks of 3 units
    fill(queue, 0, UPF, timestamps=[1, 1, 1, 1, 1, 1, 90, 1])
    queue.truncate(1)
    fill(queue, 1, UPF - 1 + 4, timestamps=[2] * (UPF - 1 + 4))
    assert queue.offset_for_time(50) is None
    assert queue.offset_for_time(2) == 1


def test_correct_min_offsets_deletes_files_it_had_to_keep(open_store: StoreFactory) -> None:
    """A file kept as the newest is deleted by a later call once a newer file exists."""
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, UPF)
    store.correct_min_offsets(cl_of(UPF))
    assert len(os.listdir(queue.directory)) == 2  # file 0 kept: it carries max_offset
    fill(queue, UPF, 2)
    store.correct_min_offsets(cl_of(0))  # min_offset stays; file 0 is now wholly below
    assert queue.min_offset == UPF
    assert sorted(os.listdir(queue.directory))[0] == unit_file_name(1, UPF)
    queue.truncate(UPF - 1)  # below the first unit left: the queue empties
    assert (queue.min_offset, queue.max_offset) == (UPF - 1, UPF - 1)


def test_truncate_beyond_commitlog(open_store: StoreFactory) -> None:
    store = open_store()
    for queue_id in range(3):
        fill(store.queue("t", queue_id), 0, 2 * UPF + queue_id)
    store.truncate_beyond(cl_of(UPF + 1))
    for queue_id in range(3):
        assert store.queue("t", queue_id).max_offset == UPF + 1
    store.truncate_beyond(cl_of(1000))  # nothing beyond: no change
    assert store.queue("t", 1).max_offset == UPF + 1
    store.truncate_beyond(cl_of(0))
    assert [store.queue("t", queue_id).max_offset for queue_id in range(3)] == [0, 0, 0]


def test_correct_min_offsets_deletes_old_files(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 4 * UPF + 2)
    store.correct_min_offsets(cl_of(2 * UPF + 3) - 5)  # between two units
    assert queue.min_offset == 2 * UPF + 3
    assert queue.max_offset == 4 * UPF + 2
    names = sorted(name for name in os.listdir(queue.directory) if name.isdigit())
    assert names == [unit_file_name(index, UPF) for index in (2, 3, 4)]
    with pytest.raises(OffsetOutOfRangeError):
        queue.get(2 * UPF + 2)
    with pytest.raises(OffsetOutOfRangeError):
        queue.get_range(2 * UPF + 2, 5)
    assert unit_tuple(queue.get(2 * UPF + 3))[0] == cl_of(2 * UPF + 3)
    store.correct_min_offsets(cl_of(0))  # never moves back
    assert queue.min_offset == 2 * UPF + 3


def test_correct_min_offsets_keeps_the_newest_file(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 2 * UPF)
    store.correct_min_offsets(cl_of(2 * UPF))  # every unit is below the log
    assert (queue.min_offset, queue.max_offset) == (2 * UPF, 2 * UPF)
    assert len(queue.get_range(2 * UPF, 4)) == 0
    assert queue.offset_for_time(0) is None
    store.close()
    reopened = open_store().queue("t", 0)
    assert reopened.max_offset == 2 * UPF  # max offset survives retention
    with pytest.raises(InvalidArgumentError, match="gap"):
        reopened.put(2 * UPF + 5, cl_of(2 * UPF + 5), 1, 0, 0)


# ------------------------------------------------------------------ timestamps / time look-up


def test_timestamps_across_files(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    stamps = [(offset * 37) % 11 for offset in range(2 * UPF + 3)]
    fill(queue, 0, len(stamps), timestamps=stamps)
    assert list(queue.timestamps(3, 2 * UPF)) == stamps[3 : 3 + 2 * UPF]
    assert list(queue.timestamps(4, 2)) == stamps[4:6]
    assert len(queue.timestamps(len(stamps), 0)) == 0
    with pytest.raises(OffsetOutOfRangeError):
        queue.timestamps(len(stamps) - 1, 2)


def test_offset_for_time_boundaries(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    stamps = [100, 200, 200, 200, 300, 300, 400, 500, 500, 500, 500, 600]
    fill(queue, 5, len(stamps), timestamps=stamps)
    assert queue.offset_for_time(0) == 5  # before the first unit: min_offset
    assert queue.offset_for_time(100) == 5
    assert queue.offset_for_time(101) == 6
    assert queue.offset_for_time(200) == 6  # the first of the equals
    assert queue.offset_for_time(500) == 12
    assert queue.offset_for_time(600) == 16
    assert queue.offset_for_time(601) is None  # after the last


def test_offset_for_time_never_below_min_offset(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    stamps = [900, 100, 100, 100, 100, 100, 950, 100, 100, 100, 100, 100, 200, 300]
    fill(queue, 0, len(stamps), timestamps=stamps)
    assert queue.offset_for_time(800) == 0
    store.correct_min_offsets(cl_of(2))
    assert queue.offset_for_time(800) == 6
    assert queue.offset_for_time(0) == 2
    store.correct_min_offsets(cl_of(7))
    assert queue.offset_for_time(800) is None
    assert queue.offset_for_time(250) == 13


def test_offset_for_time_follows_appends(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 10, timestamps=list(range(10)))
    assert queue.offset_for_time(12) is None  # builds the index
    fill(queue, 10, 5, timestamps=[20, 11, 12, 13, 14])
    assert queue.offset_for_time(12) == 10
    assert queue.offset_for_time(21) is None
    fill(queue, 15, 1, timestamps=[25])
    assert queue.offset_for_time(21) == 15
    queue.truncate(11)
    assert queue.offset_for_time(21) is None
    assert queue.offset_for_time(20) == 10


def brute_force_offset(stamps: list[int], start: int, low: int, target: int) -> int | None:
    """The first offset >= low whose timestamp >= target (offsets begin at ``start``)."""
    for index in range(low - start, len(stamps)):
        if stamps[index] >= target:
            return start + index
    return None


@HYPOTHESIS
@given(
    start=st.integers(0, 20),
    stamps=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    retained=st.integers(0, 60),
    targets=st.lists(st.integers(-1, 52), min_size=1, max_size=8),
    interval=st.sampled_from([1, 3, 8, 20]),
)
def test_offset_for_time_matches_brute_force(
    open_store: StoreFactory,
    start: int,
    stamps: list[int],
    retained: int,
    targets: list[int],
    interval: int,
) -> None:
    """Out-of-order CreateTime timestamps, any block size, after retention."""
    store = open_store(time_index_interval_units=interval)
    queue = store.queue("t", len(store.existing_queues()))  # a fresh queue per example
    fill(queue, start, len(stamps), timestamps=stamps, batch=True)
    store_min = start + min(retained, len(stamps))
    queue.correct_min_offset(cl_of(store_min))
    assert queue.min_offset == store_min
    for target in targets:
        assert queue.offset_for_time(target) == brute_force_offset(stamps, start, store_min, target)


# ------------------------------------------------------------------ read-only, closed


def test_read_only_queue_sees_writer_units(open_store: StoreFactory) -> None:
    writer = open_store()
    reader = open_store(read_only=True)
    written = writer.queue("t", 0)
    seen = reader.queue("t", 0)
    assert seen.max_offset == 0
    fill(written, 0, 3)
    assert seen.max_offset == 3
    fill(written, 3, 2 * UPF)  # new files too
    assert len(seen.get_range(2 * UPF, 10)) == 3
    assert seen.max_offset == 2 * UPF + 3
    assert unit_tuple(seen.get(2 * UPF + 2)) == unit_tuple(written.get(2 * UPF + 2))
    assert seen.offset_for_time(1000 + 2 * UPF) == 2 * UPF
    with pytest.raises(ReadOnlyStoreError):
        seen.put(2 * UPF + 3, cl_of(2 * UPF + 3), 1, 0, 0)
    with pytest.raises(ReadOnlyStoreError):
        seen.truncate(0)


def test_read_only_queue_follows_retention(open_store: StoreFactory) -> None:
    writer = open_store()
    reader = open_store(read_only=True)
    fill(writer.queue("t", 0), 0, 4 * UPF)
    seen = reader.queue("t", 0)
    assert seen.min_offset == 0
    writer.correct_min_offsets(cl_of(2 * UPF))
    assert seen.min_offset == 2 * UPF  # the oldest file is gone: reloaded
    with pytest.raises(OffsetOutOfRangeError):
        seen.get(UPF)


def test_read_only_never_creates(open_store: StoreFactory, cq_dir: str) -> None:
    reader = open_store(read_only=True)
    queue = reader.queue("t", 0)
    assert queue.max_offset == 0
    reader.correct_min_offsets(0)
    reader.flush()
    assert not os.path.exists(cq_dir)


def test_closed_store_refuses_use(open_store: StoreFactory) -> None:
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 2)
    store.close()
    store.close()  # idempotent
    for call in (lambda: queue.get(0), lambda: queue.max_offset, lambda: store.queue("t", 1)):
        with pytest.raises(StoreClosedError):
            call()


def test_repr_names_the_queue(open_store: StoreFactory) -> None:
    queue = open_store().queue("orders", 7)
    assert isinstance(queue, ConsumeQueue)
    assert repr(queue) == "ConsumeQueue('orders', 7)"
    assert (queue.topic, queue.queue_id) == ("orders", 7)


def test_store_type(open_store: StoreFactory) -> None:
    assert isinstance(open_store(), ConsumeQueueStore)


# ------------------------------------------------------------------ model-based


class QueueModel:
    """A list-and-dict model of one queue (what the store promises, nothing more)."""

    def __init__(self, units_per_file: int) -> None:
        self.units_per_file = units_per_file
        self.units: dict[int, tuple[int, int, int, int]] = {}  # offset -> cl, size, tag, ts
        self.first = self.min = self.max = 0

    def append(self, offset: int, unit: tuple[int, int, int, int]) -> None:
        if self.first == self.max:
            self.units.clear()
            self.first = self.min = self.max = offset
        assert offset == self.max
        self.units[offset] = unit
        self.max += 1

    def truncate(self, offset: int) -> None:
        if offset >= self.max:
            return
        if offset <= self.first:
            self.units.clear()
            self.first = self.min = self.max = offset
            return
        for dropped in range(offset, self.max):
            del self.units[dropped]
        self.max = offset
        self.min = min(self.min, offset)

    def correct_min(self, commitlog_min: int) -> None:
        if self.min >= self.max:
            return
        self.min = next(
            (o for o in range(self.min, self.max) if self.units[o][0] >= commitlog_min), self.max
        )
        newest = (self.max - 1) // self.units_per_file
        oldest_kept = min(self.min // self.units_per_file, newest)
        self.first = max(self.first, oldest_kept * self.units_per_file)
        for gone in [o for o in self.units if o < self.first]:
            del self.units[gone]

    def reopen(self) -> None:
        if self.first == self.max:
            self.units.clear()
            self.first = self.min = self.max = 0
        self.min = self.first

    def offset_for_time(self, target: int) -> int | None:
        return next((o for o in range(self.min, self.max) if self.units[o][3] >= target), None)


@settings(HYPOTHESIS, max_examples=60)
@given(data=st.data())
def test_queue_against_model(open_store: StoreFactory, data: st.DataObject) -> None:
    """Random appends, re-puts, truncations, retention and reopens against the model."""
    store = open_store(max_open_files=2)
    queue_id = len(store.existing_queues()) + 1000
    queue = store.queue("model", queue_id)
    model = QueueModel(UPF)
    next_cl = 1
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        action = data.draw(
            st.sampled_from(["append", "batch", "reput", "truncate", "retain", "reopen"])
        )
        if action in ("append", "batch"):
            count = data.draw(st.integers(1, 2 * UPF)) if action == "batch" else 1
            start = model.max
            if model.first == model.max:
                start = data.draw(st.integers(0, 3 * UPF), label="fresh start")
            elif action == "batch":  # a re-dispatch may overlap what is stored
                start = data.draw(st.integers(model.first, model.max), label="batch start")
            stored = range(start, min(start + count, model.max)) if model.first < model.max else []
            units = [model.units[offset] for offset in stored]
            for _ in range(count - len(units)):
                next_cl += data.draw(st.integers(1, 50))
                units.append(
                    (next_cl, data.draw(st.integers(1, 99)), 3, data.draw(st.integers(0, 40)))
                )
            columns = [np.array(column) for column in zip(*units, strict=True)]
            if action == "batch":
                queue.put_batch(start, *columns)
            else:
                queue.put(start, *units[0])
            for index, unit in enumerate(units[len(stored) :]):
                model.append(start + len(stored) + index, unit)
        elif action == "reput" and model.first < model.max:
            offset = data.draw(st.integers(model.first, model.max - 1))
            queue.put(offset, *model.units[offset])
            cl, size, tag, ts = model.units[offset]
            with pytest.raises(CorruptDataError):
                queue.put(offset, cl, size + 1, tag, ts)
        elif action == "truncate":
            offset = data.draw(st.integers(0, model.max + 2))
            queue.truncate(offset)
            model.truncate(offset)
        elif action == "retain":
            commitlog_min = data.draw(st.integers(0, next_cl + 5))
            queue.correct_min_offset(commitlog_min)
            model.correct_min(commitlog_min)
        elif action == "reopen":
            store.close()
            store = open_store(max_open_files=2)
            queue = store.queue("model", queue_id)
            model.reopen()
        assert (queue.min_offset, queue.max_offset) == (model.min, model.max)
        start = data.draw(st.integers(model.min, model.max), label="read start")
        got = queue.get_range(start, 5)
        expected = [model.units[o][:3] for o in range(start, start + len(got))]
        assert [tuple(int(value) for value in unit.item()) for unit in got] == expected
        assert len(got) >= min(1, model.max - start)
        target = data.draw(st.integers(-1, 41), label="time")
        assert queue.offset_for_time(target) == model.offset_for_time(target)


# ------------------------------------------------------- recovery after a power cut


def _verify_all(position: int, size: int, offset: int) -> bool:
    """The CommitLog check of the tests: the unit fill() wrote for ``offset``."""
    return position == cl_of(offset) and size == 10 + offset


def _torn(queue: ConsumeQueue, offset: int, position: int, size: int) -> None:
    """Write a unit as a torn page leaves it (bypassing put's checks)."""
    file_index, unit_in_file = divmod(offset, UPF)
    units = queue._files.units(file_index, for_write=True)
    units.commitlog_offsets[unit_in_file] = position
    units.sizes[unit_in_file] = size


def test_recover_tail_keeps_an_untouched_queue(open_store: StoreFactory) -> None:
    queue = open_store().queue("t", 0)
    fill(queue, 0, 2 * UPF + 3)
    claim = cl_of(2 * UPF + 3)
    assert queue.recover_tail(claim, 0, _verify_all) == (0, None)
    assert queue.max_offset == 2 * UPF + 3


def test_recover_tail_cuts_torn_units_after_the_claim(open_store: StoreFactory) -> None:
    """Regression (power-loss harness): units written after the checkpoint's claim
    were torn (a zero hole, then units a kept page still held, then garbage), and open
    refused with "queue offset ... is below max offset ... but not written"."""
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 2 * UPF + 6)
    kept = UPF + 5  # units of records before the claim: intact
    claim = cl_of(kept)
    file_index, unit_in_file = divmod(kept, UPF)
    units = queue._files.units(file_index, for_write=True)
    units.sizes[unit_in_file : unit_in_file + 2] = 0  # a page reverted to zeros
    _torn(queue, 2 * UPF + 2, 0, 77)  # a torn unit: old zero offset, new size
    dropped, rebuild_from = queue.recover_tail(claim, 0, _verify_all)
    assert dropped > 0 and rebuild_from is None  # re-dispatch from the claim suffices
    assert queue.max_offset == kept
    fill(queue, kept, 4)  # re-dispatch rebuilds the rest, with no conflict
    reopened = open_store().queue("t", 0)
    assert reopened.max_offset == kept + 4
    stored = [unit_tuple(reopened.get(offset))[0] for offset in range(kept + 4)]
    assert stored == [cl_of(offset) for offset in range(kept + 4)]


def test_recover_tail_drops_a_file_the_cut_left_unreadable(open_store: StoreFactory) -> None:
    """Regression: a ConsumeQueue file created after the claim whose name survived a
    cut but whose size did not ("file is 0 bytes") made open refuse."""
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, 2 * UPF + 2)
    newest = queue._files.unit_path(2)
    store.close()
    os.truncate(newest, 0)
    queue = open_store().queue("t", 0)
    _, rebuild_from = queue.recover_tail(cl_of(UPF + 1), 0, _verify_all)
    assert queue.max_offset == UPF + 1  # the units of records before the claim
    assert not os.path.exists(newest)
    # Whatever the dropped file held comes back by re-dispatch from after the last
    # kept unit's record (its position + size), not from the claim.
    assert rebuild_from == cl_of(UPF) + 10 + UPF


def test_recover_tail_of_a_fresh_open_keeps_synced_units_before_a_torn_one(
    open_store: StoreFactory,
) -> None:
    """Review finding: a torn unit (old zero offset, new size) after the claim made the
    strict load raise "breaks the order", and recovery dropped the whole newest file,
    synced units included, with nothing to rebuild them. The load is lenient now."""
    store = open_store()
    queue = store.queue("t", 0)
    fill(queue, 0, UPF + 6)
    store.close()
    reopened = open_store()
    _torn(reopened.queue("t", 0), UPF + 5, 0, 74)  # written through a fresh mapping
    reopened.close()
    queue = open_store().queue("t", 0)
    dropped, rebuild_from = queue.recover_tail(cl_of(UPF + 5), 0, _verify_all)
    assert (dropped, rebuild_from) == (1, None)
    assert queue.max_offset == UPF + 5
    assert unit_tuple(queue.get(UPF + 4))[0] == cl_of(UPF + 4)
