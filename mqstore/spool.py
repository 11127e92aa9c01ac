"""Spool files: rows handed to a store's writer by a process that cannot take the
writer lock (a Spark sink task while a service holds the store open). The writer
appends them later (``mqstore.inbox``).

On disk (little-endian)::

    +---------------------------------------------------------------+
    | FILE_HEADER (32 bytes)                                        |
    |   magic          u32   0x5053514D ("MQSP")                    |
    |   version        u16   1                                      |
    |   reserved       u16   0                                      |
    |   block_count    u32                                          |
    |   row_count      u32   rows of all blocks                     |
    |   payload_bytes  u64   bytes after this header                |
    |   checksum       u64   xxh3_64 of the payload                 |
    +---------------------------------------------------------------+
    | block 0 | block 1 | ...                       (payload_bytes)  |
    +---------------------------------------------------------------+

    block: rows of one topic and partition, appended with one put_batch_buffers
    (append_records when it has keys or headers)
    +---------------------------------------------------------------+
    | BLOCK_HEADER (24 bytes)                                       |
    |   row_count      u32   1..BLOCK_ROWS_MAX                      |
    |   partition      i32                                          |
    |   flags          u32   HAS_KEYS | HAS_TIMESTAMPS | HAS_HEADERS  |
    |   topic_len      u16                                          |
    |   reserved       u16   0                                      |
    |   data_bytes     u64   bytes of the block after this header   |
    | topic            topic_len bytes, ASCII                       |
    | value_lengths    i32[row_count]   -1: a null value            |
    | key_lengths      i32[row_count]   -1: no key   (HAS_KEYS)     |
    | timestamps_ms    i64[row_count]   -1: none     (HAS_TIMESTAMPS)|
    | header_lengths   i32[row_count]   bytes        (HAS_HEADERS)  |
    | values, then keys, then headers: the bytes, row after row     |
    +---------------------------------------------------------------+

    one row's headers: pairs of (name_len u16, name UTF-8, value_len i32 (-1: null),
    value)

Crash policy: a spool file is written under a temporary name (``.tmp-`` suffix),
fsynced, renamed to its final ``.spool`` name and the directory fsynced. A file
with its final name is therefore complete; a crash leaves at most a temporary
file, which no reader takes (the inbox removes stale ones). ``read_spool`` checks
the checksum and the whole structure before returning anything: a file that fails
is a ``CorruptSpoolError`` and none of its rows are used.
"""

from __future__ import annotations

import mmap
import os
import struct
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Final

import attrs
import numpy as np
import xxhash

from mqstore.commitlog.durable import fsync_directory
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError, LimitExceededError
from mqstore.commitlog.record import validate_topic

__all__ = [
    "BLOCK_ROWS_MAX",
    "SPOOL_SUFFIX",
    "Block",
    "CorruptSpoolError",
    "Spool",
    "SpoolWriter",
    "read_spool",
]

SPOOL_SUFFIX: Final = ".spool"
TMP_MARK: Final = ".tmp-"  # temporary names: <name>.spool.tmp-<unique>
MAGIC: Final = 0x5053514D  # b"MQSP" read as a little-endian u32
VERSION: Final = 1
FILE_HEADER: Final = struct.Struct("<IHHIIQQ")  # magic, version, reserved, blocks, rows,
# payload_bytes, checksum
assert FILE_HEADER.size == 32
BLOCK_HEADER: Final = struct.Struct("<IiIHHQ")  # rows, partition, flags, topic_len,
# reserved, data_bytes
assert BLOCK_HEADER.size == 24
PAIR_NAME: Final = struct.Struct("<H")  # header name length
PAIR_VALUE: Final = struct.Struct("<i")  # header value length, -1: null
HAS_KEYS: Final = 0x1
HAS_TIMESTAMPS: Final = 0x2
HAS_HEADERS: Final = 0x4
FLAGS_KNOWN: Final = HAS_KEYS | HAS_TIMESTAMPS | HAS_HEADERS
# One block is one put_batch of the writer: it bounds the append-lock hold time and the
# memory one decoded block takes (the Spark sink appends 8,192 rows per put_batch too).
BLOCK_ROWS_MAX: Final = 8_192
BLOCKS_MAX: Final = 1 << 20  # 8 G rows: far above any one Spark task's output
_I32: Final = np.dtype("<i4")
_I64: Final = np.dtype("<i8")

Header = tuple[str, bytes | None]


