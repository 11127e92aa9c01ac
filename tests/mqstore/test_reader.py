"""The read path (mqstore/reader.py): get_batch against get and against what was
put, with the C read and with its pure-Python twin; corrupt records and units;
retention racing a read; the byte and count limits."""

from __future__ import annotations

import contextlib
import shutil
import struct
import tempfile
from collections.abc import Iterator
from typing import Any
from unittest import mock

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import (
    CorruptDataError,
    InvalidArgumentError,
    MessageBatch,
    MessageStore,
    OffsetOutOfRangeError,
    StoreConfig,
)
from mqstore import batch as batch_module
from mqstore.commitlog import columns
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.consumequeue import ConsumeQueue, queue_shared
from tests import strategies as s
from tests.mqstore.conftest import SMALL

#: Small files, so that reads cross ConsumeQueue files (64 units) and CommitLog files.
CONFIG = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 64 * 1024})
IMPLEMENTATIONS = ["native", "python"]


@contextlib.contextmanager
def implementation(name: str) -> Iterator[None]:
    """Run reads with the C read_columns and slices, or with their pure-Python twins
    (in a MQSTORE_PURE_PYTHON=1 run both are the twins)."""
    if name == "native" and NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    if name == "native":
        yield
        return
    with mock.patch.multiple(
        batch_module, read_columns=columns.read_columns_py, slices=columns.slices_py
    ):
        yield


_messages = st.tuples(
    st.integers(0, 1),  # queue
    st.binary(max_size=3000) | st.none(),  # body, None: a tombstone
    s.keys,
    s.tags,
    st.lists(
        st.tuples(st.sampled_from([KEY_PROPERTY, "h", "é"]), st.binary(max_size=30)), max_size=3
    ),
)


def _expected(message: tuple) -> dict[str, Any]:
    _, body, keys, tag, properties = message
    key = next((value for name, value in properties if name == KEY_PROPERTY), None)
    return {
        "body": body,
        "keys": tuple(keys),
        "tag": tag or None,
        "properties": tuple(properties),
        "kafka_key": key,
    }


def _row(batch: Any, index: int) -> dict[str, Any]:
    body = batch.body(index)
    return {
        "body": None if body is None else bytes(body),
        "keys": batch.keys(index),
        "tag": batch.tag(index),
        "properties": batch.properties(index),
        "kafka_key": batch.kafka_key(index),
    }


def _message_fields(message: Any) -> tuple:
    return (message.queue_offset, message.physical_offset, message.size,
            message.born_timestamp_ms, message.store_timestamp_ms, message.flags,
            None if message.body is None else bytes(message.body), message.tag,
            message.keys, message.properties)  # fmt: skip


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(messages=st.lists(_messages, min_size=1, max_size=60), data=st.data())
def test_get_batch_agrees_with_get_and_with_what_was_put(impl: str, messages: list,
                                                         data: st.DataObject) -> None:  # fmt: skip
    """Random stores: every window of get_batch holds what get returns for it, row by
    row, and both hold what was put; runs span ConsumeQueue and CommitLog files."""
    root = tempfile.mkdtemp()
    try:
        with implementation(impl), MessageStore.open(root, CONFIG) as store:
            store.create_topic("t", 2)
            for queue, body, keys, tag, properties in messages:
                store.put("t", queue, body, keys=keys, tag=tag, properties=properties)
            for queue in (0, 1):
                put = [_expected(m) for m in messages if m[0] == queue]
                whole = store.get_batch("t", queue, 0, 65_536)
                assert len(whole) == len(put)
                assert [_row(whole, i) for i in range(len(whole))] == put
                got = store.get("t", queue, 0, 10_000) if put else []
                assert [_message_fields(m) for m in whole.messages()] == [
                    _message_fields(m) for m in got
                ]
                if not put:
                    continue
                offset = data.draw(st.integers(0, len(put)))
                count = data.draw(st.integers(1, 70))
                window = store.get_batch("t", queue, offset, count)
                assert [_row(window, i) for i in range(len(window))] == put[offset:][:count]
                assert window.queue_offsets.tolist() == list(range(offset, offset + len(window)))
                assert window.physical_offsets.tolist() == [
                    m.physical_offset for m in got[offset:][:count]
                ]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _filled(path: Any, count: int = 10) -> None:
    with MessageStore.open(path, CONFIG) as store:
        store.create_topic("t", 1)
        for i in range(count):
            store.put("t", 0, b"body-%d" % i, properties=[(KEY_PROPERTY, b"k%d" % i)])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_flipped_bit_is_corrupt_data(impl, tmp_path) -> None:
    _filled(tmp_path / "s")
    with implementation(impl), MessageStore.open(tmp_path / "s", CONFIG) as store:
        victim = store.get("t", 0, 4, 1)[0]
        mapped = store.commitlog.file_for(victim.physical_offset)
        at = victim.physical_offset - mapped.start_offset + victim.size - 2
        mapped.mapping[at] ^= 0x10  # a bit of record 4's body, under its checksum
        assert len(store.get_batch("t", 0, 0, 4)) == 4  # the records before it read
        for start in (0, 4):
            with pytest.raises(CorruptDataError, match="checksum mismatch") as caught:
                store.get_batch("t", 0, start, 10)
            assert caught.value.position == victim.physical_offset - mapped.start_offset
        with pytest.raises(CorruptDataError):
            store.get("t", 0, 0, 10)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("damage", ["size", "other record", "past the log"])
