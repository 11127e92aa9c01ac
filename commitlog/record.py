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

import re
import struct
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any, Final, TypeVar

import numpy as np
import xxhash

from mqstore.commitlog.errors import (
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
)
from mqstore.commitlog.native import NATIVE, check_layout

__all__ = [
    "BLANK_MAGIC",
    "BLANK_SIZE",
    "FLAG_GROUP_OPEN",
    "FLAG_NULL_BODY",
    "HEADER",
    "HEADER_SIZE",
    "MESSAGE_MAGIC",
    "PREFIX",
    "Record",
    "TOPIC_NAME_MAX",
    "checksum",
    "decode",
    "decode_properties",
    "decode_run",
    "encode_into",
    "check_bodies",
    "encode_bodies",
    "encode_run",
    "encode_slices",
    "scan_records",
    "gather",
    "verify_records",
    "encode_keys",
    "encode_properties",
    "encode_tag",
    "read_prefix",
    "tag_hash",
    "validate_topic",
]

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
_TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,127}")

_tag_hash = xxhash.xxh3_64_intdigest
_hash = xxhash.xxh64_intdigest if NATIVE is None else NATIVE.xxh64
_topic_cache: dict[str, bytes] = {}
_TOPIC_CACHE_MAX: Final = 1 << 16  # validated names kept; a store rarely has more topics


def validate_topic(topic: object) -> bytes:
    """Check a topic name and return its encoded bytes.

    Raises:
        InvalidTypeError: ``topic`` is not a str.
        InvalidArgumentError: empty, too long, a character outside ``[A-Za-z0-9._-]``,
            or ``.``/``..`` (the guard against path traversal).
    """
    cached = _topic_cache.get(topic) if type(topic) is str else None
    if cached is not None:
        return cached
    if not isinstance(topic, str):
        raise InvalidTypeError(f"topic must be a str, not {type(topic).__name__}")
    if not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
        raise InvalidArgumentError(
            f"invalid topic name {topic!r}: use 1 to {TOPIC_NAME_MAX} characters "
            "from [A-Za-z0-9._-], not '.' or '..'"
        )
    encoded = topic.encode("ascii")
    if len(_topic_cache) < _TOPIC_CACHE_MAX:
        _topic_cache[topic] = encoded
    return encoded


def encode_tag(tag: str | None) -> bytes:
    """Encode a tag (None or "" mean no tag)."""
    if tag is None:
        return b""
    if not isinstance(tag, str):
        raise InvalidTypeError(f"tag must be a str or None, not {type(tag).__name__}")
    encoded = tag.encode("utf-8")
    if len(encoded) > TAG_MAX_BYTES:
        raise LimitExceededError(f"tag is {len(encoded)} bytes, the limit is {TAG_MAX_BYTES}")
    return encoded


def tag_hash(tag: bytes) -> int:
    """The signed 64-bit tag hash stored in ConsumeQueue units; 0 means no tag."""
    if not tag:
        return 0
    value = _tag_hash(tag)
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_keys(keys: Iterable[str] | str | None) -> bytes:
    """Encode message keys: one str, or an iterable of them."""
    if not keys:
        return b""
    if isinstance(keys, str):
        keys = (keys,)
    parts = []
    for key in keys:
        if not isinstance(key, str):
            raise InvalidTypeError(f"keys must be str, not {type(key).__name__}")
        encoded = key.encode("utf-8")
        if not encoded or KEY_SEPARATOR in encoded:
            raise InvalidArgumentError(f"invalid key {key!r}: keys are non-empty and hold no NUL")
        parts.append(encoded)
    joined = KEY_SEPARATOR.join(parts)
    if len(joined) > KEYS_MAX_BYTES:
        raise LimitExceededError(f"keys take {len(joined)} bytes, the limit is {KEYS_MAX_BYTES}")
    return joined


