"""OffsetIndex: appends, look-ups against a model, trim and reload, sanity checks."""

from __future__ import annotations

import os
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.segmented.index_file import IndexSanityError
from mqstore.segmented.offset_index import OffsetIndex

BASE = 1_000


def _model_lookup(entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    below = [entry for entry in entries if entry[0] <= target]
    return below[-1] if below else (BASE, 0)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000)), min_size=0, max_size=1500),
    targets=st.lists(st.integers(BASE - 10, BASE + 80_000), max_size=40),
)
def test_lookup_matches_a_model_before_and_after_trim(gaps, targets):
    entries, offset, position = [], BASE, 0
    for offset_gap, position_gap in gaps:
        offset, position = offset + offset_gap, position + position_gap
        entries.append((offset, position))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "x.index")
        index = OffsetIndex.create(path, BASE, 8 * 2048)
        for entry in entries:
            index.append(*entry)
        assert index.entries == len(entries)
        for target in [*targets, *(e[0] for e in entries[::97])]:
            assert index.lookup(target) == _model_lookup(entries, target)
        index.trim()  # a roll: the file holds exactly its entries, read lazily after
        assert os.path.getsize(path) == 8 * len(entries)
        reloaded = OffsetIndex.load(path, BASE, 8 * 2048)
        for target in targets:
            assert reloaded.lookup(target) == _model_lookup(entries, target)
        assert reloaded.last_entry() == (entries[-1] if entries else (BASE, 0))
        index.close()
        reloaded.close()


def test_is_full_at_max_entries_and_file_is_preallocated(tmp_path):
    index = OffsetIndex.create(str(tmp_path / "x.index"), 0, 8 * 3 + 5)  # rounds down
    assert os.path.getsize(tmp_path / "x.index") == 24
    for i in range(1, 4):
        assert not index.is_full
        index.append(i, i * 100)
    assert index.is_full
    with pytest.raises(AssertionError):  # our invariant: callers roll before this
        index.append(4, 400)
    index.close()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x00" * 12, "multiple"),  # not a whole number of entries
        (struct.pack(">ii", -1, 100), "outside"),  # relative offset below the base
        (struct.pack(">ii", 5, 0), "out of the .log"),  # position 0 is never indexed
        (struct.pack(">ii", 5, 10_000), "out of the .log"),  # past the log's end
        (struct.pack(">iiii", 9, 300, 5, 100), "not increasing"),
        (struct.pack(">ii", 99, 100), "outside"),  # past the next segment's base
    ],
)
def test_sanity_check_refuses_impossible_indexes(tmp_path, content, reason):
    path = tmp_path / "x.index"
    path.write_bytes(content)
    with pytest.raises(IndexSanityError, match=reason):
        index = OffsetIndex.load(str(path), 0, 4096)
        index.sanity_check(next_offset_max=50, log_size_bytes=5_000)


def test_missing_index_is_a_sanity_error(tmp_path):
    with pytest.raises(IndexSanityError, match="missing"):
        OffsetIndex.load(str(tmp_path / "nope.index"), 0, 4096)
