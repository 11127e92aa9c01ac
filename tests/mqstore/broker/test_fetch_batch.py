"""Fetch batches built from a CommitLog read's columns (mqstore.broker.fetch_batch):
the C ``kafka_batch`` and its pure-Python twin against Kafka's decoder and each other,
and the C one fuzzed with hostile columns (scripts/sanitize.sh runs this module under
ASan and UBSan; ``MQSTORE_FUZZ_EXAMPLES`` sets the fuzz's examples)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.batch import KEY_NAME
from mqstore.broker.batch import check_produced
from mqstore.broker.fetch_batch import build_batch, kafka_batch_py
from mqstore.commitlog.native import NATIVE
from mqstore.engine import ProducerRecord
from mqstore.segmented.record_batch import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER,
    HEADER_SIZE,
    BatchHeader,
    decode_records,
)
from tests.mqstore.engines import open_engine

EXAMPLES = int(os.environ.get("MQSTORE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # sanitizer builds run 2-5x slower
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
STORE = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
BUILDERS = [kafka_batch_py] + ([NATIVE.kafka_batch] if NATIVE is not None else [])
C_ERRORS = (ValueError, TypeError, OverflowError)

small = st.binary(max_size=40)
# NUL-prefixed names are the store's own (refused: test_commitlog_engine.py)
header_names = st.text(min_size=1, max_size=8).filter(lambda name: not name.startswith("\x00"))
records_st = st.lists(
    st.builds(
        ProducerRecord,
        st.none() | small,  # key
        st.none() | small,  # value (None: a tombstone)
        st.lists(st.tuples(header_names, small), max_size=3),  # headers
        st.none() | st.integers(0, 2**41),  # CreateTime
    ),
    min_size=1,
    max_size=12,
)


def _decoded(data: bytes | bytearray) -> list[Any]:
    """Kafka's view of one built batch: CRC-32C, size and magic checked, records
    decoded (offset deltas may have gaps, as a compacted batch's)."""
    header = BatchHeader._make(HEADER.unpack_from(data, 0))
    assert (header.magic, header.size) == (2, len(data))
    assert crc32c(memoryview(data)[ATTRIBUTES_POSITION:]) == header.crc
    return decode_records(bytes(data), 0, header, header.base_offset, header.records_count)


def _columns(batch: Any, log_append: bool = False) -> tuple[Any, ...]:
    """The 12 column arguments of kafka_batch for a MessageBatch."""
    stamps = batch.store_timestamps_ms if log_append else batch.born_timestamps_ms
    starts = batch.extra_offsets[:-1] + batch.tag_lengths + batch.keys_lengths
    return (
        batch.queue_offsets, stamps, batch.body_data, batch.body_offsets,
        batch.body_valid.view(np.uint8), batch.kafka_key_data, batch.kafka_key_offsets,
        batch.kafka_key_valid.view(np.uint8), batch.extra_data, starts, batch.extra_offsets,
        KEY_NAME,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Any) -> Any:
    opened = open_engine("commitlog", tmp_path / "store")
    yield opened
    opened.close()


@STORE
@given(records=records_st, log_append=st.booleans())
def test_a_read_becomes_the_batch_kafka_decodes_in_c_and_python(
    store: Any, records: list[ProducerRecord], log_append: bool
) -> None:
    """Keys, null values, headers (names and order) and timestamps come back as they
    were appended, the CRC-32C checks, and C and the twin build the same bytes."""
    topics = store.list_topics()
    name = f"t{len(topics)}"
    store.create_topic(name, 1, timestamp_type="LogAppendTime" if log_append else "CreateTime")
    store.append_records(name, 0, [ProducerRecord(*r[:3], r[3]) for r in records])
    read = store.get_batch(name, 0, 0, 100)
    built = [
        bytes(builder(0, len(read), 1 << 20, True, log_append, *_columns(read, log_append))[0])
        for builder in BUILDERS
    ]
    assert all(data == built[0] for data in built)
    data, taken = build_batch(read, 0, 1 << 20, must_take_one=True, log_append=log_append)
    assert data is not None and taken == len(records)
    decoded = _decoded(data)
    assert [r.offset for r in decoded] == list(range(len(records)))
    assert [(r.key, r.value) for r in decoded] == [(r.key, r.value) for r in records]
    assert [r.headers for r in decoded] == [list(r.headers) for r in records]
    stamps = (read.store_timestamps_ms if log_append else read.born_timestamps_ms).tolist()
    assert [r.timestamp_ms for r in decoded] == stamps
    assert check_produced(bytes(data)).header.attributes == (0x08 if log_append else 0)


def test_the_budget_takes_whole_records_and_the_first_always(store: Any) -> None:
    store.create_topic("b", 1)
    store.append_records("b", 0, [ProducerRecord(None, b"x" * 100, [], 5) for _ in range(50)])
    read = store.get_batch("b", 0, 0, 100)
    one, _ = build_batch(read, 0, 1 << 20, must_take_one=True, log_append=False)
    assert one is not None
    record_bytes = (len(one) - HEADER_SIZE) // 50
    for budget in (HEADER_SIZE + record_bytes * 7, HEADER_SIZE + record_bytes * 7 + 3):
        data, taken = build_batch(read, 0, budget, must_take_one=False, log_append=False)
        assert data is not None and (taken, len(data)) == (7, HEADER_SIZE + 7 * record_bytes)
    data, taken = build_batch(read, 10, 10, must_take_one=True, log_append=False)
    assert data is not None and taken == 1  # KIP-74: larger than the budget, still sent
    assert [r.offset for r in _decoded(data)] == [10]
    assert build_batch(read, 10, 10, must_take_one=False, log_append=False) == (None, 0)


def test_a_compacted_queue_keeps_its_offsets(store: Any) -> None:
    """Offsets with gaps (a compacted queue's) are offset deltas with gaps: the old
    Python builder numbered them 1, 2, 3, 4 (the row index)."""
    store.create_topic("c", 1, topic_configs={"cleanup.policy": "compact"})
    keys = [b"a", b"b", b"a", b"c", b"a", b"d"]
    store.append_records("c", 0, [ProducerRecord(k, b"v%d" % i, [], 5) for i, k in enumerate(keys)])
    assert store.compact("c")
    read = store.get_batch("c", 0, 0, 100)
    assert read.queue_offsets.tolist() == [1, 3, 4, 5]
    for builder in BUILDERS:
        data, taken = builder(0, len(read), 1 << 20, True, False, *_columns(read))
        assert taken == 4
        check = bytearray(data)  # the CRC is the caller's (build_batch sets it)
        check[CRC_POSITION:ATTRIBUTES_POSITION] = crc32c(check[ATTRIBUTES_POSITION:]).to_bytes(
            4, "big"
        )
        decoded = _decoded(check)
        assert [(r.offset, r.key) for r in decoded] == [(1, b"b"), (3, b"c"), (4, b"a"), (5, b"d")]


def _arrays(draw: Any, n: int, data_len: int) -> Any:
    """n + 1 int64 offsets: mostly valid (non-decreasing inside data), sometimes not,
    now and then of the wrong length."""
    if draw(st.integers(0, 4)):
        cuts = sorted(draw(st.lists(st.integers(0, data_len), min_size=n + 1, max_size=n + 1)))
        return np.array(cuts, dtype=np.int64)
    values = st.integers(-(2**63), 2**63 - 1) | st.integers(-3, data_len + 3)
    size = draw(st.sampled_from([n + 1, n + 1, n + 1, 0, n, n + 2]))
    return np.array(draw(st.lists(values, min_size=size, max_size=size)), dtype=np.int64)


def _properties(draw: Any) -> bytes:
    """A properties section: well-formed pairs (one maybe the key's), or a mangled one."""
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([KEY_NAME, b"h", b""]))
        value = draw(st.binary(max_size=6))
        parts.append(len(name).to_bytes(2, "little") + name)
        parts.append(len(value).to_bytes(4, "little") + value)
    section = b"".join(parts)
    if section and draw(st.booleans()):
        at = draw(st.integers(0, len(section) - 1))
        section = section[:at] + bytes([draw(st.integers(0, 255))]) + section[at + 1 :]
    return section


