"""A follower's CommitLog append: bytes copied from a leader, checked before they land.

A follower's log is a byte-for-byte copy of its leader's: the leader streams its
CommitLog by physical offset and the follower appends each chunk at exactly its own
write position (``CommitLog.append_replica``). Before a byte is written the chunk is
cut into the files it covers and every record in it is verified here
(``plan_replica_chunk``), with the recovery scan's checks (``scan_records``, C when
built: framing, magic, XXH64 checksum, the record's own physical offset) plus the
append path's file rules:

- a message record ends at least ``BLANK_SIZE`` bytes before its file's end (every
  file keeps room for a blank record);
- an end-of-file blank record fills its file exactly, so the follower rolls at the
  leader's positions and its files stay byte-identical;
- the chunk ends at a record boundary: a torn record (half of one, or a prefix
  shorter than ``BLANK_SIZE``) and zeros are refused.

Anything else is a ``CorruptDataError`` naming the stream position, and nothing of the
chunk is written. The chunk's queue offsets are folded into the queue-offset table as
recovery folds scanned records (``fold_columns``), so a promoted follower continues
every queue's offsets where the leader stopped.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple, NoReturn

from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.record import (
    BLANK_SIZE,
    SCAN_BLANK,
    SCAN_FULL,
    SCAN_INVALID,
    SCAN_LIMIT,
    SCAN_ZEROS,
    decode,
    scan_records,
)
from mqstore.commitlog.recovery import SCAN_ROWS, ScanColumns, fold_columns

__all__ = ["REPLICA_STREAM", "ReplicaPlan", "plan_replica_chunk"]

#: The "path" CorruptDataError names for bytes that came from a leader, not a file.
REPLICA_STREAM: Final = "<replica stream>"
#: Records verified per scan_records call: recovery's arrays (SCAN_ROWS rows).
assert SCAN_ROWS >= 1


class ReplicaPlan(NamedTuple):
    """A verified chunk: where each piece goes and what it changes.

    ``pieces`` are (physical start, chunk start, chunk end), one per file touched, in
    order; ``newest_store_ts_ms`` is the largest store timestamp of its messages (0:
    none); ``queue_offsets`` maps each (topic, queue id) it holds to its next offset;
    ``group_end`` is the physical end of its last record that closes an append group
    (None: no record does), and ``ends_open`` whether its last message record leaves
    its group open (record.py's FLAG_GROUP_OPEN).
    """

    pieces: list[tuple[int, int, int]]
    newest_store_ts_ms: int
    queue_offsets: dict[tuple[str, int], int]
    group_end: int | None = None
    ends_open: bool = False


def plan_replica_chunk(data: Any, position: int, file_size_bytes: int) -> ReplicaPlan:
    """Verify ``data`` as whole records starting at physical ``position``.

    Args:
        data: the bytes copied from the leader (any buffer).
        position: the physical offset of ``data[0]`` (the follower's write position).
        file_size_bytes: the CommitLog's file size; files start at its multiples.

    Returns:
        The plan ``CommitLog.append_replica`` writes.

    Raises:
        CorruptDataError: a record does not verify, breaks a file rule, or is cut off.
    """
    assert position >= 0
    assert file_size_bytes > BLANK_SIZE
    view = memoryview(data).cast("B")
    length = view.nbytes
    columns = ScanColumns()
    table: dict[tuple[str, int], int] = {}
    pieces: list[tuple[int, int, int]] = []
    newest_ts_ms = 0
    at = 0  # chunk offset of the current piece's next record
    piece_start = 0
    group_end: int | None = None
    ends_open = False
    while at < length:
        physical = position + at
        file_end = (physical // file_size_bytes + 1) * file_size_bytes
        limit = min(length, file_end - position)
        end, count, status, closed = scan_records(
            view, at, limit, position, columns.positions, columns.sizes, columns.queue_offsets,
            columns.queue_ids, columns.stamps, columns.topic_lens, columns.topic_hashes,
        )  # fmt: skip
        if count:
            last_start = int(columns.positions[count - 1])
            if position + last_start + int(columns.sizes[count - 1]) > file_end - BLANK_SIZE:
                _refuse(view, position, last_start, "no room for a blank record after it")
            newest_ts_ms = max(newest_ts_ms, fold_columns(view, count, columns, table))
            if closed:
                row = closed - 1
                group_end = position + int(columns.positions[row] + columns.sizes[row])
            ends_open = closed < count
        at = end
        if status == SCAN_FULL:
            continue
        if status == SCAN_BLANK:
            if position + end != file_end:
                _refuse(view, position, end, "a blank record does not end its file")
            pieces.append((position + piece_start, piece_start, end))
            piece_start = end
            continue
        if status == SCAN_ZEROS:
            _refuse(view, position, end, "zeros where a record should start")
        if status == SCAN_INVALID:
            _refuse(view, position, end, _reason(view, position, end, limit))
        assert status == SCAN_LIMIT
        if end != length:
            _refuse(view, position, end, "the chunk ends inside a record (torn)")
    if piece_start < length:
        pieces.append((position + piece_start, piece_start, length))
    assert sum(stop - start for _, start, stop in pieces) == length
    return ReplicaPlan(pieces, newest_ts_ms, table, group_end, ends_open)


def _reason(view: memoryview, position: int, at: int, limit: int) -> str:
    """Why the record at chunk offset ``at`` does not verify (decode says)."""
    try:
        decode(view, at, limit, REPLICA_STREAM, position)
    except CorruptDataError as error:
        return error.reason
    return "the record does not verify"  # pragma: no cover - scan and decode agree


def _refuse(view: memoryview, position: int, at: int, reason: str) -> NoReturn:
    """Raise the CorruptDataError for the chunk at chunk offset ``at``."""
    del view  # the reason is already worded; the view is the caller's to release
    raise CorruptDataError(REPLICA_STREAM, position + at, reason)
