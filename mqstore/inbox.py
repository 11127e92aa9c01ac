"""The inbox: spool files (``mqstore.spool``) that the store's writer appends.

The store has one writer (an flock on ``<root>/lock``). A process that must write
while another holds that lock (a Spark sink task while a service runs) writes its
rows to a spool file in the inbox instead; every writer ingests the inbox on a
schedule (``StoreConfig.inbox_interval_ms``).

On disk::

    <root>/inbox/<name>.spool             complete spool files, waiting
    <root>/inbox/<name>.spool.tmp-<hex>   being written (or left by a crash)
    <root>/inbox/ledger                   files already appended (atomic JSON)
    <root>/inbox/quarantine/<name>.spool  files refused, with <name>.spool.json:
                                          why, and how many blocks went in first

Ledger (written with ``write_json_atomically``)::

    {"format": "mqstore-inbox-ledger", "version": 1,
     "body": {"done": {"<name>": {"checksum": <spool checksum>, "rows": n,
                                  "ingested_ms": t}},
              "partial": {"<name>": {"checksum": c, "blocks_done": k,
                                     "unsynced_blocks_done": m,   (optional)
                                     "unsynced_log_end": p}}},    (optional)
     "checksum": "<xxh3_64 hex of the canonical JSON of 'body'>"}

Ingesting one file: validate all of it (``read_spool``) and check that every topic
and partition exists; append its blocks in order (one ``put_batch_buffers`` each, or
``append_records`` for a block with keys or headers); make the
CommitLog durable up to there; record the name as done in the ledger; delete the
file (unless a newer attempt was renamed over it meanwhile: that file is another
inode, ingested at the next tick).

Retries: a retried Spark task rewrites the same name. A file whose name the ledger
holds as done is read and validated like any other; if its checksum is the one the
ledger recorded, its rows went in already and it is deleted (``skipped``). If the
checksum differs, the retry produced other rows (a task over non-deterministic
input: an unordered shuffle, a source read twice) and the file is appended in full
(``rewritten``), its checksum replacing the old one in the ledger. Appending, not
quarantining: delivery is at-least-once, so the rows Spark counts as the task's
output must go in. The first attempt's rows stay in the log too, exactly as when a
task that appended directly is retried. Quarantining would fail the waiting task,
Spark would retry it, the retry would differ again, and the job would die after
``spark.task.maxFailures`` over input Spark allows to differ. A file that no longer
decodes goes to quarantine whether or not its name is done; nothing is deleted
unread.

Visibility: spooled rows are readable once ingested, i.e. within one
``inbox_interval_ms`` (plus the ingest time) of the spool file's rename while a
writer runs; a writer that opens later ingests them on its first tick.

Crash policy: a row is never lost. A spool file is durable before its writer
reports success, and it is deleted only after its rows are durable in the CommitLog
and its name is durable in the ledger. A crash between the first append of a file
and its ledger entry leaves the file in the inbox, not counted as done: the next
writer appends it again from its last recorded progress, so that file's rows may
appear twice (at-least-once). A failed append (a full disk...) records progress
(``partial``) and the file is retried from the next block at the next tick.

What is durable when: an appended block is durable once the sync after it returns;
the ledger never counts a block before that (a ledger ahead of the CommitLog would
lose the block at a power cut). When that sync fails (``DiskFullError``, any
``OSError`` or ``StoreError``), the blocks are in the log but not known durable:

- this process remembers how far the file got; the next tick syncs first and, once
  that succeeds, records the progress and resumes after those blocks. It appends
  nothing while the sync still fails (the CommitLog refuses appends after a failed
  sync anyway: it is poisoned until reopened);
- the ledger gets ``unsynced_blocks_done`` and ``unsynced_log_end``, the CommitLog's
  write position after those blocks (an upper bound on their end). The next writer,
  when it opens, compares that with the position recovery left: the log is a prefix,
  so if it reaches ``unsynced_log_end`` the blocks survived and count as done;
  otherwise (a power cut cut them, or may have) they are appended again
  (at-least-once). This is decided at open, before anything else is appended, and
  written back at once so a later writer never compares against a longer log.

Bad files are never dropped silently: a file that does not decode
(``CorruptSpoolError``) or that the store refuses (``SpoolRejectedError``: an
unknown topic or partition, a message over the size limit) is moved to
``quarantine/`` with a note, logged, and reported by ``ingest``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import attrs
import numpy as np

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.durable import fsync_directory
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    StoreClosedError,
    StoreError,
    UnknownTopicError,
)
from mqstore.engine import ProducerRecord
from mqstore.spool import (
    SPOOL_SUFFIX,
    TMP_MARK,
    Block,
    CorruptSpoolError,
    Spool,
    read_spool,
)
from mqstore.topics import TopicConfig

__all__ = [
    "INBOX_DIR",
    "IngestReport",
    "Inbox",
    "Quarantined",
    "SpoolRejectedError",
    "pending_spools",
]

log = logging.getLogger(__name__)

INBOX_DIR: Final = "inbox"
LEDGER_NAME: Final = "ledger"
QUARANTINE_DIR: Final = "quarantine"
FORMAT: Final = "mqstore-inbox-ledger"
VERSION: Final = 1
# One tick ingests at most this many files, so that close() (which waits for a
# running job) never waits for a long backlog; the rest go at the next ticks.
FILES_PER_INGEST_MAX: Final = 64
# Names remembered as done. A Spark task retry rewrites its file within minutes; the
# ledger keeps the newest names, far more than one retry window produces.
LEDGER_DONE_MAX: Final = 8_192
TMP_STALE_S: Final = 3_600  # a temporary file this old belongs to a dead writer


class SpoolRejectedError(StoreError):
    """A valid spool file whose rows the store refuses (unknown topic or partition,
    a message over the limit). The file is quarantined."""


class Target(Protocol):
    """What the inbox appends through: the store's engine interface."""

    def describe_topic(self, name: str) -> TopicConfig: ...

    def topic_for_write(self, name: str) -> TopicConfig: ...  # may auto-create it

    def stats(self) -> dict[str, Any]: ...  # "write_position": the CommitLog's end

    def put_batch_buffers(
        self,
        topic: str,
        queue_id: int,
        offsets: np.ndarray,
        data: Any,
        *,
        nulls: np.ndarray | None = None,
        born_timestamp_ms: np.ndarray | int | None = None,
    ) -> Any: ...

    def append_records(
        self, topic: str, partition: int, records: Sequence[ProducerRecord]
    ) -> Any: ...


