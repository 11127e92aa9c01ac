"""The idempotent producer's state: producer ids and per-partition sequence checks.

Kafka's rules (ProducerStateManager, ProducerStateEntry), for one (producer id,
topic, partition):

- a batch whose base sequence is the last one's + 1 (mod 2**31) is appended;
- a batch equal to one of the last ``BATCHES_REMEMBERED`` (5, Kafka's
  NUM_BATCHES_TO_RETAIN, which is also why clients keep at most 5 in flight) is a
  duplicate: it is not appended again and is answered with its original base offset;
- any other sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
  INVALID_PRODUCER_EPOCH; a newer epoch must start again at sequence 0.

One departure: a gap that starts at a batch this broker refused unappended for a
retriable reason (``refused``: NOT_ENOUGH_REPLICAS) is answered with that refusal,
not OUT_OF_ORDER_SEQUENCE_NUMBER. The batches behind a refused one were in flight
with it; librdkafka answers OUT_OF_ORDER there by bumping its epoch and sending
every unacknowledged message again under the new one, including a batch appended
earlier whose acks=all wait failed (NOT_ENOUGH_REPLICAS_AFTER_APPEND): that batch is
then in the log twice (the chaos suite found 3 such duplicates in 600 s). Refused
the same retriable way, the client retries them in order under the same epoch, and
the appended batch is answered as a duplicate.

Persistence, on the CommitLog engine: through the log (``log``), so a follower
that copies the CommitLog holds the same state and, promoted, answers a retried
batch as the old leader would (duplicate -> its original offsets). Each batch of an
idempotent producer is appended with the producer's entry (its epoch and remembered
batches, the new batch included) as its trailer: one record of the internal
compacted topic ``__mqstore_producer_state`` (mqstore.internal_log) written right
after the batch under the same lock hold, keyed by (producer id, topic, partition)::

    key   (big-endian): producer_id i64 | partition i32 | topic (utf-8, the rest)
    value (big-endian): epoch i16 | batches u8 | batches x (first_sequence i32
                        | last_sequence i32 | base_offset i64), oldest first

The batch's records and the trailer are one append group (FLAG_GROUP_OPEN,
mqstore.commitlog.record): a crash keeps both or neither, as Kafka's batch header
carries the producer id and sequences with the records. So no crash can leave a
batch whose state is lost (its retry would be appended again) or a state naming a
batch the log lost; a follower's end never splits the group (the leader cuts chunks
at group ends) and a promoted follower drops a group it holds only half of. The
state is folded from the topic when the broker starts and by ``reload`` (after a
promotion or a truncation); compaction keeps one record per key. A journal left by
an older version (below) is imported into the topic once and removed.

Persistence, on the segmented engine (its own logs are per partition): a journal,
``broker-producers.log`` in the store's root. Every appended
batch adds one record to it right after the engine's append returns (one ``write``
on the produce thread, which the page cache keeps across a SIGKILL); at open the
journal is replayed, and it is compacted (rewritten with the remembered batches
only, to a temporary file, fsynced, renamed over, the directory fsynced) at open, at
close and whenever it passes ``JOURNAL_BYTES_MAX``. Record layout (big-endian)::

    crc32 u32 (zlib, of what follows) | producer_id i64 | epoch i16 | partition i32
    | first_sequence i32 | last_sequence i32 | base_offset i64 | topic_bytes u16
    | topic (utf-8, topic_bytes)

Crash policy: a record with a bad CRC or cut short ends the replay there (a torn
last write); what it held is forgotten, as an unknown producer is. Batches whose
base offset is at or past the partition's end after a crash (the engine lost them:
a power cut under async flush) are dropped by ``prune``. The window between the
engine's append and the journal write is one ``write`` call: a SIGKILL inside it
forgets that one batch, and its retry would be appended again. A record of the
state topic that does not decode is skipped and counted (``malformed``). Producer
ids stay unique across restarts: they start from the wall clock.

Not thread-safe: the broker calls it from its one produce thread only (and
``close`` after that thread stopped).
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from typing import Final, NamedTuple

from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.durable import fsync_directory, fsync_file
from mqstore.commitlog.errors import StoreError
from mqstore.internal_log import PRODUCERS_TOPIC, InternalLog

__all__ = [
    "BATCHES_REMEMBERED",
    "JOURNAL_NAME",
    "ProducerIds",
    "ProducerState",
    "SequenceCheck",
]

log = logging.getLogger(__name__)

JOURNAL_NAME: Final = "broker-producers.log"
#: The journal is compacted past this size: at most PRODUCERS_MAX * 5 records of
#: about 60 bytes survive a compaction, so 8 MiB holds many batches between them.
JOURNAL_BYTES_MAX: Final = 8 << 20
#: crc32, producer_id, epoch, partition, first_sequence, last_sequence, base_offset,
#: topic_bytes (the topic's utf-8 bytes follow).
JOURNAL_RECORD: Final = struct.Struct(">IqhiiiqH")
assert JOURNAL_RECORD.size == 36
_CRC_BYTES: Final = 4

#: The state topic's key before the topic's UTF-8 bytes: producer_id, partition.
STATE_KEY: Final = struct.Struct(">qi")
#: The state topic's value: epoch, batch count, then STATE_BATCH per batch.
STATE_HEAD: Final = struct.Struct(">hB")
STATE_BATCH: Final = struct.Struct(">iiq")  # first_sequence, last_sequence, base_offset
assert STATE_KEY.size == 12 and STATE_HEAD.size == 3 and STATE_BATCH.size == 16

BATCHES_REMEMBERED: Final = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SEQUENCE_MODULUS: Final = 1 << 31  # sequences are int32 and wrap to 0
NO_PRODUCER_ID: Final = -1
PRODUCERS_MAX: Final = 100_000  # bound on the partitions' state; the oldest go first
_ID_CLOCK_SHIFT: Final = 12  # ids = wall ms << 12 | counter: 4,096 ids per ms
assert (int(time.time() * 1000) << _ID_CLOCK_SHIFT) < 2**63


class SequenceCheck(NamedTuple):
    """What a batch's sequence means: ``error`` 0 to append it, else Kafka's code;
    ``duplicate_offset`` the original base offset of a duplicate (error 0)."""

    error: int
    duplicate_offset: int | None = None


_APPEND: Final = SequenceCheck(0)
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
INVALID_PRODUCER_EPOCH: Final = 47


class _Entry:
    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        # (first sequence, last sequence, base offset) of the last batches, oldest first
        self.batches: deque[tuple[int, int, int]] = deque(maxlen=BATCHES_REMEMBERED)


class ProducerIds:
    """Hands out producer ids unique across restarts of one machine's clock."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        candidate = int(time.time() * 1000) << _ID_CLOCK_SHIFT
        self._last = max(candidate, self._last + 1)
        return self._last


