"""Committed consumer offsets through the log: Kafka's ``__consumer_offsets``.

Every commit appends one record per (group, topic, partition) to an internal
compacted topic, ``OFFSETS_TOPIC`` (one partition), and the in-memory table is the
fold of that topic in offset order: the last record of a key wins, a tombstone (no
value) deletes it. A follower copies the CommitLog byte for byte, so it holds the
same records and folds the same table (``reload``); nothing travels on a side path
(apache/rocketmq#1094 and #4771 lost newer offsets by replicating them on one).
Compaction bounds the topic by the number of keys, so a rebuild at open reads at
most one record per key after cleaning.

Record formats, Kafka's own (big-endian; a string is an i16 length + UTF-8), so a
Kafka tool reading the topic decodes them::

    key   (OffsetCommitKey v1):   version i16 = 1 | group str | topic str | partition i32
    value (OffsetCommitValue v3): version i16 = 3 | offset i64 | leader_epoch i32 (-1)
                                  | metadata str | commit_timestamp_ms i64

Keys of another version (Kafka's group metadata, version 2) are skipped; a value
that does not decode is skipped with a warning and counted (``malformed``): a bad
record never stops the fold or crashes the store.

Who keeps the table:

- the leader (a writable store that is not a follower) updates it at each commit,
  after the records are appended (and durable: the append path flushes them);
- a follower or a read-only store folds records as they appear in the topic (each
  ``load`` and ``groups`` reads what was dispatched since the last one);
- a change of role (a follower promoted, a leader demoted) rebuilds it from the
  whole topic, and ``reload`` does so on request (after a truncation).

Stores from before this format kept one file per group under ``<root>/offsets/``
(mqstore.offsets). A writer imports each valid file once (its records appended,
then the file moved to ``<root>/offsets.imported/``); a file that does not validate
stays where it is and its group keeps raising CorruptDataError, as before. A
read-only store reads files not yet imported under what the log holds.

Crash policy: a commit is acknowledged only after its records are durable, so a
crash loses none; one cut inside the import re-imports the same values at the next
open (no commit ran in between).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Mapping
from typing import Final

from mqstore.commitlog.durable import fsync_directory, makedirs_durable
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    LimitExceededError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
)
from mqstore.internal_log import OFFSETS_TOPIC, InternalLog
from mqstore.offsets import OffsetStore, validate_group

__all__ = ["IMPORTED_DIR", "LogOffsetStore"]

log = logging.getLogger(__name__)

IMPORTED_DIR: Final = "offsets.imported"  # side files already imported into the log
KEY_VERSION: Final = 1  # OffsetCommitKey v1 (v0 has the same layout)
VALUE_VERSION: Final = 3  # OffsetCommitValue v3: with leader epoch, no expire time
NO_LEADER_EPOCH: Final = -1
STRING_BYTES_MAX: Final = 0x7FFF  # an i16 length

_VERSION = struct.Struct(">h")  # the version both formats start with
_STRING_LENGTH = struct.Struct(">h")  # then a string is its UTF-8 bytes
_PARTITION = struct.Struct(">i")  # the key's last field
#: value v3 after its version: offset, leader_epoch (the metadata string follows)
_VALUE_HEAD = struct.Struct(">qi")
_COMMIT_TIME = struct.Struct(">q")  # the value's last field: commit_timestamp_ms
assert _VALUE_HEAD.size == 12

Offsets = dict[tuple[str, int], tuple[int, str]]


def encode_key(group: str, topic: str, partition: int) -> bytes:
    """The record key of (group, topic, partition).

    Raises:
        InvalidArgumentError: ``partition`` is not an int32 >= 0.
        LimitExceededError: a name past 32,767 UTF-8 bytes.
    """
    if not 0 <= partition < 2**31:
        raise InvalidArgumentError(f"partition {partition} is not an int32 >= 0")
    return b"".join(
        (_VERSION.pack(KEY_VERSION), _string(group), _string(topic), _PARTITION.pack(partition))
    )


def encode_value(offset: int, metadata: str, commit_timestamp_ms: int) -> bytes:
    """The record value of a commit.

    Raises:
        InvalidArgumentError: ``offset`` is not an int64 >= 0.
        LimitExceededError: metadata past 32,767 UTF-8 bytes.
    """
    if not 0 <= offset < 2**63:  # callers check offsets; a caller can still pass one
        raise InvalidArgumentError(f"offset {offset} is not an int64 >= 0")
    assert 0 <= commit_timestamp_ms < 2**63  # the wall clock
    return b"".join(
        (
            _VERSION.pack(VALUE_VERSION),
            _VALUE_HEAD.pack(offset, NO_LEADER_EPOCH),
            _string(metadata),
            _COMMIT_TIME.pack(commit_timestamp_ms),
        )
    )


def decode_key(data: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an offset-commit key; None for another kind of
    key (Kafka's group metadata).

    Raises:
        ValueError: the key does not decode (or leaves bytes over).
    """
    (version,) = _VERSION.unpack_from(data, 0)
    if version not in (0, 1):
        return None
    group, position = _read_string(data, _VERSION.size)
    topic, position = _read_string(data, position)
    (partition,) = _PARTITION.unpack_from(data, position)
    if position + _PARTITION.size != len(data):
        raise ValueError("bytes left over after the key")
    return group, topic, partition


