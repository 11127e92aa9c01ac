"""Batches for ``CommitLog.append_batch`` and ``append_slices``, checked and encoded
outside the append lock.

``prepare_batch`` and ``prepare_slices`` check a whole batch before anything is
written (nothing is appended if any record is invalid: the typed StoreError names
it) and return a ``PreparedBatch``: the record sizes, and an ``encode`` that the
CommitLog calls under its lock to write, from record ``done`` on, every record that
fits the current file (C when built: ``encode_bodies``, ``encode_run``,
``encode_slices`` in record.py), returning where it stopped so the file can roll.

The argument checks every append shares (queue id, timestamps) are here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import attrs
import numpy as np

from mqstore.commitlog.appender import QUEUE_ID_MAX
from mqstore.commitlog.errors import InvalidArgumentError, InvalidTypeError, LimitExceededError
from mqstore.commitlog.record import (
    FLAG_GROUP_OPEN,
    FLAG_NULL_BODY,
    HEADER_SIZE,
    check_bodies,
    encode_bodies,
    encode_keys,
    encode_properties,
    encode_run,
    encode_slices,
    encode_tag,
    validate_topic,
)

__all__ = [
    "BATCH_MESSAGES_MAX",
    "BYTES_LIKE",
    "Encoded",
    "PreparedBatch",
    "Trailer",
    "check_queue_id",
    "check_timestamp",
    "encode_batch",
    "prepare_batch",
    "prepare_slices",
]

BATCH_MESSAGES_MAX = 1 << 20  # one batch holds the append lock; bound how long
BYTES_LIKE = (bytes, bytearray, memoryview)  # what a body may be (None aside)

#: One record of a batch with keys, properties or per-record tags or timestamps:
#: (size, flags, tag, keys, properties, body, born_ts_ms or None), sections encoded.
Encoded = tuple[int, int, bytes, bytes, bytes, Any, int | None]

#: encode(mapping, in_file, file_size, position, first_queue_offset, store_ts_ms, done,
#: positions) -> the index of the first record not written.
EncodeFn = Callable[[Any, int, int, int, int, int, int, np.ndarray], int]


class PreparedBatch(NamedTuple):
    """A checked batch, ready for the lock (see the module)."""

    sizes: np.ndarray  # int32, one per record
    encode: EncodeFn
    #: What the dispatcher's BatchFeed carries: the per-record tuples (None for a
    #: plain batch), the shared tag, and the born timestamp(s) (None: the store's).
    encoded: list[Encoded] | None
    tag: bytes
    born_ts_ms: np.ndarray | int | None


@attrs.frozen
class Trailer:
    """The record that closes an append group (record.py's FLAG_GROUP_OPEN): given to
    ``CommitLog.append_batch`` or ``append_slices``, it is written right after the
    batch under the same lock hold, and every record of the batch carries the flag,
    so a crash keeps the batch and its trailer together or neither.

    ``record`` is called under the append lock with the batch's first queue offset
    and returns the trailer's (body, properties); it must be quick and not append.
    """

    topic: str
    queue_id: int
    record: Callable[[int], tuple[bytes, Any]]

    def prepare(self, first_queue_offset: int, limit_bytes: int) -> PreparedBatch:
        """The trailer for a batch whose first queue offset is ``first_queue_offset``.

        Raises:
            The errors of ``prepare_batch`` (nothing is written then).
        """
        body, properties = self.record(first_queue_offset)
        return prepare_batch(
            self.topic, self.queue_id, [body], None, None, [properties], None, limit_bytes
        )


def prepare_batch(
    topic: str,
    queue_id: int,
    bodies: Sequence[bytes | bytearray | memoryview | None],
    keys: Sequence[Sequence[str] | str | None] | None,
    tags: Sequence[str | None] | str | None,
    properties: Sequence[Any] | None,
    born_ts_ms: Sequence[int | None] | int | None,
    limit_bytes: int,
    group_open: bool = False,
) -> PreparedBatch:
    """Check and encode ``append_batch``'s arguments; ``group_open``: every record
    carries FLAG_GROUP_OPEN (a trailer follows it: ``CommitLog.append_batch``).

    Raises:
        The errors of ``CommitLog.append``, for the first invalid record.
    """
    topic_bytes = validate_topic(topic)
    check_queue_id(queue_id)
    count = len(bodies)
    if count > BATCH_MESSAGES_MAX:
        raise LimitExceededError(f"a batch holds at most {BATCH_MESSAGES_MAX} messages")
    plain = (
        not group_open
        and keys is None
        and properties is None
        and (tags is None or isinstance(tags, str))
        and (born_ts_ms is None or isinstance(born_ts_ms, int))
        and type(bodies) is list
    )
    if not plain:
        encoded = encode_batch(
            topic_bytes, bodies, keys, tags, properties, born_ts_ms, limit_bytes,
            FLAG_GROUP_OPEN if group_open else 0,
        )  # fmt: skip
        sizes = np.fromiter((item[0] for item in encoded), dtype=np.int32, count=count)

        def encode_encoded(
            mapping: Any, in_file: int, file_size: int, position: int, queue_offset: int,
            store_ts_ms: int, done: int, positions: np.ndarray,
        ) -> int:  # fmt: skip
            return int(encode_run(
                mapping, in_file, file_size, position, queue_offset, store_ts_ms, queue_id,
                topic_bytes, encoded, done, positions,
            ))  # fmt: skip

        return PreparedBatch(sizes, encode_encoded, encoded, b"", None)
    # Bodies only (the common batch): validated and encoded in C, no tuple each.
    plain_bodies = cast("list[Any]", bodies)
    shared_tag = encode_tag(cast("str | None", tags))
    plain_born = cast("int | None", born_ts_ms)
    if plain_born is not None:
        check_timestamp(plain_born)
    sizes = np.empty(count, dtype=np.int32)
    fixed = HEADER_SIZE + len(topic_bytes) + len(shared_tag)
    bad = check_bodies(plain_bodies, fixed, limit_bytes, sizes)
    if bad >= 0:
        body = plain_bodies[bad]
        if body is not None and not isinstance(body, BYTES_LIKE):
            raise InvalidTypeError(f"body must be bytes-like, not {type(body).__name__}")
        raise LimitExceededError(
            f"record {bad} of {fixed + len(body or b'')} bytes exceeds the limit of {limit_bytes}"
        )

    def encode_plain(
        mapping: Any, in_file: int, file_size: int, position: int, queue_offset: int,
        store_ts_ms: int, done: int, positions: np.ndarray,
    ) -> int:  # fmt: skip
        return int(encode_bodies(
            mapping, in_file, file_size, position, queue_offset, store_ts_ms,
            store_ts_ms if plain_born is None else plain_born, queue_id, topic_bytes,
            shared_tag, plain_bodies, done, positions,
        ))  # fmt: skip

    return PreparedBatch(sizes, encode_plain, None, shared_tag, plain_born)


def prepare_slices(
    topic: str,
    queue_id: int,
    offsets: np.ndarray,
    data: Any,
    nulls: np.ndarray | None,
    tag: str | None,
    born_ts_ms: np.ndarray | int | None,
    limit_bytes: int,
    group_open: bool = False,
) -> PreparedBatch:
    """Check ``append_slices``' arguments (bodies as an Arrow binary column);
    ``group_open`` as for ``prepare_batch``.

    Raises:
        The errors of ``prepare_batch``; InvalidArgumentError for offsets that are
        not non-decreasing within ``data``, or arrays of the wrong length.
    """
    topic_bytes = validate_topic(topic)
    check_queue_id(queue_id)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or len(offsets) < 1:
        raise InvalidArgumentError("offsets must be a 1-D array of count + 1 positions")
    count = len(offsets) - 1
    if count > BATCH_MESSAGES_MAX:
        raise LimitExceededError(f"a batch holds at most {BATCH_MESSAGES_MAX} messages")
    data_len = memoryview(data).nbytes
    lengths = np.diff(offsets)
    if count and (offsets[0] < 0 or offsets[-1] > data_len or lengths.min() < 0):
        raise InvalidArgumentError("offsets must increase within the data buffer")
    null_flags: np.ndarray | None = None
    if nulls is not None:
        null_flags = np.ascontiguousarray(nulls, dtype=np.uint8)
        if null_flags.shape != (count,):
            raise InvalidArgumentError(f"nulls has {len(null_flags)} items for {count} bodies")
        lengths = np.where(null_flags != 0, 0, lengths)
    borns: np.ndarray | None = None
    born_all: int | None = None
    if isinstance(born_ts_ms, np.ndarray):
        borns = np.ascontiguousarray(born_ts_ms, dtype=np.int64)
        if borns.shape != (count,):
            raise InvalidArgumentError(f"born_ts_ms has {len(borns)} items for {count} bodies")
        if count and borns.min() < 0:
            raise InvalidArgumentError("born timestamps must be >= 0")
    elif born_ts_ms is not None:
        check_timestamp(born_ts_ms)
        born_all = born_ts_ms
    tag_bytes = encode_tag(tag)
    extra_flags = FLAG_GROUP_OPEN if group_open else 0
    sizes64 = HEADER_SIZE + len(topic_bytes) + len(tag_bytes) + lengths
    if count and sizes64.max() > limit_bytes:
        bad = int(np.argmax(sizes64 > limit_bytes))
        raise LimitExceededError(
            f"record {bad} of {int(sizes64[bad])} bytes exceeds the limit of {limit_bytes}"
        )

    def encode(
        mapping: Any, in_file: int, file_size: int, position: int, queue_offset: int,
        store_ts_ms: int, done: int, positions: np.ndarray,
    ) -> int:  # fmt: skip
        return int(encode_slices(
            mapping, in_file, file_size, position, queue_offset, store_ts_ms,
            store_ts_ms if born_all is None else born_all, queue_id, topic_bytes,
            tag_bytes, offsets, data, null_flags, borns, done, positions, extra_flags,
        ))  # fmt: skip

    born = borns if borns is not None else born_all
    return PreparedBatch(sizes64.astype(np.int32), encode, None, tag_bytes, born)


def encode_batch(
    topic_bytes: bytes,
    bodies: Sequence[Any],
    keys: Sequence[Any] | None,
    tags: Sequence[str | None] | str | None,
    properties: Sequence[Any] | None,
    born_ts_ms: Sequence[int | None] | int | None,
    limit_bytes: int,
    extra_flags: int = 0,
) -> list[Encoded]:
    """Validate and encode every per-record section of a batch; ``extra_flags`` is
    set on every record."""
    count = len(bodies)
    for name, items in (("keys", keys), ("properties", properties)):
        if items is not None and len(items) != count:
            raise InvalidArgumentError(f"{name} has {len(items)} items for {count} bodies")
    shared_tag = encode_tag(tags) if tags is None or isinstance(tags, str) else None
    if shared_tag is None and len(tags) != count:  # type: ignore[arg-type]
        raise InvalidArgumentError(f"tags has {len(tags)} items for {count} bodies")  # type: ignore[arg-type]
    shared_born = born_ts_ms if born_ts_ms is None or isinstance(born_ts_ms, int) else None
    if isinstance(born_ts_ms, int):
        check_timestamp(born_ts_ms)
    elif born_ts_ms is not None and len(born_ts_ms) != count:
        raise InvalidArgumentError(f"born_ts_ms has {len(born_ts_ms)} items for {count} bodies")
    fixed = HEADER_SIZE + len(topic_bytes)
    encoded: list[Encoded] = []
    for index, body in enumerate(bodies):
        flags = extra_flags
        if type(body) is not bytes:
            if body is None:
                flags, body = FLAG_NULL_BODY | extra_flags, b""
            elif not isinstance(body, BYTES_LIKE):
                raise InvalidTypeError(f"body must be bytes-like, not {type(body).__name__}")
        tag_b = shared_tag if shared_tag is not None else encode_tag(tags[index])  # type: ignore[index]
        keys_b = encode_keys(keys[index]) if keys is not None else b""
        props_b = encode_properties(properties[index]) if properties is not None else b""
        born = shared_born
        if born_ts_ms is not None and shared_born is None:
            born = born_ts_ms[index]  # type: ignore[index]
            if born is not None:  # None: the store timestamp, as for one append
                check_timestamp(born)
        size = fixed + len(tag_b) + len(keys_b) + len(props_b) + len(body)
        if size > limit_bytes:
            raise LimitExceededError(
                f"record {index} of {size} bytes exceeds the limit of {limit_bytes}"
            )
        encoded.append((size, flags, tag_b, keys_b, props_b, body, born))
    return encoded


def check_queue_id(queue_id: object) -> None:
    """Raises InvalidTypeError (not an int, or a bool) or InvalidArgumentError."""
    if isinstance(queue_id, bool) or not isinstance(queue_id, int):
        raise InvalidTypeError(f"queue_id must be an int, not {type(queue_id).__name__}")
    if not 0 <= queue_id <= QUEUE_ID_MAX:
        raise InvalidArgumentError(f"queue_id {queue_id} is outside [0, {QUEUE_ID_MAX}]")


def check_timestamp(timestamp_ms: object) -> None:
    """Raises InvalidTypeError (not an int ms) or InvalidArgumentError."""
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
        raise InvalidTypeError(f"timestamps must be int ms, not {type(timestamp_ms).__name__}")
    if not 0 <= timestamp_ms < 2**63:
        raise InvalidArgumentError(f"timestamp {timestamp_ms} ms is outside [0, 2**63)")
