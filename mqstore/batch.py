"""MessageBatch: messages of one queue, column by column (``MessageStore.get_batch``).

A batch holds n consecutive messages of one (topic, queue_id), read and verified in
one C call per CommitLog file run (``read_columns``, mqstore.commitlog.columns):

- one numpy int64 array per fixed field: ``queue_offsets``, ``physical_offsets``,
  ``sizes`` (whole records, bytes), ``born_timestamps_ms``, ``store_timestamps_ms``,
  ``flags``;
- the bodies as ONE bytes buffer, ``body_data``, cut by ``body_offsets`` (int64, n + 1:
  Arrow's binary layout, body i is ``body_data[body_offsets[i]:body_offsets[i + 1]]``)
  and ``body_valid`` (False for a null body, a Kafka tombstone; its slice is empty);
- the Kafka key the same way: ``kafka_key_data``, ``kafka_key_offsets``,
  ``kafka_key_valid``. The Kafka adapter stores a record's key as the property
  ``KEY_PROPERTY`` (mqstore.commitlog_engine); the key column is the value of each
  record's first property of that name, and not valid where there is none;
- the rest as stored, for per-row access: ``extra_data``/``extra_offsets`` hold each
  record's tag, keys and properties sections one after another, cut by
  ``tag_lengths`` and ``keys_lengths``. ``tag(i)``, ``keys(i)`` (the index keys of
  ``put(keys=...)``, which ``query_by_key`` finds), ``properties(i)`` and
  ``headers(i)`` (the properties but the Kafka key) decode one row when asked.

Everything a batch holds is its own (arrays and bytes, all read-only): it stays valid
after retention deletes the CommitLog files it came from, or the store closes.
``messages()`` gives the rows as ``Message`` objects (``MessageStore.get``), whose
bodies are views into ``body_data``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any, Final

import attrs
import numpy as np

from mqstore.commitlog.columns import (
    COLUMNS_CHANGED,
    COLUMNS_CHECKSUM,
    COLUMNS_MISMATCH,
    COLUMNS_OUTSIDE,
    COLUMNS_PROPERTIES,
    COLUMNS_TAG,
    COLUMNS_TOPIC,
    OUT_BODY_OFFSETS,
    OUT_BORN_TS,
    OUT_EXTRA_OFFSETS,
    OUT_FLAGS,
    OUT_HAS_KEY,
    OUT_KEY_OFFSETS,
    OUT_KEYS_LEN,
    OUT_ROWS,
    OUT_STORE_TS,
    OUT_TAG_LEN,
    read_columns,
    rows,
    slices,
)
from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.record import (
    FLAG_NULL_BODY,
    Record,
    decode_keys,
    decode_properties,
    validate_topic,
)
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.message import Message

__all__ = ["MessageBatch", "read_run", "read_run_timestamps"]

KEY_NAME: Final = KEY_PROPERTY.encode("utf-8")
#: The bytes a Kafka key's property takes besides the key: u16 name length, the
#: name, u32 value length (record.encode_properties).
_KEY_PAIR_OVERHEAD: Final = 2 + len(KEY_NAME) + 4
_REASONS: Final = {
    COLUMNS_OUTSIDE: "unit points outside the file",
    COLUMNS_MISMATCH: "not the record of {where}",
    COLUMNS_CHECKSUM: "checksum mismatch",
    COLUMNS_TOPIC: "topic differs from its ConsumeQueue",
    COLUMNS_TAG: "tag is not valid text",
    COLUMNS_PROPERTIES: "malformed properties",
    COLUMNS_CHANGED: "the record changed while it was read",
}
#: Up to this many rows, a check over a column goes through a list (~30 ns a row)
#: rather than numpy (~2 us of calls, whatever the length).
_LIST_ROWS_MAX: Final = 32
#: The rows of read_run's one int64 block: read_columns' out (rows OUT_*), then the
#: copies of the units' two fields.
_RUN_PHYSICALS: Final = OUT_ROWS
_RUN_SIZES: Final = OUT_ROWS + 1
_RUN_ROWS: Final = OUT_ROWS + 2
_EMPTY_OFFSETS: Final = np.zeros(1, dtype=np.int64)
_EMPTY_OFFSETS.flags.writeable = False


#: Queue offsets of a run of at most this many records are ``_COUNTING[:n] + first``,
#: not ``np.arange``: arange releases the GIL for any length (numpy 2.x), and a
#: released GIL goes to the writer thread until it sleeps (docs/VISIBILITY.md, stop
#: 29). read_columns keeps the GIL below 256 records too; 2 KiB of int64.
_COUNTING_ROWS_MAX: Final = 256
_COUNTING: Final = np.arange(_COUNTING_ROWS_MAX, dtype=np.int64)
_COUNTING.flags.writeable = False


def _offsets_from(first: int, count: int) -> np.ndarray:
    """int64 ``first, first + 1, ... first + count - 1`` (a new, writable array)."""
    if count <= _COUNTING_ROWS_MAX:
        return _COUNTING[:count] + first
    return np.arange(first, first + count, dtype=np.int64)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)  # what ``flags.writeable = False`` does, in half the time
    return array


@attrs.frozen(eq=False)
class MessageBatch:
    """n messages of one queue as columns (see the module docstring). Build with
    ``MessageStore.get_batch``; ``len(batch)`` is n."""

    topic: str
    queue_id: int
    queue_offsets: np.ndarray
    physical_offsets: np.ndarray
    sizes: np.ndarray
    born_timestamps_ms: np.ndarray
    store_timestamps_ms: np.ndarray
    flags: np.ndarray
    body_data: bytes
    body_offsets: np.ndarray
    kafka_key_data: bytes
    kafka_key_offsets: np.ndarray
    kafka_key_valid: np.ndarray
    extra_data: bytes
    extra_offsets: np.ndarray
    tag_lengths: np.ndarray
    keys_lengths: np.ndarray
    _cache: dict[str, Any] = attrs.field(init=False, factory=dict, repr=False)  # lists, views

    def __attrs_post_init__(self) -> None:
        count = len(self.queue_offsets)
        assert len(self.body_offsets) == len(self.kafka_key_offsets) == count + 1
        assert len(self.extra_offsets) == count + 1 and len(self.flags) == count

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def __repr__(self) -> str:
        first = int(self.queue_offsets[0]) if len(self) else None
        return (
            f"MessageBatch(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"first_queue_offset={first}, messages={len(self)}, "
            f"body_bytes={len(self.body_data)})"
        )

    # ------------------------------------------------------------------ columns

    @property
    def body_valid(self) -> np.ndarray:
        """bool per row: False for a null body (a Kafka tombstone)."""
        valid = self._cache.get("body_valid")
        if valid is None:
            valid = self._cache["body_valid"] = _frozen((self.flags & FLAG_NULL_BODY) == 0)
        return valid

    def to_list(self, name: str) -> list[Any]:
        """A numeric column (``queue_offsets``, ``sizes``, ...) as a list of Python
        ints, made once per batch (what per-row access reads)."""
        cached = self._cache.get(name)
        if cached is None:
            cached = self._cache[name] = getattr(self, name).tolist()
        return cached

    def bodies(self) -> list[memoryview | None]:
        """Every body as a read-only view into ``body_data`` (None for a null body)."""
        return slices(self.body_data, self.body_offsets, self._valid_bytes(), True)

    def values(self) -> list[bytes | None]:
        """Every body as bytes (a copy each; None for a null body)."""
        return slices(self.body_data, self.body_offsets, self._valid_bytes(), False)

    def kafka_keys(self) -> list[bytes | None]:
        """Every Kafka key as bytes (None where the record has none)."""
        if not self.extra_data:  # no properties, so no key
            return [None] * len(self)
        valid = self.kafka_key_valid.view(np.uint8)
        return slices(self.kafka_key_data, self.kafka_key_offsets, valid, False)

    def header_rows(self) -> list[int]:
        """The rows that have a property besides the Kafka key: the rows whose
        ``headers(i)`` is not empty."""
        if not self.extra_data:  # no record has a tag, keys or properties
            return []
        key_bytes = np.diff(self.kafka_key_offsets) + _KEY_PAIR_OVERHEAD
        properties_bytes = np.diff(self.extra_offsets) - self.tag_lengths - self.keys_lengths
        more = properties_bytes > np.where(self.kafka_key_valid, key_bytes, 0)
        return np.flatnonzero(more).tolist()

    def headers_lists(self) -> list[list[tuple[str, bytes]]]:
        """Every row's ``headers(i)``, each a new list (only ``header_rows`` are
        decoded)."""
        lists: list[list[tuple[str, bytes]]] = list(map(list, repeat((), len(self))))
        for row in self.header_rows():
            lists[row] = self.headers(row)
        return lists

    def messages(self) -> list[Message]:
        """The rows as Messages (bodies are views into ``body_data``)."""
        view = self._cache.get("view")
        if view is None:
            view = self._cache["view"] = memoryview(self.body_data)
        return rows(Message, self, view, self.body_offsets, self._valid_bytes())

    def _valid_bytes(self) -> np.ndarray | None:
        """body_valid as uint8 for ``slices``, or None when every body is valid."""
        if "valid_bytes" not in self._cache:
            if len(self) <= _LIST_ROWS_MAX and not any(
                flags & FLAG_NULL_BODY for flags in self.to_list("flags")
            ):  # a few rows: a list costs less than numpy's calls
                self._cache["valid_bytes"] = None
            else:
                valid = self.body_valid
                self._cache["valid_bytes"] = None if valid.all() else valid.view(np.uint8)
        return self._cache["valid_bytes"]

    # ------------------------------------------------------------------ rows

    def body(self, row: int) -> memoryview | None:
        """Row ``row``'s body: a read-only view into ``body_data``, or None."""
        if not self.body_valid[row]:
            return None
        start, end = self.to_list("body_offsets")[row : row + 2]
        return memoryview(self.body_data)[start:end]

    def kafka_key(self, row: int) -> bytes | None:
        if not self.kafka_key_valid[row]:
            return None
        start, end = self.to_list("kafka_key_offsets")[row : row + 2]
        return self.kafka_key_data[start:end]

    def _extra(self, row: int) -> tuple[int, int, int, int]:
        """(tag start, keys start, properties start, end) of a row in extra_data."""
        start, end = self.to_list("extra_offsets")[row : row + 2]
        keys_at = start + self.to_list("tag_lengths")[row]
        return start, keys_at, keys_at + self.to_list("keys_lengths")[row], end

    def tag(self, row: int) -> str | None:
        start, keys_at, _, _ = self._extra(row)
        return str(self.extra_data[start:keys_at], "utf-8") if keys_at > start else None

    def keys_raw(self, row: int) -> memoryview:
        _, keys_at, properties_at, _ = self._extra(row)
        return memoryview(self.extra_data)[keys_at:properties_at]

    def keys(self, row: int) -> tuple[str, ...]:
        """The index keys (``put(keys=...)``) of a row."""
        return decode_keys(self.keys_raw(row))

    def properties_raw(self, row: int) -> memoryview:
        _, _, properties_at, end = self._extra(row)
        return memoryview(self.extra_data)[properties_at:end]

    def properties(self, row: int) -> tuple[tuple[str, bytes], ...]:
        return decode_properties(self.properties_raw(row))

    def headers(self, row: int) -> list[tuple[str, bytes]]:
        """The Kafka headers of a row: its properties but the Kafka key."""
        pairs = list(self.properties(row))
        if self.kafka_key_valid[row]:
            pairs.pop([name for name, _ in pairs].index(KEY_PROPERTY))
        return pairs

    # ------------------------------------------------------------------ building

    @classmethod
    def empty(cls, topic: str, queue_id: int) -> MessageBatch:
        none = _frozen(np.zeros(0, dtype=np.int64))
        return cls(topic, queue_id, none, none, none, none, none, none, b"", _EMPTY_OFFSETS,
                   b"", _EMPTY_OFFSETS, _frozen(np.zeros(0, dtype=bool)), b"",
                   _EMPTY_OFFSETS, none, none)  # fmt: skip

    @classmethod
    def concat(cls, topic: str, queue_id: int, batches: Sequence[MessageBatch]) -> MessageBatch:
        """One batch of consecutive batches (the runs of one read), in order."""
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return cls.empty(topic, queue_id)
        assert all(b.topic == topic and b.queue_id == queue_id for b in batches)

        def column(name: str) -> np.ndarray:
            return _frozen(np.concatenate([getattr(b, name) for b in batches]))

        def binary(data: str, offsets: str) -> tuple[bytes, np.ndarray]:
            parts = [getattr(b, offsets)[1:] for b in batches]
            starts = np.cumsum([0] + [len(getattr(b, data)) for b in batches[:-1]])
            joined = np.concatenate([[0], *(p + s for p, s in zip(parts, starts, strict=True))])
            return b"".join(getattr(b, data) for b in batches), _frozen(joined.astype(np.int64))

        fixed = [column(name) for name in ("queue_offsets", "physical_offsets", "sizes",
                 "born_timestamps_ms", "store_timestamps_ms", "flags")]  # fmt: skip
        bodies, body_offsets = binary("body_data", "body_offsets")
        keys, key_offsets = binary("kafka_key_data", "kafka_key_offsets")
        extras, extra_offsets = binary("extra_data", "extra_offsets")
        return cls(topic, queue_id, fixed[0], fixed[1], fixed[2], fixed[3], fixed[4], fixed[5],
                   bodies, body_offsets, keys, key_offsets, column("kafka_key_valid"), extras,
                   extra_offsets, column("tag_lengths"), column("keys_lengths"))  # fmt: skip

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> MessageBatch:
        """A batch of already decoded and verified records of one queue (in any
        order: ``query_by_key`` results), copying what they show."""
        assert records, "a batch of records has at least one"
        topic, queue_id = records[0].topic, records[0].queue_id
        assert all(r.topic == topic and r.queue_id == queue_id for r in records)
        keys, valid, extras, tags, index_keys = [], [], [], [], []
        for record in records:
            key = next((v for name, v in record.properties if name == KEY_PROPERTY), None)
            keys.append(key or b"")
            valid.append(key is not None)
            tag = b"" if record.tag is None else record.tag.encode("utf-8")
            extras.append(tag + bytes(record.keys_raw) + bytes(record.properties_raw))
            tags.append(len(tag))
            index_keys.append(len(record.keys_raw))
        bodies = [b"" if r.body is None else bytes(r.body) for r in records]

        def ints(values: Sequence[int]) -> np.ndarray:
            return _frozen(np.array(values, dtype=np.int64))

        def offsets(parts: list[bytes]) -> np.ndarray:
            return ints([0, *np.cumsum([len(part) for part in parts]).tolist()])

        fixed = [ints([getattr(r, name) for r in records]) for name in ("queue_offset",
                 "physical_offset", "size", "born_ts_ms", "store_ts_ms", "flags")]  # fmt: skip
        return cls(
            topic, queue_id, fixed[0], fixed[1], fixed[2], fixed[3], fixed[4], fixed[5],
            b"".join(bodies), offsets(bodies), b"".join(keys), offsets(keys),
            _frozen(np.array(valid, dtype=bool)), b"".join(extras), offsets(extras),
            ints(tags), ints(index_keys),
        )  # fmt: skip


