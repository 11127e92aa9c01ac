"""The IndexFile on-disk format: the one place it is declared.

An index file maps ``topic#key`` hashes to CommitLog physical offsets, in the layout
of RocketMQ's IndexFile behind an 8-byte prefix. All integers are little-endian::

    position                         size        field
    0                                4           magic            u32  INDEX_MAGIC
    4                                4           format_version   u32  FORMAT_VERSION
    8                                8           begin_ts_ms      i64  store time of entry 1
    16                               8           end_ts_ms        i64  >= every entry's time
    24                               8           begin_offset     i64  physical offset, entry 1
    32                               8           end_offset       i64  physical offset, newest
    40                               4           slot_count       i32  hash slots in this file
    44                               4           index_count      i32  entries 1..index_count
    48                               4*S         slots            i32[S]  newest entry number
                                                                          of the slot, 0 = empty
    48 + 4*S                         20*E        entries          ENTRY_DTYPE[E]

    entry n (at 48 + 4*S + 20*n):
    +0   4   key_hash         i32  key_hash(topic, key), 0 <= h < 2**31
    +4   8   physical_offset  i64  CommitLog offset of the message
    +12  4   time_delta_s     i32  floor((store_ts_ms - begin_ts_ms) / 1000)
    +16  4   prev             i32  the slot's previous entry number, 0 = end of chain

``S`` is the slot count (stored in the header) and ``E`` the entry count (derived
from the file size: ``(size - 48 - 4*S) / 20``). Entry number 0 is never written (as
in RocketMQ, 0 means "none"), so a file holds ``E - 1`` entries. A key's entries form
a chain from ``slots[key_hash % S]`` through ``prev``, newest to oldest.

Deviation from RocketMQ: ``index_count`` counts the entries written (an empty file
holds 0), where RocketMQ stores the next free number (starting at 1). A new file's
header holds times 0, offsets -1 and count 0; entry 1 sets the begin fields.

Files are named by their creation time, ``yyyyMMddHHmmssSSS`` in UTC, so ``ls``
sorts them in creation order; a name that would repeat (or go backwards with the
clock) is bumped to one millisecond after the newest name.
"""

from __future__ import annotations

import datetime
import mmap
import struct
from typing import Final, TypeAlias

import attrs
import numpy as np
import xxhash

from mqstore.commitlog.errors import InvalidTypeError
from mqstore.commitlog.record import validate_topic

__all__ = [
    "ENTRIES_POSITION_BASE",
    "ENTRY",
    "ENTRY_DTYPE",
    "ENTRY_SIZE",
    "FILE_HEADER_SIZE",
    "FILE_NAME_DIGITS",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_BEFORE_COUNT",
    "HEADER_FIELDS",
    "HEADER_FIELD_POSITION",
    "HEADER_POSITION",
    "INDEX_COUNT",
    "INDEX_COUNT_POSITION",
    "INDEX_MAGIC",
    "IndexHeader",
    "KEY_HASH_MASK",
    "PREFIX",
    "SLOT",
    "SLOT_SIZE",
    "SLOTS_POSITION",
    "SLOT_DTYPE",
    "TIME_DELTA_MAX_S",
    "TIME_GRANULARITY_MS",
    "TIME_RANGE",
    "entries_position",
    "entry_capacity",
    "entry_count_for_size",
    "file_name_for_ms",
    "file_size_bytes",
    "key_hash",
    "next_file_name",
    "parse_file_name",
]

INDEX_MAGIC: Final = 0x3158494D  # "MIX1" read little-endian as text
FORMAT_VERSION: Final = 1

