"""ConsumeQueueStore: queue naming, laziness, listing, many queues, readers, flush."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidTypeError,
    ReadOnlyStoreError,
    StoreClosedError,
)
from mqstore.consumequeue import QUEUE_ID_MAX, ConsumeQueueConfig, ConsumeQueueStore
from mqstore.consumequeue import file_cache as file_cache_module
from mqstore.consumequeue.queue_store import SEED_QUEUES_MAX
from tests import strategies

StoreFactory = Callable[..., ConsumeQueueStore]


def put_one(store: ConsumeQueueStore, topic: str, queue_id: int, commitlog_offset: int) -> None:
    store.queue(topic, queue_id).put(0, commitlog_offset, 10, 0, 1_000)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------ naming and laziness


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "x" * 128, "caf\u00e9"])
def test_bad_topic_names_are_refused(open_store: StoreFactory, topic: str) -> None:
    with pytest.raises(InvalidArgumentError):
        open_store().queue(topic, 0)


@pytest.mark.parametrize(
    ("queue_id", "error"),
    [
        (-1, InvalidArgumentError),
        (QUEUE_ID_MAX + 1, InvalidArgumentError),
        (True, InvalidTypeError),
        ("1", InvalidTypeError),
        (1.0, InvalidTypeError),
    ],
)
def test_bad_queue_ids_are_refused(
    open_store: StoreFactory, queue_id: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        open_store().queue("t", queue_id)  # type: ignore[arg-type]


def test_topic_must_be_a_str(open_store: StoreFactory) -> None:
    with pytest.raises(InvalidTypeError):
        open_store().queue(["t"], 0)  # type: ignore[arg-type]


def test_queue_objects_are_shared(open_store: StoreFactory) -> None:
    store = open_store()
    assert store.queue("t", QUEUE_ID_MAX) is store.queue("t", QUEUE_ID_MAX)
    assert store.queue("t", 1) is not store.queue("u", 1)


def test_directories_appear_on_first_write_only(open_store: StoreFactory, cq_dir: str) -> None:
    store = open_store()
    queue = store.queue("orders", 3)
    assert queue.max_offset == 0
    assert not os.path.exists(cq_dir)
    put_one(store, "orders", 3, 1)
    assert os.path.isdir(os.path.join(cq_dir, "orders", "3"))
    assert queue.directory == os.path.join(cq_dir, "orders", "3")


def test_open_refuses_a_file_as_directory(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "file")
    with open(path, "wb"):
        pass
    with pytest.raises(ConfigError):
        ConsumeQueueStore.open(path, ConsumeQueueConfig())
    with pytest.raises(InvalidTypeError):
        ConsumeQueueStore.open(str(tmp_path), {"units_per_file": 8})  # type: ignore[arg-type]


def test_existing_queues_lists_directories(open_store: StoreFactory, cq_dir: str) -> None:
    store = open_store()
    for topic, queue_id in [("b", 10), ("a", 2), ("a", 0)]:
        put_one(store, topic, queue_id, 1)
    os.makedirs(os.path.join(cq_dir, "a", "007"))  # not a canonical queue id
    os.makedirs(os.path.join(cq_dir, "a", "x"))
    os.makedirs(os.path.join(cq_dir, "bad name", "1"))
    with open(os.path.join(cq_dir, "a", "5"), "wb"):  # a file, not a queue directory
        pass
    assert store.existing_queues() == [("a", 0), ("a", 2), ("b", 10)]
    assert open_store(read_only=True).existing_queues() == [("a", 0), ("a", 2), ("b", 10)]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(names=st.sets(st.tuples(strategies.topics, strategies.queue_ids), min_size=1, max_size=4))
def test_existing_queues_round_trip(
    tmp_path_factory: pytest.TempPathFactory, names: set[tuple[str, int]]
) -> None:
    directory = str(tmp_path_factory.mktemp("cq"))
    with ConsumeQueueStore.open(directory, ConsumeQueueConfig(units_per_file=8)) as store:
        for topic, queue_id in names:
            put_one(store, topic, queue_id, 1)
        assert store.existing_queues() == sorted(names)


def test_existing_queues_of_an_empty_store(open_store: StoreFactory) -> None:
    assert open_store().existing_queues() == []


def test_reopen_finds_queues_written_before(open_store: StoreFactory) -> None:
    store = open_store()
    put_one(store, "t", 4, 77)
    store.close()
    queue = open_store().queue("t", 4)
    assert queue.max_offset == 1
    assert int(queue.get(0)["commitlog_offset"]) == 77


# ------------------------------------------------------------------ many queues


@pytest.fixture
def fast_dir() -> Iterator[str]:
    """A directory on tmpfs when there is one: this test is about descriptors, not disk
    speed, and it creates 200,000 files (removed with rm -rf: twice as fast as rmtree)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    directory = tempfile.mkdtemp(dir=parent)
    try:
        yield directory
    finally:
        if shutil.which("rm"):
            subprocess.run(["rm", "-rf", "--", directory], check=False)
        shutil.rmtree(directory, ignore_errors=True)


