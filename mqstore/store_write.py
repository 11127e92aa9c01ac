"""MessageStore's write path (a mixin of mqstore/store.py's MessageStore, as
mqstore/reader.py's StoreReader is of its reads): ``put`` (in one C call where it can:
mqstore/_put.c), the batch puts, backpressure on dispatch, and the checks a write
makes before it appends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from types import MethodType
from typing import TYPE_CHECKING, Any

import numpy as np

from mqstore.commitlog.batch import Trailer
from mqstore.commitlog.commitlog import BatchAppendResult, CommitLog
from mqstore.commitlog.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    NotLeaderError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreError,
)
from mqstore.commitlog.native import NATIVE
from mqstore.commitlog.record import validate_topic
from mqstore.compaction import check_compaction_keys
from mqstore.internal_log import INTERNAL_TOPICS
from mqstore.message import PutResult
from mqstore.topics import TopicRegistry

if TYPE_CHECKING:
    from mqstore.dispatch.dispatcher import Dispatcher
    from mqstore.topics import TopicConfig

__all__ = ["DISPATCH_BACKLOG_MAX_BYTES", "QUEUE_ID_MAX", "StoreWriter", "check_queue_id"]

log = logging.getLogger(__name__)

_new_put_result = partial(tuple.__new__, PutResult)  # a NamedTuple without its __new__

QUEUE_ID_MAX = 2**31 - 1
# Dispatch shares the GIL with producers; past this backlog a put dispatches what is
# waiting before it returns, so a producer at full speed cannot outrun the
# ConsumeQueues and readers never fall far behind (caller-runs backpressure).
DISPATCH_BACKLOG_MAX_BYTES = 256 << 10  # about 1,500 100-byte messages


class StoreWriter:
    """The writes of MessageStore (see the module)."""

    # MessageStore's, set in its __init__ and _open.
    read_only: bool
    commitlog: CommitLog
    topics: TopicRegistry
    _closed: bool
    _dispatcher: Dispatcher | None
    _put_topics: dict[str, int]
    _help_dispatch_past: int
    _putter: Any
    _append: Callable[..., PutResult]
    _replicated_wait: Callable[[int], None] | None

    if TYPE_CHECKING:  # CommitLogEngine's (after this class in MessageStore's bases)

        def _create_queue(self, name: str, queue_id: int) -> TopicConfig: ...

    def put(
        self,
        topic: str,
        queue_id: int,
        body: bytes | bytearray | memoryview | None,
        *,
        keys: Sequence[str] | str = (),
        tag: str | None = None,
        properties: Any = None,
        born_timestamp_ms: int | None = None,
    ) -> PutResult:
        """Append one message to (topic, queue_id).

        Returns:
            Its physical offset, queue offset and store timestamp.

        Raises:
            InvalidTypeError, InvalidArgumentError, LimitExceededError: bad input.
            UnknownTopicError: ``queue_id`` is not a partition of ``topic`` and
                ``auto_create_topics`` is off (on, the topic is created or grown).
            DiskFullError: no room, or writes rejected above the disk watermark.
            FlushTimeoutError: sync flush mode and the bytes were not durable in time.
        """
        try:  # one dict look-up for a topic already written through this store
            ready = (
                type(queue_id) is int  # not bool, numpy ints...
                and 0 <= queue_id < self._put_topics.get(topic, 0)
                and not self._dispatcher.failure  # type: ignore[union-attr]
            )
        except TypeError:  # an unhashable topic: the checks below say what is wrong
            ready = False
        try:
            if not ready:
                self._check_put(topic, queue_id)
                if self._compacted_topic(topic):  # never on the fast path
                    check_compaction_keys(topic, (keys,), (properties,), 1)
            result = self._append(
                topic, queue_id, body, keys=keys, tag=tag, properties=properties,
                born_ts_ms=born_timestamp_ms,
            )  # fmt: skip
        except BaseException:
            self._keep_growth()
            raise
        if result[0] > self._help_dispatch_past:
            self._help_dispatch_if_behind(result[0])
        if self._replicated_wait is not None and topic not in INTERNAL_TOPICS:
            self._replicated_wait(self.commitlog.write_position)  # mqstore.store_replica
        return result

    def _install_put(self) -> None:
        """``put`` in one C call (mqstore/_put.c's Putter, an instance attribute that
        shadows the method) for an async-flush store of this class built with the C
        module; the method above is its slow path and its pure-Python twin. Sync
        flush keeps the method: its wait for the sync is the put's cost."""
        appender = self.commitlog._appender
        if NATIVE is None or not isinstance(appender, NATIVE.Appender):
            return
        if type(self).put is not StoreWriter.put:  # a subclass's put stays in charge
            return
        self._putter = NATIVE.Putter(
            appender, self._put_topics, self._dispatcher,
            MethodType(StoreWriter.put, self), self._help_dispatch_if_behind,
        )  # fmt: skip
        self._putter.help_past = self._help_dispatch_past
        self._put_path_changed()
        self.put = self._putter.put  # type: ignore[method-assign]

    def _put_path_changed(self) -> None:
        """The Putter's fast path only while a put needs nothing it leaves out: no
        replicated wait (set_replicated_wait), an open store."""
        putter = self._putter
        if putter is not None:
            putter.enabled = self._replicated_wait is None and not self._closed

    def _uninstall_put(self) -> None:
        """Back to the method (closing: also breaks the Putter's cycle to the store)."""
        putter = self._putter
        if putter is not None:
            putter.enabled = False
            if self.__dict__.get("put") == putter.put:  # not a wrapper set since
                del self.__dict__["put"]
            self._putter = None

    def _check_put(self, topic: str, queue_id: int) -> None:
        """put's checks, for a queue not below its topic's count in ``_put_topics``: the
        store is writable and the queue is a partition of its topic (created or grown
        if allowed); then ``_put_topics`` holds the topic's partition count. Partitions
        never shrink and topics are never deleted, so every queue below that count
        stays valid once one is checked; closing empties the table.

        Raises:
            The errors of ``_check_writable`` and ``_check_queue_for_write``.
        """
        self._check_writable()
        self._check_queue_for_write(topic, queue_id)
        config = self.topics.get(topic)
        # A compacted topic's puts check their keys: never on the fast path.
        if type(queue_id) is int and not self._closed and config and not config.compacted:
            self._put_topics[topic] = config.partitions

    def _help_dispatch_if_behind(self, position: int) -> None:
        """Backpressure (``_help_dispatch``) when the record at ``position`` is more
        than DISPATCH_BACKLOG_MAX_BYTES past the dispatched position. The dispatched
        position only grows, so ``_help_dispatch_past`` (computed from it) lets put
        skip this call until a record lands past it."""
        dispatcher = self._dispatcher
        if dispatcher is None:
            return
        if position - dispatcher.position > DISPATCH_BACKLOG_MAX_BYTES:
            _help_dispatch(dispatcher)
        past = self._help_dispatch_past = dispatcher.position + DISPATCH_BACKLOG_MAX_BYTES
        putter = self._putter  # read once: a close in another thread may drop it
        if putter is not None:
            putter.help_past = past

    def put_batch(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes | bytearray | memoryview | None],
        *,
        keys: Sequence[Sequence[str] | str | None] | None = None,
        tags: Sequence[str | None] | str | None = None,
        properties: Sequence[Any] | None = None,
        born_timestamp_ms: Sequence[int | None] | int | None = None,
        trailer: Trailer | None = None,
    ) -> list[PutResult]:
        """Append many messages to one queue under one lock and one flush.

        ``keys``/``properties`` (and ``tags``/``born_timestamp_ms`` when sequences)
        hold one item per body. Nothing is appended if any message is invalid.
        ``trailer``: a record appended right after, as one append group with the
        batch (mqstore.commitlog.batch.Trailer; its topic must exist).
        """
        result = self.put_batch_arrays(
            topic, queue_id, bodies, keys=keys, tags=tags, properties=properties,
            born_timestamp_ms=born_timestamp_ms, trailer=trailer,
        )  # fmt: skip
        first, stamp = result.first_queue_offset, result.store_timestamp_ms
        count = len(result.sizes)
        # C-level loops (map, zip, tuple.__new__): no Python frame per result.
        return list(
            map(
                _new_put_result,
                zip(
                    result.physical_offsets.tolist(),
                    range(first, first + count),
                    repeat(stamp, count),
                    result.sizes.tolist(),
                    strict=True,
                ),
            )
        )

    def put_batch_arrays(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes | bytearray | memoryview | None],
        *,
        keys: Sequence[Sequence[str] | str | None] | None = None,
        tags: Sequence[str | None] | str | None = None,
        properties: Sequence[Any] | None = None,
        born_timestamp_ms: Sequence[int | None] | int | None = None,
        trailer: Trailer | None = None,
    ) -> BatchAppendResult:
        """``put_batch`` that reports where the batch landed as arrays, not one
        PutResult per message: message i is at ``physical_offsets[i]`` with queue
        offset ``first_queue_offset + i``. For producers of millions of messages a
        second (a list of bodies, no keys or properties, is encoded in C).
        """
        self._check_writable()
        try:
            self._check_queue_for_write(topic, queue_id)
            if self._compacted_topic(topic):
                check_compaction_keys(topic, keys, properties, len(bodies))
            result = self.commitlog.append_batch(
                topic, queue_id, bodies, keys=keys, tags=tags, properties=properties,
                born_ts_ms=born_timestamp_ms, trailer=trailer,
            )  # fmt: skip
        except BaseException:
            self._keep_growth()
            raise
        self._after_batch()
        return result

    def put_batch_buffers(
        self,
        topic: str,
        queue_id: int,
        offsets: np.ndarray,
        data: Any,
        *,
        nulls: np.ndarray | None = None,
        tag: str | None = None,
        born_timestamp_ms: np.ndarray | int | None = None,
        trailer: Trailer | None = None,
    ) -> BatchAppendResult:
        """``put_batch_arrays`` for bodies laid out as an Arrow binary column: body i is
        ``data[offsets[i]:offsets[i + 1]]`` (None where ``nulls[i]``), with one tag and
        a born timestamp for all or one per message (int64 array). No Python object is
        made per message: what the Spark sink uses for its value column.

        Raises:
            InvalidArgumentError: offsets not non-decreasing inside ``data``, or arrays
                of the wrong length; and the errors of ``put_batch``.
        """
        self._check_writable()
        try:
            self._check_queue_for_write(topic, queue_id)
            if self._compacted_topic(topic):
                check_compaction_keys(topic, None, None, len(offsets) - 1)
            result = self.commitlog.append_slices(
                topic, queue_id, offsets, data, nulls=nulls, tag=tag,
                born_ts_ms=born_timestamp_ms, trailer=trailer,
            )  # fmt: skip
        except BaseException:
            self._keep_growth()
            raise
        self._after_batch()
        return result

    def _after_batch(self) -> None:
        dispatcher = self._dispatcher
        if (
            dispatcher is not None
            and self.commitlog.write_position - dispatcher.position > DISPATCH_BACKLOG_MAX_BYTES
        ):
            _help_dispatch(dispatcher)
        if self._replicated_wait is not None and not self.commitlog.is_follower:
            self._replicated_wait(self.commitlog.write_position)

    def _check_queue_for_write(self, topic: str, queue_id: int) -> None:
        """Make (topic, queue_id) a partition of its topic if it is not one, when
        ``auto_create_topics`` allows (see CommitLogEngine).

        Raises:
            UnknownTopicError: not a partition, and auto-creation is off.
            InvalidArgumentError, InvalidTypeError: a bad topic name or queue id.
        """
        validate_topic(topic)
        check_queue_id(queue_id)
        config = self.topics.get(topic)
        if config is None or queue_id >= config.partitions:
            self._create_queue(topic, int(queue_id))

    def _keep_growth(self) -> None:
        """A write failed after its checks may have grown its topic (TopicRegistry.grow)
        and no record will make the dispatcher write the registry: write it now, as
        the growth was written before it moved to memory (partitions never shrink,
        not even after a crash). A failure here is logged; the write's error stands."""
        self.topics.try_persist_pending()  # nothing pending: two attribute reads

    def _compacted_topic(self, topic: str) -> bool:
        config = self.topics.get(topic)
        return config is not None and config.compacted

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")
        if self.read_only:
            raise ReadOnlyStoreError("the store is open read-only")
        if self.commitlog.is_follower:
            raise NotLeaderError("the store is a follower: write to its leader")
        if self._dispatcher is not None:
            self._dispatcher.check_failed()  # appends nobody could read: refuse them


def _help_dispatch(dispatcher: Dispatcher) -> None:
    """Backpressure: the producer dispatches the backlog before its put returns. The
    put's records are already in the log, so a failure here (a full disk for a new
    ConsumeQueue file...) must not fail the put: the dispatcher retries on its own, and
    a dispatcher that failed for good refuses the next write (``_check_writable``)."""
    try:
        dispatcher.dispatch_available()
    except StoreError as error:
        log.warning("dispatch while putting failed (the dispatcher retries): %s", error)


def check_queue_id(queue_id: object) -> None:
    if isinstance(queue_id, bool) or not isinstance(queue_id, int | np.integer):
        raise InvalidTypeError(f"queue_id must be an int, not {type(queue_id).__name__}")
    if not 0 <= int(queue_id) <= QUEUE_ID_MAX:
        raise InvalidArgumentError(f"queue_id {queue_id} is outside [0, {QUEUE_ID_MAX}]")
