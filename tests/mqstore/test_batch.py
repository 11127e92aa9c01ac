"""MessageBatch (mqstore/batch.py): its columns, per-row access, Messages made from
it, batches joined and built from decoded records."""

from __future__ import annotations

import numpy as np
import pytest

import mqstore.batch
from mqstore.batch import MessageBatch
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.message import Message


def _put(store, count=6):
    store.create_topic("t", 1)
    return store.put_batch(
        "t", 0, [b"b%d" % i if i % 3 else None for i in range(count)],
        keys=[[f"k{i}", "x"] if i % 2 else None for i in range(count)],
        tags=[f"tag{i}" if i % 2 else None for i in range(count)],
        properties=[[(KEY_PROPERTY, b"K%d" % i), ("h", b"v")] if i % 2 else [("h", b"w")]
                    for i in range(count)],
    )  # fmt: skip


def test_columns_hold_the_messages(open_store) -> None:
    store = open_store()
    results = _put(store)
    batch = store.get_batch("t", 0, 0, 100)
    assert len(batch) == 6 and batch.topic == "t" and batch.queue_id == 0
    assert batch.queue_offsets.tolist() == list(range(6))
    assert batch.physical_offsets.tolist() == [r.physical_offset for r in results]
    assert batch.sizes.tolist() == [r.size for r in results]
    assert batch.store_timestamps_ms.tolist() == [r.store_timestamp_ms for r in results]
    assert batch.body_valid.tolist() == [i % 3 != 0 for i in range(6)]
    assert batch.values() == [b"b%d" % i if i % 3 else None for i in range(6)]
    assert [None if v is None else bytes(v) for v in batch.bodies()] == batch.values()
    assert batch.kafka_keys() == [b"K%d" % i if i % 2 else None for i in range(6)]
    assert [batch.tag(i) for i in range(6)] == [f"tag{i}" if i % 2 else None for i in range(6)]
    assert [batch.keys(i) for i in range(6)] == [(f"k{i}", "x") if i % 2 else () for i in range(6)]
    assert [batch.headers(i) for i in range(6)] == [
        [("h", b"v")] if i % 2 else [("h", b"w")] for i in range(6)
    ]
    assert batch.header_rows() == list(range(6))
    lists = batch.headers_lists()
    assert lists == [batch.headers(i) for i in range(6)]
    assert len({id(pairs) for pairs in lists}) == 6  # a list of its own each
    assert batch.to_list("sizes") is batch.to_list("sizes")  # made once
    assert "messages=6" in repr(batch)


def test_messages_are_rows_of_the_batch(open_store) -> None:
    store = open_store()
    _put(store)
    batch = store.get_batch("t", 0, 0, 100)
    messages = batch.messages()
    assert all(type(m) is Message for m in messages)
    assert [m.queue_offset for m in messages] == list(range(6))
    assert [m.value for m in messages] == batch.values()
    assert messages[1].properties == ((KEY_PROPERTY, b"K1"), ("h", b"v"))
    assert bytes(messages[1].properties_raw) == bytes(store.get("t", 0, 1, 1)[0].properties_raw)
    assert bytes(messages[1].keys_raw) == b"k1\x00x"
    assert messages[1].born_ts_ms == messages[1].born_timestamp_ms
    assert messages[1].store_ts_ms == messages[1].store_timestamp_ms
    assert "queue_offset=1" in repr(messages[1]) and "body_len=-1" in repr(messages[0])


def test_headers_drop_only_the_first_kafka_key(open_store) -> None:
    """The Kafka key is the first property named KEY_PROPERTY wherever it is; a second
    one is a header, as the adapter read it before batches."""
    store = open_store()
    store.put("t", 0, b"x", properties=[("a", b"1"), (KEY_PROPERTY, b"K"), (KEY_PROPERTY, b"L")])
    store.put("t", 0, b"y", properties=[(KEY_PROPERTY, b"")])
    batch = store.get_batch("t", 0, 0, 10)
    assert batch.kafka_keys() == [b"K", b""]
    assert batch.headers(0) == [("a", b"1"), (KEY_PROPERTY, b"L")]
    assert batch.headers(1) == [] and batch.header_rows() == [0]