def test_100k_queues_keep_descriptors_bounded(fast_dir: str) -> None:
    queues = 100_000
    max_open_files = 256
    config = ConsumeQueueConfig(
        units_per_file=8, max_open_files=max_open_files, time_index_interval_units=8
    )
    baseline = open_fds()
    peak = baseline
    started = time.monotonic()
    store = ConsumeQueueStore.open(os.path.join(fast_dir, "consumequeue"), config)
    for queue_id in range(queues):
        put_one(store, "many", queue_id, queue_id + 1)
        if queue_id % 2_000 == 0:
            peak = max(peak, open_fds())
    for queue_id in range(queues):
        unit = store.queue("many", queue_id).get_range(0, 10)
        assert len(unit) == 1
        assert int(unit["commitlog_offset"][0]) == queue_id + 1
        del unit
        if queue_id % 2_000 == 0:
            peak = max(peak, open_fds())
    assert store.open_files <= max_open_files
    store.close()
    elapsed_s = time.monotonic() - started
    assert peak - baseline <= max_open_files + 4  # +4: listdir and sync descriptors
    assert open_fds() <= baseline + 1
    reopened = ConsumeQueueStore.open(os.path.join(fast_dir, "consumequeue"), config)
    assert len(reopened.existing_queues()) == queues
    assert reopened.queue("many", queues - 1).max_offset == 1
    reopened.close()
    print(f"100k queues: {elapsed_s:.1f} s, peak {peak - baseline} descriptors")


# ------------------------------------------------------------------ readers


def test_read_only_store_sees_writer_units(open_store: StoreFactory) -> None:
    writer = open_store()
    reader = open_store(read_only=True)
    assert reader.queue("t", 0).max_offset == 0
    for queue_id in range(3):
        put_one(writer, "t", queue_id, 5 + queue_id)
    assert reader.existing_queues() == [("t", 0), ("t", 1), ("t", 2)]
    assert [reader.queue("t", queue_id).max_offset for queue_id in range(3)] == [1, 1, 1]
    writer.queue("t", 1).put_batch(
        1, np.array([100, 200]), np.array([1, 2]), np.array([0, 0]), np.array([9, 9])
    )
    seen = reader.queue("t", 1)
    assert list(seen.get_range(0, 5)["commitlog_offset"]) == [6, 100, 200]
    with pytest.raises(ReadOnlyStoreError):
        reader.truncate_beyond(0)
    with pytest.raises(ReadOnlyStoreError):
        put_one(reader, "t", 5, 1)


# ------------------------------------------------------------------ flush and close


def test_flush_syncs_every_written_file_even_evicted(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, cq_dir: str
) -> None:
    synced: list[str] = []
    monkeypatch.setattr(
        file_cache_module, "sync_path", lambda path, directory=False: synced.append(path)
    )
    store = open_store(max_open_files=2)
    for queue_id in range(6):
        queue = store.queue("t", queue_id)
        for offset in range(3):  # later puts map the files; mappings are evicted
            queue.put(offset, offset + 1, 1, 0, 0)
    store.flush()
    for queue_id in range(6):
        directory = os.path.join(cq_dir, "t", str(queue_id))
        assert directory in synced
        for name in os.listdir(directory):
            assert os.path.join(directory, name) in synced
    assert os.path.join(cq_dir, "t") in synced
    synced.clear()
    store.flush()
    assert synced == []  # nothing written since