def decode_keys(raw: bytes | memoryview) -> tuple[str, ...]:
    if not raw:
        return ()
    return tuple(part.decode("utf-8") for part in bytes(raw).split(KEY_SEPARATOR))


PropertiesInput = Mapping[str, "str | bytes"] | Sequence[tuple[str, "str | bytes"]] | None


def encode_properties(properties: Any) -> bytes:
    """Encode properties: a mapping or a sequence of (key, value) pairs.

    Keys are str; values are str (stored as UTF-8) or bytes-like. Order and repeated
    keys are kept, as Kafka headers need.
    """
    if properties is None or (isinstance(properties, Sized) and not len(properties)):
        return b""
    if isinstance(properties, str | bytes) or not isinstance(properties, Iterable):
        raise InvalidTypeError(
            f"properties must be a mapping or (key, value) pairs, not {type(properties).__name__}"
        )
    items = properties.items() if isinstance(properties, Mapping) else properties
    out = bytearray()
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            raise InvalidTypeError("properties must be a mapping or (key, value) pairs") from None
        if not isinstance(key, str):
            raise InvalidTypeError(f"property keys must be str, not {type(key).__name__}")
        key_bytes = key.encode("utf-8")
        if isinstance(value, str):
            value_bytes: bytes | bytearray | memoryview = value.encode("utf-8")
        elif isinstance(value, bytes | bytearray | memoryview):
            value_bytes = value
        else:
            raise InvalidTypeError(
                f"property values must be str or bytes, not {type(value).__name__}"
            )
        if len(key_bytes) > 0xFFFF:
            raise LimitExceededError("a property key is longer than 65535 bytes")
        out += _PROPERTY_KEY.pack(len(key_bytes))
        out += key_bytes
        out += _PROPERTY_VALUE.pack(len(value_bytes))
        out += value_bytes
    return bytes(out)


def decode_properties(raw: bytes | memoryview) -> tuple[tuple[str, bytes], ...]:
    """Decode the properties section into (key, value) pairs.

    Raises:
        ValueError: the section is malformed (callers wrap it with the position).
    """
    if not raw:
        return ()
    view = memoryview(raw)
    pairs = []
    position = 0
    end = len(view)
    while position < end:
        (key_len,) = _PROPERTY_KEY.unpack_from(view, position)
        position += _PROPERTY_KEY.size
        key = bytes(view[position : position + key_len]).decode("utf-8")
        position += key_len
        (value_len,) = _PROPERTY_VALUE.unpack_from(view, position)
        position += _PROPERTY_VALUE.size
        if position + value_len > end:
            raise ValueError("property value runs past the section")
        pairs.append((key, bytes(view[position : position + value_len])))
        position += value_len
    if position != end:
        raise ValueError("leftover bytes after the properties")
    return tuple(pairs)


def checksum(record: bytes | memoryview, total_size: int, magic: int) -> int:
    """The checksum of a record whose bytes after the checksum field are ``record``."""
    return _hash(record, total_size | magic << 32)


def encode_into_py(
    buffer: Any,
    position: int,
    physical_offset: int,
    total_size: int,
    queue_offset: int,
    born_ts_ms: int,
    store_ts_ms: int,
    queue_id: int,
    flags: int,
    topic: bytes,
    tag: bytes,
    keys: bytes,
    properties: bytes,
    body: Any,
) -> None:
    """Write one whole record at ``position`` of ``buffer`` (a file's mapping).

    ``total_size`` must be ``HEADER_SIZE + len(topic) + len(tag) + len(keys) +
    len(properties) + len(body)``; the caller computed it to decide where the
    record goes, so it is passed in rather than computed twice.
    """
    tail = (
        _TAIL.pack(
            queue_offset,
            physical_offset,
            born_ts_ms,
            store_ts_ms,
            queue_id,
            flags,
            len(body),
            len(properties),
            len(keys),
            len(topic),
            len(tag),
        )
        + topic
        + tag
        + keys
        + properties
        + body
    )
    assert len(tail) + PREFIX.size == total_size
    PREFIX.pack_into(
        buffer, position, total_size, MESSAGE_MAGIC, _hash(tail, total_size | MESSAGE_MAGIC << 32)
    )
    end = position + total_size
    buffer[position + PREFIX.size : end] = tail