def read_run(
    buffer: Any,
    path: str,
    file_start: int,
    physicals: np.ndarray,
    sizes: np.ndarray,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    verify_checksums: bool = True,
) -> MessageBatch:
    """Read and verify the records of one queue that ConsumeQueue units point at in
    one CommitLog file (``buffer``, mapped from ``path``, starting at physical
    ``file_start``): queue offsets ``first_queue_offset + i``.

    Raises:
        CorruptDataError: the first record that is not exactly its unit's (see
            mqstore.commitlog.columns), naming the file and its position.
        ValueError: ``buffer`` is a closed mapping (retention deleted the file).
    """
    count = len(physicals)
    # One allocation for the int64 columns: read_columns' out, then copies of the
    # units (they are live views). Frozen once filled; the columns are views of it
    # taken after, so they are read-only too (a small read's cost is per numpy call).
    block = np.empty((_RUN_ROWS, count + 1), dtype=np.int64)
    block[_RUN_PHYSICALS, :count] = physicals
    block[_RUN_SIZES, :count] = sizes
    bodies, keys, extras = _read_checked(
        buffer, path, file_start, block[_RUN_PHYSICALS, :count], block[_RUN_SIZES, :count],
        topic, queue_id, first_queue_offset, verify_checksums, block[:OUT_ROWS],
    )  # fmt: skip
    has_key = _frozen(block[OUT_HAS_KEY, :count].astype(np.bool_))  # 0 or 1: as != 0
    block.setflags(write=False)
    columns = block[:, :count]
    queue_offsets = _frozen(_offsets_from(first_queue_offset, count))
    return MessageBatch(
        topic, queue_id, queue_offsets, columns[_RUN_PHYSICALS], columns[_RUN_SIZES],
        columns[OUT_BORN_TS], columns[OUT_STORE_TS], columns[OUT_FLAGS],
        bodies, block[OUT_BODY_OFFSETS], keys, block[OUT_KEY_OFFSETS],
        has_key, extras, block[OUT_EXTRA_OFFSETS],
        columns[OUT_TAG_LEN], columns[OUT_KEYS_LEN],
    )  # fmt: skip


