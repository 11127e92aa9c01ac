"""The dispatcher's header scan: per-record columns of a run of CommitLog records.

``dispatch_columns(buffer, start, stop, file_size, hard_end, file_start, verify, out)``
walks the records of one file from the record boundary ``start`` and writes one column
per record into ``out``, an int64 array of ``DISPATCH_ROWS`` rows (``new_columns``)::

    row                    what
    DISPATCH_PHYSICAL      physical offset (checked: file_start + position in file)
    DISPATCH_SIZE          total size
    DISPATCH_QUEUE_OFFSET  queue offset
    DISPATCH_QUEUE_ID      queue id
    DISPATCH_BORN_TS       born timestamp (CreateTime)
    DISPATCH_STORE_TS      store timestamp (LogAppendTime)
    DISPATCH_TOPIC_HASH    XXH64 (seed 0) of the topic bytes, as a signed int64
    DISPATCH_TOPIC_LEN     topic length; the topic starts HEADER_SIZE into the record
    DISPATCH_TAG_LEN       tag length; the tag follows the topic
    DISPATCH_KEYS_LEN      keys length; the keys follow the tag
    DISPATCH_FLAGS         the record's flags (record.py's FLAG_*)

It takes every record that starts before ``stop`` whole, and returns ``(end, count,
status)``: where it stopped (a record boundary), the columns filled, and why
(``DISPATCH_*``): ``out`` full, ``stop`` reached, a valid end-of-file blank record
(``end`` is then the file's end), or a record that does not parse, which starts at
``end``.

A record parses when the dispatcher can use its header without trusting it: a
message magic, a size of at least a header that ends by ``hard_end`` (the written
end, in-file) and leaves room for a blank record in the file, sections that add up to
the size, its own physical offset, known flags and an ASCII topic of at least one
byte. A blank record must fill the rest of its file and end by ``hard_end``. With
``verify`` every record is also checked as ``record.decode`` checks it (checksum,
UTF-8 tag): the dispatcher passes it for bytes no verifying scan has vouched for.

The C version (commitlog/_dispatch.c) runs without the GIL; ``dispatch_columns_py``
is its pure-Python twin (``MQSTORE_PURE_PYTHON=1``), and tests/commitlog/
test_header_scan.py holds them to the same answers.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import xxhash

from mqstore.commitlog.native import NATIVE, check_layout
from mqstore.commitlog.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    FLAGS_KNOWN,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    PREFIX,
    checksum,
)

__all__ = [
    "DISPATCH_BLANK",
    "DISPATCH_FLAGS",
    "DISPATCH_FULL",
    "DISPATCH_INVALID",
    "DISPATCH_ROWS",
    "DISPATCH_STOP",
    "dispatch_columns",
    "dispatch_columns_py",
    "new_columns",
]

#: Why dispatch_columns stopped (the C enum DISPATCH_* in commitlog/_native.h).
DISPATCH_FULL: Final = 0  # ``out`` is full: call again from ``end``
DISPATCH_STOP: Final = 1  # every record that starts before ``stop`` is taken
DISPATCH_BLANK: Final = 2  # a valid blank record: ``end`` is the file's end
DISPATCH_INVALID: Final = 3  # the record at ``end`` does not parse (or verify)

#: The rows of ``out`` (the C enum in commitlog/_native.h).
DISPATCH_PHYSICAL: Final = 0
DISPATCH_SIZE: Final = 1
DISPATCH_QUEUE_OFFSET: Final = 2
DISPATCH_QUEUE_ID: Final = 3
DISPATCH_BORN_TS: Final = 4
DISPATCH_STORE_TS: Final = 5
DISPATCH_TOPIC_HASH: Final = 6
DISPATCH_TOPIC_LEN: Final = 7
DISPATCH_TAG_LEN: Final = 8
DISPATCH_KEYS_LEN: Final = 9
DISPATCH_FLAGS: Final = 10
DISPATCH_ROWS: Final = 11

_INT64_MAX: Final = (1 << 63) - 1

if NATIVE is not None:  # the C copy of these constants: an ImportError if stale
    check_layout(
        NATIVE,
        {
            "DISPATCH_FULL": DISPATCH_FULL, "DISPATCH_STOP": DISPATCH_STOP,
            "DISPATCH_BLANK": DISPATCH_BLANK, "DISPATCH_INVALID": DISPATCH_INVALID,
            "DISPATCH_PHYSICAL": DISPATCH_PHYSICAL, "DISPATCH_SIZE": DISPATCH_SIZE,
            "DISPATCH_QUEUE_OFFSET": DISPATCH_QUEUE_OFFSET,
            "DISPATCH_QUEUE_ID": DISPATCH_QUEUE_ID, "DISPATCH_BORN_TS": DISPATCH_BORN_TS,
            "DISPATCH_STORE_TS": DISPATCH_STORE_TS,
            "DISPATCH_TOPIC_HASH": DISPATCH_TOPIC_HASH,
            "DISPATCH_TOPIC_LEN": DISPATCH_TOPIC_LEN, "DISPATCH_TAG_LEN": DISPATCH_TAG_LEN,
            "DISPATCH_KEYS_LEN": DISPATCH_KEYS_LEN, "DISPATCH_FLAGS": DISPATCH_FLAGS,
            "DISPATCH_ROWS": DISPATCH_ROWS,
        },
        "commitlog/header_scan.py",
    )  # fmt: skip


def new_columns(capacity: int) -> np.ndarray:
    """An ``out`` array for ``capacity`` records."""
    assert capacity > 0
    return np.zeros((DISPATCH_ROWS, capacity), dtype=np.int64)


def _check_arguments(
    buffer: Any, start: int, stop: int, file_size: int, hard_end: int, file_start: int,
    out: Any,
) -> int:  # fmt: skip
    """The capacity of ``out``; a ValueError or TypeError as the C version raises."""
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "iu" or out.itemsize != 8:
        raise TypeError("out must be a contiguous, aligned array of 8-byte integers")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise TypeError("out must be a contiguous, aligned array of 8-byte integers")
    capacity = out.size // DISPATCH_ROWS
    length = memoryview(buffer).nbytes
    if (
        out.size != capacity * DISPATCH_ROWS
        or not 0 <= start <= stop <= file_size <= length
        or hard_end < 0
        or not 0 <= file_start <= _INT64_MAX - file_size
    ):
        raise ValueError("dispatch_columns: bad range, start or out shape")
    return capacity


def dispatch_columns_py(
    buffer: Any, start: int, stop: int, file_size: int, hard_end: int, file_start: int,
    verify: bool, out: np.ndarray,
) -> tuple[int, int, int]:  # fmt: skip
    """The pure-Python twin of the C ``dispatch_columns`` (see the module)."""
    capacity = _check_arguments(buffer, start, stop, file_size, hard_end, file_start, out)
    rows = out.reshape(DISPATCH_ROWS, capacity)
    fit = min(file_size - BLANK_SIZE, hard_end)
    at, count = start, 0
    while at < stop:
        if count == capacity:
            return at, count, DISPATCH_FULL
        if file_size - at < BLANK_SIZE:
            return at, count, DISPATCH_INVALID
        total, magic, stored = PREFIX.unpack_from(buffer, at)
        if magic == BLANK_MAGIC:
            if total != file_size - at or file_size > hard_end:
                return at, count, DISPATCH_INVALID
            if verify and checksum(b"", total, BLANK_MAGIC) != stored:
                return at, count, DISPATCH_INVALID
            return file_size, count, DISPATCH_BLANK
        if magic != MESSAGE_MAGIC or total < HEADER_SIZE or fit - at < total:
            return at, count, DISPATCH_INVALID
        (_, _, _, queue_offset, physical, born, store_ts, queue_id, flags, body_len, props_len,
         keys_len, topic_len, tag_len) = HEADER.unpack_from(buffer, at)  # fmt: skip
        sections = HEADER_SIZE + topic_len + tag_len + keys_len + props_len + body_len
        if (
            physical != file_start + at
            or sections != total
            or flags & ~FLAGS_KNOWN
            or topic_len == 0
        ):
            return at, count, DISPATCH_INVALID
        topic = bytes(buffer[at + HEADER_SIZE : at + HEADER_SIZE + topic_len])
        if not topic.isascii():
            return at, count, DISPATCH_INVALID
        if verify:
            tag_at = at + HEADER_SIZE + topic_len
            try:
                str(buffer[tag_at : tag_at + tag_len], "utf-8")
            except UnicodeDecodeError:
                return at, count, DISPATCH_INVALID
            body = buffer[at + BLANK_SIZE : at + total]
            if checksum(body, total, MESSAGE_MAGIC) != stored:
                return at, count, DISPATCH_INVALID
        topic_hash = xxhash.xxh64_intdigest(topic)
        rows[:, count] = (
            physical, total, queue_offset, queue_id, born, store_ts,
            topic_hash - (1 << 64) if topic_hash > _INT64_MAX else topic_hash,
            topic_len, tag_len, keys_len, flags,
        )  # fmt: skip
        count += 1
        at += total
    return at, count, DISPATCH_STOP


dispatch_columns = dispatch_columns_py if NATIVE is None else NATIVE.dispatch_columns
