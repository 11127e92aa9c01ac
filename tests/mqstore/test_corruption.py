"""Corruption matrix: damage every kind of file of a CLOSED store, then open and read it.

Kinds: CommitLog, ConsumeQueue unit file, its ``.time`` companion, index file,
checkpoint, topics, offsets. Damage: flip bytes, truncate, zero a range (seeded
positions, half of them inside the written part of the file). For every case, open
must either

- refuse with CorruptDataError naming a file of the store and a position, or
- open; then every message it returns (get, query_by_key, offset_for_time,
  committed offsets, topics) must equal what was written, or the read must raise
  CorruptDataError. Whatever is lost is counted.

Outcomes per case: ``unaffected`` (all data reads back), ``recovered`` (opened,
some data unreadable or truncated, nothing wrong returned), ``refused`` (open raised
CorruptDataError). Anything else fails its case: ``misreported`` (a read raised
OffsetOutOfRangeError for damaged data, or a CorruptDataError naming no file of the
store and position), ``wrong_answer`` (offset_for_time answered
wrongly), a wrong message, an untyped exception. The counts are printed by the last
test (``pytest -s``), which also fails unless misreported and wrong_answer are 0.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import shutil
from pathlib import Path

import pytest

from mqstore import (
    CorruptDataError,
    KafkaConsumer,
    KafkaProducer,
    MessageStore,
    OffsetOutOfRangeError,
    StoreConfig,
    TopicPartition,
)
from mqstore.offsets import OffsetStore
from tests.mqstore.conftest import SMALL

CONFIG = StoreConfig(**SMALL)
# "cq_shared": the same store with each queue's first 100 units in its topic's shared
# unit log (consumequeue/<topic>/.shared/), the rest in files of its own.
SHARED_CONFIG = StoreConfig(**{**SMALL, "consumequeue_shared_units_max": 100})
QUEUES = 2
MESSAGES = 600  # 300 per queue: two CommitLog files, several ConsumeQueue files
KAFKA_RECORDS = 40
BORN_BASE_MS = 1_000_000
# 12 seeds in the unit suite (about 4 s); a wider hunt, e.g. 112 seeds (about 30 s):
# MQSTORE_CORRUPTION_SEEDS=112 pytest -s tests/mqstore/test_corruption.py
SEEDS = range(int(os.environ.get("MQSTORE_CORRUPTION_SEEDS", "12")))
KINDS = (
    "commitlog", "consumequeue", "cq_time", "cq_shared", "index", "checkpoint", "topics",
    "offsets",
)  # fmt: skip
DAMAGES = ("flip", "truncate", "zero")
KEY_PROBE_STEP = 7  # query_by_key for every 7th message: 86 look-ups per case
TIME_PROBES = tuple(range(0, 300, 13))  # offset_for_time: 0, 13, ..., 299 per queue
OUTCOME_NAMES = ("unaffected", "recovered", "refused", "misreported", "wrong_answer")
OUTCOMES: collections.Counter[tuple[str, str]] = collections.Counter()


def _body(i: int) -> bytes:
    return b"message-%05d-" % i + bytes([i % 251]) * (i % 300)


def _config_for(kind: str) -> StoreConfig:
    return SHARED_CONFIG if kind == "cq_shared" else CONFIG


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A closed store with known contents, built once."""
    return _build(tmp_path_factory.mktemp("reference") / "store", CONFIG)


@pytest.fixture(scope="module")
def shared_reference(tmp_path_factory):
    """The same contents with the queues' first units in the shared unit log."""
    path = _build(tmp_path_factory.mktemp("shared-reference") / "store", SHARED_CONFIG)
    assert _files_of(path, "cq_shared"), "the shared log holds no file"
    return path


