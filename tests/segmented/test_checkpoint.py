"""Offset checkpoint files in Kafka's text format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented.checkpoint import read_offsets, write_offsets

from .strategies import topics_and_partitions


@settings(deadline=None)
@given(offsets=st.dictionaries(topics_and_partitions, st.integers(0, 2**63 - 1), max_size=20))
def test_round_trip(tmp_path_factory, offsets):
    path = str(tmp_path_factory.mktemp("c") / "recovery-point-offset-checkpoint")
    write_offsets(path, offsets)
    assert read_offsets(path) == offsets


def test_kafka_layout_and_no_leftover_tmp(tmp_path):
    path = tmp_path / "checkpoint"
    write_offsets(str(path), {("b", 1): 7, ("a", 0): 12})
    assert path.read_text() == "0\n2\na 0 12\nb 1 7\n"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_missing_file_reads_as_empty(tmp_path):
    assert read_offsets(str(tmp_path / "nope")) == {}


@pytest.mark.parametrize(
    "content",
    [
        b"1\n0\n",  # unknown version
        b"0\n2\na 0 1\n",  # count does not match
        b"0\n1\na 0\n",  # a field missing
        b"0\n1\na 0 -1\n",  # a negative offset
        b"0\n1\na x 1\n",
        b"0\n1\n\xff 0 1\n",  # not ASCII
        b"",
    ],
)
def test_malformed_files_are_refused(tmp_path, content):
    path = tmp_path / "checkpoint"
    path.write_bytes(content)
    with pytest.raises(CorruptDataError):
        read_offsets(str(path))