def decode_value(data: bytes) -> tuple[int, str, int]:
    """(offset, metadata, commit_timestamp_ms) of a value of version 1 to 3.

    Raises:
        ValueError: the value does not decode.
    """
    (version,) = _VERSION.unpack_from(data, 0)
    position = _VERSION.size
    if version == VALUE_VERSION:
        offset, _epoch = _VALUE_HEAD.unpack_from(data, position)
        position += _VALUE_HEAD.size
    elif version in (0, 1):  # offset i64, metadata, commit time (v1: expire time too)
        (offset,) = _COMMIT_TIME.unpack_from(data, position)
        position += _COMMIT_TIME.size
    else:
        raise ValueError(f"offset commit value version {version}")
    metadata, position = _read_string(data, position)
    (stamp,) = _COMMIT_TIME.unpack_from(data, position)
    if offset < 0:
        raise ValueError(f"negative offset {offset}")
    return offset, metadata, stamp


def _string(text: str) -> bytes:
    data = text.encode()
    if len(data) > STRING_BYTES_MAX:
        raise LimitExceededError(f"{len(data)} bytes of text: at most {STRING_BYTES_MAX}")
    return _STRING_LENGTH.pack(len(data)) + data


def _read_string(data: bytes, position: int) -> tuple[str, int]:
    (size,) = _STRING_LENGTH.unpack_from(data, position)
    start = position + _STRING_LENGTH.size
    if size < 0 or start + size > len(data):
        raise ValueError("a string runs past the record")
    return data[start : start + size].decode(), start + size