def encode_run_py(
    buffer: Any,
    in_file: int,
    file_size: int,
    physical_offset: int,
    first_queue_offset: int,
    store_ts_ms: int,
    queue_id: int,
    topic: bytes,
    encoded: list[tuple[int, int, bytes, bytes, bytes, Any, int | None]],
    start: int,
    positions: Any,
) -> int:
    """Write ``encoded[start:]`` one after another from ``in_file``, while each record
    leaves room for a blank record before ``file_size``.

    ``encoded`` holds per-record (size, flags, tag, keys, properties, body, born_ts_ms
    or None for the store timestamp), as ``CommitLog.append_batch`` validated them;
    queue offsets go up by one from ``first_queue_offset``. ``positions[i]`` (an int64
    array as long as ``encoded``) gets record i's physical offset.

    Returns:
        The index after the last record written: ``len(encoded)`` when all fit, else
        the record the caller has to roll the file for.
    """
    _check_run(buffer, in_file, file_size, physical_offset, first_queue_offset, queue_id,
               len(encoded), start, positions)  # fmt: skip
    index = start
    queue_offset = first_queue_offset
    for index in range(start, len(encoded)):
        size, flags, tag_b, keys_b, props_b, body, born = encoded[index]
        if not (HEADER_SIZE <= size <= RECORD_SIZE_MAX and 0 <= flags <= 0xFFFF_FFFF):
            raise ValueError("an encoded item's size or flags is out of range")
        if in_file + size + BLANK_SIZE > file_size:
            return index
        encode_into_py(
            buffer, in_file, physical_offset, size, queue_offset,
            store_ts_ms if born is None else born, store_ts_ms,
            queue_id, flags, topic, tag_b, keys_b, props_b, body,
        )  # fmt: skip
        positions[index] = physical_offset
        physical_offset += size
        in_file += size
        queue_offset += 1
    return len(encoded)


def _check_run(
    buffer: Any,
    in_file: int,
    file_size: int,
    physical_offset: int,
    first_queue_offset: int,
    queue_id: int,
    count: int,
    start: int,
    positions: Any,
) -> None:
    """The batch encoders' argument checks (``run_check`` in the C file): a place in
    the file, and offsets that cannot wrap however many records the file takes.

    Raises:
        ValueError: an argument is out of range.
    """
    if not (0 <= start <= count and len(positions) >= count):
        raise ValueError("start or positions do not match the batch")
    if not 0 <= in_file <= file_size <= memoryview(buffer).nbytes:
        raise ValueError("in_file and file_size must satisfy 0 <= in_file <= file_size <= len")
    if not 0 <= physical_offset <= _INT64_MAX - (file_size - in_file):
        raise ValueError("physical offset out of range")
    if not 0 <= first_queue_offset <= _INT64_MAX - count:
        raise ValueError("queue offset out of range")
    if not -(1 << 31) <= queue_id < 1 << 31:
        raise ValueError("queue_id out of range")


def verify_records_py(buffer: Any, positions: Any, sizes: Any) -> int:
    """The index of the first record (at ``positions[i]`` of ``buffer``, ``sizes[i]``
    bytes; int64 arrays) whose size field, magic or checksum is wrong, or -1."""
    view = memoryview(buffer)
    for index, (position, size) in enumerate(zip(positions.tolist(), sizes.tolist(), strict=True)):
        if position < 0 or size < HEADER_SIZE or position + size > len(view):
            return index
        total_size, magic, stored = PREFIX.unpack_from(view, position)
        if total_size != size or magic != MESSAGE_MAGIC:
            return index
        if checksum(view[position + HASHED_FROM : position + size], size, magic) != stored:
            return index
    return -1


