"""The read path of MessageStore: ``get`` (Messages) and ``get_batch`` (columns).

Both read the same way. The ConsumeQueue gives units from the offset (``get_range``
stops at the end of each queue file); the units are cut into runs, one per CommitLog
file they point into, and each run is read and verified in one call
(``mqstore.batch.read_run``, C when built): every record must be exactly its unit's,
checksum included, or the read raises CorruptDataError. ``get`` then makes one
Message per row; ``get_batch`` hands the columns back.

A unit below the CommitLog's start means retention deleted the message
(OffsetOutOfRangeError); a unit anywhere else outside the log is corrupt. A file that
retention unmaps between the look-up and the read is OffsetOutOfRangeError too, never
a bare ``ValueError: mmap closed``. Mixed into MessageStore, like CommitLogEngine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NoReturn

import numpy as np

from mqstore.batch import MessageBatch, read_run, read_run_timestamps
from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    OffsetOutOfRangeError,
)

if TYPE_CHECKING:
    from mqstore.commitlog.commitlog import CommitLog
    from mqstore.commitlog.mapped_file import MappedFile
    from mqstore.compaction import CompactionLogs, CopyReader
    from mqstore.message import Message

__all__ = [
    "GET_BATCH_BYTES_DEFAULT",
    "GET_BATCH_BYTES_MAX",
    "GET_BATCH_MESSAGES_DEFAULT",
    "GET_BATCH_MESSAGES_MAX",
    "GET_MESSAGES_MAX",
    "StoreReader",
    "check_count",
    "check_offset",
]

GET_MESSAGES_MAX: Final = 10_000  # one get() returns at most this many messages
#: One get_batch holds at most this many messages: its columns take 72 B a message
#: besides the record bytes (4.7 MB at the maximum), and a larger read gains nothing.
GET_BATCH_MESSAGES_MAX: Final = 65_536
GET_BATCH_MESSAGES_DEFAULT: Final = 1_024
#: The records of one get_batch total at most max_bytes (but it always holds at least
#: one message): Kafka's fetch.max.bytes (50 MiB). The cap keeps a batch's bodies well
#: under 2 GiB, what an Arrow binary column (int32 offsets) can address.
GET_BATCH_BYTES_DEFAULT: Final = 64 << 20
GET_BATCH_BYTES_MAX: Final = 1 << 30
#: Up to this many units, the byte budget sums a Python list (~30 ns a unit) rather
#: than calling numpy (~1.5 us a call, whatever the length).
_LIST_SUM_UNITS_MAX: Final = 32


class StoreReader:
    """Mixed into MessageStore: ``get`` and ``get_batch``."""

    if TYPE_CHECKING:  # what MessageStore provides
        commitlog: CommitLog
        _compaction: CompactionLogs | CopyReader | None

        def _check_open(self) -> None: ...
        def _queue(self, topic: str, queue_id: int) -> Any: ...

    def get(self, topic: str, queue_id: int, offset: int, max_messages: int = 32) -> list[Message]:
        """Messages of (topic, queue_id) from ``offset``, at most ``max_messages``.

        An offset equal to max_offset returns []. Every returned message was verified
        against its checksum. Bodies are read-only views into one copy of this call's
        bodies (see Message): valid after retention, never a window into the log.

        Raises:
            UnknownTopicError: ``queue_id`` is not a partition of ``topic``.
            OffsetOutOfRangeError: ``offset`` < min_offset or > max_offset.
            CorruptDataError: a record fails verification (never returned).
        """
        self._check_open()
        check_count("max_messages", max_messages, GET_MESSAGES_MAX)
        check_offset(offset)
        compacted = self._compacted_read(topic, queue_id, offset, max_messages, None)
        if compacted is not None:
            return compacted.messages()
        runs = self._read_runs(topic, queue_id, offset, max_messages, None)
        if len(runs) == 1:
            return runs[0].messages()
        messages: list[Message] = []
        for run in runs:
            messages += run.messages()
        return messages

    def get_batch(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = GET_BATCH_MESSAGES_DEFAULT,
        *,
        max_bytes: int = GET_BATCH_BYTES_DEFAULT,
    ) -> MessageBatch:
        """Messages of (topic, queue_id) from ``offset`` as columns (mqstore.batch):
        at most ``max_messages``, and records of at most ``max_bytes`` in all (sizes
        as stored, headers included) but always at least one message when there is
        one. Verified as ``get`` verifies; nothing is made per message.

        Raises:
            UnknownTopicError: ``queue_id`` is not a partition of ``topic``.
            OffsetOutOfRangeError: ``offset`` < min_offset or > max_offset, or
                retention deleted the records while they were read.
            InvalidArgumentError: ``max_messages`` or ``max_bytes`` out of range.
            CorruptDataError: a record fails verification.
        """
        self._check_open()
        check_count("max_messages", max_messages, GET_BATCH_MESSAGES_MAX)
        check_count("max_bytes", max_bytes, GET_BATCH_BYTES_MAX)
        check_offset(offset)
        compacted = self._compacted_read(topic, queue_id, offset, max_messages, max_bytes)
        if compacted is not None:
            return compacted
        runs = self._read_runs(topic, queue_id, offset, max_messages, max_bytes)
        return MessageBatch.concat(topic, queue_id, runs)

    def _compacted_read(
        self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int | None
    ) -> MessageBatch | None:
        """A compacted queue's read below its copy's end (mqstore.compaction), or None."""
        compaction = self._compaction
        if compaction is None or not compaction.compacted(topic, queue_id):
            return None  # other topics' reads check and catch up once, in _read_runs
        self._queue(topic, queue_id)  # the checks and a catch-up before the copy's end

        def read_queue(start: int) -> MessageBatch:
            runs = self._read_runs(topic, queue_id, start, max_messages, max_bytes)
            return MessageBatch.concat(topic, queue_id, runs)

        return compaction.read_from(topic, queue_id, offset, max_messages, max_bytes, read_queue)

    def _read_runs(
        self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int | None
    ) -> list[MessageBatch]:
        """The runs from ``offset``: at most ``max_messages`` messages and, unless
        ``max_bytes`` is None, records of at most that many bytes (one at least)."""
        queue = self._queue(topic, queue_id)
        runs: list[MessageBatch] = []
        count = 0
        budget = max_bytes
        while True:
            units = queue.get_range(offset, max_messages - count)
            if budget is not None and len(units):
                units, budget = _within_budget(units, budget, at_least_one=count == 0)
            taken = len(units)
            if taken == 0:
                break
            runs += self._read_units(queue, topic, queue_id, offset, units)
            offset += taken
            count += taken
            # get_range stops at a file's end, at the shared log's end and at max_offset:
            # only the first two need another call. The max offset it stopped at, not a
            # new one: a read-only queue would re-read the writer's files a second time.
            if count == max_messages or budget == 0 or offset >= queue.known_max_offset:
                break
        assert count <= max_messages
        return runs

    def _read_units(
        self, queue: Any, topic: str, queue_id: int, offset: int, units: np.ndarray
    ) -> list[MessageBatch]:
        """Read the records ``units`` (queue offsets from ``offset``) point at: one run
        per CommitLog file."""
        physicals = units["commitlog_offset"]
        sizes = units["size"]
        count = len(physicals)
        runs = []
        start = 0
        while start < count:
            physical = int(physicals[start])
            mapped = self._file_of_unit(queue, topic, queue_id, offset + start, physical)
            file_end = mapped.start_offset + mapped.size_bytes
            stop = count  # units are in log order: the run ends at the first past the file
            if int(physicals[count - 1]) >= file_end:
                stop = max(start + 1, int(np.searchsorted(physicals, file_end, side="left")))
            whole = start == 0 and stop == count  # one file (a small read): no slices
            try:
                run = read_run(
                    mapped.mapping, mapped.path, mapped.start_offset,
                    physicals if whole else physicals[start:stop],
                    sizes if whole else sizes[start:stop], topic, queue_id, offset + start,
                )  # fmt: skip
            except ValueError:
                if not mapped.mapping.closed:
                    raise
                self._raise_file_gone(topic, queue_id, offset + start, mapped)
            runs.append(run)
            start = stop
        assert start == count
        return runs

    def _record_timestamps(
        self,
        queue: Any,
        topic: str,
        queue_id: int,
        start: int,
        physicals: Any,
        sizes: Any,
        *,
        create_time: bool,
    ) -> list[int]:
        """The born (``create_time``) or store timestamps of the records that units
        ``physicals``/``sizes`` (queue offsets from ``start``; int64 arrays the caller
        owns) point at, each verified as ``get`` verifies it; no batch is built.

        Raises:
            As ``get``.
        """
        stamps: list[int] = []
        count = len(physicals)
        at = 0
        while at < count:
            mapped = self._file_of_unit(queue, topic, queue_id, start + at, int(physicals[at]))
            file_end = mapped.start_offset + mapped.size_bytes
            stop = count  # units are in log order: the run ends at the first past the file
            if physicals[count - 1] >= file_end:
                stop = at + 1
                while physicals[stop] < file_end:
                    stop += 1
            whole = at == 0 and stop == count  # one file (a time probe's two units): no copies
            try:
                run = read_run_timestamps(
                    mapped.mapping, mapped.path, mapped.start_offset,
                    physicals if whole else physicals[at:stop], sizes if whole else sizes[at:stop],
                    topic, queue_id, start + at, create_time=create_time,
                )  # fmt: skip
            except ValueError:
                if not mapped.mapping.closed:
                    raise
                self._raise_file_gone(topic, queue_id, start + at, mapped)
            if whole:
                return run
            stamps += run
            at = stop
        return stamps

    def _raise_file_gone(
        self, topic: str, queue_id: int, queue_offset: int, mapped: MappedFile
    ) -> NoReturn:
        """A CommitLog file was unmapped between finding it and reading it: retention
        deleted it (or the store closed). Never a bare ``ValueError: mmap closed``."""
        self._check_open()
        raise OffsetOutOfRangeError(
            f"{topic}/{queue_id}@{queue_offset} was in {mapped.path}, which retention "
            f"deleted during the read; the log now starts at {self.commitlog.min_position}"
        )

    def _file_of_unit(
        self, queue: Any, topic: str, queue_id: int, queue_offset: int, physical: int
    ) -> MappedFile:
        """The CommitLog file a unit points into. A unit below the log start means
        retention (OffsetOutOfRangeError); anywhere else outside the log, the unit
        itself is corrupt."""
        try:
            return self.commitlog.file_for(physical)
        except OffsetOutOfRangeError:
            if 0 <= physical < self.commitlog.min_position:  # < 0: never a log offset
                raise
            raise CorruptDataError(
                queue.directory,
                queue_offset * 20,
                f"unit of {topic}/{queue_id}@{queue_offset} points at {physical}, "
                "outside the CommitLog",
            ) from None


def _within_budget(units: np.ndarray, budget: int, *, at_least_one: bool) -> tuple[np.ndarray, int]:
    """The first ``units`` whose records total at most ``budget`` bytes (the first
    unit always, when ``at_least_one``), and the budget left (0 once one did not fit)."""
    sizes = units["size"]
    # A few units: one sum of a list costs less than numpy's per-call overhead.
    if len(sizes) <= _LIST_SUM_UNITS_MAX:
        total = sum(sizes.tolist())
    else:
        total = int(sizes.sum(dtype=np.int64))
    if total <= budget:
        return units, budget - total
    taken = np.cumsum(sizes, dtype=np.int64)
    fits = int(np.searchsorted(taken, budget, side="right"))
    assert fits < len(units)
    return units[: max(fits, 1 if at_least_one else 0)], 0


def check_offset(value: object, name: str = "offset") -> None:
    """Offsets and timestamps are non-negative ints; a negative offset is out of range."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        if name == "offset":
            raise OffsetOutOfRangeError(f"offset {value} is negative")
        raise InvalidArgumentError(f"{name} {value} is negative")


def check_count(name: str, value: object, maximum: int) -> None:
    """A count argument: an int in [1, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= maximum:
        raise InvalidArgumentError(f"{name} must be in [1, {maximum}], not {value}")
