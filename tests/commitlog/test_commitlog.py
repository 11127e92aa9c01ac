from __future__ import annotations

import itertools
import os
import threading
import time

import numpy as np
import pytest

from mqstore.commitlog.allocator import AllocationService
from mqstore.commitlog.commitlog import BATCH_MESSAGES_MAX, CommitLog
from mqstore.commitlog.config import CommitLogConfig
from mqstore.commitlog.errors import (
    DiskFullError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    OffsetOutOfRangeError,
    StoreClosedError,
)
from mqstore.commitlog.mapped_file import MappedFile
from mqstore.commitlog.record import BLANK_MAGIC, PREFIX

FILE = 64 * 1024


def _file_names(tmp_path):
    return sorted(name for name in os.listdir(tmp_path / "commitlog") if name.isdigit())


def test_append_returns_offsets_and_reads_back(open_log):
    log = open_log()
    first = log.append("orders", 0, b"hello", keys=["k1", "k2"], tag="TagA", properties={"p": "v"})
    second = log.append("orders", 0, b"world", born_ts_ms=1234)
    other = log.append("orders", 1, b"!")
    assert (first.physical_offset, first.queue_offset) == (0, 0)
    assert second.physical_offset == first.size
    assert second.queue_offset == 1
    assert other.queue_offset == 0
    assert second.store_timestamp_ms >= first.store_timestamp_ms
    record = log.record_at(first.physical_offset)
    assert bytes(record.body) == b"hello"
    assert record.keys == ("k1", "k2")
    assert record.tag == "TagA"
    assert record.properties == (("p", b"v"),)
    assert log.record_at(second.physical_offset).born_ts_ms == 1234
    view = log.read(first.physical_offset, first.size)
    assert isinstance(view, memoryview)
    assert view.obj is log.files()[0].mapping  # zero-copy: a view on the mapping itself
    assert bytes(view[-5:]) == b"hello"


def test_rolls_with_blank_records_and_reads_across_files(open_log, tmp_path):
    log = open_log()
    body = b"b" * 1000
    results = [log.append("t", 0, body) for _ in range(300)]  # ~320 KB over 64 KiB files
    assert log.file_count >= 5
    for result in results:  # no record spans a file
        start_file = result.physical_offset // FILE
        assert (result.physical_offset + result.size - 1) // FILE == start_file
    # Each full file ends with a blank record right after its last message.
    by_file: dict[int, int] = {}
    for result in results:
        by_file[result.physical_offset // FILE] = result.physical_offset + result.size
    for file_index in sorted(by_file)[:-1]:
        end = by_file[file_index]
        mapped = log.files()[file_index]
        total, magic, _ = PREFIX.unpack_from(mapped.mapping, end - mapped.start_offset)
        assert magic == BLANK_MAGIC
        assert end + total == mapped.start_offset + FILE
    records = list(log.iter_records(0))
    assert [r.queue_offset for r in records] == list(range(300))
    assert all(bytes(r.body) == body for r in records)
    assert _file_names(tmp_path)[0] == "0" * 20


def test_batch_append_dense_offsets_across_files(open_log):
    log = open_log()
    log.append("t", 5, b"first")
    result = log.append_batch(
        "t",
        5,
        [bytes([i % 256]) * 700 for i in range(400)],
        keys=[[f"k{i}"] for i in range(400)],
        tags="T",
    )
    assert result.first_queue_offset == 1
    assert len(result) == 400
    records = [log.record_at(int(p)) for p in result.physical_offsets]
    assert [r.queue_offset for r in records] == list(range(1, 401))
    assert records[17].keys == ("k17",)
    assert records[17].tag == "T"
    assert bytes(records[399].body) == bytes([399 % 256]) * 700
    assert log.append("t", 5, b"next").queue_offset == 401


def test_eight_producer_threads_no_overlap_dense_offsets(open_log):
    log = open_log()
    per_thread = 400
    results: dict[int, list] = {}

    def produce(thread_index: int) -> None:
        mine = []
        for i in range(per_thread):
            body = f"{thread_index}:{i}".encode()
            mine.append((body, log.append("shared", 0, body)))
        results[thread_index] = mine

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [item for mine in results.values() for item in mine]
    assert sorted(r.queue_offset for _, r in everything) == list(range(8 * per_thread))
    spans = sorted((r.physical_offset, r.physical_offset + r.size) for _, r in everything)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end  # no overlap
    for body, result in everything:
        record = log.record_at(result.physical_offset)
        assert bytes(record.body) == body
        assert record.queue_offset == result.queue_offset
    # Each thread saw its own offsets increase: appends are ordered.
    for mine in results.values():
        offsets = [r.queue_offset for _, r in mine]
        assert offsets == sorted(offsets)
    stamps = [r.store_ts_ms for r in log.iter_records(0)]
    assert stamps == sorted(stamps)  # the store timestamp never decreases in file order


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda log: log.append("t", 0, b"x" * (FILE)), LimitExceededError),
        (lambda log: log.append("", 0, b"x"), InvalidArgumentError),
        (lambda log: log.append("a/b", 0, b"x"), InvalidArgumentError),
        (lambda log: log.append("..", 0, b"x"), InvalidArgumentError),
        (lambda log: log.append("a\x00b", 0, b"x"), InvalidArgumentError),
        (lambda log: log.append("x" * 128, 0, b"x"), InvalidArgumentError),
        (lambda log: log.append("t", 0, "text"), InvalidTypeError),
        (lambda log: log.append("t", 0, 12), InvalidTypeError),
        (lambda log: log.append("t", -1, b"x"), InvalidArgumentError),
        (lambda log: log.append("t", 2**31, b"x"), InvalidArgumentError),
        (lambda log: log.append("t", "0", b"x"), InvalidTypeError),
        (lambda log: log.append("t", True, b"x"), InvalidTypeError),
        (lambda log: log.append("t", 0, b"x", born_ts_ms=-5), InvalidArgumentError),
        (lambda log: log.append("t", 0, b"x", keys=[""]), InvalidArgumentError),
        (lambda log: log.append_batch("t", 0, [b"ok", "bad"]), InvalidTypeError),
        (lambda log: log.append_batch("t", 0, [b"ok", b"x" * FILE]), LimitExceededError),
        (lambda log: log.append_batch("t", 0, [b"a"], keys=[["k"], ["j"]]), InvalidArgumentError),
        (
            lambda log: log.append_batch("t", 0, [b""] * (BATCH_MESSAGES_MAX + 1)),
            LimitExceededError,
        ),
    ],
)
def test_bad_input_is_typed_and_leaves_the_log_unchanged(open_log, call, error):
    log = open_log()
    log.append("t", 0, b"before")
    position, offsets = log.write_position, log.queue_offsets()
    with pytest.raises(error):
        call(log)
    assert log.write_position == position
    assert log.queue_offsets() == offsets
    assert [bytes(r.body) for r in log.iter_records(0)] == [b"before"]
    assert log.append("t", 0, b"after").queue_offset == 1