def gather_py(buffer: Any, starts: Any, lengths: Any, out: Any) -> None:
    """Copy ``buffer[starts[i] : starts[i] + lengths[i]]`` one after another into
    ``out`` (int64 arrays; ``out`` writable, at least ``lengths.sum()`` bytes)."""
    view = memoryview(buffer)
    target = memoryview(out).cast("B")
    cursor = 0
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        if start < 0 or length < 0 or start + length > len(view):
            raise ValueError("a slice lies outside the buffer")
        target[cursor : cursor + length] = view[start : start + length]
        cursor += length


def check_bodies_py(bodies: list[Any], fixed_size: int, limit: int, sizes: Any) -> int:
    """Sizes of plain records (``fixed_size`` + body) into ``sizes``; the index of the
    first body that is not bytes-like or None, or makes a record above ``limit``; -1."""
    for index, body in enumerate(bodies):
        if body is not None and not isinstance(body, bytes | bytearray | memoryview):
            return index
        size = fixed_size + (0 if body is None else len(body))
        if size > limit or not 0 <= size <= 0x7FFFFFFF:
            return index
        sizes[index] = size
    return -1


def encode_bodies_py(
    buffer: Any,
    in_file: int,
    file_size: int,
    physical_offset: int,
    first_queue_offset: int,
    store_ts_ms: int,
    born_ts_ms: int,
    queue_id: int,
    topic: bytes,
    tag: bytes,
    bodies: list[Any],
    start: int,
    positions: Any,
    borns: list[int] | None = None,
    extra_flags: int = 0,
) -> int:
    """``encode_run`` for records that share topic and tag, have no keys or
    properties, and share ``born_ts_ms`` unless ``borns`` gives one each (a plain
    batch, checked by ``check_bodies``); ``extra_flags`` is set on every record."""
    _check_run(buffer, in_file, file_size, physical_offset, first_queue_offset, queue_id,
               len(bodies), start, positions)  # fmt: skip
    if len(topic) > TAG_MAX_BYTES or len(tag) > TAG_MAX_BYTES:
        raise ValueError("encode_bodies: topic or tag longer than 255 bytes")
    queue_offset = first_queue_offset
    fixed = HEADER_SIZE + len(topic) + len(tag)
    for index in range(start, len(bodies)):
        body = bodies[index]
        if body is not None and not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError("a body is not bytes-like (check_bodies first)")
        flags = (FLAG_NULL_BODY if body is None else 0) | extra_flags
        body = b"" if body is None else body
        size = fixed + len(body)
        if in_file + size + BLANK_SIZE > file_size:
            return index
        encode_into_py(
            buffer, in_file, physical_offset, size, queue_offset,
            born_ts_ms if borns is None else borns[index], store_ts_ms,
            queue_id, flags, topic, tag, b"", b"", body,
        )  # fmt: skip
        positions[index] = physical_offset
        physical_offset += size
        in_file += size
        queue_offset += 1
    return len(bodies)


