"""File names: 20-digit base offsets, partition directories."""

from __future__ import annotations

from mqstore.segmented.files import LOG_SUFFIX, parse_base_offset, partition_directory, segment_path


def test_segment_names_sort_numerically_and_parse_back():
    names = [segment_path("d", offset, LOG_SUFFIX) for offset in (0, 9, 10, 2**63 - 1)]
    assert names == sorted(names)
    assert names[1] == "d/00000000000000000009.log"
    assert [parse_base_offset(n[2:], LOG_SUFFIX) for n in names] == [0, 9, 10, 2**63 - 1]


def test_other_names_do_not_parse():
    for name in ("0.log", "0000000000000000000x.log", "00000000000000000000.index", "a.log"):
        assert parse_base_offset(name, LOG_SUFFIX) is None


def test_partition_directories_cannot_collide():
    assert partition_directory("r", "a", 10) != partition_directory("r", "a-1", 0)
    assert partition_directory("r", "a-1", 0) == "r/a-1-0"
