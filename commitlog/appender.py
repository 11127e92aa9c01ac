"""The append state of the CommitLog, and its common case in one call.

An ``Appender`` holds everything ``CommitLog.append`` changes: the write position,
the newest store timestamp, the current file (its mapping and bounds), the threshold
that prepares the next file, the dispatcher's feed (and whether it overflowed), and a
reference to the queue-offset table, a dict shared with the CommitLog. Its
``append(topic, queue_id, body, tag, born_ts_ms, keys, properties)`` does the common
case whole: the argument checks, the queue offset, the store timestamp, encode and
checksum into the mapping, the new write position, the feed entry and the append
listener. It is ``commitlog._native.Appender`` (C) when built, else ``PyAppender``
below, its pure-Python twin: tests/commitlog/test_appender.py proves that both write
the same bytes, return the same results and feed the same entries.

``append`` returns the ``AppendResult``, or None when it changed nothing and left the
append to CommitLog's general path, which does it exactly as before. None is never an
outcome a caller sees; it stands for these cases, all rare on a running log:

- an argument the general path must check or refuse (it raises the typed StoreError
  with its message), or encode (a memoryview body, a tag longer than 255 bytes);
- a topic not yet in record.py's cache of validated names (the general path
  validates it, and the cache has it from then on);
- a queue neither in its topic's seed nor in the offset table; its offset comes from
  the ConsumeQueue. ``seeds`` maps a topic to a writable int64 buffer of next offsets
  by queue id: a value >= 0 is the queue's next offset, advanced in place by each
  append (the table has no entry for such a queue: the CommitLog keeps the two
  disjoint), and -1 leaves the queue to the table. So an append to a seeded queue
  builds no key and touches no dict: at 100,000 queues the table's tuple keys and
  look-ups were 40% of the putting thread (issue 15, docs/QUEUES.md stop 32). The C
  Appender takes a seed's writable view once and keeps it while the seed stays the
  last one it looked up: a seed is not resized or made read-only meanwhile (the
  CommitLog never does);
- a record that does not fit the current file (roll), or that crosses the threshold
  that prepares the next one (a request to the allocation service);
- a log that refuses appends (``accepting`` false: closed, sealed, read-only, rejected
  writes, or poisoned by a failed sync), where the general path raises the error.

keys and properties arrive encoded (b"" for none), and a record of any size goes
through ``append`` as long as it fits the file.

The lock. ``lock`` is the CommitLog's one append lock (``CommitLog._lock``): an
``AppendLock`` from the C module when built (a PyThread lock that C takes without a
Python call and Python takes with ``with``), else a ``threading.Lock``. ``append``
takes it around everything it reads or writes of the append state, and releases it
before calling the listener. Every other path that reads or changes that state takes
the same lock: ``append``'s general path, ``append_batch`` and ``append_slices``, the
roll (under the general path's lock), ``flush_to`` (its snapshot of the write position
and timestamp), ``enable_feed``/``take_feed``, ``seal``/``close``, retention's
``delete_oldest_file`` and ``queue_offsets``. Recovery changes the state before
services start, with no other thread about. So holding the GIL is not the argument:
the C code does not depend on it for atomicity, which matters because it cannot
promise to keep it (the injected clock is Python code, and any allocation may run the
garbage collector and with it finalizers, which may switch threads). The GIL only
makes each member read or write from Python a whole value.

The listener's gate. ``listener`` is called after an append only while ``listen`` is
set (True when built). With ``listen_once`` set, the append clears ``listen`` before
the call, so the listener runs once per arming and whoever armed it re-arms it
(``CommitLog.arm_append_listener``): the dispatcher does when it goes back to sleep
and while readers wait (dispatch/dispatcher.py, ``appended``), so the appends in
between make no Python call. The check and the clear are one step under the GIL. A
listener that raises is left armed: the next append calls it again.

Four members are set without the lock: ``accepting`` after a poison or a reject
(``CommitLog._update_accepting``; seal and close set it under the lock), ``listener``,
``listen`` and ``listen_once``. Each is one store; a stale
``accepting`` at worst sends one append to the general path, which checks the log's
state itself, or lets one append through that raced the failure it would have been
refused for, as the Python path always did (the failure is set under the flush lock,
not the append lock). A record appended then is never acknowledged by a sync flush.

Memory safety (C): every member can be set from Python, so none is trusted. The file
bounds are checked on every call without overflow (``0 <= write_position -
file_start <= file_size``), the record must fit before the file's end with room for a
blank record, and it is written only through a buffer of the mapping whose length is
checked. tests/commitlog/test_native_fuzz.py drives both types with hostile state.

Crash policy: as ``CommitLog.append``'s: a record is whole or absent after a crash
(recovery stops at the first record that does not verify). Everything ``append``
allocates (results, feed entry) is allocated before it writes a byte; after the write,
replacing the queue's offset in the table allocates nothing, and a feed that cannot
grow is marked overflowed (the dispatcher then reads the log). So an append that
raises has written nothing, unless the clock's Python code removed the queue from the
table: then its record, past the write position, is overwritten by the next append,
or survives a crash as any unacknowledged write can.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import (
    BLANK_SIZE,
    FLAG_NULL_BODY,
    HEADER_SIZE,
    RECORD_SIZE_MAX,
    _topic_cache,
    encode_into,
)

__all__ = [
    "AppendResult",
    "BatchFeed",
    "FEED_BORN",
    "FEED_ENTRIES_MAX",
    "FEED_KEYED",
    "FEED_TAGGED",
    "FeedEntry",
    "PyAppender",
    "QUEUE_ID_MAX",
    "feed_columns",
    "feed_columns_py",
    "new_append_lock",
    "new_appender",
]

QUEUE_ID_MAX = 2**31 - 1  # queue_id is an i32 in the record header, never negative
FEED_ENTRIES_MAX = 1 << 16  # appends kept for the dispatcher; past it, it reads the log
TAG_MAX_BYTES = 255  # tag_len is a u8
KEYS_MAX_BYTES = 0xFFFF  # keys_len is a u16
_INT64_MAX = (1 << 63) - 1


class AppendResult(NamedTuple):
    """Where one appended record landed. A NamedTuple: immutable, named, and cheap to
    build on the per-message path (an attrs frozen class costs 2x here)."""

    physical_offset: int
    queue_offset: int
    store_timestamp_ms: int
    size: int


_new_result = tuple.__new__  # builds a NamedTuple without its Python-level __new__


class BatchFeed(NamedTuple):
    """One append_batch as the dispatcher sees it (``encoded`` from encode_batch)."""

    positions: np.ndarray
    sizes: np.ndarray
    topic: str
    queue_id: int
    first_queue_offset: int
    store_ts_ms: int
    #: Per-record (size, flags, tag, keys, properties, body, born) from encode_batch;
    #: None for a plain batch (bodies only), whose records share ``tag`` and
    #: ``born_ts_ms`` (None: the store timestamp) and carry no keys.
    encoded: list[tuple[int, int, bytes, bytes, bytes, Any, int | None]] | None
    tag: bytes = b""
    born_ts_ms: np.ndarray | int | None = None  # an array: one per record (append_slices)


#: What the dispatcher gets per append: a BatchFeed, or for one record the tuple
#: (position, size, topic, queue_id, queue_offset, born_ts_ms, store_ts_ms, tag, keys)
#: with tag and keys as their encoded bytes. It saves re-parsing what was just written.
FeedEntry = Any

_time_ns = time.time_ns


class PyAppender:
    """The pure-Python twin of ``commitlog._native.Appender`` (see the module)."""

    __slots__ = (
        "accepting",
        "clock",
        "feed",
        "feed_entries_max",
        "feed_overflow",
        "file_size",
        "file_start",
        "last_store_ts_ms",
        "listen",
        "listen_once",
        "listener",
        "lock",
        "mapping",
        "prepare_next_at",
        "queue_offsets",
        "record_size_limit",
        "result_type",
        "seeds",
        "topics",
        "write_position",
    )

    def __init__(
        self,
        lock: Any,
        queue_offsets: dict[tuple[str, int], int],
        topics: dict[str, bytes],
        result_type: type[tuple[Any, ...]],
        feed_entries_max: int,
    ) -> None:
        if type(queue_offsets) is not dict or type(topics) is not dict:
            raise TypeError("queue_offsets and topics must be dicts")
        if feed_entries_max < 0:
            raise ValueError("feed_entries_max must be >= 0")
        self.lock = lock
        self.queue_offsets = queue_offsets
        self.topics = topics
        self.result_type = result_type
        self.feed_entries_max = feed_entries_max
        self.mapping: Any = None
        self.feed: list[FeedEntry] | None = None
        self.clock: Any = None
        self.listener: Any = None
        self.seeds: Any = None
        self.file_start = self.file_size = self.write_position = self.last_store_ts_ms = 0
        self.prepare_next_at = _INT64_MAX
        self.record_size_limit = 0
        self.accepting = self.feed_overflow = False
        self.listen = True
        self.listen_once = False

    def append(
        self, topic: Any, queue_id: Any, body: Any, tag: Any, born_ts_ms: Any, keys: bytes,
        properties: bytes,
    ) -> Any:  # fmt: skip
        """Append one record; None when CommitLog's general path must (see the module)."""
        if type(keys) is not bytes or type(properties) is not bytes:
            raise TypeError("append: keys and properties must be encoded bytes")
        if type(topic) is not str or type(queue_id) is not int:
            return None
        if not 0 <= queue_id <= QUEUE_ID_MAX:
            return None
        if born_ts_ms is not None and (type(born_ts_ms) is not int or born_ts_ms < 0):
            return None
        if born_ts_ms is not None and born_ts_ms > _INT64_MAX:
            return None
        topic_bytes = self.topics.get(topic)
        if topic_bytes is None:
            return None
        if type(topic_bytes) is not bytes or not 1 <= len(topic_bytes) <= 255:
            raise ValueError("Appender: a cached topic is not 1 to 255 bytes")
        sections = self._sections(body, tag, keys, properties, len(topic_bytes))
        if sections is None:
            return None
        with self.lock:
            result = self._append_locked(topic, queue_id, born_ts_ms, topic_bytes, keys,
                                         properties, sections)  # fmt: skip
        if result is not None and self.listen:
            listener = self.listener
            if listener is not None:
                if self.listen_once:
                    self.listen = False
                try:
                    listener()  # appended; an error here propagates, as from the C call
                except BaseException:
                    self.listen = True  # and the next append calls it again
                    raise
        return result

    def _sections(
        self, body: Any, tag: Any, keys: bytes, properties: bytes, topic_len: int
    ) -> tuple[Any, bytes, int, int] | None:
        """(body, tag bytes, flags, size), or None for the general path."""
        tag_bytes = b""
        if tag is not None:
            if type(tag) is not str:
                return None
            try:
                tag_bytes = tag.encode("utf-8")
            except UnicodeEncodeError:
                return None
            if len(tag_bytes) > TAG_MAX_BYTES:
                return None
        flags = 0
        if body is None:
            flags, body = FLAG_NULL_BODY, b""
        elif not isinstance(body, bytes | bytearray):
            return None
        if len(keys) > KEYS_MAX_BYTES or len(properties) > 0xFFFF_FFFF or len(body) > 0xFFFF_FFFF:
            return None
        size = HEADER_SIZE + topic_len + len(tag_bytes) + len(keys) + len(properties) + len(body)
        if size > self.record_size_limit or size > RECORD_SIZE_MAX:
            return None
        return body, tag_bytes, flags, size

    def _append_locked(
        self, topic: str, queue_id: int, born_ts_ms: int | None, topic_bytes: bytes,
        keys: bytes, properties: bytes, sections: tuple[Any, bytes, int, int],
    ) -> Any:  # fmt: skip
        body, tag_bytes, flags, size = sections
        if not self.accepting or self.mapping is None:
            return None
        key = (topic, queue_id)
        seed = self._seed_of(topic, queue_id)
        queue_offset = self.queue_offsets.get(key) if seed is None else seed[1]
        if type(queue_offset) is not int or not 0 <= queue_offset < _INT64_MAX:
            return None
        start, file_size, position = self.file_start, self.file_size, self.write_position
        if (
            start < 0
            or file_size < 0
            or start > _INT64_MAX - file_size
            or position < start
            or position - start > file_size
        ):
            raise ValueError("Appender: write_position outside the current file")
        in_file = position - start
        if size > file_size - in_file - BLANK_SIZE:
            return None  # the file rolls
        if position + size >= self.prepare_next_at:
            return None  # the next file is to be requested
        clock = self.clock
        now_ms = _time_ns() // 1_000_000 if clock is None else clock()
        if position != self.write_position:
            raise RuntimeError("Appender: the clock moved the write position")
        stored = self.last_store_ts_ms if now_ms < self.last_store_ts_ms else now_ms
        feed = self.feed
        feeding = feed is not None and not self.feed_overflow
        if feeding and type(feed) is not list:
            raise TypeError("Appender: feed must be a list or None")
        entry = None
        if feeding and len(feed) < self.feed_entries_max:  # type: ignore[arg-type]
            born = stored if born_ts_ms is None else born_ts_ms
            entry = (position, size, topic, queue_id, queue_offset, born, stored, tag_bytes, keys)
        result = _new_result(self.result_type, (position, queue_offset, stored, size))
        mapping = self.mapping
        with memoryview(mapping) as view:
            if view.readonly:
                raise TypeError("Appender: the mapping must be a writable buffer")
            if view.nbytes < file_size:
                raise ValueError("Appender: the mapping is shorter than the file")
        if seed is not None and _read_i64(seed[0], queue_id) != queue_offset:
            raise RuntimeError("Appender: the clock moved the seed")
        encode_into(
            mapping, in_file, position, size, queue_offset,
            stored if born_ts_ms is None else born_ts_ms, stored, queue_id, flags, topic_bytes,
            tag_bytes, keys, properties, body,
        )  # fmt: skip
        if seed is None:
            self.queue_offsets[key] = queue_offset + 1
        else:
            _write_i64(seed[0], queue_id, queue_offset + 1)
        self.write_position = position + size
        self.last_store_ts_ms = stored
        if feeding:
            if entry is not None:
                feed.append(entry)  # type: ignore[union-attr]
            else:
                self.feed_overflow = True
        return result

    def _seed_of(self, topic: str, queue_id: int) -> tuple[Any, int] | None:
        """The queue's seed and next offset when its topic's seed (a writable int64
        buffer by queue id, written in place) holds one (>= 0; the table has no entry
        for it then); None for the table, then the general path."""
        seeds = self.seeds
        if seeds is None:
            return None
        if type(seeds) is not dict:
            raise TypeError("Appender: seeds must be a dict or None")
        if topic not in seeds:
            return None
        seed = seeds[topic]
        try:
            view = memoryview(seed)
        except TypeError:
            raise TypeError("Appender: a seed must be a writable buffer") from None
        with view:
            if view.readonly:
                raise TypeError("Appender: a seed must be a writable buffer")
            if view.nbytes % 8:
                raise ValueError("Appender: a seed must be a buffer of int64")
            if queue_id >= view.nbytes // 8:
                return None
        value = _read_i64(seed, queue_id)
        return (seed, value) if 0 <= value < _INT64_MAX else None