@attrs.frozen
class Quarantined:
    """A file moved to quarantine, with the typed error that moved it."""

    name: str
    error: StoreError
    blocks_done: int  # blocks appended before the error (0: none of its rows went in)


@attrs.frozen
class IngestReport:
    files: int = 0  # files appended (in full, or their remaining blocks)
    rows: int = 0  # rows appended by this call
    skipped: int = 0  # files the ledger holds with the same checksum (deleted, not appended)
    rewritten: int = 0  # of ``files``: a done name with other rows (a retry), appended
    quarantined: tuple[Quarantined, ...] = ()
    pending: int = 0  # files left for the next call


def pending_spools(directory: str) -> list[str]:
    """Names of the complete spool files waiting in ``directory``, oldest name first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if name.endswith(SPOOL_SUFFIX))


class Inbox:
    """Ingests the spool files of one store directory. Only the store's writer
    (the lock holder) constructs one; ``ingest`` is safe to call from any thread."""

    def __init__(
        self,
        directory: str,
        target: Target,
        sync: Callable[[], None],
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        """Args:
        directory: ``<root>/inbox`` (created).
        target: what rows are appended through (the store).
        sync: makes everything appended so far durable (CommitLog flush).
        """
        self.directory = directory
        self._target = target
        self._sync = sync
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._guard = threading.Lock()  # the scheduler and an explicit call may race
        os.makedirs(os.path.join(directory, QUARANTINE_DIR), exist_ok=True)
        self._ledger_path = os.path.join(directory, LEDGER_NAME)
        self._ledger: _Ledger | None = None
        # Files of this process whose sync failed: name -> (checksum, blocks appended).
        self._unsynced: dict[str, tuple[int, int]] = {}
        # Where recovery left the CommitLog, read before this writer appends anything.
        self._log_end_at_open = self._log_end()
        try:  # settle an earlier writer's unsynced blocks now, against that position;
            # the first ingest loads the ledger again (and raises if it is corrupt)
            _Ledger(self._ledger_path).settle_unsynced(self._log_end_at_open, set())
        except (StoreError, OSError) as error:  # the store opens; ingest retries it
            log.error("inbox: ledger not loaded at open: %s", error)

    def ingest(self, files_max: int = FILES_PER_INGEST_MAX) -> IngestReport:
        """Append the waiting spool files (at most ``files_max``), oldest name first.

        A store closing under a running ingest stops it quietly after recording the
        file's progress; the next writer resumes from there.

        Raises:
            StoreError: an append failed for a reason that may pass (a full disk):
                progress is recorded and the file is retried at the next call. Or
                the sync after the appends failed (``DiskFullError``, or
                ``FlushFailedError`` from the store): those blocks are remembered
                and never appended again (module docstring, "What is durable when").
            CorruptDataError: the ledger does not verify; nothing is ingested until
                it is repaired (the store itself keeps working).
        """
        assert files_max > 0
        with self._guard:
            self._load_ledger()
            self._remove_stale_tmp()
            names = pending_spools(self.directory)
            report = _Tally()
            for name in names[:files_max]:
                self._ingest_one(name, report)
                if report.closing:
                    break
            return IngestReport(
                files=report.files,
                rows=report.rows,
                skipped=report.skipped,
                rewritten=report.rewritten,
                quarantined=tuple(report.quarantined),
                pending=max(0, len(names) - files_max),
            )

    def quarantined(self) -> list[str]:
        """Names of the spool files in quarantine."""
        return pending_spools(os.path.join(self.directory, QUARANTINE_DIR))

    def _load_ledger(self) -> _Ledger:
        if self._ledger is None:
            self._ledger = _Ledger(self._ledger_path)
        self._ledger.settle_unsynced(self._log_end_at_open, set(self._unsynced))
        return self._ledger

    def _log_end(self) -> int:
        position = int(self._target.stats()["write_position"])
        assert position >= 0
        return position

    def _ingest_one(self, name: str, report: _Tally) -> None:
        ledger = self._ledger
        assert ledger is not None
        path = os.path.join(self.directory, name)
        try:
            spool = read_spool(path)
        except FileNotFoundError:
            return
        except CorruptSpoolError as error:  # a done name too: never deleted unread
            report.quarantined.append(self._quarantine(name, error, 0))
            return
        with spool:
            done_checksum = ledger.done_checksum(name)
            if done_checksum == spool.checksum:  # a crash before delete, or a same-rows retry
                self._delete_read(spool)
                report.skipped += 1
                return
            try:
                self._check_destinations(spool)
            except SpoolRejectedError as error:
                report.quarantined.append(self._quarantine(name, error, 0))
                return
            if not self._append_file(name, spool, report):
                return
            if done_checksum is not None:
                log.warning("inbox: %s was appended before with other rows; appended again", name)
                report.rewritten += 1
        self._delete_read(spool)
        report.files += 1

    def _append_file(self, name: str, spool: Spool, report: _Tally) -> bool:
        """Append ``spool`` from its durable progress; True when all of it is in and
        the ledger says so (False: quarantined, or the store is closing)."""
        ledger = self._ledger
        assert ledger is not None
        first = self._resume_at(name, spool.checksum)
        done, rows, failure = self._append_blocks(spool, first)
        assert first <= done <= spool.block_count
        self._make_durable(name, spool.checksum, first, done)
        report.rows += rows
        if failure is None:
            ledger.mark_done(name, spool.checksum, spool.rows, self._clock_ms())
            return True
        ledger.mark_partial(name, spool.checksum, done)
        if isinstance(failure, StoreClosedError):  # the store is closing: resume later
            log.info("inbox: %s stopped after %d blocks by close", name, done)
            report.closing = True
            return False
        if not isinstance(failure, SpoolRejectedError | CorruptSpoolError):
            raise failure  # may pass (disk full): retried from block ``done``
        report.quarantined.append(self._quarantine(name, failure, done))
        return False

    def _resume_at(self, name: str, checksum: int) -> int:
        """The first block of ``name`` to append. Blocks whose sync failed in this
        process are synced first (raising again if that still fails), then counted."""
        ledger = self._ledger
        assert ledger is not None
        unsynced = self._unsynced.get(name)
        if unsynced is None or unsynced[0] != checksum:  # none, or a rewritten file
            self._unsynced.pop(name, None)
            return ledger.blocks_done(name, checksum)
        self._sync()  # raises again while it still fails: nothing is appended
        ledger.mark_partial(name, checksum, unsynced[1])  # forgotten only once recorded
        del self._unsynced[name]
        return unsynced[1]

    def _make_durable(self, name: str, checksum: int, durable: int, appended: int) -> None:
        """Sync the blocks appended since ``durable``; if the sync fails, remember
        them (here and in the ledger) so that no tick appends them again."""
        try:
            self._sync()  # appended rows are durable before the ledger says so
        except (StoreError, OSError):
            if appended > durable:
                self._unsynced[name] = (checksum, appended)
                ledger = self._ledger
                assert ledger is not None
                try:
                    ledger.mark_unsynced(name, checksum, durable, appended, self._log_end())
                except (StoreError, OSError) as error:  # a reopen appends them again
                    log.error("inbox: %s: unsynced progress not recorded: %s", name, error)
            raise

    def _check_destinations(self, spool: Spool) -> None:
        for topic, partition in sorted(spool.destinations()):
            try:
                # The spooling task could not create the topic (no writer lock): the
                # writer does, when the store auto-creates topics.
                partitions = self._target.topic_for_write(topic).partitions
            except UnknownTopicError as error:
                raise SpoolRejectedError(f"{spool.path}: {error}") from None
            if partition >= partitions:
                raise SpoolRejectedError(
                    f"{spool.path}: topic {topic!r} has no partition {partition} "
                    f"(it has {partitions})"
                )

    def _append_blocks(self, spool: Spool, first: int) -> tuple[int, int, StoreError | None]:
        """Append blocks from ``first``; return (blocks done, rows appended, error)."""
        done, rows = first, 0
        try:
            for block in spool.blocks(first):
                self._append(block)
                done += 1
                rows += block.rows
        except (InvalidArgumentError, InvalidTypeError, LimitExceededError) as error:
            return done, rows, SpoolRejectedError(f"{spool.path}, block {done}: {error}")
        except StoreError as error:  # CorruptSpoolError, DiskFullError...
            return done, rows, error
        return done, rows, None

    def _append(self, block: Block) -> None:
        target, topic, partition = self._target, block.topic, block.partition
        if block.keys is None and block.headers is None:  # the value column as it lies
            target.put_batch_buffers(
                topic,
                partition,
                block.value_offsets,
                block.data,
                nulls=block.value_nulls,
                born_timestamp_ms=self._born_times(block.stamps_ms),
            )
            return
        values, count = block.values, block.rows
        keys = block.keys or [None] * count
        headers = block.headers or [[]] * count
        stamps = block.timestamps_ms or [None] * count
        records = [
            ProducerRecord(
                None if keys[i] is None else bytes(keys[i]),  # type: ignore[arg-type]
                values[i],  # type: ignore[arg-type]
                headers[i],  # type: ignore[arg-type]
                stamps[i],
            )
            for i in range(count)
        ]
        target.append_records(topic, partition, records)

    def _born_times(self, stamps_ms: np.ndarray | None) -> np.ndarray | None:
        """A block's timestamps as born times: a row without one (-1) is born now, as
        the store stamps a put without a born time."""
        if stamps_ms is None or int(stamps_ms.min()) >= 0:
            return stamps_ms
        return np.where(stamps_ms < 0, self._clock_ms(), stamps_ms)

    def _quarantine(self, name: str, error: StoreError, blocks_done: int) -> Quarantined:
        """Move a refused file aside with a note; never delete its rows."""
        log.error("inbox: quarantining %s after %d blocks: %s", name, blocks_done, error)
        quarantine = os.path.join(self.directory, QUARANTINE_DIR)
        note = {
            "error": type(error).__name__,
            "reason": str(error),
            "blocks_done": blocks_done,
            "quarantined_ms": self._clock_ms(),
        }
        write_json_atomically(os.path.join(quarantine, name + ".json"), note)
        try:
            os.rename(os.path.join(self.directory, name), os.path.join(quarantine, name))
        except FileNotFoundError:
            pass
        fsync_directory(quarantine)
        fsync_directory(self.directory)
        if self._ledger is not None:
            self._ledger.forget(name)
        return Quarantined(name, error, blocks_done)

    def _delete_read(self, spool: Spool) -> None:
        """Delete the file ``spool`` was read from, not a newer attempt renamed over
        its name since (that one is ingested at the next tick)."""
        if spool.is_at(spool.path):
            self._delete(spool.path)
        else:
            log.info("inbox: %s was rewritten while ingested; kept", spool.path)

    def _delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_directory(self.directory)

    def _remove_stale_tmp(self) -> None:
        now_s = time.time()
        for name in os.listdir(self.directory):
            if TMP_MARK not in name:
                continue
            path = os.path.join(self.directory, name)
            try:
                if now_s - os.stat(path).st_mtime > TMP_STALE_S:
                    os.unlink(path)
            except FileNotFoundError:
                continue


@attrs.define
class _Tally:
    files: int = 0
    rows: int = 0
    skipped: int = 0
    rewritten: int = 0
    quarantined: list[Quarantined] = attrs.Factory(list)
    closing: bool = False  # the store closed under us: stop, resume at the next open


class _Ledger:
    """Names of spool files already appended, and the progress of interrupted ones."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._done: dict[str, dict[str, int]] = {}
        self._partial: dict[str, dict[str, int]] = {}
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return
        self._done, self._partial = _parse_ledger(path, raw)

    def done_checksum(self, name: str) -> int | None:
        """The checksum ``name`` had when it was appended; None if it is not done."""
        entry = self._done.get(name)
        return None if entry is None else entry["checksum"]

    def blocks_done(self, name: str, checksum: int) -> int:
        """Where to resume ``name``: its recorded progress if the file is the same."""
        entry = self._partial.get(name)
        if entry is None or entry["checksum"] != checksum:
            return 0  # a rewritten file (another task attempt) starts over
        return entry["blocks_done"]

    def mark_partial(self, name: str, checksum: int, blocks_done: int) -> None:
        self._partial[name] = {"checksum": checksum, "blocks_done": blocks_done}
        self._write()

    def mark_unsynced(
        self, name: str, checksum: int, blocks_done: int, appended: int, log_end: int
    ) -> None:
        """Blocks [blocks_done, appended) are in the log, not known durable; they
        lie before ``log_end``."""
        assert blocks_done < appended
        self._partial[name] = {
            "checksum": checksum,
            "blocks_done": blocks_done,
            "unsynced_blocks_done": appended,
            "unsynced_log_end": log_end,
        }
        self._write()

    def settle_unsynced(self, log_end_at_open: int, own: set[str]) -> None:
        """Count an earlier writer's unsynced blocks as done when the recovered log
        reaches past them (it is a prefix), else drop them (appended again). Names
        in ``own`` are this process's: their blocks are in memory, not settled here."""
        changed = False
        for name, entry in self._partial.items():
            if name in own or "unsynced_log_end" not in entry:
                continue
            if entry["unsynced_log_end"] <= log_end_at_open:
                entry["blocks_done"] = entry["unsynced_blocks_done"]
            del entry["unsynced_blocks_done"], entry["unsynced_log_end"]
            changed = True
        if changed:
            self._write()

    def mark_done(self, name: str, checksum: int, rows: int, now_ms: int) -> None:
        self._partial.pop(name, None)
        self._done.pop(name, None)  # a rewritten name moves to the newest end
        self._done[name] = {"checksum": checksum, "rows": rows, "ingested_ms": now_ms}
        while len(self._done) > LEDGER_DONE_MAX:  # dicts keep insertion order: oldest first
            del self._done[next(iter(self._done))]
        self._write()

    def forget(self, name: str) -> None:
        if self._partial.pop(name, None) is not None:
            self._write()

    def _write(self) -> None:
        body = {"done": self._done, "partial": self._partial}
        document = {"format": FORMAT, "version": VERSION, "body": body}
        document["checksum"] = json_checksum(body)
        write_json_atomically(self.path, document)


def _parse_ledger(
    path: str, raw: bytes
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Raises CorruptDataError: the ledger is never guessed (a guess could append a
    file twice or skip one)."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptDataError(path, getattr(error, "pos", 0) or 0, "not valid JSON") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CorruptDataError(path, 0, "not an mqstore inbox ledger")
    if document.get("version") != VERSION:
        raise CorruptDataError(path, 0, f"unsupported version {document.get('version')!r}")
    body = document.get("body")
    if not isinstance(body, dict) or document.get("checksum") != json_checksum(body):
        raise CorruptDataError(path, 0, "checksum mismatch")
    done, partial = body.get("done"), body.get("partial")
    if not isinstance(done, dict) or not isinstance(partial, dict):
        raise CorruptDataError(path, 0, "done and partial must be objects")
    return done, partial
