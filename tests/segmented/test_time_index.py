"""TimeIndex: only growing timestamps are kept, look-ups, the slot kept for the roll."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.segmented.index_file import IndexSanityError
from mqstore.segmented.time_index import NO_TIMESTAMP, TimeIndex

BASE = 500


@settings(max_examples=60, deadline=None)
@given(
    appends=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 3)), max_size=300),
    targets=st.lists(st.integers(-5, 1100), max_size=30),
)
def test_keeps_only_growing_timestamps_and_looks_up_like_a_model(
    tmp_path_factory, appends, targets
):
    path = str(tmp_path_factory.mktemp("t") / "x.timeindex")
    index = TimeIndex.create(path, BASE, 12 * 400)
    kept: list[tuple[int, int]] = []
    offset = BASE
    for timestamp, offset_gap in appends:
        offset += offset_gap
        index.maybe_append(timestamp, offset)
        if not kept or timestamp > kept[-1][0]:
            kept.append((timestamp, offset))
    assert index.entries == len(kept)
    for target in targets:
        below = [entry for entry in kept if entry[0] <= target]
        assert index.lookup(target) == (below[-1] if below else (NO_TIMESTAMP, BASE))
    assert index.last_entry() == (kept[-1] if kept else (NO_TIMESTAMP, BASE))
    index.trim()
    assert os.path.getsize(path) == 12 * len(kept)
    index.close()


def test_is_full_keeps_one_slot_for_the_final_entry(tmp_path):
    index = TimeIndex.create(str(tmp_path / "x.timeindex"), 0, 12 * 3)
    index.maybe_append(10, 1)
    assert not index.is_full
    index.maybe_append(20, 2)
    assert index.is_full  # 2 of 3: the third is for the roll
    index.maybe_append(30, 3, skip_full_check=True)
    assert index.entries == 3 and index.last_entry() == (30, 3)
    index.close()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x00" * 13, "multiple"),
        (struct.pack(">qiqi", 50, 1, 40, 2), "not increasing"),  # time went back
        (struct.pack(">qi", 50, -3), "outside"),
        (struct.pack(">qi", 50, 10_000), "outside"),
    ],
)
def test_sanity_check_refuses_impossible_indexes(tmp_path, content, reason):
    path = tmp_path / "x.timeindex"
    path.write_bytes(content)
    with pytest.raises(IndexSanityError, match=reason):
        TimeIndex.load(str(path), 0, 4096).sanity_check(next_offset_max=100)
