"""Small JSON metadata files written atomically and validated by checksum.

A write goes to ``<path>.tmp``, is fsynced, renamed over ``<path>``, and the
directory is fsynced: a reader sees the old document or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
from typing import Any

import xxhash

__all__ = ["json_checksum", "write_json_atomically"]


def json_checksum(value: Any) -> str:
    """xxh3_64 (hex) of the canonical JSON of ``value``."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return xxhash.xxh3_64_hexdigest(canonical.encode())


def write_json_atomically(path: str, document: Any) -> None:
    tmp_path = path + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp_path, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
