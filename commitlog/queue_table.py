"""The CommitLog's queue-offset table: the next queue offset of every queue it appends to.

Two places hold a queue's next offset, never both:

- ``table``, a dict (topic, queue id) -> next offset: queues counted by a scan of the
  log (recovery, a replica's truncation), loaded one by one from the ConsumeQueue, or
  taken by a path written in Python (the general append path, batches, replication);
- ``seeds``, per topic a writable int64 array by queue id, loaded from the ConsumeQueue
  in one call the first time the topic needs an offset (issue 15: seeding the table with
  100,000 entries at once cost 30-130 ms). A value >= 0 is the queue's next offset, and
  the Appender (commitlog/appender.py) advances it in place; -1 leaves the queue to
  ``table``.

An append to a seeded queue so builds no (topic, queue id) key and touches no dict. At
100,000 queues the dict's tuple keys, look-ups and inserts were about 40% of the putting
thread (docs/QUEUES.md, stop 32).

The two stay disjoint: whatever writes ``table`` from Python goes through ``set``, which
clears the queue's seed slot; a seed loaded after keys of its topic entered ``table``
(a scan at open) clears their slots as it loads (``_unseeded``). Everything here runs
under the CommitLog's append lock, as the Appender does. A queue id outside a seed
(past its end, or negative: a record's int32 field) is never read from it nor written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["QueueTable"]


class QueueTable:
    """Next queue offsets: ``table`` and ``seeds``, disjoint (see the module)."""

    __slots__ = ("_asked", "_bases", "_unseeded", "queue_loader", "seeds", "table", "topic_loader")

    def __init__(self) -> None:
        self.table: dict[tuple[str, int], int] = {}
        self.seeds: dict[str, np.ndarray] = {}
        self.queue_loader: Callable[[str, int], int] | None = None
        self.topic_loader: Callable[[str], np.ndarray] | None = None
        self._bases: dict[str, np.ndarray] = {}  # each seed as loaded (read-only)
        self._asked: set[str] = set()  # topics the topic loader was asked for, once each
        self._unseeded: dict[str, set[int]] = {}  # table keys of topics with no seed yet

    def get(self, topic: str, queue_id: int) -> int:
        """The next offset of (topic, queue_id), loaded into ``table`` when neither
        place has it (or taken from its seed into ``table``)."""
        offset = self.table.get((topic, queue_id))
        return self._load(topic, queue_id) if offset is None else offset

    def known(self, topic: str, queue_id: int) -> int | None:
        """The next offset either place holds, without loading; None for neither."""
        offset = self.table.get((topic, queue_id))
        if offset is None:
            seed = self.seeds.get(topic)
            if seed is not None and 0 <= queue_id < len(seed) and seed[queue_id] >= 0:
                offset = int(seed[queue_id])
        return offset

    def set(self, key: tuple[str, int], offset: int) -> None:
        """``table[key] = offset``, the queue's seed slot cleared."""
        self.table[key] = offset
        self._in_table(*key)

    def raise_to(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Each queue's next offset to at least ``offsets[key]``, through ``set`` (a
        replica's chunk: the records it copied end there). One pass, no call per queue
        that stays where it is: at 100,000 queues a ``known`` and a ``set`` per queue cost
        0.41 µs against 0.11 µs for the dict alone."""
        table, seeds = self.table, self.seeds
        for key, offset in offsets.items():
            current = table.get(key)
            if current is None:
                seed = seeds.get(key[0])
                queue_id = key[1]
                current = 0
                if seed is not None and 0 <= queue_id < len(seed):
                    current = max(int(seed[queue_id]), 0)
            if offset > current:
                table[key] = offset
                self._in_table(*key)

    def after_scan(self) -> None:
        """After a scan wrote ``table`` directly (``scan_log``): its keys clear their
        seed slots, now or when their topic's seed loads."""
        for topic, queue_id in self.table:
            self._in_table(topic, queue_id)

    def _in_table(self, topic: str, queue_id: int) -> None:
        """The queue is in ``table``: clear its seed slot, now or when its topic's seed
        loads."""
        seed = self.seeds.get(topic)
        if seed is not None:
            if 0 <= queue_id < len(seed):
                seed[queue_id] = -1
        elif topic not in self._asked:
            self._unseeded.setdefault(topic, set()).add(queue_id)

    def clear(self) -> None:
        """Forget every offset (a replica truncated or restarted: it scans again)."""
        self.table.clear()
        self.seeds.clear()
        self._bases.clear()
        self._asked.clear()
        self._unseeded.clear()

    def snapshot(self) -> dict[tuple[str, int], int]:
        """Every queue appended to or asked for since open: ``table``, and the seeded
        queues whose offset moved."""
        out = dict(self.table)
        for topic, seed in self.seeds.items():
            moved = np.flatnonzero((seed >= 0) & (seed != self._bases[topic]))
            for queue_id, offset in zip(moved.tolist(), seed[moved].tolist(), strict=True):
                out[(topic, queue_id)] = offset
        return out

    def _load(self, topic: str, queue_id: int) -> int:
        loader = self.topic_loader
        if loader is not None and topic not in self._asked:
            self._asked.add(topic)  # once: a partition added later loads alone
            loaded = np.array(loader(topic), dtype=np.int64)  # a copy the log owns
            unseeded = self._unseeded.pop(topic, ())
            if len(loaded):
                for known in unseeded:
                    if 0 <= known < len(loaded):
                        loaded[known] = -1
                base = loaded.copy()
                base.flags.writeable = False
                self._bases[topic] = base
                self.seeds[topic] = loaded
        seed = self.seeds.get(topic)
        offset = int(seed[queue_id]) if seed is not None and 0 <= queue_id < len(seed) else -1
        if offset < 0:
            queue_loader = self.queue_loader
            offset = queue_loader(topic, queue_id) if queue_loader is not None else 0
        assert offset >= 0
        self.set((topic, queue_id), offset)
        return offset