def test_a_wrong_unit_is_corrupt_data(impl, damage, tmp_path) -> None:
    """A unit whose size is off, that points at another record of the queue, or past
    the log: CorruptDataError from get_batch, never another record's data."""
    path = tmp_path / "s"
    _filled(path)
    unit_file = path / "consumequeue" / "t" / "0" / ("0" * 20)
    data = bytearray(unit_file.read_bytes())
    physical, size = struct.unpack_from("<qi", data, 3 * 20)
    if damage == "size":
        struct.pack_into("<i", data, 3 * 20 + 8, size + 1)
    elif damage == "other record":
        data[3 * 20 : 3 * 20 + 12] = data[4 * 20 : 4 * 20 + 12]
    else:
        struct.pack_into("<q", data, 3 * 20, physical + (1 << 40))
    unit_file.write_bytes(bytes(data))
    with implementation(impl), MessageStore.open(path, CONFIG) as store:
        assert [bytes(v) for v in store.get_batch("t", 0, 0, 3).bodies()] == [
            b"body-0", b"body-1", b"body-2"
        ]  # fmt: skip
        with pytest.raises(CorruptDataError):
            store.get_batch("t", 0, 0, 10)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_get_batch_racing_retention_raises_offset_out_of_range(impl, open_store,
                                                               monkeypatch) -> None:  # fmt: skip
    """A CommitLog file unmapped by retention between finding it and reading it is
    OffsetOutOfRangeError (what KafkaConsumer resets on), never ValueError."""
    store = open_store()
    store.put("t", 0, b"x")
    commitlog = store.commitlog
    real_file_for = commitlog.file_for

    def file_for_then_retention(position: int) -> Any:
        mapped = real_file_for(position)
        mapped.mapping.close()  # retention unmapped it right after the look-up
        return mapped

    monkeypatch.setattr(commitlog, "file_for", file_for_then_retention)
    with implementation(impl), pytest.raises(OffsetOutOfRangeError, match="retention"):
        store.get_batch("t", 0, 0, 10)


def test_max_bytes_bounds_the_records_but_one_always_comes(open_store) -> None:
    store = open_store()
    results = store.put_batch("t", 0, [b"x" * 100] * 20)
    size = results[0].size
    assert len(store.get_batch("t", 0, 0, 20, max_bytes=size * 5)) == 5
    assert len(store.get_batch("t", 0, 0, 20, max_bytes=size * 5 + size - 1)) == 5
    assert len(store.get_batch("t", 0, 0, 20, max_bytes=1)) == 1  # never stuck
    assert len(store.get_batch("t", 0, 18, 20, max_bytes=size * 5)) == 2
    assert len(store.get_batch("t", 0, 20, 20)) == 0
    with pytest.raises(OffsetOutOfRangeError):
        store.get_batch("t", 0, 21, 20)
    for bad in ({"max_messages": 0}, {"max_messages": 65_537}, {"max_bytes": 0}):
        with pytest.raises(InvalidArgumentError):
            store.get_batch("t", 0, 0, **{"max_messages": 5, **bad})


def test_max_bytes_cuts_a_long_run_at_the_budget(open_store) -> None:
    """Past the few units a list sums, the budget cuts with numpy: the same counts."""
    store = open_store()
    size = store.put_batch("t", 0, [b"x" * 100] * 200)[0].size
    assert len(store.get_batch("t", 0, 0, 200, max_bytes=size * 50)) == 50
    assert len(store.get_batch("t", 0, 0, 200, max_bytes=size * 50 + size - 1)) == 50
    assert len(store.get_batch("t", 0, 0, 200, max_bytes=size * 200)) == 200
    assert len(store.get_batch("t", 0, 0, 200, max_bytes=size * 100)) == 100  # 64 + 36


