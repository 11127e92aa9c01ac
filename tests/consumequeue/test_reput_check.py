"""The re-dispatch's check of kept units (consumequeue/reput_check.py): the C version
and its pure-Python twin give the same answers (and refuse the same arguments), and
``ConsumeQueue.units_in_place`` counts exactly the units ``put_batch`` would not write."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore, reput_check
from mqstore.consumequeue.format import UNIT
from mqstore.consumequeue.reput_check import RunColumns, units_in_place_py

IMPLEMENTATIONS = [
    pytest.param(units_in_place_py, id="python"),
    pytest.param(
        getattr(NATIVE, "units_in_place", None), id="c",
        marks=pytest.mark.skipif(NATIVE is None, reason="the C module is not built"),
    ),
]  # fmt: skip
INTERVAL = 4  # units per block of the time index in these tests


def _file(units: list[tuple[int, int, int]], times: list[int], capacity: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """A unit file's units, a time file's times and block maxima, ``capacity`` units."""
    stored = np.zeros(capacity, dtype=UNIT)
    stored[: len(units)] = units
    stamps = np.zeros(capacity, dtype=np.int64)
    stamps[: len(times)] = times
    maxima = np.zeros(-(-capacity // INTERVAL), dtype=np.int64)
    for at, stamp in enumerate(times):
        maxima[at // INTERVAL] = max(maxima[at // INTERVAL], stamp)
    return stored, stamps, maxima


def _run(count: int, first: int) -> dict[str, np.ndarray]:
    """Columns of ``count`` records of one queue, from queue offset ``first``."""
    return {
        "queue_offsets": np.arange(first, first + count, dtype=np.int64),
        "physical": np.arange(count, dtype=np.int64) * 100 + 7,
        "sizes": np.full(count, 90, dtype=np.int64),
        "tags": np.arange(count, dtype=np.int64) % 3 - 1,
        "timestamps": np.arange(count, dtype=np.int64) * 5 + 1_000,
    }


def _call(function: Any, run: dict[str, np.ndarray], stored: tuple, **changes: Any) -> Any:
    args = {"interval": INTERVAL, "unit_in_file": 0, "first_offset": 0, "order": None,
            "lo": 0, "count": len(run["physical"]), **changes}  # fmt: skip
    units, times, maxima = stored
    try:
        return function(
            units, times, maxima, args["interval"], args["unit_in_file"], args["first_offset"],
            run["queue_offsets"], run["physical"], run["sizes"], run.get("tags"),
            run["timestamps"], args["order"], args["lo"], args["count"],
        )  # fmt: skip
    except (ValueError, TypeError, OverflowError) as error:
        return type(error).__name__


@pytest.mark.parametrize("function", IMPLEMENTATIONS)
def test_every_kept_unit_is_in_place(function: Any) -> None:
    run = _run(10, 0)
    stored = _file(
        list(zip(run["physical"].tolist(), run["sizes"].tolist(), run["tags"].tolist(),
                 strict=True)),
        run["timestamps"].tolist(), 16,
    )  # fmt: skip
    assert _call(function, run, stored) == 10
    assert _call(function, run, stored, lo=3, count=7, unit_in_file=3, first_offset=3) == 7


@pytest.mark.parametrize("function", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "damage", ["hole", "physical", "size", "tag", "time", "block_max", "queue_offset"]
)
def test_the_first_unit_not_in_place_stops_the_count(function: Any, damage: str) -> None:
    run = _run(10, 0)
    units = list(zip(run["physical"].tolist(), run["sizes"].tolist(), run["tags"].tolist(),
                     strict=True))  # fmt: skip
    stored = _file(units, run["timestamps"].tolist(), 16)
    bad = 6
    if damage == "hole":
        stored[0][bad] = (0, 0, 0)
    elif damage in ("physical", "size", "tag"):
        stored[0][{"physical": "commitlog_offset", "size": "size", "tag": "tag_hash"}[damage]][
            bad
        ] += 1
    elif damage == "time":
        stored[1][bad] -= 1
    elif damage == "block_max":
        stored[2][bad // INTERVAL] = run["timestamps"][bad] - 1
    else:
        run["queue_offsets"][bad:] += 1  # a gap in the queue's offsets
    assert _call(function, run, stored) == bad  # (the block's earlier units are below)


@pytest.mark.parametrize("function", IMPLEMENTATIONS)
def test_no_tags_means_tag_hash_zero(function: Any) -> None:
    run = _run(5, 0)
    del run["tags"]
    stored = _file(
        list(zip(run["physical"].tolist(), run["sizes"].tolist(), [0] * 5, strict=True)),
        run["timestamps"].tolist(), 8,
    )  # fmt: skip
    assert _call(function, run, stored) == 5
    stored[0]["tag_hash"][2] = 1
    assert _call(function, run, stored) == 2


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], tuple, dict[str, Any]]:
    """A run of rows (shuffled by an order, or not), a file partly holding them, some
    units damaged, and arguments that are mostly sane and sometimes hostile."""
    rows = draw(st.integers(0, 24))
    capacity = draw(st.integers(0, 32))
    first = draw(st.integers(0, 40))
    run = _run(rows, first)
    if draw(st.booleans()):
        del run["tags"]
    for name in ("physical", "sizes", "timestamps"):
        if rows and draw(st.integers(0, 5)) == 0:
            run[name][draw(st.integers(0, rows - 1))] = draw(
                st.sampled_from([-1, 0, 1 << 31, 1 << 62])
            )
    order = None
    if draw(st.booleans()):
        order = np.array(draw(st.permutations(list(range(rows)))), dtype=np.int64)
        if rows and draw(st.integers(0, 5)) == 0:
            order[draw(st.integers(0, rows - 1))] = draw(st.sampled_from([-1, rows, 1 << 40]))
    unit_in_file = draw(st.integers(0, 8))
    kept = max(0, min(rows, capacity - unit_in_file))
    picked = np.arange(rows) if order is None else np.clip(order, 0, max(rows - 1, 0))
    stored_units = [(0, 0, 0)] * unit_in_file
    stored_times = [0] * unit_in_file
    for i in range(kept):
        row = int(picked[i])
        tag = 0 if "tags" not in run else int(run["tags"][row])
        stored_units.append((int(run["physical"][row]), int(run["sizes"][row]) & 0x7FFF_FFFF, tag))
        stored_times.append(int(run["timestamps"][row]))
    stored = _file(stored_units[:capacity], stored_times[:capacity], capacity)
    if kept and draw(st.booleans()):
        at = unit_in_file + draw(st.integers(0, kept - 1))
        stored[draw(st.integers(0, 1))][at] = 0

    def mostly(sane: Any, *hostile: Any) -> Any:
        return sane if draw(st.integers(0, 7)) else draw(st.sampled_from(hostile))

    args = {
        "unit_in_file": unit_in_file,
        "first_offset": mostly(first, first + 1, -1),
        "order": order,
        "lo": mostly(0, 1, rows, rows + 1, -1),
        "count": mostly(kept, rows, capacity, kept + 1, -1),
        "interval": mostly(INTERVAL, 1, 0, -3),
    }
    return run, stored, args


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
@settings(max_examples=400, deadline=None)
@given(case=cases())
def test_c_and_python_agree(case: tuple) -> None:
    run, stored, args = case
    assert _call(NATIVE.units_in_place, run, stored, **args) == _call(
        units_in_place_py, run, stored, **args
    )


@pytest.mark.skipif(NATIVE is None, reason="the C module is not built")
def test_c_refuses_arrays_of_the_wrong_kind() -> None:
    run = _run(4, 0)
    stored = _file([], [], 8)
    for name in ("physical", "sizes", "timestamps", "queue_offsets", "tags"):
        bad = dict(run, **{name: run[name].astype(np.int32)})
        assert _call(NATIVE.units_in_place, bad, stored) == "TypeError"
        assert _call(units_in_place_py, bad, stored) == "TypeError"
    strided = dict(run, physical=np.arange(8, dtype=np.int64)[::2])
    assert _call(NATIVE.units_in_place, strided, stored) == "ValueError"
    assert _call(units_in_place_py, strided, stored) == "ValueError"


def _columns(units: list[tuple[int, int, int]], times: list[int], first: int) -> RunColumns:
    physical, sizes, tags = (
        np.array(column, dtype=np.int64) for column in zip(*units, strict=True)
    )
    offsets = np.arange(first, first + len(units), dtype=np.int64)
    return RunColumns(offsets, physical, sizes, tags, np.array(times, dtype=np.int64), None)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None)
@given(
    kept=st.integers(1, 40),
    extra=st.integers(0, 10),
    start=st.integers(0, 45),
    damage=st.sampled_from([None, "hole", "time", "unit"]),
    at=st.integers(0, 49),
)
def test_in_place_is_what_put_batch_leaves_alone(
    implementation: Any, kept: int, extra: int, start: int, damage: str | None, at: int,
) -> None:  # fmt: skip
    """A queue holding ``kept`` units (over several files), one of them damaged: the
    units ``units_in_place`` counts from ``start`` are exactly those before the first
    that ``put_batch`` of the same units writes or refuses."""
    directory = tempfile.mkdtemp()
    original = reput_check.units_in_place
    reput_check.units_in_place = implementation
    try:
        config = ConsumeQueueConfig(units_per_file=8, max_open_files=16,
                                    time_index_interval_units=3)  # fmt: skip
        with ConsumeQueueStore.open(directory, config) as store:
            _check_against_put_batch(store.queue("t", 0), kept, extra, start, damage, at)
    finally:
        reput_check.units_in_place = original
        shutil.rmtree(directory)


def _check_against_put_batch(queue: Any, kept: int, extra: int, start: int, damage: str | None,
                             at: int) -> None:  # fmt: skip
    units = [(1_000 + 10 * n, 50 + n % 7, n % 3) for n in range(kept + extra)]
    times = [5_000 + n for n in range(kept + extra)]
    whole = _columns(units, times, 0)
    queue.put_batch(0, whole.physical[:kept], whole.sizes[:kept], whole.tags[:kept],
                    whole.timestamps[:kept])  # fmt: skip
    start = min(start, kept + extra - 1)
    at = min(at, kept - 1)
    if damage == "hole":
        queue.truncate(at)
        queue.put_batch(at, whole.physical[at:kept], whole.sizes[at:kept], whole.tags[at:kept],
                        whole.timestamps[at:kept])  # fmt: skip
        files = queue._files  # a unit lost in the crash, the ones after it kept
        upf = queue._upf
        files.units(at // upf).sizes[at % upf] = 0
    elif damage == "time":
        upf = queue._upf
        queue._files.times(at // upf).times[at % upf] -= 1
    elif damage == "unit":
        units[at] = (units[at][0], units[at][1], units[at][2] + 1)  # the log says otherwise
    run = _columns(units, times, 0)
    found = queue.units_in_place(start, run, start, kept + extra - start)
    expect = 0
    if start < kept:
        expect = kept - start
        if damage is not None and at >= start:
            expect = at - start
    assert found == expect
    if found:  # put_batch of the units found in place writes nothing
        files = range(queue._file_lo, queue._file_hi)
        before = [bytes(queue._files.units(i).units) for i in files]
        stop = start + found
        queue.put_batch(start, run.physical[start:stop], run.sizes[start:stop],
                        run.tags[start:stop], run.timestamps[start:stop])  # fmt: skip
        assert [bytes(queue._files.units(i).units) for i in files] == before
