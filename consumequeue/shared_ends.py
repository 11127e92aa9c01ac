"""The ``ends`` file of a topic's shared unit log: the next offset of every queue whose
records retention deleted (layout in mqstore.consumequeue.format: a header of magic,
entry count and CRC32 of the entries, then (queue id int32, next offset int64)
entries sorted by queue id).

Why: a queue whose shared records are all deleted, and that has no file of its own,
would lose its max offset on reopen; SharedUnitLog rewrites this file before it
deletes a shared file, and seeds those queues' empty runs from it at load.

Crash policy: the file is replaced atomically (written and fsynced under a temporary
name, renamed, the directory fsynced), so a crash leaves the old file or the new one.
A damaged file is refused with CorruptDataError, never guessed at.
"""

from __future__ import annotations

import os
import zlib
from typing import Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue.format import (
    SHARED_END,
    SHARED_ENDS_FILE,
    SHARED_ENDS_HEADER,
    SHARED_ENDS_MAGIC,
    TEMP_SUFFIX,
)
from mqstore.consumequeue.mapped_file import _wrap_os_error, sync_path

__all__ = ["ENDS_COUNT_MAX", "read_ends", "write_ends"]

ENDS_COUNT_MAX: Final = 1 << 31  # queue ids are int32: one entry each at most


def read_ends(directory: str) -> dict[int, int]:
    """The ``ends`` file in ``directory`` (queue id -> next offset); {} when absent.

    Raises:
        CorruptDataError: a bad magic, count or checksum, or a negative entry.
    """
    path = os.path.join(directory, SHARED_ENDS_FILE)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    if len(data) < SHARED_ENDS_HEADER.size:
        raise CorruptDataError(path, 0, f"ends file of {len(data)} bytes has no header")
    magic, count, crc = SHARED_ENDS_HEADER.unpack_from(data)
    body = data[SHARED_ENDS_HEADER.size :]
    if magic != SHARED_ENDS_MAGIC:
        raise CorruptDataError(path, 0, f"bad ends magic 0x{magic:08x}")
    if len(body) != count * SHARED_END.itemsize:
        raise CorruptDataError(path, 4, f"{count} ends entries do not fit {len(body)} bytes")
    if zlib.crc32(body) != crc:
        raise CorruptDataError(path, 8, "ends entries do not match their checksum")
    entries = np.frombuffer(body, dtype=SHARED_END)
    if len(entries) and (entries["next_offset"].min() < 0 or entries["queue_id"].min() < 0):
        raise CorruptDataError(path, SHARED_ENDS_HEADER.size, "negative ends entry")
    return dict(zip(entries["queue_id"].tolist(), entries["next_offset"].tolist(), strict=True))


def write_ends(directory: str, ends: dict[int, int]) -> None:
    """Replace the ``ends`` file in ``directory`` with ``ends``, durably.

    Raises:
        DiskFullError, StoreError: writing failed (the old file stays).
    """
    assert len(ends) < ENDS_COUNT_MAX
    entries = np.array(sorted(ends.items()), dtype=SHARED_END)
    assert len(entries) == 0 or entries["next_offset"].min() >= 0
    body = entries.tobytes()
    data = SHARED_ENDS_HEADER.pack(SHARED_ENDS_MAGIC, len(entries), zlib.crc32(body)) + body
    path = os.path.join(directory, SHARED_ENDS_FILE)
    temporary = path + TEMP_SUFFIX
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, data)
            assert written == len(data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as error:
        raise _wrap_os_error(error, f"writing {path}") from error
    sync_path(directory, directory=True)
