"""Committed consumer offsets (``<root>/offsets/<group>``), one file per group.

Format: one JSON document per group, written atomically (``<group>.tmp``, fsync,
rename, fsync the directory)::

    {"format": "mqstore-offsets", "version": 1, "group": "<group>",
     "offsets": {"<topic>": {"<partition>": [<offset>, "<metadata>"]}},
     "checksum": "<xxh3_64 hex of the canonical JSON of 'offsets'>"}

A commit either lands whole or not at all. A file that fails validation is refused
with CorruptDataError naming the file: committed offsets are never guessed.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from typing import Any, Final, Protocol

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.durable import makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    ReadOnlyStoreError,
)

__all__ = ["CommittedOffsets", "OffsetStore", "validate_group"]

FORMAT: Final = "mqstore-offsets"
VERSION: Final = 1
_GROUP_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,127}")


def validate_group(group: object) -> str:
    """Group ids name files: 1 to 127 characters of ``[A-Za-z0-9._-]``, not . or .."""
    if not isinstance(group, str):
        raise InvalidTypeError(f"group_id must be a str, not {type(group).__name__}")
    if not _GROUP_RE.fullmatch(group) or group in (".", ".."):
        raise InvalidArgumentError(
            f"invalid group id {group!r}: use 1 to 127 characters from [A-Za-z0-9._-]"
        )
    return group


class CommittedOffsets(Protocol):
    """What an engine's ``offsets`` offers: these side files (the segmented engine)
    or the log (the CommitLog engine: mqstore.offsets_log.LogOffsetStore)."""

    def load(self, group: str) -> dict[tuple[str, int], tuple[int, str]]: ...

    def commit(self, group: str, offsets: Mapping[tuple[str, int], tuple[int, str]]) -> None: ...

    def groups(self) -> list[str]: ...


class OffsetStore:
    """Committed offsets of every group of one store, one file per group (the
    segmented engine's; the CommitLog engine keeps them in its log)."""

    def __init__(self, root: str, read_only: bool) -> None:
        self.directory = os.path.join(root, "offsets")
        self.read_only = read_only
        self._lock = threading.Lock()
        if not read_only:
            makedirs_durable(self.directory)  # committed offsets are primary data

    def _path(self, group: str) -> str:
        return os.path.join(self.directory, validate_group(group))

    def load(self, group: str) -> dict[tuple[str, int], tuple[int, str]]:
        """{(topic, partition): (offset, metadata)} committed by ``group``."""
        path = self._path(group)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return {}
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CorruptDataError(path, getattr(error, "pos", 0) or 0, "not valid JSON") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CorruptDataError(path, 0, "not an mqstore offsets file")
        if document.get("version") != VERSION or document.get("group") != group:
            raise CorruptDataError(path, 0, "wrong version or group")
        offsets = document.get("offsets")
        if not isinstance(offsets, dict) or document.get("checksum") != json_checksum(offsets):
            raise CorruptDataError(path, 0, "checksum mismatch")
        result: dict[tuple[str, int], tuple[int, str]] = {}
        try:
            for topic, partitions in offsets.items():
                for partition, (offset, metadata) in partitions.items():
                    if not isinstance(offset, int) or offset < 0 or not isinstance(metadata, str):
                        raise ValueError("bad entry")
                    result[(topic, int(partition))] = (offset, metadata)
        except (AttributeError, TypeError, ValueError):
            raise CorruptDataError(path, 0, "malformed offsets") from None
        return result

    def commit(self, group: str, offsets: Mapping[tuple[str, int], tuple[int, str]]) -> None:
        """Merge ``offsets`` into the group's committed offsets, atomically."""
        if self.read_only:  # a caller can do this: never an assert (python -O drops it)
            raise ReadOnlyStoreError("the store is open read-only: cannot commit offsets")
        path = self._path(group)
        with self._lock:
            merged = self.load(group)
            merged.update(offsets)
            body: dict[str, dict[str, list[Any]]] = {}
            for (topic, partition), (offset, metadata) in sorted(merged.items()):
                body.setdefault(topic, {})[str(partition)] = [offset, metadata]
            document = {
                "format": FORMAT,
                "version": VERSION,
                "group": group,
                "offsets": body,
                "checksum": json_checksum(body),
            }
            write_json_atomically(path, document)

    def groups(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.endswith(".tmp") and _GROUP_RE.fullmatch(n))