def _read_i64(buffer: Any, index: int) -> int:
    with memoryview(buffer) as view, view.cast("B") as raw:
        return int.from_bytes(raw[index * 8 : index * 8 + 8], sys.byteorder, signed=True)


def _write_i64(buffer: Any, index: int, value: int) -> None:
    with memoryview(buffer) as view, view.cast("B") as raw:
        raw[index * 8 : index * 8 + 8] = value.to_bytes(8, sys.byteorder, signed=True)


#: feed_columns flags: some entry of the run has a tag, keys, a born timestamp of its own.
FEED_TAGGED = 1
FEED_KEYED = 2
FEED_BORN = 4
_INT32_MAX = (1 << 31) - 1


def feed_columns_py(
    entries: list[Any], start: int, end: int, slot_map: dict[Any, Any],
    slots: np.ndarray, positions: np.ndarray, sizes: np.ndarray, queue_offsets: np.ndarray,
    born: np.ndarray, stored: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """The dispatcher's columns of a run of one-record feed entries (the 9-tuples
    ``append`` feeds): ``entries[start:]`` while each is an exact 9-tuple that ends at
    or before ``end``, at most ``len(positions)`` of them. ``slots`` (int32) gets the
    queue's slot, or -1: from ``slot_map[topic]`` when that is a buffer of int32 slots
    by queue id that holds the id (-1 in it: no slot), else ``slot_map[(topic,
    queue_id)]``; positions, queue_offsets, born and stored (int64) and sizes (int32)
    the fields.

    Returns:
        (count, flags): the entries taken, and FEED_TAGGED | FEED_KEYED | FEED_BORN
        when some entry has a tag, keys, or a born timestamp other than its stored one.

    Raises:
        TypeError: ``entries`` is not a list, or an entry field has the wrong type.
        ValueError: columns of different lengths, ``start`` outside ``entries``, a
            position or size out of range.
    """
    if type(entries) is not list or type(slot_map) is not dict:
        raise TypeError("feed_columns: entries must be a list, slot_map a dict")
    columns = ((slots, 4), (positions, 8), (sizes, 4), (queue_offsets, 8), (born, 8), (stored, 8))
    for column, itemsize in columns:
        if not isinstance(column, np.ndarray) or column.dtype.kind not in "iu":
            raise TypeError("feed_columns: columns must be integer arrays")
        if column.itemsize != itemsize:
            raise TypeError(f"feed_columns: a column must hold {itemsize}-byte integers")
    capacity = len(slots)
    if any(len(column) != capacity for column, _ in columns):
        raise ValueError("feed_columns: columns differ in length")
    if not 0 <= start <= len(entries):
        raise ValueError("feed_columns: start outside the entries")
    count = flags = 0
    while count < capacity and start + count < len(entries):
        item = entries[start + count]
        if type(item) is not tuple or len(item) != 9:
            break
        position, size, topic, queue_id, queue_offset, born_ts, store_ts, tag, keys = item
        if type(position) is not int or type(size) is not int:
            raise TypeError("feed_columns: a feed entry field is not an int")
        if not 0 <= size <= _INT32_MAX or not 0 <= position <= _INT64_MAX - size:
            raise ValueError("feed_columns: a position or size out of range")
        if position + size > end:
            break
        if (type(topic) is not str or type(queue_id) is not int or type(tag) is not bytes
                or type(keys) is not bytes):  # fmt: skip
            raise TypeError("feed_columns: a feed entry field has the wrong type")
        if any(type(value) is not int for value in (queue_offset, born_ts, store_ts)):
            raise TypeError("feed_columns: a feed entry field is not an int")
        slot = _array_slot(slot_map.get(topic), queue_id)
        if slot is None:
            slot = slot_map.get((topic, queue_id), -1)
        slots[count] = slot if -(1 << 31) <= slot <= _INT32_MAX else -1
        positions[count] = position
        sizes[count] = size
        queue_offsets[count] = queue_offset
        born[count] = born_ts
        stored[count] = store_ts
        flags |= (FEED_TAGGED if tag else 0) | (FEED_KEYED if keys else 0)
        flags |= FEED_BORN if born_ts != store_ts else 0
        count += 1
    return count, flags


def _array_slot(found: Any, queue_id: int) -> int | None:
    """feed_columns' slot of a queue in a topic's slot array (None: not an array, or
    it does not hold the id)."""
    if found is None or type(found) is int:
        return None
    with memoryview(found) as view:
        if view.nbytes % 4:
            raise ValueError("feed_columns: a slot array must hold int32")
        if not 0 <= queue_id < view.nbytes // 4:
            return None
        with view.cast("B") as raw:
            return int.from_bytes(raw[queue_id * 4 : queue_id * 4 + 4], sys.byteorder, signed=True)


feed_columns = feed_columns_py if NATIVE is None else NATIVE.feed_columns


def new_append_lock() -> Any:
    """The CommitLog's append lock: C's AppendLock when built, else a threading.Lock."""
    return threading.Lock() if NATIVE is None else NATIVE.AppendLock()


def new_appender(lock: Any, queue_offsets: dict[tuple[str, int], int]) -> Any:
    """An Appender (C when built) over ``queue_offsets`` and record.py's topic cache,
    taking ``lock`` (from new_append_lock). It refuses appends until the CommitLog sets
    its file, limit and ``accepting``."""
    factory = PyAppender if NATIVE is None else NATIVE.Appender
    return factory(lock, queue_offsets, _topic_cache, AppendResult, FEED_ENTRIES_MAX)