def test_a_read_to_the_max_offset_asks_the_consume_queue_once(open_store, monkeypatch) -> None:
    """get_range stops at max_offset and at a ConsumeQueue file's end: only the file's
    end takes another call (a small read's fixed cost)."""
    store = open_store(CONFIG)
    store.put_batch("t", 0, [b"x"] * 100)  # ConsumeQueue files of 64 units
    calls: list[tuple[int, int]] = []
    get_range = ConsumeQueue.get_range

    def counted(queue: ConsumeQueue, start: int, max_units: int) -> np.ndarray:
        calls.append((start, max_units))
        return get_range(queue, start, max_units)

    monkeypatch.setattr(ConsumeQueue, "get_range", counted)
    assert store.get_batch("t", 0, 99, 1000).queue_offsets.tolist() == [99]
    assert [m.queue_offset for m in store.get("t", 0, 90, 500)] == list(range(90, 100))
    assert calls == [(99, 1000), (90, 500)]
    calls.clear()
    assert store.get_batch("t", 0, 60, 1000).queue_offsets.tolist() == list(range(60, 100))
    assert calls == [(60, 1000), (64, 996)]


def test_a_followers_read_re_reads_the_writers_queue_files_once(open_store, monkeypatch) -> None:
    """A read-only get_batch follows the writer's appends once per get_range call,
    not again to learn where get_range stopped; it still sees units written after
    its last look, and goes on past a ConsumeQueue file's end."""
    writer = open_store(CONFIG)
    writer.put_batch("t", 0, [b"x"] * 100)  # ConsumeQueue files of 64 units
    assert writer.max_offset("t", 0) == 100  # dispatched (a read catches up)
    follower = open_store(CONFIG, path=writer.root, read_only=True)
    assert follower.max_offset("t", 0) == 100
    writer.put_batch("t", 0, [b"y"] * 10)
    assert writer.max_offset("t", 0) == 110
    refreshes: list[int] = []
    refresh_max = queue_shared.refresh_max

    def counted(queue: ConsumeQueue) -> None:
        refreshes.append(queue._max_offset)
        refresh_max(queue)

    monkeypatch.setattr(queue_shared, "refresh_max", counted)
    batch = follower.get_batch("t", 0, 60, 1000)
    assert batch.queue_offsets.tolist() == list(range(60, 110))  # across the file's end
    assert batch.values()[-10:] == [b"y"] * 10  # written after the follower's last look
    assert refreshes == [100, 110]  # one per get_range call; before: [100, 110, 110]
    refreshes.clear()
    writer.put_batch("t", 0, [b"z"] * 5)
    assert writer.max_offset("t", 0) == 115
    assert follower.get_batch("t", 0, 110, 1000).values() == [b"z"] * 5
    assert refreshes == [110]  # before: [110, 115]


def test_every_array_of_a_batch_is_read_only(open_store) -> None:
    """read_run's columns are views of one block, frozen before they are taken."""
    store = open_store(CONFIG)
    store.put_batch("t", 0, [b"ab"] * 70, properties=[[(KEY_PROPERTY, b"k")]] * 70)
    for count in (1, 10, 70):  # one run; runs in two ConsumeQueue files, concatenated
        batch = store.get_batch("t", 0, 0, count)
        assert len(batch) == count
        assert batch.kafka_keys() == [b"k"] * count and batch.kafka_key_valid.dtype == bool
        arrays = [value for value in vars_of(batch) if isinstance(value, np.ndarray)]
        assert len(arrays) == 12
        for array in arrays:
            assert not array.flags.writeable
            with pytest.raises(ValueError):
                array[:1] = 0


def vars_of(batch: MessageBatch) -> list[Any]:
    return [getattr(batch, field.name) for field in attrs.fields(MessageBatch)]


def test_a_batch_outlives_its_store_and_is_read_only(open_store) -> None:
    """Everything a batch holds is its own: it reads the same after the store closed
    (the CommitLog unmapped), and neither its arrays nor its messages change."""
    store = open_store()
    store.put_batch("t", 0, [b"a", None, b"ccc"], properties=[None, [("h", b"v")], None])
    batch = store.get_batch("t", 0, 0, 10)
    messages = batch.messages()
    store.close()
    assert [None if m.body is None else bytes(m.body) for m in messages] == [b"a", None, b"ccc"]
    assert batch.body_valid.tolist() == [True, False, True]
    assert batch.headers(1) == [("h", b"v")] and batch.header_rows() == [1]
    with pytest.raises(ValueError):
        batch.sizes[0] = 1
    with pytest.raises(AttributeError):
        messages[0].body = memoryview(b"x")  # type: ignore[misc]
    assert isinstance(messages[0].body, memoryview) and messages[0].body.readonly


def test_get_batch_reads_many_files_in_one_batch(open_store) -> None:
    """One batch over runs in several CommitLog files and ConsumeQueue files is the
    concatenation of the runs."""
    store = open_store(CONFIG)
    bodies = [bytes([i % 251]) * 900 for i in range(300)]  # ~1 MB: many 64 KiB files
    store.put_batch("t", 0, bodies)
    batch = store.get_batch("t", 0, 0, 300)
    assert len(batch) == 300 and store.commitlog.file_count > 3
    assert batch.body_data == b"".join(bodies)
    assert np.diff(batch.body_offsets).tolist() == [900] * 300