#: What every file starts with.
PREFIX: Final = struct.Struct(
    "<"
    "I"  # magic: INDEX_MAGIC
    "I"  # format_version: FORMAT_VERSION
)
#: RocketMQ's 40-byte IndexHeader, fields in layout order.
HEADER: Final = struct.Struct(
    "<"
    "q"  # begin_ts_ms: store timestamp of entry 1, the base of every time delta
    "q"  # end_ts_ms: an upper bound of every entry's store timestamp
    "q"  # begin_offset: physical offset of entry 1
    "q"  # end_offset: physical offset of the newest entry
    "i"  # slot_count: hash slots in this file
    "i"  # index_count: entries written; the newest entry is number index_count
)
#: The header up to the index count: what a writer updates before publishing the count.
HEADER_BEFORE_COUNT: Final = struct.Struct(HEADER.format[:-1])
#: The header's first two fields alone (begin_ts_ms, end_ts_ms): what a query reads.
TIME_RANGE: Final = struct.Struct(HEADER.format[:3])
#: The index count alone: the field a writer publishes last and a reader reads first.
INDEX_COUNT: Final = struct.Struct("<i")
#: One hash slot: the newest entry number in the slot's chain, 0 when empty.
SLOT: Final = struct.Struct("<i")
#: One entry, fields in layout order.
ENTRY: Final = struct.Struct(
    "<"
    "i"  # key_hash: key_hash(topic, key), non-negative int32
    "q"  # physical_offset: CommitLog offset of the message
    "i"  # time_delta_s: whole seconds from the header's begin_ts_ms (floor)
    "i"  # prev: previous entry number of the same slot, 0 = end of chain
)
#: The same entry as a numpy dtype, for bulk writes and truncation.
ENTRY_DTYPE: Final = np.dtype(
    [
        ("key_hash", "<i4"),
        ("physical_offset", "<i8"),
        ("time_delta_s", "<i4"),
        ("prev", "<i4"),
    ]
)
SLOT_DTYPE: Final = np.dtype("<i4")

HEADER_POSITION: Final = PREFIX.size
HEADER_FIELDS: Final = (
    "begin_ts_ms",
    "end_ts_ms",
    "begin_offset",
    "end_offset",
    "slot_count",
    "index_count",
)
#: Byte position of each header field in the file, derived from HEADER's format.
HEADER_FIELD_POSITION: Final = {
    name: HEADER_POSITION + struct.calcsize("<" + HEADER.format[1 : 1 + i])
    for i, name in enumerate(HEADER_FIELDS)
}
INDEX_COUNT_POSITION: Final = HEADER_FIELD_POSITION["index_count"]
FILE_HEADER_SIZE: Final = PREFIX.size + HEADER.size
SLOTS_POSITION: Final = FILE_HEADER_SIZE
SLOT_SIZE: Final = SLOT.size
ENTRY_SIZE: Final = ENTRY.size
ENTRIES_POSITION_BASE: Final = SLOTS_POSITION  # plus slot_count * SLOT_SIZE
assert PREFIX.size == 8
assert HEADER.size == 40
assert FILE_HEADER_SIZE == 48
assert INDEX_COUNT_POSITION == 44
assert HEADER_FIELD_POSITION["begin_offset"] == 24
assert HEADER_POSITION + HEADER.size == INDEX_COUNT_POSITION + INDEX_COUNT.size
assert HEADER_BEFORE_COUNT.size + INDEX_COUNT.size == HEADER.size
assert TIME_RANGE.size == 16
assert HEADER_FIELD_POSITION["begin_ts_ms"] == HEADER_POSITION
assert SLOT_SIZE == SLOT_DTYPE.itemsize == 4
assert ENTRY_SIZE == ENTRY_DTYPE.itemsize == 20
assert ENTRY_DTYPE.fields is not None
assert [ENTRY_DTYPE.fields[name][1] for name in ENTRY_DTYPE.fields] == [0, 4, 12, 16]

KEY_HASH_MASK: Final = 0x7FFFFFFF  # folds a hash to a non-negative int32
TIME_DELTA_MAX_S: Final = 0x7FFFFFFF  # time_delta_s is an i32 (68 years)
TIME_GRANULARITY_MS: Final = 1000  # an entry's time is known to the second: [t, t + 999]
FILE_NAME_DIGITS: Final = 17  # yyyyMMddHHmmssSSS
_NAME_TIME_FORMAT: Final = "%Y%m%d%H%M%S"

_xxh3 = xxhash.xxh3_64_intdigest

WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap
ReadableBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap


def key_hash(topic: str, key: str) -> int:
    """The index hash of a message key: xxh3_64 of ``f"{topic}#{key}"`` (UTF-8),
    folded to a non-negative int32 (high half XOR low half, top bit cleared).

    Topic names cannot hold ``#`` (they are validated), so ``topic#key`` is unambiguous.

    Raises:
        InvalidArgumentError: the topic name is invalid.
        InvalidTypeError: the key is not a str.
    """
    topic_bytes = validate_topic(topic)
    if type(key) is not str:
        raise InvalidTypeError(f"key must be a str, not {type(key).__name__}")
    h = _xxh3(topic_bytes + b"#" + key.encode("utf-8", "surrogatepass"))
    return ((h >> 32) ^ h) & KEY_HASH_MASK


@attrs.frozen(kw_only=True)
class IndexHeader:
    """The 40-byte header (the prefix is checked separately)."""

    begin_ts_ms: int
    end_ts_ms: int
    begin_offset: int
    end_offset: int
    slot_count: int
    index_count: int

    def pack_into(self, buffer: WritableBuffer, position: int = HEADER_POSITION) -> None:
        HEADER.pack_into(
            buffer,
            position,
            self.begin_ts_ms,
            self.end_ts_ms,
            self.begin_offset,
            self.end_offset,
            self.slot_count,
            self.index_count,
        )

    @classmethod
    def unpack_from(cls, buffer: ReadableBuffer, position: int = HEADER_POSITION) -> IndexHeader:
        begin_ts_ms, end_ts_ms, begin_offset, end_offset, slot_count, index_count = (
            HEADER.unpack_from(buffer, position)
        )
        return cls(
            begin_ts_ms=begin_ts_ms,
            end_ts_ms=end_ts_ms,
            begin_offset=begin_offset,
            end_offset=end_offset,
            slot_count=slot_count,
            index_count=index_count,
        )


def entries_position(slot_count: int) -> int:
    """Byte position of entry number 0 (unused) in a file of ``slot_count`` slots."""
    assert slot_count >= 1
    return ENTRIES_POSITION_BASE + slot_count * SLOT_SIZE


def file_size_bytes(slot_count: int, entry_count: int) -> int:
    """Size of a file of ``slot_count`` slots and ``entry_count`` entry numbers."""
    assert slot_count >= 1
    assert entry_count >= 2
    return entries_position(slot_count) + entry_count * ENTRY_SIZE


def entry_count_for_size(slot_count: int, size_bytes: int) -> int | None:
    """The entry count a file of this size and slot count holds, or None if the size
    does not fit the layout (too short, or not a whole number of entries)."""
    room_bytes = size_bytes - entries_position(slot_count)
    if room_bytes < 2 * ENTRY_SIZE or room_bytes % ENTRY_SIZE:
        return None
    return room_bytes // ENTRY_SIZE


def entry_capacity(entry_count: int) -> int:
    """Entries a file can hold: entry number 0 is never used."""
    return entry_count - 1


def file_name_for_ms(epoch_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` (UTC) for a wall-clock time in epoch milliseconds."""
    assert epoch_ms >= 0
    seconds, millis = divmod(epoch_ms, 1000)
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return f"{moment.strftime(_NAME_TIME_FORMAT)}{millis:03d}"


def parse_file_name(name: str) -> int | None:
    """The epoch milliseconds an index file name stands for, or None if the name is
    not one of ours (temporary files, strangers)."""
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        return None
    try:
        moment = datetime.datetime.strptime(name[:-3], _NAME_TIME_FORMAT)
    except ValueError:
        return None
    seconds = int(moment.replace(tzinfo=datetime.UTC).timestamp())
    return seconds * 1000 + int(name[-3:])


def next_file_name(now_ms: int, newest_name: str | None) -> str:
    """The name of a file created at ``now_ms``: its creation time, or one millisecond
    after the newest existing name when that would not sort after it (two files in
    one millisecond, or a clock that went back)."""
    if newest_name is not None:
        newest_ms = parse_file_name(newest_name)
        assert newest_ms is not None
        now_ms = max(now_ms, newest_ms + 1)
    name = file_name_for_ms(now_ms)
    assert newest_name is None or name > newest_name
    return name