def test_largest_allowed_record_fits(open_log):
    log = open_log()
    limit = log.config.record_size_limit_bytes
    body = b"z" * (limit - 68 - 1)
    result = log.append("t", 0, body)
    assert result.size == limit
    assert bytes(log.record_at(result.physical_offset).body) == body


def test_read_out_of_range(open_log):
    log = open_log()
    result = log.append("t", 0, b"x")
    with pytest.raises(OffsetOutOfRangeError):
        log.read(result.physical_offset, result.size + 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 4)
    with pytest.raises(OffsetOutOfRangeError):
        log.record_at(10 * FILE)


def test_tombstone_body_none(open_log):
    log = open_log()
    result = log.append("t", 0, None, keys=["gone"])
    assert log.record_at(result.physical_offset).body is None


def test_closed_log_refuses_appends(open_log):
    log = open_log()
    log.close()
    with pytest.raises(StoreClosedError):
        log.append("t", 0, b"x")


def test_reject_writes_then_resume(open_log):
    log = open_log()
    log.reject_writes("disk usage 91% >= 90%")
    with pytest.raises(DiskFullError, match="91%"):
        log.append("t", 0, b"x")
    log.reject_writes(None)
    assert log.append("t", 0, b"x").queue_offset == 0


def test_reopen_continues_queue_offsets(tmp_path, small_config):
    directory = str(tmp_path / "commitlog")
    log = CommitLog.open(directory, small_config)
    for i in range(200):
        log.append("t", i % 3, b"m" * 500)
    end = log.write_position
    log.close()
    log = CommitLog.open(directory, small_config)
    try:
        assert log.write_position == end
        assert log.append("t", 0, b"x").queue_offset == 67
        assert log.append("t", 2, b"x").queue_offset == 66
        assert log.append("new", 0, b"x").queue_offset == 0
    finally:
        log.close()


