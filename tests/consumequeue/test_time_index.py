"""Block geometry, the running-maximum time index, and its search (C and twin)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue.time_index import (
    REMEMBERED_FILES_MAX,
    BlockGeometry,
    TimeIndex,
    first_reaching_py,
    time_search_py,
)


def test_block_geometry_with_a_short_last_block() -> None:
    geometry = BlockGeometry(8, 3)  # blocks per file: [0,3) [3,6) [6,8)
    assert geometry.blocks_per_file == 3
    assert [geometry.block_of(offset) for offset in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert geometry.block_bounds(2) == (6, 8)
    assert geometry.block_bounds(3) == (8, 11)
    assert geometry.block_bounds(5) == (14, 16)


@given(st.integers(1, 50), st.integers(1, 60), st.integers(0, 10_000))
def test_every_offset_lies_in_its_block(units_per_file: int, interval: int, offset: int) -> None:
    geometry = BlockGeometry(units_per_file, interval)
    start, end = geometry.block_bounds(geometry.block_of(offset))
    assert start <= offset < end
    assert start // units_per_file == (end - 1) // units_per_file  # never crosses a file


@given(
    maxima=st.lists(st.integers(0, 100), min_size=1, max_size=200),
    cut=st.integers(0, 200),
    targets=st.lists(st.integers(-1, 101), min_size=1, max_size=5),
)
def test_first_block_reaching_matches_brute_force(
    maxima: list[int], cut: int, targets: list[int]
) -> None:
    index = TimeIndex(block_start=5)
    cut = min(cut, len(maxima))
    index.replace_from(5, np.array(maxima[:cut] + [0] * 3, dtype=np.int64), 1)
    index.replace_from(5 + cut, np.array(maxima[cut:], dtype=np.int64), 2)  # redo a suffix
    assert index.end_block == 5 + len(maxima)
    assert index.covered_max_offset == 2
    for target in targets:
        expected = next((5 + i for i, value in enumerate(maxima) if value >= target), None)
        assert index.first_block_reaching(target) == expected


IMPLEMENTATIONS = [
    pytest.param((time_search_py, first_reaching_py), id="python"),
    pytest.param(
        (getattr(NATIVE, "time_search", None), getattr(NATIVE, "first_reaching", None)),
        id="c",
        marks=pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built"),
    ),
]


@pytest.mark.parametrize("functions", IMPLEMENTATIONS)
@given(
    head=st.lists(st.integers(0, 30), max_size=20),
    blocks=st.lists(st.integers(0, 30), max_size=20),
    spare=st.integers(0, 3),
    target=st.integers(-1, 31),
)
def test_time_search_finds_the_first_running_maximum_reaching_t(
    functions: tuple[Any, Any], head: list[int], blocks: list[int], spare: int, target: int
) -> None:
    """Head units first, then blocks; counts below the arrays' lengths are honoured."""
    time_search = functions[0]
    head_max = np.maximum.accumulate(np.array(head + [99] * spare, dtype=np.int64))
    block_max = np.maximum.accumulate(np.array(blocks + [99] * spare, dtype=np.int64))
    items = list(head_max[: len(head)]) + list(block_max[: len(blocks)])
    reaching = [index for index, value in enumerate(items) if value >= target]
    expected = reaching[0] if reaching else -1
    assert time_search(head_max, len(head), block_max, len(blocks), target) == expected


@pytest.mark.parametrize("functions", IMPLEMENTATIONS)
@given(
    times=st.lists(st.integers(0, 30), max_size=20),
    bounds=st.tuples(st.integers(0, 20), st.integers(0, 20)),
    target=st.integers(-1, 31),
)
def test_first_reaching_scans_its_window(
    functions: tuple[Any, Any], times: list[int], bounds: tuple[int, int], target: int
) -> None:
    first_reaching = functions[1]
    start, end = min(bounds), min(max(bounds), len(times))
    start = min(start, end)
    array = np.array(times, dtype=np.int64)
    array.flags.writeable = False  # as a read-only mapping's view
    expected = next((i for i in range(start, end) if times[i] >= target), -1)
    assert first_reaching(array, start, end, target) == expected


@pytest.mark.parametrize("functions", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "call",
    [
        lambda f: f[0](np.zeros(2, np.int64), 3, np.zeros(2, np.int64), 0, 0),  # head count
        lambda f: f[0](np.zeros(2, np.int64), -1, np.zeros(2, np.int64), 0, 0),
        lambda f: f[0](np.zeros(2, np.int64), 0, np.zeros(2, np.int64), 3, 0),  # block count
        lambda f: f[1](np.zeros(2, np.int64), 1, 0, 0),  # start > end
        lambda f: f[1](np.zeros(2, np.int64), 0, 3, 0),  # end past the array
        lambda f: f[1](np.zeros(2, np.int64), -1, 1, 0),
    ],
)
def test_bad_arguments_are_value_errors(functions: tuple[Any, Any], call: Any) -> None:
    with pytest.raises(ValueError):
        call(functions)


class _Mapped:
    """Stands for a mapped file: remember_files only takes weak references."""

    __slots__ = ("__weakref__",)


def test_remembered_files_are_weak_and_bounded() -> None:
    index = TimeIndex(0)
    held = [(_Mapped(), _Mapped()) for _ in range(REMEMBERED_FILES_MAX + 1)]
    for file_index, (times, units) in enumerate(held):
        index.remember_files(file_index, times, units)  # type: ignore[arg-type]
    del times, units  # the loop's names would keep the last pair alive
    assert index.files(0) is None  # the oldest half went when the bound was reached
    assert index.files(REMEMBERED_FILES_MAX // 2) == held[REMEMBERED_FILES_MAX // 2]
    assert index.files(REMEMBERED_FILES_MAX) == held[REMEMBERED_FILES_MAX]
    held[REMEMBERED_FILES_MAX] = (_Mapped(), held[REMEMBERED_FILES_MAX][1])
    assert index.files(REMEMBERED_FILES_MAX) is None  # its time file is gone
    assert index.files(10**6) is None
