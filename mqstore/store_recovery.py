"""MessageStore's recovery of derived state at open (a mixin of mqstore/store.py's
MessageStore): after the CommitLog is recovered, ConsumeQueues and the index are
made to agree with it, cut back where they ran ahead and re-dispatched from the
checkpoint's dispatched position, during the log's recovery scan where it can
(dispatch/scan_dispatch.py) and after it for the rest (docs/RELIABILITY.md).
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import TYPE_CHECKING

from mqstore.commitlog.checkpoint import Checkpoint
from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.commitlog.record import tag_hash
from mqstore.config import StoreConfig
from mqstore.consumequeue import ConsumeQueueStore
from mqstore.consumequeue.tail_writer import TailWriter
from mqstore.dispatch.dispatcher import Dispatcher
from mqstore.dispatch.scan_dispatch import ScanDispatch
from mqstore.indexfile import IndexService
from mqstore.indexfile.format import key_hash
from mqstore.replication.epochs import EPOCH_FILE

__all__ = ["REDISPATCH_ROUND_BYTES_MAX", "StoreRecovery"]

log = logging.getLogger("mqstore.store")

# Log bytes one re-dispatch round at open takes: bounds the index entries a round
# collects (a keyed 100-byte message each: ~2.5M entries), at ~4 rounds per GiB.
REDISPATCH_ROUND_BYTES_MAX = 256 << 20
TAG_HASHES_CACHED = 4096  # distinct tags whose hashes the re-dispatch at open remembers


class StoreRecovery:
    """The open's recovery of ConsumeQueues and the index (see the module)."""

    # MessageStore's, set in its __init__ and _open.
    root: str
    config: StoreConfig
    read_only: bool
    commitlog: CommitLog
    consume_queues: ConsumeQueueStore
    index: IndexService
    recovered_from_crash: bool
    power_loss_possible: bool
    redispatched_at_open: int
    _rebuild_derived: bool
    _open_replicated: bool
    _redispatched_from: int
    _derived_unsynced: bool
    _dispatcher: Dispatcher | None

    if TYPE_CHECKING:  # MessageStore's and its other mixins'

        def _uses_create_time(self, topic: str) -> bool: ...
        def _hold_at_open(self, checkpoint: Checkpoint | None, replicated: bool) -> int | None: ...
        def _apply_topic_retention(self) -> int: ...
        def _write_checkpoint(self, derived: bool = False, opening: bool = False) -> None: ...

    def _scan_dispatch(self, checkpoint: Checkpoint | None) -> ScanDispatch | None:
        """The re-dispatch during the recovery scan (dispatch/scan_dispatch.py), for a
        writer reopening after a crash whose re-dispatch starts at the checkpoint's
        dispatched position with nothing held back, in async flush mode (a clean
        reopen scans nothing: no threads or columns for it); the index is cut back to
        there first."""
        if (
            self.read_only or checkpoint is None or not self.recovered_from_crash
            or self._rebuild_derived
            or self.power_loss_possible or self.config.flush_mode == "sync"
            or self._open_replicated or self.index.dropped_files
            or os.path.exists(os.path.join(self.root, EPOCH_FILE))
        ):  # fmt: skip
            return None
        self.index.truncate_beyond(checkpoint.dispatched_position)
        return ScanDispatch(
            checkpoint.dispatched_position, self.consume_queues.queue,
            TailWriter(self.consume_queues), self.index, self._uses_create_time,
            lru_cache(maxsize=TAG_HASHES_CACHED)(tag_hash),
        )  # fmt: skip

    def _recover_derived(self, checkpoint: Checkpoint | None,
                         scan_dispatch: ScanDispatch | None) -> None:  # fmt: skip
        """Make ConsumeQueues and the index agree with the recovered CommitLog (after
        what ``scan_dispatch`` did during the scan, if any)."""
        commitlog = self.commitlog
        end = commitlog.write_position
        if scan_dispatch is not None:  # before the cuts below (an append group cut short)
            scan_dispatch.finish()
        rebuild_from: int | None = None
        if self.power_loss_possible and checkpoint is not None:
            # A power cut may have torn what was written after the checkpoint's claim.
            dropped, rebuild_from = self.consume_queues.recover_tails(
                checkpoint.dispatched_position, commitlog.min_position, self._unit_is_intact
            )
            if dropped:
                log.warning("dropped %d ConsumeQueue units past the checkpoint", dropped)
            self.index.recover_tail(
                checkpoint.dispatched_position, commitlog.min_position, self._entry_is_intact
            )
        self.consume_queues.truncate_beyond(end)
        # Index pages written after the last checkpoint may be lost with power: cut
        # back to what the checkpoint vouches for; re-dispatch puts the rest back.
        # (Cut back already when re-dispatched during the scan: entries past it are new.)
        index_end = end
        if checkpoint is not None and scan_dispatch is None:
            index_end = min(end, checkpoint.dispatched_position)
        self.index.truncate_beyond(index_end)
        if commitlog.min_position > 0:
            self.consume_queues.correct_min_offsets(commitlog.min_position)
        start = commitlog.min_position
        if checkpoint is not None and not self._rebuild_derived:
            start = checkpoint.dispatched_position
        elif checkpoint is not None:
            log.warning("ConsumeQueue or index files are missing: rebuilding from the CommitLog")
        start = min(max(start, commitlog.min_position), end)
        if self.index.dropped_files:  # its entries come back from the older files' end on
            start = min(start, max(self.index.last_physical_offset, commitlog.min_position))
        if rebuild_from is not None:  # whole ConsumeQueue files were dropped: put them back
            start = min(start, max(rebuild_from, commitlog.min_position))
        self._redispatched_from = start
        position, position_ts_ms, redispatched = start, 0, 0
        if scan_dispatch is not None and scan_dispatch.from_position == start:
            position = min(max(scan_dispatch.position, start), end)
            redispatched = scan_dispatch.records
            if scan_dispatch.position <= end:
                position_ts_ms = scan_dispatch.store_ts_ms
        self._dispatcher = Dispatcher(
            commitlog,
            self.consume_queues,
            self.index,
            start_position=position,
            start_ts_ms=position_ts_ms,
            sync_mode=self.config.flush_mode == "sync",
            uses_create_time=self._uses_create_time,
            interval_ms=self.config.dispatch_interval_ms,
        )
        # Re-dispatch synchronously: when open returns, every recovered record is
        # readable through its ConsumeQueue and the index. In sync mode a record is
        # readable once durable: the recovered range is synced first. In async mode
        # the flush service syncs it, off the open (CommitLog._recover).
        if self.config.flush_mode == "sync":
            commitlog.flush_to(end)
        dispatcher = self._dispatcher
        shown = self._hold_at_open(checkpoint, self._open_replicated)  # mqstore.store_replica
        if shown is not None:
            end = min(end, shown)
        while dispatcher.position < end:
            before = dispatcher.position
            redispatched += dispatcher.dispatch_available(REDISPATCH_ROUND_BYTES_MAX)
            if dispatcher.position == before:
                break  # nothing readable below the end: a guard, never a spin
        self.redispatched_at_open = redispatched
        if redispatched:
            log.info("re-dispatched %d records from %d to %d", redispatched, start, end)
        self._apply_topic_retention()  # log starts moved by topic retention are not on disk
        # After an unclean stop the dead process's writes (units, a queue directory it
        # created) may be unsynced and are on no list of ours: the claim stays where the
        # last checkpoint put it until the first checkpoint after open syncs them all.
        self._derived_unsynced = self.recovered_from_crash
        self._write_checkpoint(derived=True, opening=True)

    def _unit_is_intact(
        self, topic: str, queue_id: int, physical: int, size: int, queue_offset: int
    ) -> bool:
        """Whether the CommitLog holds, at ``physical``, the verified record of
        (topic, queue_id) at ``queue_offset`` with that size (recovery's unit check)."""
        try:
            record = self.commitlog.record_at(physical)
        except (OffsetOutOfRangeError, CorruptDataError):
            return False
        return (
            record.size == size
            and record.queue_offset == queue_offset
            and record.queue_id == queue_id
            and record.topic == topic
        )

    def _entry_is_intact(self, entry_key_hash: int, physical: int) -> bool:
        """Whether the CommitLog holds at ``physical`` a verified record one of whose
        keys hashes to ``entry_key_hash`` (recovery's index entry check)."""
        try:
            record = self.commitlog.record_at(physical)
        except (OffsetOutOfRangeError, CorruptDataError):
            return False
        return any(key_hash(record.topic, key) == entry_key_hash for key in record.keys)
