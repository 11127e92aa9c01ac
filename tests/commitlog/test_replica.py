"""A follower's CommitLog append (commitlog/replica.py, CommitLog.append_replica): copied
bytes land byte-identical, and gaps, torn and corrupt chunks are refused whole.

Runs on the C path when built and on the pure-Python path with MQSTORE_PURE_PYTHON=1.
"""

from __future__ import annotations

import os
import time

import attrs
import pytest

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import (
    CorruptDataError,
    IllegalStateError,
    NotLeaderError,
    ReplicaPositionError,
)
from mqstore.commitlog.record import BLANK_SIZE, HEADER_SIZE
from mqstore.commitlog.replica import plan_replica_chunk

from .conftest import SMALL_FILE_BYTES


@pytest.fixture
def pair(tmp_path, small_config):
    """A leader log and an empty follower log, closed at the end."""
    leader = CommitLog.open(str(tmp_path / "leader"), small_config)
    follower = CommitLog.open(str(tmp_path / "follower"), small_config)
    follower.set_follower(True)
    yield leader, follower
    leader.close()
    follower.close()


def _fill(leader: CommitLog, count: int, size: int = 700) -> None:
    for i in range(count):
        leader.append("orders", i % 3, bytes([i % 251]) * size, keys=f"k{i}", tag="t")


def _boundaries(leader: CommitLog) -> list[int]:
    """Every record end of the leader's log, blank records' (file ends) included."""
    ends = {r.physical_offset + r.size for r in leader.iter_records(0)}
    ends.update(range(SMALL_FILE_BYTES, leader.write_position + 1, SMALL_FILE_BYTES))
    return sorted(ends)


def _copy(leader: CommitLog, follower: CommitLog, chunk_bytes: int) -> None:
    """Copy the leader's log to the follower in chunks of at most ``chunk_bytes``, cut
    at record boundaries (one record when a record is larger)."""
    boundaries = _boundaries(leader)
    position = follower.write_position
    while position < leader.write_position:
        later = [end for end in boundaries if end > position]
        fitting = [end for end in later if end - position <= chunk_bytes]
        end = fitting[-1] if fitting else later[0]
        position = follower.append_replica(position, _read_span(leader, position, end))