class CorruptSpoolError(CorruptDataError):
    """A spool file does not decode (bad magic, checksum, structure); none of its
    rows may be appended. Carries the file's path and the bad position."""


@attrs.frozen(eq=False)
class Block:
    """The decoded rows of one block, over one bytes copy of the block (the file's
    mapping is never exported). Values are an Arrow-style binary column: value i is
    ``data[value_offsets[i]:value_offsets[i + 1]]``, None where ``value_nulls[i]``;
    the form ``MessageStore.put_batch_buffers`` takes, with no object per row."""

    topic: str
    partition: int
    data: bytes
    value_offsets: np.ndarray  # int64[rows + 1]: positions in ``data``
    value_nulls: np.ndarray | None  # uint8[rows], 1: a null value; None: no null value
    stamps_ms: np.ndarray | None  # int64[rows], -1: none; None: the block has none
    keys: list[memoryview | None] | None
    headers: list[list[Header]] | None

    @property
    def rows(self) -> int:
        return len(self.value_offsets) - 1

    @property
    def values(self) -> list[memoryview | None]:
        """The values one by one (views of ``data``): for rows with keys or headers."""
        view = memoryview(self.data)
        bounds = self.value_offsets.tolist()
        nulls = [False] * self.rows if self.value_nulls is None else self.value_nulls.tolist()
        return [None if n else view[bounds[i] : bounds[i + 1]] for i, n in enumerate(nulls)]

    @property
    def timestamps_ms(self) -> list[int | None] | None:
        if self.stamps_ms is None:
            return None
        return [None if t < 0 else t for t in self.stamps_ms.tolist()]


@attrs.frozen
class _BlockAt:
    """Where a validated block lies in the file, and its shape."""

    position: int  # of the block header, in the file
    rows: int
    partition: int
    flags: int
    topic: str
    data_bytes: int


