"""Batches checked outside the lock (commitlog/batch.py): whole-batch refusal with the
typed errors, and an ``encode`` that stops at the file's end for the caller to roll."""

from __future__ import annotations

import numpy as np
import pytest

from mqstore.commitlog.batch import (
    BATCH_MESSAGES_MAX,
    check_queue_id,
    check_timestamp,
    prepare_batch,
    prepare_slices,
)
from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError, LimitExceededError
from mqstore.commitlog.record import BLANK_SIZE, HEADER_SIZE, decode

LIMIT = 1_000


def test_plain_and_encoded_batches_write_their_records_until_the_file_ends() -> None:
    plain = prepare_batch("t", 1, [b"a" * 10, None, b"c"], None, "tag", None, 7, LIMIT)
    keyed = prepare_batch("t", 1, [b"a" * 10, None, b"c"], [["k"], None, "k2"], None, None,
                          None, LIMIT)  # fmt: skip
    assert plain.encoded is None and plain.tag == b"tag" and plain.born_ts_ms == 7
    assert keyed.encoded is not None and len(keyed.encoded) == 3
    for batch in (plain, keyed):
        sizes = batch.sizes.tolist()
        room = sizes[0] + sizes[1] + BLANK_SIZE  # two records fit, the third does not
        buffer = bytearray(room)
        positions = np.zeros(3, np.int64)
        stop = batch.encode(buffer, 0, room, 5_000, 40, 99, 0, positions)
        assert stop == 2
        assert positions[:2].tolist() == [5_000, 5_000 + sizes[0]]
        first = decode(buffer, 0, room, "f", 5_000)
        assert first is not None and first.queue_offset == 40 and first.queue_id == 1
        assert first.store_ts_ms == 99
        assert first.born_ts_ms == (7 if batch is plain else 99)


def test_slices_are_bodies_of_one_buffer() -> None:
    data = b"helloworld"
    batch = prepare_slices("t", 0, np.array([0, 5, 10]), data, np.array([0, 1]), None, None,
                           LIMIT)  # fmt: skip
    assert batch.sizes.tolist() == [HEADER_SIZE + 1 + 5, HEADER_SIZE + 1]
    buffer = bytearray(1_000)
    positions = np.zeros(2, np.int64)
    assert batch.encode(buffer, 0, 1_000, 0, 0, 1, 0, positions) == 2
    record = decode(buffer, 0, 1_000, "f", 0)
    assert record is not None and bytes(record.body or b"") == b"hello"


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("t", True, [b"x"]), InvalidTypeError, "queue_id must be an int, not bool"),
        (("t", -1, [b"x"]), InvalidArgumentError, "outside"),
        (("t", 0, [b"x", "text"]), InvalidTypeError, "body must be bytes-like, not str"),
        (("t", 0, [b"x" * LIMIT]), LimitExceededError, "record 0 of"),
        (("../x", 0, [b"x"]), InvalidArgumentError, "invalid topic name"),
    ],
)
def test_a_bad_record_refuses_the_whole_batch(args, error, message) -> None:
    with pytest.raises(error, match=message):
        prepare_batch(*args, None, None, None, None, LIMIT)


def test_lengths_and_counts_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="keys has 1 items for 2 bodies"):
        prepare_batch("t", 0, [b"a", b"b"], [["k"]], None, None, None, LIMIT)
    with pytest.raises(InvalidArgumentError, match="born_ts_ms has 1 items"):
        prepare_batch("t", 0, [b"a", b"b"], None, None, None, [5], LIMIT)
    with pytest.raises(InvalidArgumentError, match="offsets must increase"):
        prepare_slices("t", 0, np.array([0, 5, 3]), b"x" * 10, None, None, None, LIMIT)
    with pytest.raises(LimitExceededError, match="at most"):
        prepare_slices("t", 0, np.zeros(BATCH_MESSAGES_MAX + 2, np.int64), b"", None, None,
                       None, LIMIT)  # fmt: skip
    with pytest.raises(InvalidTypeError):
        check_queue_id(1.0)
    with pytest.raises(InvalidArgumentError):
        check_timestamp(2**63)