class ProducerState:
    """Sequence state per (producer id, topic, partition), kept in the log when
    ``log`` is given, else journaled in ``directory`` when one is given (see the
    module docstring), else in memory only."""

    def __init__(self, directory: str | None = None, log: InternalLog | None = None) -> None:
        """Fold the state topic (``log``), or replay and compact the journal in
        ``directory`` (None for both: memory only). With ``log``, a journal found in
        ``directory`` is imported into the topic once and removed.

        Raises:
            StoreError: the journal cannot be rewritten (a read-only or full disk).
        """
        self._entries: dict[tuple[int, str, int], _Entry] = {}
        # (producer id, topic, partition) -> (epoch, first sequence, error code) of
        # the last batch refused unappended (``refused``); cleared by an append
        self._refused: dict[tuple[int, str, int], tuple[int, int, int]] = {}
        self._log = log
        self._path = None if directory is None else os.path.join(directory, JOURNAL_NAME)
        self._fd = -1
        self._journal_bytes = 0
        self.malformed = 0  # state records skipped because they did not decode
        if log is not None:
            self._fold()
            if self._path is not None and not log.is_follower():
                self._import_journal(self._path)
            self._path = None  # never journaled to a file again
        elif self._path is not None:
            self._replay(self._path)
            self._compact()

    def reload(self) -> int:
        """Rebuild the state from the log (after a promotion or a truncation);
        returns the records folded (0 without a log)."""
        if self._log is None:
            return 0
        self._entries.clear()
        return self._fold()

    def _fold(self) -> int:
        """Apply every record of the state topic, oldest first: what readers see,
        then what the log holds past it (a leader restarted held)."""
        assert self._log is not None
        offset, latest = self._log.bounds()
        folded = 0
        while offset < latest:
            batch = self._log.read(offset)
            if not len(batch):
                break  # the rest is not dispatched yet
            for key, value in zip(batch.keys, batch.values, strict=True):
                self._apply(key, value)
            folded += len(batch)
            offset = batch.offsets[-1] + 1
        unexposed = self._log.read_unexposed(offset)
        for key, value in unexposed:
            self._apply(key, value)
        return folded + len(unexposed)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        try:
            if key is None:
                raise ValueError("no key")
            pid, partition = STATE_KEY.unpack_from(key, 0)
            topic = bytes(key[STATE_KEY.size :]).decode()
            if value is None:
                self._entries.pop((pid, topic, partition), None)
                return
            epoch, count = STATE_HEAD.unpack_from(value, 0)
            if len(value) != STATE_HEAD.size + count * STATE_BATCH.size or count == 0:
                raise ValueError(f"{len(value)} bytes for {count} batches")
            batches = [
                STATE_BATCH.unpack_from(value, STATE_HEAD.size + i * STATE_BATCH.size)
                for i in range(count)
            ]
        except (struct.error, UnicodeDecodeError, ValueError) as error:
            self.malformed += 1
            log.warning("%s: a record that does not decode skipped: %s", PRODUCERS_TOPIC, error)
            return
        self._entries.pop((pid, topic, partition), None)  # the newest record goes last
        for first, last, base in batches[-BATCHES_REMEMBERED:]:
            self._remember(pid, epoch, topic, partition, first, last, base)

    def _import_journal(self, path: str) -> None:
        """Append the entries of an older version's journal to the log, then remove it."""
        if not os.path.exists(path):
            return
        self._replay(path)
        try:
            for key in list(self._entries):
                self._write_entry(key)
            os.unlink(path)
            fsync_directory(os.path.dirname(path))
        except (OSError, StoreError) as error:
            log.warning("producer journal %s not imported: %s", path, error)

    def _write_entry(self, key: tuple[int, str, int]) -> None:
        """Append one producer's entry to the state topic (raises StoreError)."""
        assert self._log is not None
        entry = self._entries[key]
        pid, topic, partition = key
        value = _state_value(entry.epoch, list(entry.batches))
        self._log.append([(STATE_KEY.pack(pid, partition) + topic.encode(), value)])

    def trailer(
        self, producer_id: int, epoch: int, topic: str, partition: int, first: int, count: int
    ) -> Trailer | None:
        """The state record to append with this batch as its trailer (one append
        group: see the module), or None: no state topic, or no producer id. Its value
        is the entry as ``appended`` will leave it, with the batch's base offset
        filled in under the append lock.

        Raises:
            StoreError: the state topic cannot be created.
        """
        if self._log is None or producer_id == NO_PRODUCER_ID:
            return None
        entry = self._entries.get((producer_id, topic, partition))
        kept = [] if entry is None or entry.epoch != epoch else list(entry.batches)
        kept = kept[1 - BATCHES_REMEMBERED :]  # the new batch makes five
        last = (first + count - 1) % SEQUENCE_MODULUS

        def value_for(base_offset: int) -> bytes:
            return _state_value(epoch, [*kept, (first, last, base_offset)])

        return self._log.trailer(STATE_KEY.pack(producer_id, partition) + topic.encode(),
                                 value_for)  # fmt: skip

    def prune(self, end_offset: Callable[[str, int], int | None]) -> int:
        """Forget batches at or past their partition's end in the log (``end_offset``
        None: the partition is gone): a journal may name batches the engine lost, and
        a compacted topic's copy (which a truncation does not cut) may name batches a
        truncation removed. The end must be the log's, not the one readers see: a
        leader restarted held (mqstore.store_replica) holds batches past it, whose
        retries must be answered as duplicates. Returns how many were forgotten."""
        forgotten = 0
        for key in list(self._entries):
            _, topic, partition = key
            end = end_offset(topic, partition)
            entry = self._entries[key]
            kept = [b for b in entry.batches if end is not None and b[2] < end]
            forgotten += len(entry.batches) - len(kept)
            if not kept:
                del self._entries[key]
            elif len(kept) < len(entry.batches):
                entry.batches = deque(kept, maxlen=BATCHES_REMEMBERED)
        if forgotten and self._path is not None:
            self._compact()
        return forgotten

    def close(self) -> None:
        """Compact the journal and close it (idempotent)."""
        if self._fd < 0:
            return
        self._compact()
        os.close(self._fd)
        self._fd = -1

    def _replay(self, path: str) -> None:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return
        position = 0
        while position + JOURNAL_RECORD.size <= len(data):
            crc, pid, epoch, partition, first, last, base, size = JOURNAL_RECORD.unpack_from(
                data, position
            )
            end = position + JOURNAL_RECORD.size + size
            if end > len(data) or zlib.crc32(data[position + _CRC_BYTES : end]) != crc:
                break
            try:
                topic = data[end - size : end].decode()
            except UnicodeDecodeError:
                break
            self._remember(pid, epoch, topic, partition, first, last, base)
            position = end
        if position != len(data):
            log.warning("%s: torn or corrupt tail at byte %d ignored", path, position)

    def _compact(self) -> None:
        """Rewrite the journal with the remembered batches only, atomically."""
        path = self._path
        assert path is not None
        records = [
            _journal_record(pid, entry.epoch, topic, partition, *batch)
            for (pid, topic, partition), entry in self._entries.items()
            for batch in entry.batches
        ]
        tmp_path = path + ".tmp"
        try:
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, b"".join(records))
                fsync_file(fd, tmp_path)
            finally:
                os.close(fd)
            os.rename(tmp_path, path)
            fsync_directory(os.path.dirname(path))
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as error:
            raise StoreError(f"producer journal {path}: {error}") from error
        self._journal_bytes = sum(map(len, records))

    def check(
        self, producer_id: int, epoch: int, topic: str, partition: int, first: int, count: int
    ) -> SequenceCheck:
        """Whether the batch (sequences first .. first + count - 1) may be appended."""
        if producer_id == NO_PRODUCER_ID:
            return _APPEND
        key = (producer_id, topic, partition)
        entry = self._entries.get(key)
        refused = self._refused.get(key)
        if refused is not None and refused[0] == epoch and _after(first, refused[1]):
            return SequenceCheck(refused[2])  # in flight behind the refused batch
        if entry is None:
            return _APPEND  # unknown here (new, or from before a restart): start fresh
        if epoch < entry.epoch:
            return SequenceCheck(INVALID_PRODUCER_EPOCH)
        if epoch > entry.epoch:
            return _APPEND if first == 0 else SequenceCheck(OUT_OF_ORDER_SEQUENCE_NUMBER)
        last = (first + count - 1) % SEQUENCE_MODULUS
        for old_first, old_last, base_offset in entry.batches:
            if old_first == first and old_last == last:
                return SequenceCheck(0, base_offset)
        expected = (entry.batches[-1][1] + 1) % SEQUENCE_MODULUS if entry.batches else first
        if first != expected:
            return SequenceCheck(OUT_OF_ORDER_SEQUENCE_NUMBER)
        return _APPEND

    def refused(
        self, producer_id: int, epoch: int, topic: str, partition: int, first: int, error: int
    ) -> None:
        """Remember a batch refused before its append with the retriable ``error``
        (NOT_ENOUGH_REPLICAS): until a batch of the producer is appended here, the
        batches after it are refused the same way (see the module docstring)."""
        if producer_id == NO_PRODUCER_ID:
            return
        key = (producer_id, topic, partition)
        known = self._refused.get(key)
        if known is not None and known[0] == epoch and _after(first, known[1]):
            return  # the gap starts at the earlier one
        if known is None and len(self._refused) >= PRODUCERS_MAX:
            del self._refused[next(iter(self._refused))]
        self._refused[key] = (epoch, first, error)

    def appended(
        self,
        producer_id: int,
        epoch: int,
        topic: str,
        partition: int,
        first: int,
        count: int,
        base_offset: int,
    ) -> None:
        """Remember an appended batch (with a state topic, its record went with the
        batch as its ``trailer``)."""
        if producer_id == NO_PRODUCER_ID:
            return
        self._refused.pop((producer_id, topic, partition), None)
        last = (first + count - 1) % SEQUENCE_MODULUS
        self._remember(producer_id, epoch, topic, partition, first, last, base_offset)
        if self._log is not None:
            return
        if self._fd < 0:
            return
        record = _journal_record(producer_id, epoch, topic, partition, first, last, base_offset)
        try:
            os.write(self._fd, record)
            self._journal_bytes += len(record)
            if self._journal_bytes > JOURNAL_BYTES_MAX:
                self._compact()
        except OSError as error:  # the batch is appended; only its memory is at risk
            log.warning("producer journal: %s", error)
        except StoreError as error:
            log.warning("%s", error)

    def _remember(
        self, pid: int, epoch: int, topic: str, partition: int, first: int, last: int, base: int
    ) -> None:
        key = (pid, topic, partition)
        entry = self._entries.get(key)
        if entry is None or entry.epoch != epoch:
            if entry is None and len(self._entries) >= PRODUCERS_MAX:
                del self._entries[next(iter(self._entries))]  # the oldest producer
            entry = self._entries[key] = _Entry(epoch)
        entry.batches.append((first, last, base))


def _after(sequence: int, other: int) -> bool:
    """Whether ``sequence`` comes after ``other`` (int32 sequences wrap to 0)."""
    return 0 < (sequence - other) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2


def _state_value(epoch: int, batches: list[tuple[int, int, int]]) -> bytes:
    """The state topic's value for an entry (see the module)."""
    parts = [STATE_HEAD.pack(epoch, len(batches))]
    parts += [STATE_BATCH.pack(*batch) for batch in batches]
    return b"".join(parts)


def _journal_record(
    pid: int, epoch: int, topic: str, partition: int, first: int, last: int, base: int
) -> bytes:
    name = topic.encode()
    assert len(name) <= 0xFFFF  # topic names are validated far shorter (249)
    assert 0 <= base < 2**63
    body = JOURNAL_RECORD.pack(0, pid, epoch, partition, first, last, base, len(name)) + name
    crc = zlib.crc32(memoryview(body)[_CRC_BYTES:])
    return crc.to_bytes(_CRC_BYTES, "big") + body[_CRC_BYTES:]
