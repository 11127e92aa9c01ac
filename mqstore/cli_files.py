"""What ``mqstore dump`` and ``mqstore verify`` share: rendering decoded lines, and
reading store files with plain reads and read-only maps (never a store, never a lock).
"""

from __future__ import annotations

import base64
import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import Any, Final

Line = dict[str, Any]

# ---------------------------------------------------------------- rendering


def to_json(value: Any) -> Any:
    """A JSON-ready copy: a bytes field ``name`` becomes ``name`` (UTF-8 text) or
    ``name_base64`` when it is not UTF-8."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, bytes | bytearray | memoryview):
                try:
                    out[key] = bytes(item).decode("utf-8")
                except UnicodeDecodeError:
                    out[key + "_base64"] = base64.b64encode(item).decode("ascii")
            else:
                out[key] = to_json(item)
        return out
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


# Control characters, and bytes that are not UTF-8 (decoded as surrogates), as \xNN.
_ESCAPES: Final = (
    {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F]}
    | {0xDC00 + code: f"\\x{code:02x}" for code in range(0x80, 0x100)}
    | {
        ord("\n"): "\\n",
        ord("\r"): "\\r",
        ord("\t"): "\\t",
        ord("\\"): "\\\\",
    }
)


def printable(data: bytes | bytearray | memoryview | str) -> str:
    """Text or bytes as one line: UTF-8, with bad bytes and control characters escaped."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "surrogateescape")
    return text.translate(_ESCAPES)


def to_text(line: Line) -> str:
    """``key: value`` pairs on one line, as kafka-dump-log prints them; a record of a
    batch starts with ``|``."""
    parts = ["|"] if "in_batch" in line else []
    for key, value in line.items():
        if key != "in_batch":
            parts.append(f"{key}: {_item_text(value)}")
    return " ".join(parts)


def _item_text(item: Any) -> str:
    if isinstance(item, dict):
        return "=".join(_item_text(value) for value in item.values())
    if isinstance(item, list | tuple):
        return "[" + ", ".join(_item_text(value) for value in item) + "]"
    if isinstance(item, bytes | bytearray | memoryview | str):
        return printable(item)
    if isinstance(item, bool):
        return "true" if item else "false"
    return "null" if item is None else str(item)


# ---------------------------------------------------------------- files


@contextlib.contextmanager
def mapped(path: str) -> Iterator[mmap.mmap | bytes]:
    """The file's bytes, mapped read-only (b"" for an empty file)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            yield b""
            return
        buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield buffer
    finally:
        close_map(buffer)


def close_map(buffer: mmap.mmap) -> None:
    try:
        buffer.close()
    except BufferError:  # a record view is still held; the map goes with it
        pass


def read_bytes(path: str, position: int, size: int) -> bytes:
    with open(path, "rb") as handle:
        return os.pread(handle.fileno(), size, position)


def is_digits(name: str, count: int) -> bool:
    return len(name) == count and name.isdigit()