def test_queue_flush_syncs_only_that_queue(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    monkeypatch.setattr(
        file_cache_module, "sync_path", lambda path, directory=False: synced.append(path)
    )
    store = open_store()
    put_one(store, "t", 0, 1)
    put_one(store, "t", 1, 1)
    store.queue("t", 0).flush()
    assert synced
    assert all(os.sep + "1" not in path for path in synced)
    synced.clear()
    store.flush()
    assert any(path.endswith(os.path.join("t", "1")) for path in synced)


def test_close_is_idempotent_and_final(open_store: StoreFactory) -> None:
    store = open_store()
    put_one(store, "t", 0, 1)
    store.close()
    store.close()
    for call in (store.flush, store.existing_queues, lambda: store.queue("t", 0)):
        with pytest.raises(StoreClosedError):
            call()


def test_context_manager_closes(cq_dir: str) -> None:
    config = ConsumeQueueConfig(units_per_file=8)
    with ConsumeQueueStore.open(cq_dir, config) as store:
        put_one(store, "t", 0, 1)
    with pytest.raises(StoreClosedError):
        store.flush()


# ------------------------------------------------------------------ other processes, threads

READER_SCRIPT = """
import sys
from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore
config = ConsumeQueueConfig(units_per_file=8, max_open_files=16, time_index_interval_units=3)
store = ConsumeQueueStore.open(sys.argv[1], config, read_only=True)
queue = store.queue("t", 0)
for line in sys.stdin:  # one line per round: report what this process sees
    units = queue.get_range(int(line), 100)
    print(queue.max_offset, units["commitlog_offset"].tolist(), flush=True)
"""


def test_reader_in_another_process_sees_the_writer(open_store: StoreFactory, cq_dir: str) -> None:
    writer = open_store(max_open_files=16)
    queue = writer.queue("t", 0)
    queue.put(0, 100, 1, 0, 1)
    repository = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    reader = subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, cq_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=repository,
        env={**os.environ, "PYTHONPATH": repository},
    )
    assert reader.stdin is not None
    assert reader.stdout is not None
    try:
        reader.stdin.write("0\n")
        reader.stdin.flush()
        assert reader.stdout.readline().split(" ", 1) == ["1", "[100]\n"]
        for offset in range(1, 10):  # crosses into a second file
            queue.put(offset, 100 + offset, 1, 0, 1)
        reader.stdin.write("8\n")
        reader.stdin.flush()
        assert reader.stdout.readline() == "10 [108, 109]\n"
    finally:
        reader.stdin.close()
        assert reader.wait(timeout=30) == 0


