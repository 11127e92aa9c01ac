"""The CommitLog record format: the one place it is declared.

Layout of a message record (all integers little-endian)::

    offset size field
    0      4    total_size       u32  whole record, this field included
    4      4    magic            u32  MESSAGE_MAGIC
    8      8    checksum         u64  XXH64 over bytes [16, total_size), seeded with
                                      the u64 at [0, 8) (total_size | magic << 32), so it
                                      covers every byte of the record but its own field
    16     8    queue_offset     i64  dense from 0 per (topic, queue_id)
    24     8    physical_offset  i64  where the record starts in the CommitLog
    32     8    born_ts_ms       i64  producer's timestamp (CreateTime)
    40     8    store_ts_ms      i64  set under the append lock (LogAppendTime)
    48     4    queue_id         i32
    52     4    flags            u32  FLAG_* bits below
    56     4    body_len         u32
    60     4    properties_len   u32
    64     2    keys_len         u16
    66     1    topic_len        u8
    67     1    tag_len          u8
    68     ...  topic | tag | keys | properties | body

- topic: ASCII from ``[A-Za-z0-9._-]``, 1 to 127 bytes, never ``.`` or ``..``.
- tag: UTF-8, 0 to 255 bytes; empty means no tag.
- keys: UTF-8 keys joined by NUL; each key is non-empty and holds no NUL.
- properties: repeated (u16 key_len, key UTF-8, u32 value_len, value bytes).

An end-of-file blank record fills the rest of a file when the next record does not
fit: ``total_size`` = bytes left in the file, ``magic`` = BLANK_MAGIC, and a checksum
over its 16-byte header. A record never spans two files, and every file keeps room
for a blank record, so a reader always finds one of the two magics at a record start.

Append groups: records appended as one unit (a Kafka producer's batch and the record
of its producer state that follows it) carry ``FLAG_GROUP_OPEN`` on every record but
the last. Nothing else is written between them, and a crash that cuts a group short
loses all of it: recovery (commitlog/recovery.py) ends the log after the last record
without the flag. A reader that is not recovering treats the flag as opaque.

Decoding validates size, magic and checksum; any failure is a ``CorruptDataError``
naming the file and the position, never a half-decoded record.

The checksum is XXH64 rather than XXH3 because it is short enough to carry in C:
commitlog/_native.c encodes and verifies records without a Python call per record
(``encode_into``, ``encode_run``, ``verify_records``, ``gather`` below pick the C or
the pure-Python version; see commitlog/native.py).
"""

from __future__ import annotations

import struct
from typing import Final

import xxhash

from mqstore.commitlog.native import NATIVE, check_layout

MESSAGE_MAGIC: Final = 0x4D515232  # "2RQM" in the file: format 2 (XXH64 checksums)
BLANK_MAGIC: Final = 0x4D514232  # "2BQM"

#: total_size u32, magic u32, checksum u64: the part read first at any record start.
PREFIX: Final = struct.Struct("<IIQ")
#: The full fixed header, fields in the order of the layout above.
HEADER: Final = struct.Struct(
    "<"
    "I"  # total_size
    "I"  # magic
    "Q"  # checksum
    "q"  # queue_offset
    "q"  # physical_offset
    "q"  # born_ts_ms
    "q"  # store_ts_ms
    "i"  # queue_id
    "I"  # flags
    "I"  # body_len
    "I"  # properties_len
    "H"  # keys_len
    "B"  # topic_len
    "B"  # tag_len
)
#: The header after the checksum: what encode packs before hashing.
_TAIL: Final = struct.Struct(HEADER.format.replace("IIQ", "", 1))
_SEED_PREFIX: Final = struct.Struct("<Q")
_PROPERTY_KEY: Final = struct.Struct("<H")
_PROPERTY_VALUE: Final = struct.Struct("<I")

