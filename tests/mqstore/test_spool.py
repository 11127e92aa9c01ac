"""Spool files: round trips, the crash policy of the writer, and corruption."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import LimitExceededError
from mqstore.spool import (
    BLOCK_ROWS_MAX,
    FILE_HEADER,
    SPOOL_SUFFIX,
    TMP_MARK,
    CorruptSpoolError,
    SpoolWriter,
    read_spool,
)

MAX_BYTES = 1 << 30


def _rows(block):
    values = [None if v is None else bytes(v) for v in block.values]
    keys = None if block.keys is None else [None if k is None else bytes(k) for k in block.keys]
    return values, keys, block.timestamps_ms, block.headers


def _write(path, blocks):
    with SpoolWriter(str(path), max_bytes=MAX_BYTES) as writer:
        for topic, partition, values, extra in blocks:
            writer.add_block(topic, partition, values, **extra)
        writer.commit()


def test_round_trip_of_every_column_kind(tmp_path):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    _write(
        path,
        [
            ("t", 0, [b"v0", None, b""], {}),
            ("t", 3, [b"x"], {"timestamps_ms": [1_700_000_000_000]}),
            (
                "other",
                1,
                [b"a", b"b"],
                {
                    "keys": [b"k", None],
                    "timestamps_ms": [None, 5],
                    "headers": [[("h", b"1"), ("n", None)], []],
                },
            ),
        ],
    )
    assert sorted(os.listdir(tmp_path)) == [f"a{SPOOL_SUFFIX}"]  # no temporary file left
    with read_spool(str(path)) as spool:
        assert spool.rows == 6
        assert spool.destinations() == {("t", 0), ("t", 3), ("other", 1)}
        blocks = list(spool.blocks())
        assert [(b.topic, b.partition) for b in blocks] == [("t", 0), ("t", 3), ("other", 1)]
        assert _rows(blocks[0]) == ([b"v0", None, b""], None, None, None)
        assert _rows(blocks[1]) == ([b"x"], None, [1_700_000_000_000], None)
        assert _rows(blocks[2]) == (
            [b"a", b"b"],
            [b"k", None],
            [None, 5],
            [[("h", b"1"), ("n", None)], []],
        )
        assert [b.topic for b in spool.blocks(2)] == ["other"]  # resume from a block


row = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=10),
    st.none() | st.integers(0, 2**62),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(row, min_size=1, max_size=20), min_size=1, max_size=4))
def test_round_trip_property(tmp_path_factory, blocks):
    path = tmp_path_factory.mktemp("spool") / f"p{SPOOL_SUFFIX}"
    with SpoolWriter(str(path), max_bytes=MAX_BYTES) as writer:
        for i, rows in enumerate(blocks):
            writer.add_block(
                "t",
                i,
                [r[0] for r in rows],
                keys=[r[1] for r in rows],
                timestamps_ms=[r[2] for r in rows],
                headers=[r[3] for r in rows],
            )
        writer.commit()
    with read_spool(str(path)) as spool:
        for rows, block in zip(blocks, spool.blocks(), strict=True):
            values, keys, stamps, headers = _rows(block)
            assert values == [r[0] for r in rows]
            if block.keys is not None:
                assert keys == [r[1] for r in rows]
            else:
                assert all(r[1] is None for r in rows)
            assert (stamps or [None] * len(rows)) == [r[2] for r in rows]
            assert (headers or [[]] * len(rows)) == [r[3] for r in rows]


def test_a_writer_that_fails_leaves_no_spool_file(tmp_path):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    with pytest.raises(RuntimeError), SpoolWriter(str(path), max_bytes=MAX_BYTES) as writer:
        writer.add_block("t", 0, [b"v"])
        raise RuntimeError("task failed")
    assert os.listdir(tmp_path) == []


def test_uncommitted_file_keeps_its_temporary_name(tmp_path):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    writer = SpoolWriter(str(path), max_bytes=MAX_BYTES)
    writer.add_block("t", 0, [b"v"])
    (name,) = os.listdir(tmp_path)
    assert TMP_MARK in name
    assert not name.endswith(SPOOL_SUFFIX)  # never taken by the inbox
    writer.abort()
    assert os.listdir(tmp_path) == []


def test_size_limit_and_block_limit(tmp_path):
    writer = SpoolWriter(str(tmp_path / f"a{SPOOL_SUFFIX}"), max_bytes=200)
    with pytest.raises(LimitExceededError):
        writer.add_block("t", 0, [b"x" * 300])
    with pytest.raises(AssertionError):
        writer.add_block("t", 0, [b"x"] * (BLOCK_ROWS_MAX + 1))
    writer.abort()


@pytest.mark.parametrize(
    "damage",
    ["flip_payload", "truncate", "append", "magic", "block_count", "empty"],
)
def test_damaged_files_are_refused(tmp_path, damage):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    _write(path, [("t", 0, [b"value-%d" % i for i in range(10)], {"keys": [b"k"] * 10})])
    raw = bytearray(path.read_bytes())
    if damage == "flip_payload":
        raw[FILE_HEADER.size + 30] ^= 0x10
    elif damage == "truncate":
        del raw[-3:]
    elif damage == "append":
        raw += b"\0"
    elif damage == "magic":
        raw[0] ^= 0xFF
    elif damage == "block_count":
        raw[8] = 2
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptSpoolError) as caught:
        read_spool(str(path))
    assert caught.value.path == str(path)


def test_structure_is_checked_even_when_the_checksum_matches(tmp_path):
    """A writer bug (lengths that overrun the block) is caught, not trusted."""
    import xxhash

    path = tmp_path / f"a{SPOOL_SUFFIX}"
    _write(path, [("t", 0, [b"abc", b"de"], {})])
    raw = bytearray(path.read_bytes())
    at = FILE_HEADER.size + 24 + 1  # first value length, after the block header and topic
    raw[at : at + 4] = (4).to_bytes(4, "little")
    payload = bytes(raw[FILE_HEADER.size :])
    raw[24:32] = xxhash.xxh3_64_intdigest(payload).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptSpoolError, match="block holds"):
        read_spool(str(path))


def _column(values, gap):
    """``values`` as an Arrow-style binary column: offsets into one buffer that starts
    with ``gap`` unused bytes, and a null spanning ``gap`` bytes of garbage (Arrow
    allows it; the file must not keep them)."""
    data, offsets, nulls = bytearray(b"?" * gap), [gap], []
    for value in values:
        data += b"#" * gap if value is None else value
        offsets.append(len(data))
        nulls.append(value is None)
    return np.array(offsets, dtype=np.int64), bytes(data), np.array(nulls, dtype=np.uint8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.none() | st.binary(max_size=30), st.none() | st.integers(0, 2**62)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 7),
)
def test_a_column_block_is_the_block_add_block_writes(tmp_path_factory, rows, gap):
    directory = tmp_path_factory.mktemp("spool")
    values = [r[0] for r in rows]
    stamps = [r[1] for r in rows]
    by_rows = directory / f"rows{SPOOL_SUFFIX}"
    _write(by_rows, [("t", 2, values, {"timestamps_ms": stamps})])
    by_column = directory / f"column{SPOOL_SUFFIX}"
    offsets, data, nulls = _column(values, gap)
    with SpoolWriter(str(by_column), max_bytes=MAX_BYTES) as writer:
        writer.add_column_block(
            "t",
            2,
            offsets,
            data,
            nulls=nulls,
            timestamps_ms=np.array([-1 if t is None else t for t in stamps], dtype=np.int64),
        )
        writer.commit()
    assert by_column.read_bytes() == by_rows.read_bytes()


def test_a_block_decodes_to_the_columns_put_batch_buffers_takes(tmp_path):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    _write(path, [("t", 0, [b"ab", None, b"", b"cde"], {"timestamps_ms": [None, 7, None, 9]})])
    with read_spool(str(path)) as spool:
        (block,) = spool.blocks()
    assert block.rows == 4
    starts, ends = block.value_offsets[:-1], block.value_offsets[1:]
    spans = [block.data[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    assert spans == [b"ab", b"", b"", b"cde"]
    assert block.value_nulls is not None
    assert block.value_nulls.tolist() == [0, 1, 0, 0]
    assert block.stamps_ms is not None
    assert block.stamps_ms.tolist() == [-1, 7, -1, 9]
    assert _rows(block) == ([b"ab", None, b"", b"cde"], None, [None, 7, None, 9], None)
    _write(path, [("t", 0, [b"x", b"y"], {})])
    with read_spool(str(path)) as spool:
        (block,) = spool.blocks()
    assert (block.value_nulls, block.stamps_ms) == (None, None)  # nothing to carry


def test_a_spool_knows_when_a_retry_was_renamed_over_its_name(tmp_path):
    path = tmp_path / f"a{SPOOL_SUFFIX}"
    _write(path, [("t", 0, [b"first"], {})])
    with read_spool(str(path)) as spool:
        assert spool.is_at(str(path))
        _write(path, [("t", 0, [b"retry"], {})])  # another attempt: rename over the name
        assert not spool.is_at(str(path))
        assert [bytes(v) for v in next(spool.blocks()).values] == [b"first"]  # still ours
    os.unlink(path)
    assert not spool.is_at(str(path))