def test_concat_joins_runs_in_order(open_store) -> None:
    store = open_store()
    _put(store)
    parts = [store.get_batch("t", 0, start, 2) for start in (0, 2, 4)]
    joined = MessageBatch.concat("t", 0, parts)
    whole = store.get_batch("t", 0, 0, 6)
    for name in ("queue_offsets", "physical_offsets", "sizes", "flags", "body_offsets",
                 "kafka_key_offsets", "kafka_key_valid", "extra_offsets", "tag_lengths",
                 "keys_lengths", "born_timestamps_ms", "store_timestamps_ms"):  # fmt: skip
        assert np.array_equal(getattr(joined, name), getattr(whole, name)), name
    assert (joined.body_data, joined.kafka_key_data, joined.extra_data) == (
        whole.body_data, whole.kafka_key_data, whole.extra_data)  # fmt: skip
    assert MessageBatch.concat("t", 0, parts[:1]) is parts[0]
    empty = MessageBatch.concat("t", 0, [])
    assert len(empty) == 0 and empty.messages() == [] and empty.values() == []
    assert empty.kafka_keys() == [] and empty.header_rows() == []


def test_message_of_a_record_copies_it(open_store) -> None:
    """Message.of (query_by_key's results) builds a one-row batch from a decoded
    Record: the same fields as a read gives."""
    store = open_store()
    _put(store)
    read = store.get("t", 0, 1, 1)[0]
    made = Message.of(store.commitlog.record_at(read.physical_offset))
    fields = ("topic", "queue_id", "queue_offset", "physical_offset", "size", "flags",
              "born_timestamp_ms", "store_timestamp_ms", "tag", "keys", "properties",
              "value")  # fmt: skip
    assert [getattr(made, f) for f in fields] == [getattr(read, f) for f in fields]
    assert made._batch.kafka_keys() == [b"K1"]
    tombstone = store.get("t", 0, 0, 1)[0]
    assert Message.of(store.commitlog.record_at(tombstone.physical_offset)).body is None


def test_arrays_are_read_only(open_store) -> None:
    store = open_store()
    _put(store)
    batch = store.get_batch("t", 0, 0, 6)
    for name in ("queue_offsets", "body_offsets", "born_timestamps_ms", "kafka_key_valid"):
        with pytest.raises(ValueError):
            getattr(batch, name)[0] = 0


@pytest.mark.parametrize("count", [1, 255, 256, 257, 1000])
def test_queue_offsets_of_a_run_count_from_its_first(open_store, count) -> None:
    """Up to 256 records the offsets are a cached range plus the first, past it
    np.arange: both are the queue offsets, read-only."""
    store = open_store()
    store.create_topic("t", 1)
    store.put_batch("t", 0, [b"x"] * (count + 3))
    batch = store.get_batch("t", 0, 3, count)
    assert batch.queue_offsets.tolist() == list(range(3, 3 + count))
    assert batch.queue_offsets.dtype == np.int64
    assert not batch.queue_offsets.flags.writeable


def test_a_small_read_calls_no_arange(open_store, monkeypatch) -> None:
    """np.arange releases the GIL for any length (numpy 2.x), which hands it to the
    writer thread (docs/VISIBILITY.md, stop 29): a read of up to 256 records must not
    call it."""
    store = open_store()
    store.create_topic("t", 1)
    store.put_batch("t", 0, [b"x"] * 300)

    class NoArange:  # numpy as mqstore.batch sees it, without arange
        def __getattr__(self, name):
            if name == "arange":
                raise AssertionError("np.arange in a small read")
            return getattr(np, name)

    monkeypatch.setattr(mqstore.batch, "np", NoArange())
    assert len(store.get_batch("t", 0, 10, 256)) == 256
    assert [message.queue_offset for message in store.get("t", 0, 290, 5)] == list(range(290, 295))