def encode_slices_py(
    buffer: Any,
    in_file: int,
    file_size: int,
    physical_offset: int,
    first_queue_offset: int,
    store_ts_ms: int,
    born_ts_ms: int,
    queue_id: int,
    topic: bytes,
    tag: bytes,
    offsets: Any,
    data: Any,
    nulls: Any,
    borns: Any,
    start: int,
    positions: Any,
    flags: int,
) -> int:
    """``encode_bodies`` for bodies given as an Arrow binary column: body i is
    ``data[offsets[i]:offsets[i + 1]]`` (None where ``nulls[i]``); ``borns`` gives
    per-record born timestamps, or None for ``born_ts_ms`` for all; ``flags`` (0 or
    FLAG_GROUP_OPEN) is set on every record.

    Raises:
        ValueError: ``flags`` is neither, as the C version.
    """
    if flags not in (0, FLAG_GROUP_OPEN):
        raise ValueError("encode_slices: flags must be 0 or FLAG_GROUP_OPEN")
    view = memoryview(data).cast("B")
    bounds = offsets.tolist()
    null_at = None if nulls is None else nulls.tolist()
    bodies = [
        None if null_at is not None and null_at[i] else view[bounds[i] : bounds[i + 1]]
        for i in range(len(bounds) - 1)
    ]
    return encode_bodies_py(
        buffer, in_file, file_size, physical_offset, first_queue_offset, store_ts_ms,
        born_ts_ms, queue_id, topic, tag, bodies, start, positions,
        None if borns is None else borns.tolist(), flags,
    )  # fmt: skip


#: Why scan_records stopped (the C enum SCAN_* in commitlog/_native.c).
SCAN_FULL: Final = 0  # the output arrays are full: call again from ``end``
SCAN_ZEROS: Final = 1  # zeros: the unwritten rest of the file, the end of the log
SCAN_BLANK: Final = 2  # an end-of-file blank record: ``end`` is the file's end
SCAN_INVALID: Final = 3  # a record that does not verify starts at ``end``
SCAN_LIMIT: Final = 4  # ``limit`` reached


def scan_records_py(
    buffer: Any,
    start: int,
    limit: int,
    file_start: int,
    positions: Any,
    sizes: Any,
    queue_offsets: Any,
    queue_ids: Any,
    store_ts_ms: Any,
    topic_lens: Any,
    topic_hashes: Any,
    dispatch: Any = None,
) -> tuple[int, int, int, int]:
    """Walk and verify records from ``start`` as ``decode`` does, filling one row of
    the output arrays per record (position in the file, size, queue offset, queue id,
    store timestamp, topic length, XXH64 of the topic bytes); with ``dispatch`` (an
    int64 array of commitlog/header_scan.py's DISPATCH_ROWS rows, at least as wide),
    its column of what ``dispatch_columns`` gives for the record instead (the output
    arrays are left as they are; they still set the capacity).

    Returns:
        (end, count, status, closed): where the walk stopped, how many rows were
        filled, why (SCAN_*), and how many of those rows end with a record that
        closes its append group (the last one without FLAG_GROUP_OPEN; 0: none).
    """
    at, count, capacity, closed = start, 0, len(positions), 0
    columns = (sizes, queue_offsets, queue_ids, store_ts_ms, topic_lens, topic_hashes)
    if min(map(len, columns)) < capacity or not 0 <= start <= limit <= memoryview(buffer).nbytes:
        raise ValueError("scan_records: outputs too short, bad range or start")
    if not 0 <= file_start <= _INT64_MAX - limit:
        raise ValueError("scan_records: outputs too short, bad range or start")
    if dispatch is not None and (dispatch.ndim != 2 or dispatch.shape[1] < capacity):
        raise ValueError("scan_records: outputs too short, bad range or start")
    while True:
        if count == capacity:
            return at, count, SCAN_FULL, closed
        if at + BLANK_SIZE > limit:
            return at, count, SCAN_LIMIT, closed
        total, magic, _ = PREFIX.unpack_from(buffer, at)
        if total == 0 and magic == 0:
            return at, count, SCAN_ZEROS, closed
        try:
            record = decode(buffer, at, limit, "", file_start)
        except CorruptDataError:
            return at, count, SCAN_INVALID, closed
        if record is None:
            return at + total, count, SCAN_BLANK, closed
        topic = record.topic.encode("ascii")
        topic_hash = xxhash.xxh64_intdigest(topic)
        if dispatch is None:
            positions[count] = at
            sizes[count] = record.size
            queue_offsets[count] = record.queue_offset
            queue_ids[count] = record.queue_id
            store_ts_ms[count] = record.store_ts_ms
            topic_lens[count] = len(topic)
            topic_hashes[count] = topic_hash
        else:  # (dispatch_columns' rows, in their order)
            fields = HEADER.unpack_from(buffer, at)
            dispatch[:, count] = (
                file_start + at, record.size, record.queue_offset, record.queue_id,
                record.born_ts_ms, record.store_ts_ms,
                topic_hash - (1 << 64) if topic_hash >> 63 else topic_hash,  # as int64
                len(topic), fields[_FIELDS.index("TAG_LEN")],
                fields[_FIELDS.index("KEYS_LEN")], record.flags,
            )  # fmt: skip
        at += record.size
        count += 1
        if not record.flags & FLAG_GROUP_OPEN:
            closed = count


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
    check_layout(NATIVE, LAYOUT, "commitlog/record.py")