def _build(path: Path, config: StoreConfig) -> Path:
    with MessageStore.open(path, config) as store:
        store.create_topic("k", partitions=QUEUES)
        for i in range(MESSAGES):
            store.put(
                "t", i % QUEUES, _body(i), keys=[f"key{i}"], born_timestamp_ms=BORN_BASE_MS + i
            )
        producer = KafkaProducer(store)
        for i in range(KAFKA_RECORDS):
            producer.send("k", b"kafka-%d" % i, partition=i % QUEUES)
        consumer = KafkaConsumer(
            "k", store=store, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
        )
        while sum(len(r) for r in consumer.poll(timeout_ms=100).values()):
            pass
        consumer.commit()  # records of __consumer_offsets, in the CommitLog
        committed = store.offsets.load("g")
    # The same offsets as a side file of a store from before offsets went through the
    # log ("offsets" kind): the next open imports it, or refuses the group if damaged.
    OffsetStore(str(path), read_only=False).commit("g", committed)
    return path


def _files_of(root: Path, kind: str) -> list[Path]:
    if kind == "commitlog":
        return sorted((root / "commitlog").iterdir())
    if kind == "cq_shared":
        return sorted(p for p in (root / "consumequeue").glob("*/.shared/*") if p.name.isdigit())
    if kind in ("consumequeue", "cq_time"):
        files = sorted(p for p in (root / "consumequeue").rglob("*") if p.is_file())
        files = [p for p in files if p.parent.name != ".shared"]
        return [p for p in files if p.name.endswith(".time") == (kind == "cq_time")]
    if kind == "index":
        return sorted((root / "index").iterdir())
    if kind == "offsets":
        return [root / "offsets" / "g"]
    return [root / kind]


