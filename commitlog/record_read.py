"""Reading the CommitLog record format (commitlog/record_format.py declares it):
``decode`` and ``Record``, a run of records (``decode_run``), the keys and properties
sections, and the pure-Python twins of commitlog/_scan.c: ``scan_records_py`` (the
recovery scan's walk of a file), ``verify_records_py`` and ``gather_py``.
commitlog/record.py re-exports every name here: importers use that module.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import xxhash

from mqstore.commitlog.errors import (
    CorruptDataError,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record_format import (
    _FIELDS,
    _INT64_MAX,
    _PROPERTY_KEY,
    _PROPERTY_VALUE,
    _SEED_PREFIX,
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
    MESSAGE_MAGIC,
    PREFIX,
    SCAN_BLANK,
    SCAN_FULL,
    SCAN_INVALID,
    SCAN_LIMIT,
    SCAN_ZEROS,
    _hash,
    checksum,
)


def decode_keys(raw: bytes | memoryview) -> tuple[str, ...]:
    if not raw:
        return ()
    return tuple(part.decode("utf-8") for part in bytes(raw).split(KEY_SEPARATOR))


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


# The C versions (commitlog/_scan.c) when the module built, else the twins above.
if NATIVE is None:
    scan_records = scan_records_py
    verify_records = verify_records_py
    gather = gather_py
else:
    scan_records = NATIVE.scan_records
    verify_records = NATIVE.verify_records
    gather = NATIVE.gather


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