if NATIVE is None:
    encode_into = encode_into_py
    encode_run = encode_run_py
    check_bodies = check_bodies_py
    encode_bodies = encode_bodies_py
    encode_slices = encode_slices_py
    scan_records = scan_records_py
    verify_records = verify_records_py
    gather = gather_py
else:
    encode_into = NATIVE.encode_into
    encode_run = NATIVE.encode_run
    check_bodies = NATIVE.check_bodies
    encode_bodies = NATIVE.encode_bodies
    encode_slices = NATIVE.encode_slices
    scan_records = NATIVE.scan_records
    verify_records = NATIVE.verify_records
    gather = NATIVE.gather


def encode_blank_into(buffer: Any, position: int, total_size: int) -> None:
    """Write an end-of-file blank record of ``total_size`` bytes at ``position``."""
    assert total_size >= BLANK_SIZE
    PREFIX.pack_into(
        buffer, position, total_size, BLANK_MAGIC, _hash(b"", total_size | BLANK_MAGIC << 32)
    )


class Record:
    """One decoded message record. ``body`` is a zero-copy view into the log.

    Fields follow the layout in the module docstring. ``physical_offset`` is the
    record's start in the CommitLog and ``size`` its total size in bytes.
    """

    __slots__ = (
        "_keys_raw",
        "_properties_raw",
        "body",
        "born_ts_ms",
        "flags",
        "physical_offset",
        "queue_id",
        "queue_offset",
        "size",
        "store_ts_ms",
        "tag",
        "topic",
    )

    def __init__(
        self,
        size: int,
        queue_offset: int,
        physical_offset: int,
        born_ts_ms: int,
        store_ts_ms: int,
        queue_id: int,
        flags: int,
        topic: str,
        tag: str | None,
        keys_raw: memoryview,
        properties_raw: memoryview,
        body: memoryview | None,
    ) -> None:
        self.size = size
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.born_ts_ms = born_ts_ms
        self.store_ts_ms = store_ts_ms
        self.queue_id = queue_id
        self.flags = flags
        self.topic = topic
        self.tag = tag
        self._keys_raw = keys_raw
        self._properties_raw = properties_raw
        self.body = body

    @property
    def keys(self) -> tuple[str, ...]:
        return decode_keys(self._keys_raw)

    @property
    def keys_raw(self) -> memoryview:
        return self._keys_raw

    @property
    def properties_raw(self) -> memoryview:
        return self._properties_raw

    @property
    def properties(self) -> tuple[tuple[str, bytes], ...]:
        return decode_properties(self._properties_raw)

    def __repr__(self) -> str:
        body_len = -1 if self.body is None else len(self.body)
        return (
            f"Record(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, physical_offset={self.physical_offset}, "
            f"size={self.size}, store_ts_ms={self.store_ts_ms}, body_len={body_len})"
        )


RecordT = TypeVar("RecordT", bound=Record)


