"""Block geometry and the running-maximum time index."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from mqstore.consumequeue.time_index import BlockGeometry, TimeIndex


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
