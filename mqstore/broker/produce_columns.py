"""Produce on the CommitLog engine: a checked batch's records as columns for the
store's columnar put, with no Python object per record.

``kafka_values(buffer, start, end, count, last_delta)`` (record_spans' arguments) is
``commitlog._native.kafka_values`` (mqstore/broker/_kafka_codec.c) when the C module
is built, else ``kafka_values_py``, its pure-Python twin (also under
``MQSTORE_PURE_PYTHON=1``). Both walk and check the records with ``record_spans``
(Kafka's DefaultRecord.readFrom checks: mqstore.segmented.record_batch), so a batch one
refuses the other refuses alike, and return ``(rows, values, value_offsets)``:

- ``rows``: ``VALUE_FIELDS`` native int64 per record: timestamp delta, key size (-1:
  null), value size (-1: null), header count;
- ``values``: the values one after another (a null one is empty);
- ``value_offsets``: count + 1 native int64 cutting ``values`` (Arrow's layout), what
  ``MessageStore.put_batch_buffers`` takes.

``ProducedColumns.of`` wraps them as numpy arrays. tests/mqstore/broker/
test_produce_columns.py compares the two and fuzzes the C one.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import numpy as np

from mqstore.commitlog.native import NATIVE
from mqstore.segmented.record_batch import HEADER_SIZE, SPAN_FIELDS, record_spans_py

__all__ = ["VALUE_FIELDS", "ProducedColumns", "kafka_values", "kafka_values_py"]

VALUE_FIELDS: Final = 4  # timestamp delta, key size, value size, header count
_MASK64: Final = (1 << 64) - 1


def _varint(buffer: Any, cursor: int, limit: int) -> tuple[int, int]:
    """A zig-zag varint at ``cursor`` (already checked by record_spans); (value, next)."""
    result, shift = 0, 0
    while cursor < limit and shift < 70:
        byte = buffer[cursor]
        cursor += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    result &= _MASK64
    return (-(result >> 1) - 1 if result & 1 else result >> 1), cursor


def kafka_values_py(
    buffer: Any, start: int, end: int, count: int, last_delta: int
) -> tuple[bytes, bytes, bytes]:
    """The pure-Python twin of the C ``kafka_values`` (see the module docstring).

    Raises:
        ValueError: as ``record_spans`` raises for a record that does not decode.
    """
    spans = np.frombuffer(record_spans_py(buffer, start, end, count, last_delta), np.int64)
    data = bytes(buffer)
    rows = np.zeros((len(spans) // SPAN_FIELDS, VALUE_FIELDS), dtype=np.int64)
    values: list[bytes] = []
    offsets = [0]
    for index, span in enumerate(spans.reshape(-1, SPAN_FIELDS).tolist()):
        _, _, key_size, value_at, value_size, record_at, _ = span
        _, cursor = _varint(data, record_at, len(data))  # the record's length
        stamp_delta, _ = _varint(data, cursor + 1, len(data))  # after the attributes
        value = data[value_at : value_at + max(value_size, 0)]
        headers, _ = _varint(data, value_at + len(value), len(data))
        rows[index] = (stamp_delta, key_size, value_size, headers)
        values.append(value)
        offsets.append(offsets[-1] + len(value))
    return rows.tobytes(), b"".join(values), np.array(offsets, dtype=np.int64).tobytes()


kafka_values: Any = kafka_values_py if NATIVE is None else NATIVE.kafka_values


class ProducedColumns(NamedTuple):
    """The records of one checked, uncompressed batch as columns."""

    timestamps_ms: np.ndarray  # int64: base timestamp + each delta (wrapping as Kafka's)
    key_sizes: np.ndarray  # int64, -1: null
    value_sizes: np.ndarray  # int64, -1: null (a tombstone)
    header_counts: np.ndarray  # int64
    values: bytes
    value_offsets: np.ndarray  # int64, count + 1

    @classmethod
    def of(cls, data: bytes, base_timestamp_ms: int, count: int, last_delta: int) -> Any:
        """The columns of the records of ``data``, one whole uncompressed batch.

        Raises:
            ValueError: a record does not decode (``record_spans``' reasons).
        """
        rows, values, offsets = kafka_values(data, HEADER_SIZE, len(data), count, last_delta)
        table = np.frombuffer(rows, np.int64).reshape(-1, VALUE_FIELDS)
        assert len(table) == count
        with np.errstate(over="ignore"):
            stamps = table[:, 0] + np.int64(base_timestamp_ms)
        return cls(
            stamps, table[:, 1], table[:, 2], table[:, 3], values, np.frombuffer(offsets, np.int64)
        )

    @property
    def plain(self) -> bool:
        """No record has a key or a header (what the columnar put stores as is)."""
        return not (self.key_sizes >= 0).any() and not self.header_counts.any()