def test_queue_offset_loader_is_asked_for_unseen_queues(tmp_path, small_config):
    asked = []

    def loader(topic, queue_id):
        asked.append((topic, queue_id))
        return 41

    log = CommitLog.open(
        str(tmp_path / "cl"), small_config, recover_from=0, queue_offset_loader=loader
    )
    try:
        assert log.append("t", 3, b"x").queue_offset == 41
        assert log.append("t", 3, b"x").queue_offset == 42
        assert asked == [("t", 3)]
    finally:
        log.close()


def test_topic_offsets_loader_seeds_the_table_once_per_topic(tmp_path, small_config):
    """Issue 15: the first unseen queue of a topic seeds the table with the topic's
    offsets (one call), so the other queues' first appends take the common path; the
    table's own counts (records scanned at open, appends) win over the seed, and
    queues the seed leaves out are loaded one by one."""
    asked: list[object] = []

    def loader(topic, queue_id):
        asked.append((topic, queue_id))
        return 70

    def seeder(topic):
        asked.append(topic)
        return np.array([5, 6, 7, -1, 8] if topic == "t" else [], dtype=np.int64)

    directory = str(tmp_path / "cl")
    log = CommitLog.open(directory, small_config)
    log.append("t", 1, b"before")  # scanned at the next open: queue 1 is at 1
    log.close()
    log = CommitLog.open(
        directory, small_config, recover_from=0, queue_offset_loader=loader,
        topic_offsets_loader=seeder,
    )  # fmt: skip
    try:
        assert log.append("t", 0, b"x").queue_offset == 5
        assert log.append("t", 2, b"x", keys="k").queue_offset == 7  # the general path
        assert log.append("t", 1, b"x").queue_offset == 1  # scanned: not the seed's 6
        assert log.append("t", 9, b"x").queue_offset == 70  # left out: loaded alone
        assert log.append("t", 3, b"x").queue_offset == 70  # -1: loaded alone
        assert log.append("u", 0, b"x").queue_offset == 70  # an empty seed: loaded alone
        assert log.append("t", 4, b"x").queue_offset == 8  # a common append: from the seed
        assert asked == ["t", ("t", 9), ("t", 3), "u", ("u", 0)]
        assert log.append("t", 0, b"x").queue_offset == 6
        assert log.queue_offsets()[("t", 4)] == 9
    finally:
        log.close()


_EMPTY_QUEUES = {  # a ConsumeQueue that has none of the log's records yet
    "topic_offsets_loader": lambda topic: np.zeros(4, dtype=np.int64),
    "queue_offset_loader": lambda topic, queue_id: 0,
}


def test_records_counted_after_open_win_over_a_seed_loaded_later(tmp_path):
    """count_queues_from (records held from readers at open): a topic's seed loaded
    after the count must not hand out the counted queue's offsets again."""
    config = CommitLogConfig(file_size_bytes=64 * 1024, prewarm=False)
    directory = str(tmp_path / "cl")
    log = CommitLog.open(directory, config)
    for _ in range(5):
        log.append("t", 1, b"x")
    end = log.write_position
    log.close()
    log = CommitLog.open(directory, config, recover_from=end, **_EMPTY_QUEUES)
    try:
        log.count_queues_from(0)  # the held records: in no ConsumeQueue yet
        assert log.append("t", 0, b"x").queue_offset == 0  # loads t's seed (all 0)
        assert log.append("t", 1, b"x").queue_offset == 5
        assert log.append("t", 1, b"x").queue_offset == 6
    finally:
        log.close()


def test_a_truncated_replica_counts_what_it_kept_over_a_seed_loaded_later(tmp_path):
    """truncate_replica rescans what it keeps: a seed loaded after the cut must not
    hand out those offsets again once the replica takes appends."""
    config = CommitLogConfig(file_size_bytes=64 * 1024, prewarm=False)
    leader = CommitLog.open(str(tmp_path / "leader"), config)
    follower = CommitLog.open(str(tmp_path / "follower"), config, **_EMPTY_QUEUES)
    try:
        follower.set_follower(True)
        cut = 0
        for index in range(10):
            leader.append("t", 1, b"x")
            if index == 4:
                cut = leader.write_position
        end = leader.write_position
        follower.append_replica(0, bytes(leader.file_for(0).mapping[:end]))
        follower.truncate_replica(cut, 0)
        follower.set_follower(False)
        assert follower.append("t", 0, b"x").queue_offset == 0  # loads t's seed
        assert follower.append("t", 1, b"x").queue_offset == 5
    finally:
        leader.close()
        follower.close()


