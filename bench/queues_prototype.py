"""Throwaway prototypes behind the option figures of docs/QUEUES.md (issue 15).

Not the store's code: each prototype patches the running store (TailWriter.write and
ConsumeQueue.get_range) so that the units of every queue go to another storage, then
measures one case as bench.queues does (a fresh store and topic, timed puts, the wait
until the dispatcher's lag is 0, then a get() of the last message of 64 queues).

- ``shared``: one append-only file of 48-byte records (the unit, queue id, queue
  offset, time) per topic, one pwrite per dispatch round; per queue an array of
  record indexes in memory; get_range gathers through it.
- ``lmdb``: units keyed (queue id, queue offset) big-endian, one write transaction
  per dispatch round (sync=False: no durability, a lower bound on its cost).
- ``-lean`` suffix: also no ConsumeQueue object per queue on the put and dispatch
  paths (the CommitLog's first put to a queue asks for its max offset: 0 for a queue
  without an object in a fresh store).

    python -m bench.queues_prototype MODE QUEUES [MESSAGES]   # one JSON line
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import time
from array import array
from typing import Any

import numpy as np

from mqstore import MessageStore, StoreConfig
from mqstore.consumequeue import consume_queue, tail_writer
from mqstore.consumequeue.format import UNIT

RECORD = np.dtype(
    [("commitlog_offset", "<i8"), ("size", "<i4"), ("tag_hash", "<i8"), ("queue_id", "<i4"),
     ("queue_offset", "<i8"), ("timestamp_ms", "<i8"), ("reserved", "<u8")]
)  # fmt: skip
assert RECORD.itemsize == 48
RECORD_UNIT = np.dtype(
    {"names": ["commitlog_offset", "size", "tag_hash"], "formats": ["<i8", "<i4", "<i8"],
     "offsets": [0, 8, 12], "itemsize": 48}
)  # fmt: skip
KEY = struct.Struct(">IQ")


class SharedFile:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.fd = os.open(os.path.join(directory, "0" * 20), os.O_RDWR | os.O_CREAT, 0o644)
        self.count = 0
        self.records: np.ndarray | None = None

    def append(self, records: np.ndarray) -> None:
        os.pwrite(self.fd, records.tobytes(), self.count * RECORD.itemsize)
        self.count += len(records)

    def gather(self, positions: np.ndarray) -> np.ndarray:
        size = os.fstat(self.fd).st_size
        if self.records is None or len(self.records) * RECORD.itemsize < size:
            mapping = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
            self.records = np.frombuffer(mapping, dtype=RECORD_UNIT)
        return self.records[positions].astype(UNIT)


class LmdbUnits:
    def __init__(self, directory: str) -> None:
        import lmdb

        self.env = lmdb.open(directory, map_size=1 << 34, sync=False, metasync=False)

    def put(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def range(self, queue_id: int, start: int, count: int) -> np.ndarray:
        values = []
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(KEY.pack(queue_id, start)):
                for key, value in cursor:
                    if KEY.unpack(key)[0] != queue_id or len(values) >= count:
                        break
                    values.append(value[: UNIT.itemsize])
        return np.frombuffer(b"".join(values), dtype=UNIT)


def install(store: MessageStore, root: str, mode: str, lean: bool) -> None:
    shared = SharedFile(os.path.join(root, "consumequeue", "t", ".shared"))
    kv = LmdbUnits(os.path.join(root, "cq.lmdb")) if mode == "lmdb" else None
    index: list[array[int]] = []
    nexts: list[int] = []
    queue_ids: list[int] = []
    original_add = tail_writer.TailWriter._add_slot

    class Lite:  # slot state without a ConsumeQueue (lean)
        __slots__ = ("_max_offset",)

        def __init__(self) -> None:
            self._max_offset = 0

    def add_slot(self: Any, topic: str, queue_id: int) -> int:
        if lean:
            slot = len(self._queues)
            self._queues.append(Lite())
            self._refs.append(None)
            self._slots[(topic, queue_id)] = slot
        else:
            slot = original_add(self, topic, queue_id)
        index.append(array("q"))
        nexts.append(0)
        queue_ids.append(queue_id)
        return slot

    def write(self: Any, slots: np.ndarray, offsets: np.ndarray, clogs: np.ndarray,
              sizes: np.ndarray, tags: np.ndarray, times: np.ndarray) -> None:  # fmt: skip
        slot_list, offset_list = slots.tolist(), offsets.tolist()
        if kv is None:
            records = np.zeros(len(slots), dtype=RECORD)
            records["commitlog_offset"], records["size"], records["tag_hash"] = clogs, sizes, tags
            records["queue_id"] = np.asarray(queue_ids, dtype=np.int32)[slots]
            records["queue_offset"], records["timestamp_ms"] = offsets, times
            base = shared.count
            shared.append(records)
            for slot, offset, position in zip(
                slot_list, offset_list, range(base, base + len(slots)), strict=True
            ):
                assert offset == nexts[slot]
                index[slot].append(position)
                nexts[slot] = offset + 1
        else:
            units = np.zeros(len(slots), dtype=[("unit", UNIT), ("time", "<i8")])
            units["unit"]["commitlog_offset"], units["unit"]["size"] = clogs, sizes
            units["unit"]["tag_hash"], units["time"] = tags, times
            raw, width = units.tobytes(), units.itemsize
            pairs = enumerate(zip(slot_list, offset_list, strict=True))
            kv.put([(KEY.pack(queue_ids[slot], offset), raw[i * width : (i + 1) * width])
                    for i, (slot, offset) in pairs])  # fmt: skip
            for slot, offset in zip(slot_list, offset_list, strict=True):
                nexts[slot] = offset + 1
        for slot in set(slot_list):
            self._queues[slot]._max_offset = nexts[slot]

    def get_range(self: Any, start: int, max_units: int) -> np.ndarray:
        slot = store._dispatcher._tail._slots[(self.topic, self.queue_id)]  # type: ignore[union-attr]
        count = min(max_units, nexts[slot] - start)
        if kv is not None:
            return kv.range(self.queue_id, start, count)
        return shared.gather(np.frombuffer(index[slot], dtype=np.int64)[start : start + count])

    tail_writer.TailWriter._add_slot = add_slot  # type: ignore[method-assign]
    tail_writer.TailWriter.write = write  # type: ignore[method-assign]
    consume_queue.ConsumeQueue.get_range = get_range  # type: ignore[method-assign]
    if lean:
        store_queue = type(store.consume_queues).queue

        def queue(self: Any, topic: str, queue_id: int) -> Any:
            found = store_queue(self, topic, queue_id)
            slot = store._dispatcher._tail._slots.get((topic, queue_id))  # type: ignore[union-attr]
            if slot is not None:
                found._max_offset = nexts[slot]
            return found

        type(store.consume_queues).queue = queue  # type: ignore[method-assign]


def _lean_max_offset(self: MessageStore, topic: str, queue_id: int) -> int:
    found = self.consume_queues._queues.get((topic, queue_id))
    return 0 if found is None else found.max_offset


def main() -> None:
    mode, queues = sys.argv[1], int(sys.argv[2])
    messages = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
    lean = mode.endswith("-lean")
    mode = mode.removesuffix("-lean")
    if lean:  # before open: the CommitLog keeps the bound method
        MessageStore._queue_max_offset = _lean_max_offset  # type: ignore[method-assign]
    root = tempfile.mkdtemp(prefix="queues-prototype-")
    store = MessageStore.open(root, StoreConfig(commitlog_file_size_bytes=256 << 20, prewarm=False))
    store.create_topic("t", queues)
    install(store, root, mode, lean)
    fds_before = len(os.listdir("/proc/self/fd"))
    body = b"x" * 100
    started = time.perf_counter()
    for index in range(messages):
        store.put("t", index % queues, body)
    while store._dispatcher.lag_bytes():  # type: ignore[union-attr]
        time.sleep(0.0005)
    elapsed_s = time.perf_counter() - started
    fds = len(os.listdir("/proc/self/fd")) - fds_before
    for queue_id in range(0, queues, max(1, queues // 64)):
        last = messages // queues + (queue_id < messages % queues) - 1
        got = store.get("t", queue_id, last, 1)
        assert len(got) == 1 and got[0].body == body
    shown = f"{mode}{'-lean' if lean else ''}"
    rate = round(messages / elapsed_s)
    figures = {"mode": shown, "queues": queues, "readable_msg_per_s": rate, "open_fds_growth": fds}
    print(json.dumps(figures))
    shutil.rmtree(root, ignore_errors=True)
    os._exit(0)  # the patched store is not closed cleanly


if __name__ == "__main__":
    main()