def read_run_timestamps(
    buffer: Any,
    path: str,
    file_start: int,
    physicals: Any,
    sizes: Any,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    *,
    create_time: bool,
) -> list[int]:
    """The born (``create_time``) or store timestamps of the records ``read_run``
    reads, verified as it verifies them (checksums included), without the batch.

    ``physicals`` and ``sizes`` are int64 arrays (numpy or ``array("q")``) the caller
    owns (not live views).

    Raises:
        As ``read_run``.
    """
    out = np.empty((OUT_ROWS, len(physicals) + 1), dtype=np.int64)
    _read_checked(
        buffer, path, file_start, physicals, sizes, topic, queue_id, first_queue_offset, True,
        out,
    )  # fmt: skip
    return out[OUT_BORN_TS if create_time else OUT_STORE_TS, : len(physicals)].tolist()


def _read_checked(
    buffer: Any,
    path: str,
    file_start: int,
    physicals: Any,
    sizes: Any,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    verify_checksums: bool,
    out: np.ndarray,
) -> tuple[bytes, bytes, bytes]:
    """``read_columns`` into ``out`` (int64, OUT_ROWS rows wider than the run); its
    first failure as CorruptDataError."""
    bad, reason, bodies, keys, extras = read_columns(
        buffer, file_start, physicals, sizes, validate_topic(topic), queue_id,
        first_queue_offset, KEY_NAME, verify_checksums, out,
    )  # fmt: skip
    if bad >= 0:
        where = f"{topic}/{queue_id}@{first_queue_offset + bad}"
        message = _REASONS[reason].format(where=where)
        raise CorruptDataError(path, int(physicals[bad]) - file_start, message)
    assert bodies is not None and keys is not None and extras is not None
    return bodies, keys, extras