def test_concurrent_writer_and_readers(open_store: StoreFactory) -> None:
    store = open_store(max_open_files=4)
    queue = store.queue("t", 0)
    total = 300
    errors: list[BaseException] = []

    def read() -> None:
        try:
            offset = 0
            while offset < total:
                units = queue.get_range(offset, 7)
                for unit in units:
                    assert int(unit["commitlog_offset"]) == 10 * (offset + 1)
                    offset += 1
                assert queue.offset_for_time(offset // 2) in (None, *range(offset + 1))
        except BaseException as error:
            errors.append(error)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in readers:
        thread.start()
    for offset in range(total):
        if offset % 50 == 0:
            batch = np.arange(offset, offset + 50)
            queue.put_batch(offset, 10 * (batch + 1), batch + 1, batch, batch)
        store.queue("other", offset).put(0, 1, 1, 0, 0)  # churn the file cache
    for thread in readers:
        thread.join(timeout=30)
    assert not errors


# ------------------------------------------------------------------ no object per queue


def _put_units(store: ConsumeQueueStore, queue_id: int, count: int, clog: list[int]) -> None:
    queue = store.queue("t", queue_id)
    for offset in range(count):
        clog[0] += 100
        queue.put(offset, clog[0], 10, 0, 1_000)


@pytest.mark.parametrize("shared_units_max", [0, 4])
def test_next_offsets_without_objects_agree_with_the_queues(
    open_store: StoreFactory, shared_units_max: int
) -> None:
    """max_offset_of, next_offsets_without_objects and shared_append_limits answer
    for queues without an object from the shared log alone (issue 15: no object per
    queue on the put and dispatch paths), and say what the queues' objects say: for a
    queue never written, one in the shared log, one graduated to own files, one
    emptied by truncation."""
    writer = open_store(shared_units_max=4)  # the units: some shared, one graduated
    clog = [0]
    for queue_id, count in ((1, 3), (2, 6), (3, 2)):
        _put_units(writer, queue_id, count, clog)
    writer.queue("t", 3).truncate(0)  # an empty run that ends at 0
    writer.close()
    store = open_store(shared_units_max=shared_units_max)
    ids = [0, 1, 2, 3, 4]
    offsets = store.next_offsets_without_objects("t", 5)
    limits = store.shared_append_limits("t", ids)
    single = {queue_id: store.max_offset_of("t", queue_id) for queue_id in (0, 1, 3)}
    assert not store._queues  # none of that built an object
    assert offsets.tolist() == [0, 3, -1, 0, 0]  # queue 2 has own files: asked alone
    if shared_units_max:
        assert limits == [4, 4, None, 4, 4]
    else:
        assert limits == [None] * 5
    for queue_id in ids:
        queue = store.queue("t", queue_id)
        assert store.max_offset_of("t", queue_id) == queue.max_offset
        assert offsets[queue_id] in (-1, queue.max_offset)
        assert single.get(queue_id, queue.max_offset) == queue.max_offset
        if limits[queue_id] is not None:
            assert limits[queue_id] == queue.append_limit()
    assert store.next_offsets_without_objects("t", 5).tolist() == [-1] * 5  # all have objects


def test_next_offsets_without_objects_refuse_and_skip(open_store: StoreFactory) -> None:
    store = open_store(shared_units_max=4)
    with pytest.raises(InvalidArgumentError):
        store.next_offsets_without_objects("a/b", 2)
    with pytest.raises(InvalidTypeError):
        store.max_offset_of("t", True)  # type: ignore[arg-type]
    assert store.shared_append_limits("a/b", [0]) == [None]  # queue() says what is wrong
    assert store.shared_append_limits("t", [-1, 0]) == [None, 4]
    assert len(store.next_offsets_without_objects("t", 0)) == 0
    assert len(store.next_offsets_without_objects("t", 2**31)) == SEED_QUEUES_MAX  # bounded
    put_one(store, "t", 0, 100)
    store.close()
    reader = open_store(read_only=True, shared_units_max=4)
    assert len(reader.next_offsets_without_objects("t", 2)) == 0  # a reader follows the writer
    assert reader.shared_append_limits("t", [0]) == [None]
    assert reader.max_offset_of("t", 0) == 1


def test_confirm_shared_confirms_only_what_put_would_find_stored(
    open_store: StoreFactory,
) -> None:
    """The bulk re-put check of many small shared queues: a unit is confirmed only
    when its queue's readable run holds exactly it at its offset."""
    store = open_store(shared_units_max=4)
    for offset in range(2):  # units (queue q, offset o) at commitlog 100 + 10 * (3o + q)
        for queue_id in range(3):  # in commitlog order, as the shared log keeps them
            store.queue("t", queue_id).put(offset, 100 + 10 * (3 * offset + queue_id), 10, 5, 1)
    ids = np.array([0, 1, 2, 0, 1, 2, 2], dtype=np.int32)
    offsets = np.array([0, 0, 0, 1, 1, 1, 2], dtype=np.int64)
    clogs = np.array([100, 110, 120, 130, 140, 150, 160], dtype=np.int64)
    sizes = np.full(7, 10, dtype=np.int64)
    tags = np.full(7, 5, dtype=np.int64)
    assert store.confirm_shared("t", ids, offsets, clogs, sizes, tags).tolist() == [True] * 6 + [
        False  # offset 2 of queue 2 is not stored
    ]
    sizes[1], tags[3] = 11, 6  # a different size, a different tag
    offsets[4] = 0  # queue 1's record at 140 holds offset 1, not 0
    ids[5] = 1  # the record at 150 is queue 2's
    assert store.confirm_shared("t", ids, offsets, clogs, sizes, tags).tolist() == [
        True, False, True, False, False, False, False,
    ]  # fmt: skip
    store.queue("t", 0).truncate(0)  # queue 0's records are tombstones now
    confirmed = store.confirm_shared("t", ids[:3], offsets[:3], clogs[:3], np.full(3, 10), tags[:3])
    assert confirmed.tolist() == [False, True, True]
