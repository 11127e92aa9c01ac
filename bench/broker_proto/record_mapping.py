"""Mapping option A, prototype: every Kafka record one CommitLog record (today's model).

    Produce: check the batch (wire_batch), decode its records, append them with the
             engine's ``append_records`` (key -> the ``\\0key`` property and an index
             key, headers -> properties, timestamp -> born timestamp): exactly what the
             embedded KafkaProducer stores, so everything reads them as today.
    Fetch:   read the records back (``read_records``) and build one record batch v2
             around them: varints, CRC-32C, base offset = the fetch offset.

Both directions run in Python here; bench/broker_build.c is the Fetch loop in C, to
measure what this option would cost once moved to C. Compressed batches are refused
(this prototype does not decompress; docs/BROKER.md gives the cost).

Crash policy: the store's (append_records appends a batch under one lock; a crash
keeps a prefix of it, never a torn record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from bench.broker_proto.wire_batch import INVALID_RECORD, InvalidBatchError, split_batches
from mqstore.engine import TIMESTAMP_LOG_APPEND_TIME, ProducerRecord
from mqstore.segmented.record_batch import (
    COMPRESSION_MASK,
    HEADER,
    BatchHeader,
    build_batch,
    decode_records,
    encode_record,
    set_base_offset,
)

if TYPE_CHECKING:
    from mqstore.store import MessageStore

__all__ = ["FETCH_RECORDS_MAX", "append_produced", "build_fetch_batch"]

FETCH_RECORDS_MAX: Final = 10_000  # MessageStore.get's bound per call (GET_MESSAGES_MAX)


def append_produced(store: MessageStore, topic: str, partition: int, records: bytes) -> int:
    """Append the records of a Produce request's partition; return the base offset.

    Raises:
        InvalidBatchError: the batch fails the broker's checks, or is compressed.
    """
    (produced,) = split_batches(records)
    if produced.attributes & COMPRESSION_MASK:
        raise InvalidBatchError(f"{produced.codec} batches are not decoded here", INVALID_RECORD)
    header = BatchHeader._make(HEADER.unpack_from(records, 0))
    decoded = decode_records(records, 0, header, header.base_offset, header.records_count)
    appended = store.append_records(
        topic,
        partition,
        [ProducerRecord(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded],
    )
    return appended[0].offset


def build_fetch_batch(
    store: MessageStore, topic: str, partition: int, offset: int, max_records: int
) -> bytearray | None:
    """One record batch v2 holding the records from ``offset`` (at most
    ``max_records``), or None when there are none."""
    stored = store.read_records(topic, partition, offset, min(max_records, FETCH_RECORDS_MAX))
    if not stored:
        return None
    base_ts = stored[0].timestamp_ms
    encoded = [
        encode_record(
            index,
            record.timestamp_ms - base_ts,
            record.key,
            record.value,
            [(name.encode("utf-8"), value) for name, value in record.headers],
        )
        for index, record in enumerate(stored)
    ]
    log_append = stored[0].timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    max_ts = max(record.timestamp_ms for record in stored)
    batch = build_batch(encoded, base_ts, max_ts, log_append)
    set_base_offset(batch, offset)
    return batch
