"""The CommitLog engine's storage adapter (mqstore.broker.column_log): Produce through
the columnar put or, for keys and headers, per record; Fetch built from columns in C;
and what a librdkafka client sees of both through a broker."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from mqstore.broker import Broker, BrokerConfig, RecordLog
from mqstore.broker.batch import InvalidBatchError, check_produced
from mqstore.broker.column_log import ColumnLog
from mqstore.commitlog.errors import OffsetOutOfRangeError
from mqstore.engine import ProducerRecord
from mqstore.segmented import batch_builder
from mqstore.segmented.record_batch import (
    HEADER,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    decode_records,
)
from tests.mqstore.broker.conftest import librdkafka_read
from tests.mqstore.engines import open_engine

NOW_MS = 1_700_000_000_000


@pytest.fixture
def store(tmp_path: Any) -> Any:
    opened = open_engine("commitlog", tmp_path / "store")
    yield opened
    opened.close()


def produced(records: list[ProducerRecord], codec: int = 0) -> Any:
    """A checked batch of ``records`` as a producer sends it (kafka-python's builder
    when compressed)."""
    if not codec:
        return check_produced(bytes(batch_builder.build(records, NOW_MS, False, 1 << 30).batch))
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24,
    )  # fmt: skip
    for i, record in enumerate(records):
        builder.append(i, timestamp=record.timestamp_ms, key=record.key, value=record.value,
                       headers=list(record.headers))  # fmt: skip
    return check_produced(bytes(builder.build()))


def fetched(log: Any, topic: str, offset: int = 0, max_bytes: int = 1 << 20) -> list[Any]:
    out = []
    for data in log.fetch(topic, 0, offset, max_bytes):
        header = BatchHeader._make(HEADER.unpack_from(data))
        out += decode_records(bytes(data), 0, header, header.base_offset, header.records_count)
    return out


def test_plain_batches_take_the_columnar_put_and_come_back_as_sent(store: Any) -> None:
    store.create_topic("p", 1)
    log = ColumnLog(store)
    records = [ProducerRecord(None, b"v%d" % i, [], NOW_MS + i) for i in range(5)]
    records.append(ProducerRecord(None, None, [], NOW_MS))  # a tombstone
    first = log.append("p", 0, produced(records))
    second = log.append("p", 0, produced(records[:2]))
    assert (first.base_offset, second.base_offset, first.log_append_time_ms) == (0, 6, -1)
    got = store.get("p", 0, 0, 10)
    assert [None if m.body is None else bytes(m.body) for m in got] == [
        r.value for r in records + records[:2]
    ]
    assert [m.born_timestamp_ms for m in got] == [r.timestamp_ms for r in records + records[:2]]
    assert all(m.properties == () and m.keys == () for m in got)  # nothing per record
    assert [(r.offset, r.value, r.timestamp_ms) for r in fetched(log, "p")] == [
        (i, r.value, r.timestamp_ms) for i, r in enumerate(records + records[:2])
    ]


def test_keys_and_headers_go_per_record_and_are_indexed(store: Any) -> None:
    store.create_topic("k", 1)
    log = ColumnLog(store)
    records = [
        ProducerRecord(None, b"plain", [], NOW_MS),
        ProducerRecord(b"key", b"keyed", [], NOW_MS),
        ProducerRecord(None, b"headed", [("h", b"1")], NOW_MS),
    ]
    assert log.append("k", 0, produced(records)).base_offset == 0
    assert [bytes(m.body) for m in store.query_by_key("k", "key")] == [b"keyed"]
    assert [(r.key, r.value, r.headers) for r in fetched(log, "k")] == [
        (r.key, r.value, list(r.headers)) for r in records
    ]


@pytest.mark.parametrize("codec", [1, 4])  # gzip, zstd
def test_compressed_plain_batches_are_inflated_then_put(store: Any, codec: int) -> None:
    store.create_topic("z", 1)
    records = [ProducerRecord(None, b"x" * 50, [], NOW_MS + i) for i in range(20)]
    ColumnLog(store).append("z", 0, produced(records, codec))
    assert [bytes(m.body) for m in store.get("z", 0, 0, 30)] == [r.value for r in records]


def test_log_append_time_answers_the_store_time(store: Any) -> None:
    store.create_topic("l", 1, timestamp_type="LogAppendTime")
    log = ColumnLog(store)
    appended = log.append("l", 0, produced([ProducerRecord(None, b"v", [], 5)] * 3))
    stored = store.get("l", 0, 0, 3)
    assert appended.log_append_time_ms == stored[0].store_timestamp_ms > 5
    (header,) = [
        BatchHeader._make(HEADER.unpack_from(data)) for data in log.fetch("l", 0, 0, 1 << 20)
    ]
    assert header.attributes & TIMESTAMP_TYPE_MASK
    assert [r.timestamp_ms for r in fetched(log, "l")] == [m.store_timestamp_ms for m in stored]


def test_a_batch_whose_records_do_not_decode_stores_nothing(store: Any) -> None:
    store.create_topic("bad", 1)
    good = produced([ProducerRecord(None, b"v", [], 5)] * 3)
    data = bytearray(good.data)
    data[HEADER_SIZE] = 0x7F  # the first record's length: past the batch
    with pytest.raises(InvalidBatchError):
        ColumnLog(store).append("bad", 0, good._replace(data=bytes(data)))
    assert store.max_offset("bad", 0) == 0


def test_fetch_sizes_ranges_and_the_end(store: Any) -> None:
    store.create_topic("sized", 1)
    store.append_records("sized", 0, [ProducerRecord(None, b"x" * 1000, [], 5)] * 100)
    log = ColumnLog(store)
    small = log.fetch("sized", 0, 10, 4_000)
    assert len(small) == 1 and 1 <= len(fetched(log, "sized", 10, 4_000)) <= 3
    assert sum(map(len, small)) <= 4_000
    assert [r.offset for r in fetched(log, "sized", 0, 10)] == [0]  # KIP-74
    whole = fetched(log, "sized")
    assert [r.offset for r in whole] == list(range(100))
    assert log.fetch("sized", 0, 100, 1 << 20) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.fetch("sized", 0, 101, 1 << 20)


def test_a_fetch_fills_its_budget_over_several_reads(store: Any) -> None:
    """Stored records are larger than their wire form: the first read (by stored
    bytes) leaves budget, and later reads fill it to within one record."""
    store.create_topic("many", 1)
    store.append_records("many", 0, [ProducerRecord(None, b"v" * 100, [], 5)] * 20_000)
    out = ColumnLog(store).fetch("many", 0, 0, 1 << 20)
    size = sum(map(len, out))
    assert (1 << 20) - 200 < size <= 1 << 20
    assert len(out) >= 2


def test_a_compacted_topic_keeps_its_offsets_on_both_builders(store: Any) -> None:
    """Offsets with gaps go out as offset deltas with gaps (the Python builder used to
    number them by row: 1, 2, 3, 4)."""
    store.create_topic("c", 1, topic_configs={"cleanup.policy": "compact"})
    keys = [b"a", b"b", b"a", b"c", b"a", b"d"]
    store.append_records("c", 0, [ProducerRecord(k, b"v", [], 5) for k in keys])
    assert store.compact("c")
    for log in (ColumnLog(store), RecordLog(store)):
        assert [(r.offset, r.key) for r in fetched(log, "c")] == [
            (1, b"b"), (3, b"c"), (4, b"a"), (5, b"d"),
        ]  # fmt: skip


def test_librdkafka_round_trip_with_crc_checks(store: Any) -> None:
    """librdkafka produces keyless and keyed records through the broker and reads
    them back with check.crcs on: offsets, keys, values, headers as produced."""
    store.create_topic("wire", 1)
    with Broker(store, BrokerConfig(port=0)) as broker:
        assert isinstance(broker.log, ColumnLog)
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "1"}
        )
        sent = []
        for i in range(3_000):
            key = b"k%d" % i if i % 1_000 == 7 else None
            headers = [("h", b"%d" % i)] if i % 1_000 == 9 else None
            value = None if i == 2_999 else b"value-%d" % i
            producer.produce("wire", value, key, partition=0, headers=headers)
            sent.append((key, value, headers))
        assert producer.flush(30) == 0
        got = [
            (message.offset(), message.key(), message.value(), message.headers())
            for message in librdkafka_read(broker.bootstrap, "wire", 0, len(sent))
        ]
    assert [g[0] for g in got] == list(range(len(sent)))
    assert [(g[1], g[2], g[3]) for g in got] == sent
