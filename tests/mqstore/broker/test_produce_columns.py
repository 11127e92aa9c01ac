"""A produced batch's records as columns (mqstore.broker.produce_columns): the C
``kafka_values`` and its pure-Python twin against Kafka's decoder and each other, and
both fed damaged batches (scripts/sanitize.sh runs this module under ASan and UBSan;
``MQSTORE_FUZZ_EXAMPLES`` sets the fuzz's examples)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.broker.produce_columns import ProducedColumns, kafka_values_py
from mqstore.commitlog.native import NATIVE
from mqstore.segmented import batch_builder
from mqstore.segmented.record_batch import HEADER_SIZE, check_batch, decode_records
from tests.segmented.strategies import producer_records

EXAMPLES = int(os.environ.get("MQSTORE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUNCTIONS = [kafka_values_py] + ([NATIVE.kafka_values] if NATIVE is not None else [])


def _batch(records: list[Any]) -> bytes:
    return bytes(batch_builder.build(records, 1_700_000_000_000, False, 1 << 30).batch)


def _outcomes(*args: Any) -> list[Any]:
    outcomes = []
    for function in FUNCTIONS:
        try:
            outcomes.append(("ok", function(*args)))
        except ValueError as error:
            outcomes.append(("raised", error.args[0]))
    return outcomes


@settings(deadline=None)
@given(records=st.lists(producer_records, min_size=1, max_size=8))
def test_the_columns_are_what_kafka_decodes_in_c_and_python(records: list[Any]) -> None:
    data = _batch(records)
    header = check_batch(data, 0)
    args = (data, HEADER_SIZE, len(data), header.records_count, header.last_offset_delta)
    outcomes = _outcomes(*args)
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    columns = ProducedColumns.of(
        data, header.base_timestamp, header.records_count, header.last_offset_delta
    )
    decoded = decode_records(data, 0, header, 0, header.records_count)
    assert columns.timestamps_ms.tolist() == [r.timestamp_ms for r in decoded]
    assert columns.key_sizes.tolist() == [-1 if r.key is None else len(r.key) for r in decoded]
    assert columns.value_sizes.tolist() == [
        -1 if r.value is None else len(r.value) for r in decoded
    ]
    assert columns.header_counts.tolist() == [len(r.headers) for r in decoded]
    offsets = columns.value_offsets.tolist()
    values = [columns.values[a:b] for a, b in itertools.pairwise(offsets)]
    assert values == [r.value or b"" for r in decoded]
    assert columns.plain == all(r.key is None and not r.headers for r in decoded)


@FUZZ
@given(
    records=st.lists(producer_records, min_size=1, max_size=4),
    position=st.integers(min_value=0, max_value=10_000),
    value=st.integers(0, 255),
    count_shift=st.sampled_from([0, 0, 0, -1, 1, 2**31]),
)
def test_damaged_records_are_refused_alike_and_never_read_outside(
    records: list[Any], position: int, value: int, count_shift: int
) -> None:
    """A byte of the records replaced, or a record count that lies: C and the twin
    return the same columns or raise the same (position, reason); every value they
    gather lies inside the batch."""
    data = bytearray(_batch(records))
    header = check_batch(bytes(data), 0)
    data[HEADER_SIZE + position % (len(data) - HEADER_SIZE)] = value
    count = header.records_count + count_shift
    outcomes = _outcomes(bytes(data), HEADER_SIZE, len(data), count, count - 1)
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    if outcomes[0][0] == "ok":
        _, values, offsets = outcomes[0][1]
        assert len(values) <= len(data)
        assert np.frombuffer(offsets, np.int64)[-1] == len(values)


@pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")
def test_bad_arguments_are_errors_not_reads() -> None:
    assert NATIVE is not None
    with pytest.raises(TypeError):
        NATIVE.kafka_values(b"", 0, 0)
    with pytest.raises(TypeError):
        NATIVE.kafka_values("text", 0, 0, 0, -1)
    for start, end in [(-1, 10), (10, 5), (0, 1 << 40)]:
        with pytest.raises(ValueError):
            NATIVE.kafka_values(b"x" * 70, start, end, 1, 0)