class LogOffsetStore:
    """Committed offsets of every group, kept in ``OFFSETS_TOPIC`` (the module
    docstring says how). The same calls as ``mqstore.offsets.OffsetStore``."""

    def __init__(self, root: str, offset_log: InternalLog, read_only: bool) -> None:
        self.read_only = read_only
        self.directory = os.path.join(root, "offsets")  # the side files, if any
        self.malformed = 0  # records skipped because they did not decode
        self._log = offset_log
        self._legacy = OffsetStore(root, read_only=True)  # reads only: never creates it
        self._imported_dir = os.path.join(root, IMPORTED_DIR)
        self._lock = threading.Lock()
        self._table: dict[str, Offsets] = {}
        self._next_offset = 0  # the next record of the topic to fold
        self._follower: bool | None = None  # the role the table was built for

    # ------------------------------------------------------------------ the API

    def load(self, group: str) -> Offsets:
        """{(topic, partition): (offset, metadata)} committed by ``group``.

        Raises:
            InvalidArgumentError, InvalidTypeError: not a valid group id.
            CorruptDataError: the group's side file was not imported (it does not
                validate).
        """
        validate_group(group)
        with self._lock:
            self._refresh()
            committed = dict(self._table.get(group, {}))
        if self.read_only or group in self._unimported():
            return {**self._legacy.load(group), **committed}
        return committed

    def commit(self, group: str, offsets: Mapping[tuple[str, int], tuple[int, str]]) -> None:
        """Merge ``offsets`` into the group's committed offsets: one record each,
        appended together, durable before this returns.

        Raises:
            ReadOnlyStoreError: the store is open read-only.
            NotLeaderError: the store is a follower.
            InvalidArgumentError: an offset or partition out of Kafka's range.
            LimitExceededError: metadata past 32,767 UTF-8 bytes.
            CorruptDataError: the group's side file was not imported.
        """
        if self.read_only:  # a caller can do this: never an assert (python -O drops it)
            raise ReadOnlyStoreError("the store is open read-only: cannot commit offsets")
        validate_group(group)
        now_ms = int(time.time() * 1000)
        records = [
            (encode_key(group, topic, partition), encode_value(offset, metadata, now_ms))
            for (topic, partition), (offset, metadata) in sorted(offsets.items())
        ]
        if not records:
            return
        with self._lock:
            self._refresh()
            if group in self._unimported():
                self._legacy.load(group)  # raises what is wrong with it
            self._log.append(records)
            self._table.setdefault(group, {}).update(offsets)

    def groups(self) -> list[str]:
        """Every group with committed offsets."""
        with self._lock:
            self._refresh()
            names = {group for group, committed in self._table.items() if committed}
        return sorted(names | set(self._legacy.groups()))

    def reload(self) -> int:
        """Rebuild the table from the whole topic (a follower promoted, a log
        truncated); returns the records folded."""
        with self._lock:
            self._follower = None
            return self._refresh()

    # ------------------------------------------------------------------ the fold

    def _refresh(self) -> int:
        """Bring the table up to date for the store's role (under ``_lock``);
        returns the records folded."""
        follower = self._log.is_follower()
        if follower != self._follower:
            self._table.clear()
            self._next_offset = 0
            self._follower = follower
            folded = self._fold()
            if not follower and not self.read_only:
                self._import_side_files()
            return folded
        if follower or self.read_only:
            return self._fold()
        return 0  # the leader's table is updated by its own commits

    def _fold(self) -> int:
        """Apply the records from ``_next_offset`` to the topic's end."""
        earliest, latest = self._log.bounds()
        self._next_offset = max(self._next_offset, earliest)
        folded = 0
        while self._next_offset < latest:
            try:
                batch = self._log.read(self._next_offset)
            except OffsetOutOfRangeError:  # retention moved the start meanwhile
                self._next_offset = self._log.bounds()[0]
                continue
            if not len(batch):
                break  # the rest is not dispatched yet
            for key, value in zip(batch.keys, batch.values, strict=True):
                self._apply(key, value)
            folded += len(batch)
            self._next_offset = batch.offsets[-1] + 1
        if not self._follower and not self.read_only:  # a leader restarted held
            unexposed = self._log.read_unexposed(self._next_offset)
            for key, value in unexposed:
                self._apply(key, value)
            folded += len(unexposed)
        return folded

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        try:
            decoded = None if key is None else decode_key(bytes(key))
            if decoded is None:
                return
            group, topic, partition = decoded
            if value is None:
                self._table.get(group, {}).pop((topic, partition), None)
                return
            offset, metadata, _ = decode_value(bytes(value))
        except (struct.error, UnicodeDecodeError, ValueError) as error:
            self.malformed += 1
            log.warning("%s: a record that does not decode skipped: %s", OFFSETS_TOPIC, error)
            return
        self._table.setdefault(group, {})[(topic, partition)] = (offset, metadata)

    # ------------------------------------------------------------------ side files

    def _unimported(self) -> list[str]:
        return self._legacy.groups()

    def _import_side_files(self) -> None:
        """Append each valid side file's offsets, then move it out of ``offsets/``."""
        imported = []
        for group in self._unimported():
            try:
                committed = self._legacy.load(group)
            except CorruptDataError as error:
                log.error("offsets of group %s not imported: %s", group, error)
                continue
            now_ms = int(time.time() * 1000)
            records = [
                (encode_key(group, topic, partition), encode_value(offset, metadata, now_ms))
                for (topic, partition), (offset, metadata) in sorted(committed.items())
            ]
            if records:
                self._log.append(records)
            self._table.setdefault(group, {}).update(committed)
            imported.append(group)
        if not imported:
            return
        makedirs_durable(self._imported_dir)
        for group in imported:  # after the records are durable: a crash re-imports
            os.replace(os.path.join(self.directory, group), os.path.join(self._imported_dir, group))
        # Durable moves: a lost one would re-import old values over newer commits.
        fsync_directory(self._imported_dir)
        fsync_directory(self.directory)
        log.info("offsets of %d group(s) imported into %s", len(imported), OFFSETS_TOPIC)