def test_next_queue_offset_refuses_a_queue_id_out_of_range(tmp_path, small_config):
    """A negative id must not reach the seeds (it would index one from its end and
    wipe the last queue's offset)."""
    from mqstore.commitlog.errors import InvalidArgumentError

    log = CommitLog.open(
        str(tmp_path / "cl"), small_config, topic_offsets_loader=lambda t: np.zeros(3, np.int64),
        queue_offset_loader=lambda t, q: 0,
    )  # fmt: skip
    try:
        for _ in range(3):
            log.append("t", 2, b"x")
        with pytest.raises(InvalidArgumentError):
            log.next_queue_offset("t", -1)
        assert log.append("t", 2, b"x").queue_offset == 3
    finally:
        log.close()


def test_config_bounds():
    from mqstore.commitlog.errors import ConfigError

    with pytest.raises(ConfigError):
        CommitLogConfig(file_size_bytes=1000)
    with pytest.raises(ConfigError):
        CommitLogConfig(file_size_bytes=65 * 1024 + 1)
    with pytest.raises(ConfigError):
        CommitLogConfig(flush_mode="sometimes")
    assert CommitLogConfig(file_size_bytes=FILE).record_size_limit_bytes == FILE - 16


def test_rolled_and_deleted_files_are_durable_names(open_log, syscalls):
    """Regression: retention unlinked the oldest file, and rolls renamed new files
    into place, without an fsync of the CommitLog directory."""
    log = open_log()
    while log.file_count < 3:
        log.append("t", 0, b"x" * 1000)
    deleted = log.delete_oldest_file()
    assert deleted is not None
    assert ("unlink", deleted.path) in syscalls.events
    renamed = [path for kind, path in syscalls.events if kind == "rename"]
    assert renamed  # the rolls created files
    # Closing joins the allocation thread, which may be making the next file (its
    # rename's directory fsync still to come); close itself fsyncs no directory.
    log.close()
    assert syscalls.undurable_names() == []


def test_retention_waits_for_a_flush_that_is_syncing_the_oldest_file(open_log):
    """Regression: delete_oldest_file closed the oldest file holding only the append
    lock while flush_to, holding the flush lock, was about to sync its copy of the file
    list: the sync hit the closed file and poisoned the log with FlushFailedError."""
    log = open_log(syncer=MappedFile.flush)
    while log.file_count < 3:
        log.append("t", 0, b"x" * 1000)
    oldest = log._files.files[0]
    deleting: list[threading.Thread] = []

    def sync_while_retention_runs(mapped: MappedFile) -> None:
        if mapped is oldest and not deleting:
            thread = threading.Thread(target=log.delete_oldest_file)
            deleting.append(thread)
            thread.start()
            thread.join(0.3)  # fixed: blocked on the flush lock; before: closed the file
        MappedFile.flush(mapped)

    log._syncer = sync_while_retention_runs
    log.flush_to(log.write_position)  # raised FlushFailedError before the fix
    deleting[0].join(10)
    assert not deleting[0].is_alive()
    assert not os.path.exists(oldest.path)
    assert log.append("t", 0, b"after").queue_offset > 0  # the log is not poisoned


def test_reads_racing_retention_raise_offset_out_of_range(open_log, monkeypatch):
    """Regression: read() and record_at() on a file that retention unmapped between
    the look-up and the read raised a bare ``ValueError: mmap closed or invalid``
    (query_by_key's verification reads through record_at)."""
    log = open_log()
    result = log.append("t", 0, b"x")
    real_find = log._find

    def find_then_retention(position):
        mapped = real_find(position)
        mapped.mapping.close()
        return mapped

    monkeypatch.setattr(log, "_find", find_then_retention)
    with pytest.raises(OffsetOutOfRangeError, match="retention"):
        log.record_at(result.physical_offset)
    with pytest.raises(OffsetOutOfRangeError, match="retention"):
        log.read(result.physical_offset, result.size)


# ---------------------------------------------------------------- preparing the next file

RECORD = 68 + 1 + 1000  # a record of topic "t" with a 1000-byte body
BELOW_HALF = FILE // 2 // RECORD  # records that stay below 50 % of a file (30)
DEADLINE_S = 10.0


@pytest.fixture
def requests(monkeypatch):
    """Start offsets the log asks the allocation service for, in order."""
    asked: list[int] = []
    real_request = AllocationService.request

    def request(self, start_offset):
        asked.append(start_offset)
        real_request(self, start_offset)

    monkeypatch.setattr(AllocationService, "request", request)
    return asked