def read_prefix(buffer: Any, position: int, limit: int, path: str) -> tuple[int, int]:
    """Read and check (total_size, magic) at ``position``; do not verify the checksum.

    Args:
        buffer: the whole file's bytes (a mapping or a view).
        position: the record start inside the file.
        limit: the end of readable bytes inside the file.
        path: the file, for errors.

    Raises:
        CorruptDataError: the prefix is cut off, the magic is unknown or the size is
            impossible.
    """
    if position + BLANK_SIZE > limit:
        raise CorruptDataError(path, position, "record prefix cut off")
    total_size, magic, _ = PREFIX.unpack_from(buffer, position)
    if magic == MESSAGE_MAGIC:
        minimum = HEADER_SIZE
    elif magic == BLANK_MAGIC:
        minimum = BLANK_SIZE
    else:
        raise CorruptDataError(path, position, f"bad magic 0x{magic:08x}")
    if total_size < minimum or position + total_size > limit:
        raise CorruptDataError(path, position, f"impossible total size {total_size}")
    return total_size, magic


def decode(buffer: Any, position: int, limit: int, path: str, file_start: int) -> Record | None:
    """Decode and fully verify the record at ``position`` of a file.

    Args:
        buffer: the whole file's bytes.
        position: the record start inside the file.
        limit: the end of readable bytes inside the file.
        path: the file, for errors.
        file_start: the file's physical start offset; a record whose stored
            physical offset differs is stale or misplaced, hence corrupt.

    Returns:
        The record, or None for an end-of-file blank record.

    Raises:
        CorruptDataError: anything about the record is wrong.
    """
    total_size, magic = read_prefix(buffer, position, limit, path)
    (stored,) = _SEED_PREFIX.unpack_from(buffer, position + CHECKSUM_OFFSET)
    if magic == BLANK_MAGIC:
        # A blank record's checksum covers its 16-byte header only.
        if _hash(b"", total_size | magic << 32) != stored:
            raise CorruptDataError(path, position, "blank record checksum mismatch")
        return None
    view = memoryview(buffer)[position : position + total_size]
    if _hash(view[HASHED_FROM:], total_size | magic << 32) != stored:
        raise CorruptDataError(path, position, "checksum mismatch")
    record = _decode_verified(view, total_size, path, position)
    if record.physical_offset != file_start + position:
        raise CorruptDataError(
            path, position, f"record claims physical offset {record.physical_offset}"
        )
    return record


def _decode_verified(view: memoryview, total_size: int, path: str, where: int) -> Record:
    (
        _,
        _,
        _,
        queue_offset,
        physical_offset,
        born_ts_ms,
        store_ts_ms,
        queue_id,
        flags,
        body_len,
        properties_len,
        keys_len,
        topic_len,
        tag_len,
    ) = HEADER.unpack_from(view, 0)
    if HEADER_SIZE + topic_len + tag_len + keys_len + properties_len + body_len != total_size:
        raise CorruptDataError(path, where, "section lengths do not add up to the total size")
    if flags & ~FLAGS_KNOWN:
        raise CorruptDataError(path, where, f"unknown flags 0x{flags:x}")
    cursor = HEADER_SIZE
    try:
        topic = str(view[cursor : cursor + topic_len], "ascii")
        cursor += topic_len
        tag = str(view[cursor : cursor + tag_len], "utf-8") if tag_len else None
    except UnicodeDecodeError:
        raise CorruptDataError(path, where, "topic or tag is not valid text") from None
    cursor += tag_len
    keys_raw = view[cursor : cursor + keys_len]
    cursor += keys_len
    properties_raw = view[cursor : cursor + properties_len]
    cursor += properties_len
    body = None if flags & FLAG_NULL_BODY else view[cursor:total_size]
    return Record(
        total_size,
        queue_offset,
        physical_offset,
        born_ts_ms,
        store_ts_ms,
        queue_id,
        flags,
        topic,
        tag,
        keys_raw,
        properties_raw,
        body,
    )


