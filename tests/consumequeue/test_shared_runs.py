"""The shared log's pass over a round's units (consumequeue/shared_runs.py): the C
``runs_append`` against its pure-Python twin, and the runs it leaves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue.shared_runs import SharedRun, runs_append_py

native = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")

# A queue's run before the pass: none, None, empty, or (first_offset, length).
_runs = st.dictionaries(
    st.integers(0, 5),
    st.none() | st.just("empty") | st.tuples(st.integers(0, 50), st.integers(1, 4)),
    max_size=6,
)
_units = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 60)), max_size=30)


def _build(description: dict[int, Any]) -> dict[int, Any]:
    runs: dict[int, Any] = {}
    for queue_id, shape in description.items():
        if shape is None:
            runs[queue_id] = None
        elif shape == "empty":
            runs[queue_id] = SharedRun(7)
        else:
            first_offset, length = shape
            run = SharedRun(first_offset)
            run.extend(range(100 + queue_id * 10, 100 + queue_id * 10 + length))
            runs[queue_id] = run
    return runs


def _snapshot(value: Any) -> Any:
    if value is None:
        return None
    assert type(value) is SharedRun
    return (value.first_offset, value.min_offset, list(value))


def _outcome(function: Any, description: dict[int, Any], units: list, first: int) -> Any:
    runs = _build(description)
    ids = np.array([queue_id for queue_id, _ in units], dtype=np.int32)
    offsets = np.array([offset for _, offset in units], dtype=np.int64)
    count, started = function(runs, SharedRun.of_unit, ids, offsets, first, len(units))
    return (
        count,
        {queue_id: _snapshot(run) for queue_id, run in started.items()},
        {queue_id: _snapshot(run) for queue_id, run in runs.items()},
    )


@native
@settings(max_examples=300, deadline=None)
@given(_runs, _units, st.integers(0, 10_000))
def test_c_runs_append_is_its_python_twin(description, units, first) -> None:
    assert NATIVE is not None
    assert _outcome(NATIVE.runs_append, description, units, first) == _outcome(
        runs_append_py, description, units, first
    )


@pytest.mark.parametrize("twin", ["c", "py"])
def test_a_pass_starts_extends_and_stops_at_the_first_unit_out_of_its_run(twin) -> None:
    if twin == "c" and NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    function = runs_append_py if twin == "py" else NATIVE.runs_append  # type: ignore[union-attr]
    runs: dict[int, Any] = {1: SharedRun(10, 3), 2: SharedRun(4)}  # 2: empty
    ids = np.array([1, 2, 3, 1, 3, 1, 2], dtype=np.int32)
    offsets = np.array([11, 9, 0, 12, 1, 99, 10], dtype=np.int64)
    count, started = function(runs, SharedRun.of_unit, ids, offsets, 500, 7)
    assert count == 5  # queue 1 at 99 is not the next of its run: the pass stops there
    assert list(runs[1]) == [3, 500, 503] and runs[1].first_offset == 10
    assert list(runs[2]) == [501] and runs[2].first_offset == 9  # restarted at 9
    assert list(runs[3]) == [502, 504] and runs[3].first_offset == 0
    assert set(started) == {2, 3} and started[3] is None and len(started[2]) == 0


@pytest.mark.parametrize("twin", ["c", "py"])
def test_bad_arguments_are_refused_before_anything_changes(twin) -> None:
    if twin == "c" and NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    function = runs_append_py if twin == "py" else NATIVE.runs_append  # type: ignore[union-attr]
    runs: dict[int, Any] = {}
    ids32, offsets64 = np.zeros(2, np.int32), np.zeros(2, np.int64)
    for args, error in [
        ((runs, SharedRun.of_unit, ids32, offsets64, 0, 3), ValueError),  # past the arrays
        ((runs, SharedRun.of_unit, ids32, offsets64, -1, 2), ValueError),
        ((runs, SharedRun.of_unit, ids32, offsets64, 2**63 - 1, 2), ValueError),
        ((runs, SharedRun.of_unit, offsets64, offsets64, 0, 2), TypeError),  # ids not int32
        ((runs, SharedRun.of_unit, ids32, ids32, 0, 2), TypeError),
        (([], SharedRun.of_unit, ids32, offsets64, 0, 2), TypeError),
        ((runs, None, ids32, offsets64, 0, 2), TypeError),
    ]:
        with pytest.raises(error):
            function(*args)
        assert runs == {}