HEADER_SIZE: Final = HEADER.size
BLANK_SIZE: Final = PREFIX.size
CHECKSUM_OFFSET: Final = 8
HASHED_FROM: Final = PREFIX.size
assert HEADER_SIZE == 68
assert BLANK_SIZE == 16
assert _TAIL.size == HEADER_SIZE - PREFIX.size

FLAG_NULL_BODY: Final = 0x1  # the body is None (a Kafka tombstone), body_len is 0
#: Not the last record of its append group (see the module): the records of a group
#: follow one another in the log (one lock hold writes them), and recovery ends the
#: log after the last record without this flag, so a group cut short by a crash is
#: dropped whole.
FLAG_GROUP_OPEN: Final = 0x2
FLAGS_KNOWN: Final = FLAG_NULL_BODY | FLAG_GROUP_OPEN
RECORD_SIZE_MAX: Final = 0xFFFF_FFFF  # total_size is a u32
_INT64_MAX: Final = (1 << 63) - 1

TOPIC_NAME_MAX: Final = 127  # bytes; RocketMQ's maxTopicLength for the V1 magic
TAG_MAX_BYTES: Final = 255  # tag_len is a u8
KEYS_MAX_BYTES: Final = 0xFFFF  # keys_len is a u16
KEY_SEPARATOR: Final = b"\x00"
_hash = xxhash.xxh64_intdigest if NATIVE is None else NATIVE.xxh64


def checksum(record: bytes | memoryview, total_size: int, magic: int) -> int:
    """The checksum of a record whose bytes after the checksum field are ``record``."""
    return _hash(record, total_size | magic << 32)


#: Why scan_records stopped (the C enum SCAN_* in commitlog/_native.h).
SCAN_FULL: Final = 0  # the output arrays are full: call again from ``end``
SCAN_ZEROS: Final = 1  # zeros: the unwritten rest of the file, the end of the log
SCAN_BLANK: Final = 2  # an end-of-file blank record: ``end`` is the file's end
SCAN_INVALID: Final = 3  # a record that does not verify starts at ``end``
SCAN_LIMIT: Final = 4  # ``limit`` reached


#: Header fields in layout order: the C file's AT_* offsets are derived from HEADER.
_FIELDS: Final = (
    "TOTAL_SIZE", "MAGIC", "CHECKSUM", "QUEUE_OFFSET", "PHYSICAL_OFFSET", "BORN_TS",
    "STORE_TS", "QUEUE_ID", "FLAGS", "BODY_LEN", "PROPERTIES_LEN", "KEYS_LEN", "TOPIC_LEN",
    "TAG_LEN",
)  # fmt: skip
_CODES: Final = HEADER.format.lstrip("<")
assert len(_CODES) == len(_FIELDS)
#: The constants commitlog/_native.c keeps a copy of (its LAYOUT), checked at import.
LAYOUT: Final = {
    "HEADER_SIZE": HEADER_SIZE,
    "BLANK_SIZE": BLANK_SIZE,
    "MESSAGE_MAGIC": MESSAGE_MAGIC,
    "BLANK_MAGIC": BLANK_MAGIC,
    "FLAG_NULL_BODY": FLAG_NULL_BODY,
    "FLAG_GROUP_OPEN": FLAG_GROUP_OPEN,
    "FLAGS_KNOWN": FLAGS_KNOWN,
    "RECORD_SIZE_MAX": RECORD_SIZE_MAX,
    "SCAN_FULL": SCAN_FULL,
    "SCAN_ZEROS": SCAN_ZEROS,
    "SCAN_BLANK": SCAN_BLANK,
    "SCAN_INVALID": SCAN_INVALID,
    "SCAN_LIMIT": SCAN_LIMIT,
    **{f"AT_{name}": struct.calcsize("<" + _CODES[:i]) for i, name in enumerate(_FIELDS)},
}

if NATIVE is not None:
    check_layout(NATIVE, LAYOUT, "commitlog/record_format.py")
