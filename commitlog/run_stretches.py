"""What grouping a run of dispatch columns needs, in one pass: ``run_stretches``.

``run_stretches(rows, count, starts)`` reads the first ``count`` columns of ``rows`` (an
int64 array of commitlog/header_scan.py's DISPATCH_ROWS rows: the dispatcher's columns,
as ``dispatch_columns`` or the recovery scan's ``scan_records`` fill them) and returns
``(stretches, store_ts_max, tagged, keyed, first_empty_topic)``::

    starts[:stretches]   the row where each stretch of one (topic hash, queue id) starts
                         (row 0 starts the first; the rows of one put batch are one)
    store_ts_max         the largest store timestamp of the rows
    tagged, keyed        whether any row has a tag, any has keys
    first_empty_topic    the first row whose topic is empty (``count``: none)

Why: the recovery scan's re-dispatch (dispatch/scan_dispatch.py) groups every run per
queue and folds it into the queue-offset table; found with numpy, that took a dozen
passes over 64 Ki-row columns in the thread that writes the units, memory-bound. Here
it is one pass, made in the thread that scanned the run (the C version runs without the
GIL), and the grouping then works on the stretches (a few hundred a run, not 64 Ki).

``count`` is at least 1 and at most the rows' width and ``starts``' length (else a
ValueError). The C version is in commitlog/_dispatch.c; ``run_stretches_py`` is its
pure-Python twin (``MQSTORE_PURE_PYTHON=1``), held to the same answers by
tests/commitlog/test_run_stretches.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mqstore.commitlog.header_scan import (
    DISPATCH_KEYS_LEN,
    DISPATCH_QUEUE_ID,
    DISPATCH_ROWS,
    DISPATCH_STORE_TS,
    DISPATCH_TAG_LEN,
    DISPATCH_TOPIC_HASH,
    DISPATCH_TOPIC_LEN,
)
from mqstore.commitlog.native import NATIVE

__all__ = ["Stretches", "run_stretches", "run_stretches_py", "stretches_of"]


class Stretches(NamedTuple):
    """``run_stretches``' answer for the first ``rows`` columns, with the starts it
    wrote."""

    rows: int
    starts: np.ndarray  # int64: the row each stretch of one queue starts at
    store_ts_max: int
    tagged: bool
    keyed: bool
    first_empty_topic: int  # the run's count when no topic is empty


def run_stretches_py(rows: Any, count: int, starts: Any) -> tuple[int, int, bool, bool, int]:
    """The twin of the C ``run_stretches`` (see the module)."""
    if not isinstance(rows, np.ndarray) or rows.dtype.kind not in "iu" or rows.itemsize != 8:
        raise TypeError("rows must be a contiguous, aligned array of 8-byte integers")
    if not isinstance(starts, np.ndarray) or starts.dtype.kind not in "iu" or starts.itemsize != 8:
        raise TypeError("starts must be a contiguous, aligned array of 8-byte integers")
    if not rows.flags.c_contiguous or not starts.flags.c_contiguous or not starts.flags.writeable:
        raise TypeError("rows and starts must be contiguous (starts writable)")
    width = rows.size // DISPATCH_ROWS
    if rows.size != width * DISPATCH_ROWS or not 1 <= count <= min(width, starts.size):
        raise ValueError("run_stretches: bad count or short arrays")
    table = rows.reshape(DISPATCH_ROWS, width)[:, :count].astype(np.int64)
    hashes, queue_ids = table[DISPATCH_TOPIC_HASH], table[DISPATCH_QUEUE_ID]
    changed = np.flatnonzero((hashes[1:] != hashes[:-1]) | (queue_ids[1:] != queue_ids[:-1]))
    found = np.concatenate(([0], changed + 1))
    starts.reshape(-1)[: len(found)] = found
    empty = np.flatnonzero(table[DISPATCH_TOPIC_LEN] == 0)
    return (
        len(found), int(table[DISPATCH_STORE_TS].max()), bool(table[DISPATCH_TAG_LEN].any()),
        bool(table[DISPATCH_KEYS_LEN].any()), int(empty[0]) if len(empty) else count,
    )  # fmt: skip


run_stretches = run_stretches_py if NATIVE is None else NATIVE.run_stretches


def stretches_of(rows: np.ndarray, count: int, starts: np.ndarray) -> Stretches:
    """``run_stretches`` of a run's first ``count`` columns, into ``starts`` (a view of
    it is the answer's ``starts``)."""
    stretches, store_ts_max, tagged, keyed, first_empty_topic = run_stretches(rows, count, starts)
    assert 1 <= stretches <= count
    return Stretches(count, starts[:stretches], store_ts_max, tagged, keyed, first_empty_topic)
