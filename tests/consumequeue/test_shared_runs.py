"""The shared log's pass over a round's units (consumequeue/shared_runs.py): the C
``runs_append`` against its pure-Python twin, and the runs it leaves."""

from __future__ import annotations

import gc
import sys
from array import array
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


def _outcome(
    function: Any, description: dict[int, Any], units: list, first: int, new_run: Any
) -> Any:
    runs = _build(description)
    ids = np.array([queue_id for queue_id, _ in units], dtype=np.int32)
    offsets = np.array([offset for _, offset in units], dtype=np.int64)
    count, started = function(runs, new_run, ids, offsets, first, len(units))
    for run in runs.values():  # made by the pass or not: out of the cyclic GC
        assert run is None or not gc.is_tracked(run)
    return (
        count,
        {queue_id: _snapshot(run) for queue_id, run in started.items()},
        {queue_id: _snapshot(run) for queue_id, run in runs.items()},
    )


@native
@settings(max_examples=300, deadline=None)
@given(_runs, _units, st.integers(0, 10_000), st.sampled_from(["class", "of_unit"]))
def test_c_runs_append_is_its_python_twin(description, units, first, maker) -> None:
    """new_run as the SharedRun class (the C pass makes the runs itself) or as
    SharedRun.of_unit (called for each)."""
    assert NATIVE is not None
    new_run = SharedRun if maker == "class" else SharedRun.of_unit
    assert _outcome(NATIVE.runs_append, description, units, first, new_run) == _outcome(
        runs_append_py, description, units, first, SharedRun.of_unit
    )


@native
def test_the_registered_class_makes_runs_with_no_python_call() -> None:
    """With the class as new_run the C pass calls nothing in Python (not the class,
    not of_unit), and the runs it makes hold their offsets (ints too large to be
    cached, shared by both slots, with no reference lost or leaked)."""
    assert NATIVE is not None
    offset = 2**40 + 12345
    ids = np.array([3, 4, 3], dtype=np.int32)
    offsets = np.array([offset, offset + 7, offset + 1], dtype=np.int64)
    calls: list[str] = []
    runs: dict[int, Any] = {}
    sys.setprofile(lambda frame, event, arg: calls.append(event) if event == "call" else None)
    try:
        count, _ = NATIVE.runs_append(runs, SharedRun, ids, offsets, 9, 3)
    finally:
        sys.setprofile(None)
    assert calls == [] and count == 3
    run = runs[3]
    assert type(run) is SharedRun and list(run) == [9, 11] and run.end == offset + 2
    assert run.first_offset == run.min_offset == offset and not gc.is_tracked(run)
    references = sys.getrefcount(run.first_offset)  # outside an assert: pytest holds values
    assert run.first_offset is run.min_offset and references == 3  # two slots, the argument


@native
def test_runs_register_takes_only_a_plain_run_class() -> None:
    """A class whose instances the C pass could not safely make as SharedRun's is
    refused: not an array.array subclass, a subclass of a subclass, other or extra
    slots, an instance dict, an __init__ of its own, or a metaclass (an mro() of its
    own would hide array.array from its constructor, called without the class call's
    checks)."""
    assert NATIVE is not None

    class Hiding(type):
        def mro(cls) -> list[type]:
            return [cls, object]

    class Hidden(array, metaclass=Hiding):
        __slots__ = ("first_offset", "min_offset")

    class Deeper(SharedRun):
        __slots__ = ()

    class Dict(array):
        first_offset: int
        min_offset: int

    class Extra(array):
        __slots__ = ("first_offset", "min_offset", "other")

    class Named(array):
        __slots__ = ("first_offset", "lowest")

    class Initialised(array):
        __slots__ = ("first_offset", "min_offset")

        def __init__(self, *args: Any) -> None:
            pass

    for cls in (list, Deeper, Dict, Extra, Named, Initialised, Hidden, 7):
        with pytest.raises(TypeError):
            NATIVE.runs_register(cls)
    NATIVE.runs_register(SharedRun)  # as at import: the accepted class stays


@pytest.mark.parametrize("twin", ["c", "py"])
def test_a_pass_starts_extends_and_stops_at_the_first_unit_out_of_its_run(twin) -> None:
    if twin == "c" and NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    function = runs_append_py if twin == "py" else NATIVE.runs_append  # type: ignore[union-attr]
    runs: dict[int, Any] = {1: SharedRun(10, 3), 2: SharedRun(4)}  # 2: empty
    ids = np.array([1, 2, 3, 1, 3, 1, 2], dtype=np.int32)
    offsets = np.array([11, 9, 0, 12, 1, 99, 10], dtype=np.int64)
    count, started = function(runs, SharedRun, ids, offsets, 500, 7)
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