def _damage(path: Path, damage: str, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    written = len(data.rstrip(b"\0")) or len(data)  # half the cases aim at written bytes
    limit = written if rng.random() < 0.5 else len(data)
    position = rng.randrange(max(limit, 1))
    if damage == "flip":
        for _ in range(rng.randint(1, 4)):
            spot = min(len(data) - 1, position + rng.randrange(64))
            data[spot] ^= 1 << rng.randrange(8)
    elif damage == "truncate":
        del data[position:]
    else:
        end = min(len(data), position + rng.randint(1, 256))
        data[position:end] = bytes(end - position)
    path.write_bytes(bytes(data))
    return f"{damage} {path.name} at {position} of {len(data)}"


def _check_contents(store: MessageStore) -> int:
    """Compare everything the store returns with what was written; return how many
    items were unreadable (lost or refused with CorruptDataError)."""
    lost = 0
    for queue in range(QUEUES):
        expected = [_body(i) for i in range(queue, MESSAGES, QUEUES)]
        lost += _check_queue(store, "t", queue, expected)
        kafka = [b"kafka-%d" % i for i in range(queue, KAFKA_RECORDS, QUEUES)]
        lost += _check_queue(store, "k", queue, kafka)
        lost += _check_times(store, queue)
    for i in range(0, MESSAGES, KEY_PROBE_STEP):
        try:
            hits = store.query_by_key("t", f"key{i}", 0, 2**62, 4)
        except CorruptDataError as error:
            lost += _unreadable(store, error)
            continue
        assert all(bytes(m.body) == _body(i) for m in hits), f"key{i} returned a wrong message"
        lost += not hits
    assert set(store.list_topics()) <= {"t", "k"}
    return lost


def _check_queue(store: MessageStore, topic: str, queue: int, expected: list[bytes]) -> int:
    low, high = store.min_offset(topic, queue), store.max_offset(topic, queue)
    assert 0 <= low <= high <= len(expected), (topic, queue, low, high)
    lost = low + len(expected) - high
    offset = low
    while offset < high:
        try:
            messages = store.get(topic, queue, offset, 100)
        except CorruptDataError as error:
            lost += _unreadable(store, error)
            offset += 1
            continue
        assert messages, f"{topic}/{queue}: nothing at {offset} below {high}"
        for message in messages:
            assert message.queue_offset == offset
            assert bytes(message.body) == expected[offset], f"{topic}/{queue}@{offset} differs"
            offset += 1
    return lost


class WrongAnswerError(AssertionError):
    """offset_for_time answered wrongly without raising CorruptDataError."""


class MisreportedError(AssertionError):
    """A read refused damaged data without naming a file of the store and a position."""


def _unreadable(store: MessageStore, error: CorruptDataError) -> int:
    """Count one read refused with ``error``, which must say where the damage is."""
    root = os.path.abspath(store.root)
    path = os.path.abspath(error.path)
    if os.path.commonpath([path, root]) != root:
        raise MisreportedError(f"{error}: {path} is not a file of the store {root}")
    if not isinstance(error.position, int) or error.position < 0:
        raise MisreportedError(f"{error}: position {error.position!r}")
    return 1


def _check_times(store: MessageStore, queue: int) -> int:
    """offset_for_time must return the first offset born at or after the time, or
    raise CorruptDataError; returns 1 when the answer is unreadable."""
    low, high = store.min_offset("t", queue), store.max_offset("t", queue)
    for offset in TIME_PROBES:
        born_ms = BORN_BASE_MS + offset * QUEUES + queue
        try:
            found = store.offset_for_time("t", queue, born_ms)
        except CorruptDataError as error:
            return _unreadable(store, error)
        if offset >= high:  # truncated away: None, or nothing before the end
            if found is not None:
                raise WrongAnswerError(f"t/{queue}: {found} for a time past the end {high}")
            return 1
        expected = max(offset, low)
        if found != expected:
            raise WrongAnswerError(f"t/{queue}: offset_for_time gave {found}, not {expected}")
    return 0


def _check_committed(store: MessageStore, kind: str) -> int:
    consumer = KafkaConsumer(store=store, group_id="g", enable_auto_commit=False)
    try:
        for queue in range(QUEUES):
            try:
                committed = consumer.committed(TopicPartition("k", queue))
            except CorruptDataError as error:
                assert "offsets" in error.path
                return _unreadable(store, error)
            if committed is None and kind == "commitlog":
                return 1  # a commit's record cut by the damage: lost, never wrong
            assert committed == KAFKA_RECORDS // QUEUES, committed
    finally:
        consumer.close(autocommit=False)
    return 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_damaged_file_is_recovered_or_refused(request, tmp_path, caplog, kind, damage, seed):
    root = tmp_path / "store"
    source = request.getfixturevalue("shared_reference" if kind == "cq_shared" else "reference")
    shutil.copytree(source, root)
    rng = random.Random(f"{kind}-{damage}-{seed}")
    victim = rng.choice(_files_of(root, kind))
    what = _damage(victim, damage, rng)
    caplog.set_level(logging.WARNING)
    try:
        store = MessageStore.open(root, _config_for(kind))
    except CorruptDataError as error:
        assert os.path.commonpath([error.path, str(root)]) == str(root), what
        assert isinstance(error.position, int)
        assert error.position >= 0
        assert error.path in str(error)
        OUTCOMES[(kind, "refused")] += 1
        return
    with store:
        try:
            lost = _check_contents(store) + _check_committed(store, kind)
        except OffsetOutOfRangeError as error:
            # A damaged unit pointing past the CommitLog must be corruption, not
            # "retention moved the log start" (a consumer would skip the partition).
            OUTCOMES[(kind, "misreported")] += 1
            pytest.fail(f"{what}: misreported as OffsetOutOfRangeError: {error}")
        except MisreportedError as error:
            OUTCOMES[(kind, "misreported")] += 1
            pytest.fail(f"{what}: misreported: {error}")
        except WrongAnswerError as error:
            OUTCOMES[(kind, "wrong_answer")] += 1
            pytest.fail(f"{what}: wrong answer: {error}")
    OUTCOMES[(kind, "recovered" if lost else "unaffected")] += 1


def test_unit_pointing_past_the_commitlog_is_corrupt_data(tmp_path):
    """A ConsumeQueue unit whose CommitLog offset lies past the log is corruption.

    Today get() raises OffsetOutOfRangeError, which KafkaConsumer takes for "retention
    moved the log start" and resets the position: with auto_offset_reset="latest" it
    silently skips the rest of the partition."""
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as store:
        store.create_topic("k", partitions=1)
        producer = KafkaProducer(store)
        for i in range(10):
            producer.send("k", b"%d" % i, partition=0)
    unit_file = path / "consumequeue" / "k" / "0" / ("0" * 20)
    data = bytearray(unit_file.read_bytes())
    data[3 * 20 + 4] ^= 0x80  # bit 39 of unit 3's commitlog_offset: far past the log
    unit_file.write_bytes(bytes(data))
    with MessageStore.open(path, CONFIG) as store:
        assert [bytes(m.body) for m in store.get("k", 0, 0, 3)] == [b"0", b"1", b"2"]
        with pytest.raises(CorruptDataError) as caught:
            store.get("k", 0, 3, 1)
        assert caught.value.path.startswith(str(path / "consumequeue" / "k" / "0"))
        consumer = KafkaConsumer(store=store, auto_offset_reset="latest")
        consumer.assign([TopicPartition("k", 0)])
        consumer.seek(TopicPartition("k", 0), 3)
        with pytest.raises(CorruptDataError):
            consumer.poll(timeout_ms=0)
        assert consumer.position(TopicPartition("k", 0)) == 3  # not skipped to the end


def test_unit_with_a_negative_commitlog_offset_is_corrupt_data(tmp_path):
    """A unit whose CommitLog offset turned negative (its sign bit flipped) is
    corruption: retention never moves the log start below 0. Found by the matrix's
    wider run (seed 74, consumequeue flip), where get raised OffsetOutOfRangeError."""
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as store:
        for i in range(10):
            store.put("t", 0, b"%d" % i)
    unit_file = path / "consumequeue" / "t" / "0" / ("0" * 20)
    data = bytearray(unit_file.read_bytes())
    data[3 * 20 + 7] ^= 0x80  # the sign bit of unit 3's commitlog_offset (i64, LE)
    unit_file.write_bytes(bytes(data))
    with MessageStore.open(path, CONFIG) as store:
        assert [bytes(m.body) for m in store.get("t", 0, 0, 3)] == [b"0", b"1", b"2"]
        with pytest.raises(CorruptDataError):
            store.get("t", 0, 3, 1)


def test_zz_outcome_counts():
    """Print the matrix; each kind must have been damaged somewhere it matters."""
    cases = len(KINDS) * len(DAMAGES) * len(SEEDS)
    assert sum(OUTCOMES.values()) == cases, "run the whole module to count outcomes"
    print()
    for kind in KINDS:
        row = {o: OUTCOMES[(kind, o)] for o in OUTCOME_NAMES}
        print(f"{kind:>13}: {row}")
    totals = collections.Counter()
    for (_, outcome), count in OUTCOMES.items():
        totals[outcome] += count
    print(f"{'total':>13}: {dict(totals)} of {cases} cases")
    assert totals["misreported"] == 0, "a damaged file was misreported"
    assert totals["wrong_answer"] == 0, "a damaged file gave a wrong answer"
    for kind in ("commitlog", "consumequeue", "cq_shared", "topics", "offsets"):
        assert OUTCOMES[(kind, "unaffected")] < len(DAMAGES) * len(SEEDS), kind


def test_zeroed_time_file_gives_no_wrong_answer(tmp_path):
    """Zeroed bytes in a ``.time`` companion (timestamps and block maxima) must not
    turn into a wrong offset_for_time answer: the right offset or CorruptDataError."""
    path = tmp_path / "s"
    with MessageStore.open(path, CONFIG) as store:
        for i in range(40):
            store.put("t", 0, b"%d" % i, born_timestamp_ms=BORN_BASE_MS + i)
    time_file = path / "consumequeue" / "t" / "0" / ("0" * 20 + ".time")
    data = bytearray(time_file.read_bytes())
    data[32:] = bytes(len(data) - 32)  # keep the header, zero every timestamp
    time_file.write_bytes(bytes(data))
    with MessageStore.open(path, CONFIG) as store:
        try:
            found = store.offset_for_time("t", 0, BORN_BASE_MS + 30)
        except CorruptDataError:
            return
        assert found == 30
