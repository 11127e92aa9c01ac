"""The store checkpoint (``<root>/checkpoint``): positions that bound recovery.

Layout (little-endian), two 64-byte slots in one 4 KiB file::

    offset size field (per slot; slot k at byte k * 64)
    0      4    magic                 u32  CHECKPOINT_MAGIC
    4      2    version               u16  1
    6      2    reserved              u16  0
    8      8    sequence              u64  grows by one per write; the newest valid slot wins
    16     8    flushed_position      i64  a record boundary; every byte before it is durable
    24     8    dispatched_position   i64  a record boundary; ConsumeQueue and index hold
                                           every record before it
    32     8    flushed_ts_ms         i64  store timestamp of the last flushed record
    40     8    dispatched_ts_ms      i64  store timestamp of the last dispatched record
    48     8    written_at_ms         i64  wall clock of this write
    56     8    checksum              u64  xxh3_64 of bytes [0, 56) of the slot

Writes alternate between the slots and are made durable with fdatasync, so a torn
write can only damage the slot being written; the other one still holds the
previous checkpoint. A file with no valid slot reads as "no checkpoint", and
recovery then scans from the start of the log.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import Final

import attrs
import xxhash

from mqstore.commitlog.durable import fsync_directory, fsync_file

__all__ = ["Checkpoint", "CheckpointFile", "CHECKPOINT_NAME"]

log = logging.getLogger(__name__)

CHECKPOINT_NAME: Final = "checkpoint"
CHECKPOINT_MAGIC: Final = 0x4D51434B  # "KCQM" little-endian: mqstore checkpoint
CHECKPOINT_VERSION: Final = 1
FILE_SIZE_BYTES: Final = 4096  # one page: a slot write never straddles pages
SLOT = struct.Struct(
    "<"
    "I"  # magic
    "H"  # version
    "H"  # reserved
    "Q"  # sequence
    "q"  # flushed_position
    "q"  # dispatched_position
    "q"  # flushed_ts_ms
    "q"  # dispatched_ts_ms
    "q"  # written_at_ms
    "Q"  # checksum
)
SLOT_SIZE: Final = SLOT.size
assert SLOT_SIZE == 64
CHECKSUMMED: Final = SLOT_SIZE - 8


@attrs.frozen(kw_only=True)
class Checkpoint:
    """Positions saved by the last checkpoint write."""

    flushed_position: int = 0
    dispatched_position: int = 0
    flushed_ts_ms: int = 0
    dispatched_ts_ms: int = 0
    sequence: int = 0


class CheckpointFile:
    """Reads and writes ``<root>/checkpoint``."""

    def __init__(self, root: str, read_only: bool = False) -> None:
        self.path = os.path.join(root, CHECKPOINT_NAME)
        self.read_only = read_only
        self._fd = -1
        if not read_only:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if os.fstat(self._fd).st_size != FILE_SIZE_BYTES:
                # New (or cut short by a crash): its size and its name must be durable
                # before a slot in it is trusted to bound recovery.
                os.ftruncate(self._fd, FILE_SIZE_BYTES)
                fsync_file(self._fd, self.path)
                fsync_directory(root)

    def load(self) -> Checkpoint | None:
        """The newest valid checkpoint, or None if there is none."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(FILE_SIZE_BYTES)
        except FileNotFoundError:
            return None
        best: Checkpoint | None = None
        for slot in range(2):
            raw = data[slot * SLOT_SIZE : (slot + 1) * SLOT_SIZE]
            if len(raw) < SLOT_SIZE:
                continue
            fields = SLOT.unpack(raw)
            (
                magic,
                version,
                _,
                sequence,
                flushed,
                dispatched,
                flushed_ts,
                dispatched_ts,
                _,
                check,
            ) = fields
            if magic != CHECKPOINT_MAGIC or version != CHECKPOINT_VERSION:
                continue
            if xxhash.xxh3_64_intdigest(raw[:CHECKSUMMED]) != check:
                log.warning("checkpoint %s: slot %d fails its checksum; ignored", self.path, slot)
                continue
            if flushed < 0 or dispatched < 0:
                continue
            if best is None or sequence > best.sequence:
                best = Checkpoint(
                    flushed_position=flushed,
                    dispatched_position=dispatched,
                    flushed_ts_ms=flushed_ts,
                    dispatched_ts_ms=dispatched_ts,
                    sequence=sequence,
                )
        return best

    def store(self, checkpoint: Checkpoint) -> Checkpoint:
        """Write ``checkpoint`` durably into the slot after the current one.

        Returns:
            The checkpoint as written (with its new sequence number).
        """
        assert not self.read_only
        assert checkpoint.flushed_position >= 0
        assert checkpoint.dispatched_position >= 0
        sequence = checkpoint.sequence + 1
        body = SLOT.pack(
            CHECKPOINT_MAGIC,
            CHECKPOINT_VERSION,
            0,
            sequence,
            checkpoint.flushed_position,
            checkpoint.dispatched_position,
            checkpoint.flushed_ts_ms,
            checkpoint.dispatched_ts_ms,
            time.time_ns() // 1_000_000,
            0,
        )[:CHECKSUMMED]
        raw = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
        os.pwrite(self._fd, raw, (sequence % 2) * SLOT_SIZE)
        fsync_file(self._fd, self.path)
        return attrs.evolve(checkpoint, sequence=sequence)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
