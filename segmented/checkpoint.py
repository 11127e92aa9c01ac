"""Offset checkpoint files, in Kafka's text format (OffsetCheckpointFile).

Used for ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``::

    0                       format version
    2                       number of entries
    orders 0 1234           topic, partition, offset (one line each)
    orders 1 1187

A write goes to ``<path>.tmp``, is fsynced, renamed over ``<path>`` and the directory
is fsynced, so a reader sees the old file or the new one. A file that does not parse
raises CorruptDataError; the store then falls back as Kafka does (recovery point 0:
recover everything; log start: the first segment's base offset), never guessing.
"""

from __future__ import annotations

import os
from typing import Final

from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented.files import fsync_directory

__all__ = ["read_offsets", "write_offsets"]

VERSION: Final = 0
ENTRIES_MAX: Final = 10_000_000  # a count beyond any real store: refuse it unread


def write_offsets(path: str, offsets: dict[tuple[str, int], int]) -> None:
    """Replace the file at ``path`` with ``offsets``, atomically and durably."""
    lines = [str(VERSION), str(len(offsets))]
    for (topic, partition), offset in sorted(offsets.items()):
        assert " " not in topic and partition >= 0 and offset >= 0
        lines.append(f"{topic} {partition} {offset}")
    tmp_path = path + ".tmp"
    with open(tmp_path, "w", encoding="ascii") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp_path, path)
    fsync_directory(os.path.dirname(path) or ".")


def read_offsets(path: str) -> dict[tuple[str, int], int]:
    """The offsets in the file at ``path``; {} if there is none.

    Raises:
        CorruptDataError: a wrong version, count or line (position = byte of the line).
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return {}
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as error:
        raise CorruptDataError(path, error.start, "not ASCII text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or lines[0] != str(VERSION):
        raise CorruptDataError(path, 0, f"expected version {VERSION} and a count")
    if not lines[1].isdigit() or int(lines[1]) != len(lines) - 2 or int(lines[1]) > ENTRIES_MAX:
        raise CorruptDataError(path, len(lines[0]) + 1, f"count {lines[1]!r} does not match")
    offsets: dict[tuple[str, int], int] = {}
    position = len(lines[0]) + len(lines[1]) + 2
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            raise CorruptDataError(path, position, f"malformed line {line!r}")
        offsets[(fields[0], int(fields[1]))] = int(fields[2])
        position += len(line) + 1
    return offsets
