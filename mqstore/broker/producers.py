"""The idempotent producer's state: producer ids and per-partition sequence checks.

Kafka's rules (ProducerStateManager, ProducerStateEntry), for one (producer id,
topic, partition):

- a batch whose base sequence is the last one's + 1 (mod 2**31) is appended;
- a batch equal to one of the last ``BATCHES_REMEMBERED`` (5, Kafka's
  NUM_BATCHES_TO_RETAIN, which is also why clients keep at most 5 in flight) is a
  duplicate: it is not appended again and is answered with its original base offset;
- any other sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
  INVALID_PRODUCER_EPOCH; a newer epoch must start again at sequence 0.

Crash policy (this step): the state lives in memory. After a restart a producer id
the broker does not know starts fresh at whatever sequence it sends (Kafka answers
UNKNOWN_PRODUCER_ID there and the client resets); a retry of a batch that was
appended just before the crash may then be appended twice. Producer ids stay unique
across restarts: they start from the wall clock. Rebuilding the state from stored
batch headers comes with the B2 mapping (docs/BROKER.md section 4).

Not thread-safe: the broker calls it from its one produce thread only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Final, NamedTuple

__all__ = ["BATCHES_REMEMBERED", "ProducerIds", "ProducerState", "SequenceCheck"]

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
    """Sequence state per (producer id, topic, partition)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str, int], _Entry] = {}

    def check(
        self, producer_id: int, epoch: int, topic: str, partition: int, first: int, count: int
    ) -> SequenceCheck:
        """Whether the batch (sequences first .. first + count - 1) may be appended."""
        if producer_id == NO_PRODUCER_ID:
            return _APPEND
        entry = self._entries.get((producer_id, topic, partition))
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
        """Remember an appended batch."""
        if producer_id == NO_PRODUCER_ID:
            return
        key = (producer_id, topic, partition)
        entry = self._entries.get(key)
        if entry is None or entry.epoch != epoch:
            if entry is None and len(self._entries) >= PRODUCERS_MAX:
                del self._entries[next(iter(self._entries))]  # the oldest producer
            entry = self._entries[key] = _Entry(epoch)
        last = (first + count - 1) % SEQUENCE_MODULUS
        entry.batches.append((first, last, base_offset))