def _wait_for_file(tmp_path, start_offset):
    deadline = time.monotonic() + DEADLINE_S
    while f"{start_offset:020d}" not in _file_names(tmp_path):
        assert time.monotonic() < deadline, f"file {start_offset} never appeared"
        time.sleep(0.005)


def test_next_file_is_requested_only_past_the_threshold(open_log, tmp_path, requests):
    log = open_log(CommitLogConfig(file_size_bytes=FILE, prewarm=False, prepare_next_percent=50))
    for _ in range(BELOW_HALF):
        log.append("t", 0, b"b" * 1000)
    assert log.write_position < FILE // 2
    assert requests == []
    assert _file_names(tmp_path) == ["0" * 20]  # an idle log holds one file
    log.append("t", 0, b"b" * 1000)  # past half of the file
    assert requests == [FILE]
    _wait_for_file(tmp_path, FILE)  # built in the background, before the roll
    while log.write_position < FILE:
        log.append("t", 0, b"b" * 1000)
    assert requests == [FILE]  # the new file is below its own threshold
    assert log.roll_wait_ns
    while log.write_position < FILE + FILE // 2:
        log.append("t", 0, b"b" * 1000)
    assert requests == [FILE, 2 * FILE]


def test_a_threshold_of_zero_requests_the_next_file_at_once(open_log, requests):
    log = open_log(CommitLogConfig(file_size_bytes=FILE, prewarm=False, prepare_next_percent=0))
    assert requests == [FILE]  # at open, before any append: RocketMQ's way
    while log.write_position < FILE:
        log.append("t", 0, b"b" * 1000)
    assert requests == [FILE, 2 * FILE]  # at the roll


def test_reopen_past_the_threshold_requests_the_next_file(tmp_path, requests):
    config = CommitLogConfig(file_size_bytes=FILE, prewarm=False, prepare_next_percent=50)
    directory = str(tmp_path / "commitlog")
    log = CommitLog.open(directory, config)
    for _ in range(BELOW_HALF + 1):
        log.append("t", 0, b"b" * 1000)
    log.close()
    requests.clear()
    log = CommitLog.open(directory, config)
    try:
        assert requests == [FILE]
    finally:
        log.close()


def test_without_preallocation_nothing_is_requested(open_log, requests):
    config = CommitLogConfig(file_size_bytes=FILE, prewarm=False, preallocate_next=False)
    log = open_log(config)
    while log.write_position < 2 * FILE:
        log.append("t", 0, b"b" * 1000)
    assert requests == []
    assert log.file_count == 3  # each roll built its own file


@pytest.fixture
def slow_allocation(monkeypatch):
    """Background builds wait for ``release``; every build is recorded with its thread."""
    release = threading.Event()
    builds: list[tuple[str, int]] = []
    real_build = AllocationService._build

    def build(self, start_offset, hurry=None):
        thread = threading.current_thread().name
        builds.append((thread, start_offset))
        if thread == "mqstore-allocate":
            assert release.wait(DEADLINE_S)
            assert hurry is not None and hurry.is_set()  # the writer waits: no pacing
        return real_build(self, start_offset, hurry)

    monkeypatch.setattr(AllocationService, "_build", build)
    return release, builds


@pytest.mark.parametrize("batch", [False, True])
def test_a_roll_waits_for_the_file_when_the_writer_outruns_allocation(
    open_log, requests, slow_allocation, batch
):
    release, builds = slow_allocation
    log = open_log(CommitLogConfig(file_size_bytes=FILE, prewarm=False, prepare_next_percent=50))
    count = 2 * FILE // RECORD  # past the end of the first file, and past half the second
    bodies = [bytes([i % 256]) * 1000 for i in range(count)]
    wait_s = 0.2

    def write() -> None:
        if batch:  # one call crosses the threshold, the roll and the next threshold
            log.append_batch("t", 0, bodies)
        else:
            for body in bodies:
                log.append("t", 0, body)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(wait_s)
    assert writer.is_alive()  # the roll waits for the background build
    assert requests == [FILE]
    release.set()
    writer.join(DEADLINE_S)
    assert not writer.is_alive()
    assert log.roll_wait_ns[0] >= wait_s / 2 * 1e9
    # Built once, in the background: the writer waited for it instead of building it.
    assert [thread for thread, start in builds if start == FILE] == ["mqstore-allocate"]
    assert requests == [FILE, 2 * FILE]
    assert [bytes(r.body) for r in log.iter_records(0)] == bodies