@st.composite
def hostile_columns(draw: Any) -> tuple[Any, ...]:
    n = draw(st.integers(1, 6) | st.just(0))
    bodies, keys = draw(st.binary(max_size=64)), draw(st.binary(max_size=16))
    sections = [_properties(draw) for _ in range(n)]
    extras = b"".join(sections)
    ends = np.cumsum([0] + [len(s) for s in sections], dtype=np.int64)
    starts = ends[:-1].copy()
    if draw(st.booleans()) and n:
        starts[draw(st.integers(0, n - 1))] = draw(st.integers(-(2**63), 2**63 - 1))
    offsets = np.array(
        draw(st.lists(st.integers(-5, 2**31 + 5) | st.sampled_from([0, 1, 2, 2**63 - 1]),
                      min_size=n, max_size=n)),
        dtype=np.int64,
    )  # fmt: skip
    if draw(st.integers(0, 3)):  # mostly in order, as a read's are
        offsets = np.sort(offsets)
    stamps = np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)),
                      dtype=np.int64)  # fmt: skip
    body_valid = None if draw(st.booleans()) else np.array(
        draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), dtype=np.uint8
    )  # fmt: skip
    key_valid = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
    return (
        offsets, stamps, bodies, _arrays(draw, n, len(bodies)), body_valid, keys,
        _arrays(draw, n, len(keys)), key_valid, extras, starts, ends, KEY_NAME,
    )  # fmt: skip


@pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")
@FUZZ
@given(
    columns=hostile_columns(),
    first=st.integers(-2, 7),
    count=st.integers(-1, 8),
    budget=st.sampled_from([-1, 0, 10, 61, 70, 200, 1 << 20, 2**63 - 1]),
    flags=st.tuples(st.booleans(), st.booleans()),
)
def test_hostile_columns_never_read_outside_and_c_agrees_with_the_twin(
    columns: tuple[Any, ...], first: int, count: int, budget: int, flags: tuple[bool, bool]
) -> None:
    """Any columns: the C function returns or raises ValueError (never reads outside
    its buffers: ASan's part), and the twin gives the same bytes or raises too."""
    args = (first, count, budget, *flags, *columns)
    outcomes = []
    for builder in BUILDERS:
        try:
            built, taken = builder(*args)
            outcomes.append(("ok", None if built is None else bytes(built), taken))
        except C_ERRORS as error:
            outcomes.append(("raised", type(error).__name__))
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    if outcomes[0][0] == "ok" and outcomes[0][1] is not None:
        assert len(outcomes[0][1]) <= max(budget, 0) or outcomes[0][2] == 1


@pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")
def test_wrong_argument_types_are_type_errors() -> None:
    good = (
        np.zeros(1, np.int64), np.zeros(1, np.int64), b"", np.zeros(2, np.int64), None, b"",
        np.zeros(2, np.int64), np.zeros(1, np.uint8), b"", np.zeros(1, np.int64),
        np.zeros(2, np.int64), KEY_NAME,
    )  # fmt: skip
    assert NATIVE is not None
    built, taken = NATIVE.kafka_batch(0, 1, 100, True, False, *good)
    assert taken == 1 and len(built) == HEADER_SIZE + 7  # the smallest record
    for index, wrong in [(0, np.zeros(1, np.int32)), (2, "text"), (7, np.zeros(1, np.int64))]:
        bad = list(good)
        bad[index] = wrong
        with pytest.raises(TypeError):
            NATIVE.kafka_batch(0, 1, 100, True, False, *bad)
    with pytest.raises(TypeError):
        NATIVE.kafka_batch(0, 1, 100)
