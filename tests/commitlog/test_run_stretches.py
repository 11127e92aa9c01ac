"""run_stretches (commitlog/run_stretches.py): C and the twin give the same stretches
and summary as a plain per-row loop, and refuse the same bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.header_scan import (
    DISPATCH_KEYS_LEN,
    DISPATCH_QUEUE_ID,
    DISPATCH_ROWS,
    DISPATCH_STORE_TS,
    DISPATCH_TAG_LEN,
    DISPATCH_TOPIC_HASH,
    DISPATCH_TOPIC_LEN,
    new_columns,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.run_stretches import run_stretches_py, stretches_of

RUNS = [run_stretches_py] if NATIVE is None else [NATIVE.run_stretches, run_stretches_py]

#: A record's fields that run_stretches reads: topic hash, queue id, store timestamp,
#: tag length, keys length, topic length (few values, so stretches and repeats occur).
_rows = st.lists(
    st.tuples(
        st.sampled_from([-(1 << 63), -5, 7, (1 << 63) - 1]),
        st.integers(0, 3),
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=40,
)


def _expected(records: list[tuple[int, ...]]) -> tuple[list[int], int, bool, bool, int]:
    starts = [i for i, r in enumerate(records) if i == 0 or r[:2] != records[i - 1][:2]]
    empty = [i for i, r in enumerate(records) if r[5] == 0]
    return (
        starts, max(r[2] for r in records), any(r[3] for r in records),
        any(r[4] for r in records), empty[0] if empty else len(records),
    )  # fmt: skip


@settings(max_examples=200)
@given(_rows, st.integers(0, 3), st.data())
def test_agrees_with_a_loop(records: list[tuple[int, ...]], extra: int, data) -> None:
    """Stretches of (topic hash, queue id), the largest store timestamp, any tag, any
    keys, the first empty topic; over the first ``count`` rows of a wider array."""
    rows = new_columns(len(records) + extra)
    fields = (DISPATCH_TOPIC_HASH, DISPATCH_QUEUE_ID, DISPATCH_STORE_TS, DISPATCH_TAG_LEN,
              DISPATCH_KEYS_LEN, DISPATCH_TOPIC_LEN)  # fmt: skip
    for column, record in enumerate(records):
        for row, value in zip(fields, record, strict=True):
            rows[row, column] = value
    rows[:, len(records) :] = data.draw(st.integers(0, 9))  # past count: never read
    want = _expected(records)
    for run in RUNS:
        starts = np.full(len(records) + extra, -1, np.int64)
        answer = run(rows, len(records), starts)
        assert (list(starts[: answer[0]]), *answer[1:]) == want
        assert (starts[answer[0] :] == -1).all()  # nothing written past the stretches
        found = stretches_of(rows, len(records), starts)
        assert (found.rows, found.starts.tolist()) == (len(records), want[0])


@pytest.mark.parametrize("run", RUNS)
def test_refuses_bad_arguments(run) -> None:
    rows, starts = new_columns(4), np.zeros(4, np.int64)
    for count in (0, -1, 5):
        with pytest.raises(ValueError):
            run(rows, count, starts)
    with pytest.raises(ValueError):
        run(rows, 4, np.zeros(3, np.int64))  # starts too short
    with pytest.raises(ValueError):
        run(np.zeros(DISPATCH_ROWS * 4 + 1, np.int64), 4, starts)  # not whole rows
    with pytest.raises(TypeError):
        run(rows.astype(np.int32), 4, starts)
    with pytest.raises(TypeError):
        run(rows, 4, np.zeros(4, np.int32))
    readonly = np.zeros(4, np.int64)
    readonly.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        run(rows, 4, readonly)
