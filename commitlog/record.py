"""The CommitLog record format, for its users: this module re-exports the format
(commitlog/record_format.py: the layout, its constants, the checksum) and the reads
(commitlog/record_read.py: ``decode``, ``Record``, the scans' twins), and holds the
writes: topic, tag, keys and properties encoders, and the pure-Python twins of
commitlog/_native.c's record encoders. Each function named here without ``_py`` is
the C one when the module built, else its twin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any, Final

import xxhash

from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record_format import (
    _INT64_MAX,
    _PROPERTY_KEY,
    _PROPERTY_VALUE,
    _TAIL,
    BLANK_MAGIC,
    BLANK_SIZE,
    CHECKSUM_OFFSET,
    FLAG_GROUP_OPEN,
    FLAG_NULL_BODY,
    FLAGS_KNOWN,
    HASHED_FROM,
    HEADER,
    HEADER_SIZE,
    KEY_SEPARATOR,
    KEYS_MAX_BYTES,
    LAYOUT,
    MESSAGE_MAGIC,
    PREFIX,
    RECORD_SIZE_MAX,
    SCAN_BLANK,
    SCAN_FULL,
    SCAN_INVALID,
    SCAN_LIMIT,
    SCAN_ZEROS,
    TAG_MAX_BYTES,
    TOPIC_NAME_MAX,
    _hash,
    checksum,
)
from mqstore.commitlog.record_read import (
    Record,
    RecordT,
    decode,
    decode_keys,
    decode_properties,
    decode_run,
    gather,
    gather_py,
    read_prefix,
    scan_records,
    scan_records_py,
    verify_records,
    verify_records_py,
)

__all__ = [
    "BLANK_MAGIC",
    "BLANK_SIZE",
    "CHECKSUM_OFFSET",
    "FLAGS_KNOWN",
    "FLAG_GROUP_OPEN",
    "FLAG_NULL_BODY",
    "HASHED_FROM",
    "HEADER",
    "HEADER_SIZE",
    "KEYS_MAX_BYTES",
    "KEY_SEPARATOR",
    "LAYOUT",
    "MESSAGE_MAGIC",
    "PREFIX",
    "RECORD_SIZE_MAX",
    "Record",
    "RecordT",
    "SCAN_BLANK",
    "SCAN_FULL",
    "SCAN_INVALID",
    "SCAN_LIMIT",
    "SCAN_ZEROS",
    "TAG_MAX_BYTES",
    "TOPIC_NAME_MAX",
    "check_bodies",
    "check_bodies_py",
    "checksum",
    "decode",
    "decode_keys",
    "decode_properties",
    "decode_run",
    "encode_bodies",
    "encode_bodies_py",
    "encode_into",
    "encode_into_py",
    "encode_keys",
    "encode_properties",
    "encode_run",
    "encode_run_py",
    "encode_slices",
    "encode_slices_py",
    "encode_tag",
    "gather",
    "gather_py",
    "read_prefix",
    "scan_records",
    "scan_records_py",
    "tag_hash",
    "validate_topic",
    "verify_records",
    "verify_records_py",
]

_TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,127}")

_tag_hash = xxhash.xxh3_64_intdigest
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


if NATIVE is None:
    encode_into = encode_into_py
    encode_run = encode_run_py
    check_bodies = check_bodies_py
    encode_bodies = encode_bodies_py
    encode_slices = encode_slices_py
else:
    encode_into = NATIVE.encode_into
    encode_run = NATIVE.encode_run
    check_bodies = NATIVE.check_bodies
    encode_bodies = NATIVE.encode_bodies
    encode_slices = NATIVE.encode_slices


def encode_blank_into(buffer: Any, position: int, total_size: int) -> None:
    """Write an end-of-file blank record of ``total_size`` bytes at ``position``."""
    assert total_size >= BLANK_SIZE
    PREFIX.pack_into(
        buffer, position, total_size, BLANK_MAGIC, _hash(b"", total_size | BLANK_MAGIC << 32)
    )