def _read_span(leader: CommitLog, start: int, end: int) -> bytes:
    out = bytearray()
    while start < end:
        file_end = (start // SMALL_FILE_BYTES + 1) * SMALL_FILE_BYTES
        stop = min(end, file_end)
        out += leader.file_for(start).mapping[
            start % SMALL_FILE_BYTES : stop - (start // SMALL_FILE_BYTES) * SMALL_FILE_BYTES
        ]
        start = stop
    return bytes(out)


def _files(log: CommitLog) -> list[tuple[str, bytes]]:
    return [(os.path.basename(f.path), bytes(f.mapping)) for f in log.files()]


@pytest.mark.parametrize("chunk_bytes", [1, 5_000, 3 * SMALL_FILE_BYTES])
def test_copied_bytes_make_the_follower_byte_identical(pair, chunk_bytes):
    leader, follower = pair
    _fill(leader, 300)  # 300 x ~770 bytes: about 4 files of 64 KiB, with blank records
    assert leader.file_count >= 3
    _copy(leader, follower, chunk_bytes)
    assert follower.write_position == leader.write_position
    assert _files(follower) == _files(leader)  # names, sizes and every byte
    assert follower.queue_offsets() == leader.queue_offsets()
    assert follower.last_store_ts_ms == leader.last_store_ts_ms
    got = [(r.topic, r.queue_id, r.queue_offset, bytes(r.body)) for r in follower.iter_records(0)]
    want = [(r.topic, r.queue_id, r.queue_offset, bytes(r.body)) for r in leader.iter_records(0)]
    assert got == want


def test_a_chunk_spanning_files_rolls_where_the_leader_rolled(pair):
    leader, follower = pair
    _fill(leader, 200)
    end = leader.write_position
    follower.append_replica(0, _read_span(leader, 0, end))  # one chunk, several files
    assert [os.path.getsize(f.path) for f in follower.files()] == [
        os.path.getsize(f.path) for f in leader.files()
    ]
    assert _files(follower) == _files(leader)


def test_a_follower_survives_a_reopen_and_goes_on_copying(tmp_path, small_config):
    leader = CommitLog.open(str(tmp_path / "leader"), small_config)
    follower = CommitLog.open(str(tmp_path / "follower"), small_config)
    follower.set_follower(True)
    _fill(leader, 150)
    middle = leader.write_position
    follower.append_replica(0, _read_span(leader, 0, middle))
    follower.close()
    follower = CommitLog.open(str(tmp_path / "follower"), small_config)  # recovery scan
    follower.set_follower(True)
    assert follower.write_position == middle
    _fill(leader, 150)
    follower.append_replica(middle, _read_span(leader, middle, leader.write_position))
    assert _files(follower) == _files(leader)
    assert follower.queue_offsets() == leader.queue_offsets()
    leader.close()
    follower.close()


def _snapshot(log: CommitLog) -> tuple[int, list[tuple[str, bytes]], dict]:
    return log.write_position, _files(log), log.queue_offsets()


@pytest.mark.parametrize("position_shift", [-1, 1, 10_000])
def test_a_non_contiguous_chunk_is_refused_and_nothing_is_written(pair, position_shift):
    leader, follower = pair
    _fill(leader, 20)
    first = leader.iter_records(0).__next__().size
    follower.append_replica(0, _read_span(leader, 0, first))
    before = _snapshot(follower)
    with pytest.raises(ReplicaPositionError) as caught:
        follower.append_replica(first + position_shift, _read_span(leader, first, 2 * first))
    assert caught.value.write_position == first
    assert _snapshot(follower) == before


def test_a_chunk_that_overlaps_the_end_is_refused(pair):
    leader, follower = pair
    _fill(leader, 20)
    end = leader.write_position
    follower.append_replica(0, _read_span(leader, 0, end))
    before = _snapshot(follower)
    with pytest.raises(ReplicaPositionError):
        follower.append_replica(0, _read_span(leader, 0, end))  # sent twice
    assert _snapshot(follower) == before


@pytest.mark.parametrize("cut", [1, BLANK_SIZE - 1, BLANK_SIZE, HEADER_SIZE + 3, -1])
def test_a_torn_chunk_is_refused_and_nothing_is_written(pair, cut):
    leader, follower = pair
    _fill(leader, 10)
    sizes = [r.size for r in leader.iter_records(0)]
    two = sizes[0] + sizes[1]
    data = _read_span(leader, 0, two + sizes[2])
    torn = data[: two + cut] if cut > 0 else data[:cut]  # whole records, then part of one
    before = _snapshot(follower)
    with pytest.raises(CorruptDataError) as caught:
        follower.append_replica(0, torn)
    assert caught.value.position == two
    assert _snapshot(follower) == before
    assert follower.append_replica(0, data) == len(data)  # the whole chunk still goes in


@pytest.mark.parametrize("where", ["header", "topic", "body", "checksum"])
def test_a_flipped_bit_is_refused_and_nothing_is_written(pair, where):
    leader, follower = pair
    _fill(leader, 10)
    sizes = [r.size for r in leader.iter_records(0)]
    data = bytearray(_read_span(leader, 0, sum(sizes[:4])))
    second = sizes[0]
    offset = {"header": 20, "checksum": 9, "topic": HEADER_SIZE + 1, "body": sizes[1] - 5}[where]
    data[second + offset] ^= 0x10
    before = _snapshot(follower)
    with pytest.raises(CorruptDataError) as caught:
        follower.append_replica(0, bytes(data))
    assert caught.value.position == second
    assert _snapshot(follower) == before


def test_a_blank_record_that_does_not_end_its_file_is_refused(pair):
    leader, follower = pair
    _fill(leader, 200)
    blank_at = next(
        r.physical_offset + r.size
        for r, n in zip(leader.iter_records(0), list(leader.iter_records(0))[1:], strict=False)
        if n.physical_offset != r.physical_offset + r.size
    )
    data = _read_span(leader, 0, SMALL_FILE_BYTES)
    with pytest.raises(CorruptDataError) as caught:  # the blank claims past the chunk
        follower.append_replica(0, data[: blank_at + BLANK_SIZE])
    assert caught.value.position == blank_at
    assert follower.write_position == 0
    assert follower.append_replica(0, data) == SMALL_FILE_BYTES


def test_zeros_are_refused(pair):
    _, follower = pair
    with pytest.raises(CorruptDataError):
        follower.append_replica(0, bytes(4096))
    assert follower.write_position == 0


def test_a_local_append_on_a_follower_is_refused(pair):
    _, follower = pair
    with pytest.raises(NotLeaderError):
        follower.append("orders", 0, b"x")
    with pytest.raises(NotLeaderError):
        follower.append("orders", 0, b"x", keys="k")
    with pytest.raises(NotLeaderError):
        follower.append_batch("orders", 0, [b"x", b"y"])
    assert follower.write_position == 0


def test_a_leader_takes_no_replicated_bytes(pair):
    leader, _ = pair
    with pytest.raises(IllegalStateError):
        leader.append_replica(0, b"")
    leader.append("orders", 0, b"x")  # and still appends locally


def test_plan_folds_queue_offsets_and_timestamps(tmp_path, small_config):
    leader = CommitLog.open(str(tmp_path / "leader"), small_config)
    _fill(leader, 9, size=10)
    plan = plan_replica_chunk(_read_span(leader, 0, leader.write_position), 0, SMALL_FILE_BYTES)
    assert plan.queue_offsets == {("orders", 0): 3, ("orders", 1): 3, ("orders", 2): 3}
    assert plan.newest_store_ts_ms == leader.last_store_ts_ms
    assert plan.pieces == [(0, 0, leader.write_position)]
    leader.close()


def _wait_for_spare(log: CommitLog) -> str:
    """The path of the file after the last one, once the allocation service parked it."""
    last = log.files()[-1]
    path = os.path.join(os.path.dirname(last.path), f"{last.start_offset + SMALL_FILE_BYTES:020d}")
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the allocation service parked no spare"
        time.sleep(0.01)
    return path


def test_a_cut_removes_the_spare_parked_past_it_and_the_log_reopens(tmp_path, small_config):
    config = attrs.evolve(small_config, prepare_next_percent=0)  # the spare at once
    leader = CommitLog.open(str(tmp_path / "leader"), config)
    follower = CommitLog.open(str(tmp_path / "follower"), config)
    follower.set_follower(True)
    _fill(leader, 300)
    _copy(leader, follower, 3 * SMALL_FILE_BYTES)
    assert follower.file_count >= 4
    spare = _wait_for_spare(follower)
    cut = next(end for end in _boundaries(leader) if end > 1000)  # in the first file
    follower.truncate_replica(cut, 0)
    assert not os.path.exists(spare)  # else it follows a gap: the next load refuses
    names = sorted(os.listdir(tmp_path / "follower"))
    assert names[0] == f"{0:020d}"
    assert len(names) <= 2  # the first file, and the spare after it asked for again
    follower.close()
    follower = CommitLog.open(str(tmp_path / "follower"), config)
    follower.set_follower(True)
    assert follower.write_position == cut
    follower.append_replica(cut, _read_span(leader, cut, leader.write_position))
    assert _files(follower)[: leader.file_count] == _files(leader)
    leader.close()
    follower.close()


def test_a_restart_removes_the_spare_parked_below_it(tmp_path, small_config):
    config = attrs.evolve(small_config, prepare_next_percent=0)
    follower = CommitLog.open(str(tmp_path / "follower"), config)
    follower.set_follower(True)
    leader = CommitLog.open(str(tmp_path / "leader"), config)
    _fill(leader, 100)
    _copy(leader, follower, SMALL_FILE_BYTES)
    spare = _wait_for_spare(follower)
    restart_at = 8 * SMALL_FILE_BYTES
    follower.restart_replica_at(restart_at)
    assert not os.path.exists(spare)  # else it lies below the new first file, past a gap
    follower.close()
    follower = CommitLog.open(str(tmp_path / "follower"), config)
    assert follower.write_position == restart_at
    leader.close()
    follower.close()