class SpoolWriter:
    """Writes one spool file: ``add_block`` per group of rows, then ``commit``.

    Nothing is visible under ``final_path`` until ``commit`` returns; ``abort`` (or
    leaving the ``with`` block on an exception) removes the temporary file.
    """

    def __init__(self, final_path: str, *, max_bytes: int) -> None:
        if not final_path.endswith(SPOOL_SUFFIX):
            raise InvalidArgumentError(f"a spool file name ends in {SPOOL_SUFFIX}")
        self.final_path = final_path
        self.max_bytes = max_bytes
        self.tmp_path = f"{final_path}{TMP_MARK}{uuid.uuid4().hex}"
        self._handle = open(self.tmp_path, "wb")  # noqa: SIM115 - closed by commit/abort
        self._handle.write(bytes(FILE_HEADER.size))
        self._hash = xxhash.xxh3_64()
        self._payload_bytes = 0
        self.blocks = 0
        self.rows = 0

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None or not self._handle.closed:
            self.abort()

    def add_block(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        timestamps_ms: Sequence[int | None] | None = None,
        headers: Sequence[Sequence[Header] | None] | None = None,
    ) -> None:
        """Append one block (at most BLOCK_ROWS_MAX rows of one topic and partition).

        Raises:
            LimitExceededError: the file would pass ``max_bytes``.
        """
        count = len(values)
        assert 0 < count <= BLOCK_ROWS_MAX
        assert keys is None or len(keys) == count
        flags = 0
        arrays = [_lengths(values)]
        data = [b"".join(v for v in values if v)]
        if keys is not None and any(k is not None for k in keys):
            flags |= HAS_KEYS
            arrays.append(_lengths(keys))
            data.append(b"".join(k for k in keys if k))
        if timestamps_ms is not None and any(t is not None for t in timestamps_ms):
            flags |= HAS_TIMESTAMPS
            stamps = np.array([-1 if t is None else t for t in timestamps_ms], dtype=_I64)
            assert stamps.min() >= -1
            arrays.append(stamps)
        if headers is not None and any(headers):
            flags |= HAS_HEADERS
            encoded = [_encode_headers(h) for h in headers]
            arrays.append(np.array([len(e) for e in encoded], dtype=_I32))
            data.append(b"".join(encoded))
        self._write_block(topic, partition, count, flags, [*arrays, *data])

    def add_column_block(
        self,
        topic: str,
        partition: int,
        offsets: np.ndarray,
        data: Any,
        *,
        nulls: np.ndarray | None = None,
        timestamps_ms: np.ndarray | None = None,
    ) -> None:
        """``add_block`` for values laid out as an Arrow binary column (the form of
        ``MessageStore.put_batch_buffers``): value i is ``data[offsets[i]:offsets[i+1]]``,
        None where ``nulls[i]``; ``timestamps_ms`` int64, -1 for none. The bytes go
        from ``data`` to the file with no object per row.

        Raises:
            LimitExceededError: the file would pass ``max_bytes``.
        """
        count = len(offsets) - 1
        assert 0 < count <= BLOCK_ROWS_MAX
        assert nulls is None or len(nulls) == count
        bounds = np.asarray(offsets, dtype=np.int64)
        spans = np.diff(bounds)
        assert int(spans.min()) >= 0, "offsets never decrease"
        assert int(spans.max()) < 1 << 31, "a value's length fits the i32 length array"
        start, end = int(bounds[0]), int(bounds[-1])
        values: Any = memoryview(data).cast("B")[start:end]
        lengths = spans.astype(_I32)
        if nulls is not None and nulls.any():
            null = nulls.astype(bool)
            lengths[null] = -1
            if spans[null].any():  # Arrow lets a null span bytes; the file does not
                values = np.frombuffer(values, np.uint8)[_kept_bytes(bounds - start, null)]
        arrays: list[Any] = [lengths]
        flags = 0
        if timestamps_ms is not None and (timestamps_ms >= 0).any():
            stamps = np.ascontiguousarray(timestamps_ms, dtype=_I64)
            assert stamps.shape == (count,)
            assert stamps.min() >= -1
            flags |= HAS_TIMESTAMPS
            arrays.append(stamps)
        self._write_block(topic, partition, count, flags, [*arrays, values])

    def _write_block(
        self, topic: str, partition: int, count: int, flags: int, parts: list[Any]
    ) -> None:
        """Write one block: its header, topic, then ``parts`` (numpy arrays written
        raw, and bytes-like data) in the order of the layout."""
        validate_topic(topic)
        topic_raw = topic.encode("ascii")
        body = [memoryview(topic_raw), *(memoryview(p).cast("B") for p in parts)]
        data_bytes = sum(part.nbytes for part in body)
        header = BLOCK_HEADER.pack(count, partition, flags, len(topic_raw), 0, data_bytes)
        if FILE_HEADER.size + self._payload_bytes + len(header) + data_bytes > self.max_bytes:
            raise LimitExceededError(f"spool file {self.final_path} would pass {self.max_bytes} B")
        assert self.blocks < BLOCKS_MAX
        for part in (memoryview(header), *body):
            self._handle.write(part)
            self._hash.update(part)
        self._payload_bytes += len(header) + data_bytes
        self.blocks += 1
        self.rows += count

    def commit(self) -> None:
        """Write the header, fsync, rename to the final name, fsync the directory."""
        assert self.blocks > 0, "an empty spool file is never written"
        header = FILE_HEADER.pack(
            MAGIC, VERSION, 0, self.blocks, self.rows, self._payload_bytes, self._hash.intdigest()
        )
        handle = self._handle
        handle.seek(0)
        handle.write(header)
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.rename(self.tmp_path, self.final_path)  # replaces an earlier attempt's file
        fsync_directory(os.path.dirname(self.final_path))

    def abort(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass


def _kept_bytes(offsets: np.ndarray, null: np.ndarray) -> np.ndarray:
    """A bool mask over ``offsets[0]..offsets[-1]`` that drops the bytes null items span."""
    delta = np.zeros(int(offsets[-1] - offsets[0]) + 1, dtype=np.int64)
    np.add.at(delta, offsets[:-1][null] - offsets[0], 1)
    np.add.at(delta, offsets[1:][null] - offsets[0], -1)
    return np.cumsum(delta[:-1]) == 0


def _lengths(items: Sequence[bytes | None]) -> np.ndarray:
    return np.array([-1 if item is None else len(item) for item in items], dtype=_I32)


def _encode_headers(pairs: Sequence[Header] | None) -> bytes:
    if not pairs:
        return b""
    out = bytearray()
    for name, value in pairs:
        raw = name.encode("utf-8")
        out += PAIR_NAME.pack(len(raw)) + raw
        if value is None:
            out += PAIR_VALUE.pack(-1)
        else:
            out += PAIR_VALUE.pack(len(value)) + bytes(value)
    return bytes(out)


class Spool:
    """A validated spool file, opened by ``read_spool``. Close it (or use ``with``)."""

    def __init__(
        self,
        path: str,
        mapping: mmap.mmap,
        checksum: int,
        blocks: list[_BlockAt],
        identity: tuple[int, int] = (0, 0),
    ):
        self.path = path
        self.checksum = checksum
        # (st_dev, st_ino) of the file read: a rename over ``path`` (a retried task
        # rewriting its name) makes another file, which ``is_at`` tells apart.
        self.identity = identity
        self.rows = sum(block.rows for block in blocks)
        self._mapping = mapping
        self._blocks = blocks

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._mapping.close()

    def is_at(self, path: str) -> bool:
        """Whether ``path`` still names the file this spool was read from."""
        try:
            status = os.stat(path)
        except FileNotFoundError:
            return False
        return (status.st_dev, status.st_ino) == self.identity

    @property
    def block_count(self) -> int:
        return len(self._blocks)

    def destinations(self) -> set[tuple[str, int]]:
        """Every (topic, partition) the file appends to."""
        return {(block.topic, block.partition) for block in self._blocks}

    def blocks(self, first: int = 0) -> Iterator[Block]:
        """Decode blocks from index ``first`` on, one at a time."""
        for block in self._blocks[first:]:
            yield self._decode(block)

    def _decode(self, at: _BlockAt) -> Block:
        start = at.position + BLOCK_HEADER.size + len(at.topic)
        raw = self._mapping[start : at.position + BLOCK_HEADER.size + at.data_bytes]
        rows, flags, cursor = at.rows, at.flags, 0
        value_len = np.frombuffer(raw, _I32, rows, cursor)
        cursor += 4 * rows
        key_len = None
        if flags & HAS_KEYS:
            key_len = np.frombuffer(raw, _I32, rows, cursor)
            cursor += 4 * rows
        stamps = None
        if flags & HAS_TIMESTAMPS:
            stamps = np.frombuffer(raw, _I64, rows, cursor)
            cursor += 8 * rows
        header_len = None
        if flags & HAS_HEADERS:
            header_len = np.frombuffer(raw, _I32, rows, cursor)
            cursor += 4 * rows
        value_offsets = _offsets(cursor, value_len)
        value_nulls = (value_len < 0).view(np.uint8) if int(value_len.min()) < 0 else None
        cursor = int(value_offsets[-1])
        view = memoryview(raw)
        keys = None
        if key_len is not None:
            keys, cursor = _slices(view, cursor, key_len)
        headers = None
        if header_len is not None:
            sections, cursor = _slices(view, cursor, header_len)
            headers = [_decode_headers(s, self.path, at.position) for s in sections]
        assert cursor == len(raw), "validated at open"
        return Block(at.topic, at.partition, raw, value_offsets, value_nulls, stamps, keys, headers)


def _offsets(cursor: int, lengths: np.ndarray) -> np.ndarray:
    """int64[rows + 1] positions of items laid out one after the other from ``cursor``
    (a negative length, a null, takes no bytes)."""
    offsets = np.empty(len(lengths) + 1, dtype=np.int64)
    offsets[0] = cursor
    np.cumsum(np.maximum(lengths, 0), out=offsets[1:])
    offsets[1:] += cursor
    return offsets


def _slices(
    view: memoryview, cursor: int, lengths: np.ndarray
) -> tuple[list[memoryview | None], int]:
    bounds = _offsets(cursor, lengths).tolist()
    out: list[memoryview | None] = [
        None if n < 0 else view[bounds[i] : bounds[i + 1]] for i, n in enumerate(lengths.tolist())
    ]
    return out, bounds[-1]


def _decode_headers(section: memoryview | None, path: str, position: int) -> list[Header]:
    pairs: list[Header] = []
    if not section:
        return pairs
    raw, cursor, end = bytes(section), 0, len(section)
    try:
        while cursor < end:
            (name_len,) = PAIR_NAME.unpack_from(raw, cursor)
            cursor += PAIR_NAME.size
            name = raw[cursor : cursor + name_len].decode("utf-8")
            cursor += name_len
            (value_len,) = PAIR_VALUE.unpack_from(raw, cursor)
            cursor += PAIR_VALUE.size
            if value_len < -1 or cursor + max(value_len, 0) > end:
                raise ValueError(f"header value length {value_len}")
            pairs.append((name, None if value_len < 0 else raw[cursor : cursor + value_len]))
            cursor += max(value_len, 0)
    except (struct.error, UnicodeDecodeError, ValueError) as error:
        raise CorruptSpoolError(path, position, f"malformed headers: {error}") from None
    if cursor != end:
        raise CorruptSpoolError(path, position, "headers overrun their section")
    return pairs


def read_spool(path: str) -> Spool:
    """Open and validate a spool file: checksum, header and every block's structure.

    Raises:
        CorruptSpoolError: the file does not decode; nothing of it may be used.
        FileNotFoundError: the file is gone (another writer took it).
    """
    with open(path, "rb") as handle:
        status = os.fstat(handle.fileno())
        size, identity = status.st_size, (status.st_dev, status.st_ino)
        if size < FILE_HEADER.size:
            raise CorruptSpoolError(path, 0, f"{size} bytes is shorter than the header")
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        magic, version, _, block_count, rows, payload_bytes, checksum = FILE_HEADER.unpack_from(
            mapping, 0
        )
        if magic != MAGIC:
            raise CorruptSpoolError(path, 0, f"bad magic {magic:#010x}")
        if version != VERSION:
            raise CorruptSpoolError(path, 4, f"unsupported version {version}")
        if payload_bytes != size - FILE_HEADER.size:
            raise CorruptSpoolError(path, 16, f"payload of {payload_bytes} B in a {size} B file")
        if not 0 < block_count <= BLOCKS_MAX:
            raise CorruptSpoolError(path, 8, f"block count {block_count}")
        if xxhash.xxh3_64_intdigest(memoryview(mapping)[FILE_HEADER.size :]) != checksum:
            raise CorruptSpoolError(path, FILE_HEADER.size, "checksum mismatch")
        blocks = _walk_blocks(path, mapping, block_count)
        if sum(block.rows for block in blocks) != rows:
            raise CorruptSpoolError(path, 12, "row count differs from the blocks")
    except BaseException:
        mapping.close()
        raise
    return Spool(path, mapping, checksum, blocks, identity)


def _walk_blocks(path: str, mapping: mmap.mmap, block_count: int) -> list[_BlockAt]:
    blocks: list[_BlockAt] = []
    position, end = FILE_HEADER.size, len(mapping)
    for _ in range(block_count):
        if position + BLOCK_HEADER.size > end:
            raise CorruptSpoolError(path, position, "block header past the end")
        rows, partition, flags, topic_len, _, data_bytes = BLOCK_HEADER.unpack_from(
            mapping, position
        )
        if not 0 < rows <= BLOCK_ROWS_MAX or partition < 0 or flags & ~FLAGS_KNOWN:
            raise CorruptSpoolError(path, position, "bad block header")
        data_at = position + BLOCK_HEADER.size
        if data_at + data_bytes > end:
            raise CorruptSpoolError(path, position, "block data past the end")
        try:
            topic = mapping[data_at : data_at + topic_len].decode("ascii")
            validate_topic(topic)
        except (UnicodeDecodeError, ValueError, TypeError):
            raise CorruptSpoolError(path, data_at, "bad topic") from None
        expected = topic_len + _block_data_bytes(mapping, data_at + topic_len, rows, flags)
        if expected != data_bytes:
            raise CorruptSpoolError(path, position, f"block holds {data_bytes} B, not {expected}")
        blocks.append(_BlockAt(position, rows, partition, flags, topic, data_bytes))
        position = data_at + data_bytes
    if position != end:
        raise CorruptSpoolError(path, position, f"{end - position} bytes after the last block")
    return blocks


def _block_data_bytes(mapping: mmap.mmap, at: int, rows: int, flags: int) -> int:
    """Bytes of a block after its topic, from its length arrays (each checked)."""
    arrays = 1 + bool(flags & HAS_KEYS) + bool(flags & HAS_HEADERS)
    array_bytes = 4 * rows * arrays + (8 * rows if flags & HAS_TIMESTAMPS else 0)
    if at + array_bytes > len(mapping):
        return -1
    total, cursor = array_bytes, at
    for present in (True, bool(flags & HAS_KEYS)):
        if present:
            lengths = np.frombuffer(mapping, _I32, rows, cursor)
            if int(lengths.min()) < -1:
                return -1
            total += int(np.maximum(lengths, 0).sum())
            cursor += 4 * rows
    if flags & HAS_TIMESTAMPS:
        cursor += 8 * rows
    if flags & HAS_HEADERS:
        lengths = np.frombuffer(mapping, _I32, rows, cursor)
        if int(lengths.min()) < 0:
            return -1
        total += int(lengths.sum())
    del lengths  # release the mapping's buffer export before it may be closed
    return total