def decode_run(
    buffer: Any,
    path: str,
    file_start: int,
    physical_offsets: Any,
    sizes: Any,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    record_class: type[RecordT],
) -> list[RecordT]:
    """Decode and verify the records of one queue that ConsumeQueue units point at.

    Every record must lie in this file (``buffer``, starting at physical
    ``file_start``), verify its checksum, and be exactly the unit's record: its size,
    topic, queue id, queue offset (``first_queue_offset + i``) and physical offset.
    This is ``decode`` with the expectations folded in, one loop, for bulk reads. The
    store reads through ``columns.read_columns`` (the same checks, gathered into
    columns); this stays the reference tests/commitlog/test_columns.py holds it to.

    Raises:
        CorruptDataError: the first record that fails, with its position in the file.
    """
    view = memoryview(buffer)
    unpack = HEADER.unpack_from
    topic_raw = topic.encode("ascii")
    topic_len_expected = len(topic_raw)
    records = []
    # Checksums first, for the whole run in one call (C when built); the loop below
    # then checks the header fields record by record.
    physicals = np.asarray(physical_offsets, dtype=np.int64)  # arrays (or sequences)
    lengths = np.asarray(sizes, dtype=np.int64)
    hashed = NATIVE is not None
    bad = -1
    if hashed:
        bad = verify_records(buffer, physicals - file_start, lengths)
        if bad >= 0:
            hashed = False  # the loop finds the record and says what is wrong with it
            physicals, lengths = physicals[: bad + 1], lengths[: bad + 1]
    positions = physicals - file_start
    queue_offset = first_queue_offset
    for physical, size in zip(physicals.tolist(), lengths.tolist(), strict=True):
        position = physical - file_start
        if position < 0 or position + HEADER_SIZE > len(view) or size < HEADER_SIZE:
            raise CorruptDataError(path, position, "unit points outside the file")
        (total_size, magic, stored, record_queue_offset, record_physical, born_ts_ms,
         store_ts_ms, record_queue_id, flags, body_len, properties_len, keys_len, topic_len,
         tag_len) = unpack(buffer, position)  # fmt: skip
        if (
            magic != MESSAGE_MAGIC
            or total_size != size
            or record_physical != physical
            or record_queue_offset != queue_offset
            or record_queue_id != queue_id
            or topic_len != topic_len_expected
            or flags & ~FLAGS_KNOWN
            or HEADER_SIZE + topic_len + tag_len + keys_len + properties_len + body_len
            != total_size
        ):
            raise CorruptDataError(
                path, position, f"not the record of {topic}/{queue_id}@{queue_offset}"
            )
        end = position + total_size
        if end > len(view) or (
            not hashed
            and _hash(view[position + HASHED_FROM : end], total_size | magic << 32) != stored
        ):
            raise CorruptDataError(path, position, "checksum mismatch")
        cursor = position + HEADER_SIZE
        if view[cursor : cursor + topic_len] != topic_raw:
            raise CorruptDataError(path, position, "topic differs from its ConsumeQueue")
        cursor += topic_len
        tag = None
        if tag_len:
            try:
                tag = str(view[cursor : cursor + tag_len], "utf-8")
            except UnicodeDecodeError:
                raise CorruptDataError(path, position, "tag is not valid text") from None
            cursor += tag_len
        keys_raw = view[cursor : cursor + keys_len]
        cursor += keys_len
        properties_raw = view[cursor : cursor + properties_len]
        cursor += properties_len
        records.append(
            record_class(
                total_size,
                queue_offset,
                physical,
                born_ts_ms,
                store_ts_ms,
                queue_id,
                flags,
                topic,
                tag,
                keys_raw,
                properties_raw,
                None if flags & FLAG_NULL_BODY else view[cursor:end],
            )
        )
        queue_offset += 1
    if bad >= 0:  # verify_records and the loop disagree: never return a short run
        raise CorruptDataError(path, int(positions[bad]), "checksum mismatch")
    return records
