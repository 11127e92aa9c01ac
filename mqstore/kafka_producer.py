"""The Kafka-style producer over any engine (mqstore.engine), with kafka-python's names.

    producer = KafkaProducer(store, value_serializer=str.encode, linger_ms=5)
    producer.send("orders", "created", key=b"order-1").add_callback(print)
    producer.flush()

With ``linger_ms=0`` (the default) ``send`` appends at once and returns a resolved
future. With ``linger_ms`` > 0 records wait in one batch per partition and a batch
is appended with one ``append_records`` call when it reaches ``batch_size`` bytes,
at the linger thread's next tick, or at ``flush()``/``close()``.

Invariants of linger mode:
- Order per partition: a batch is popped and appended under one drain lock, so two
  drainers (the linger thread, a sender whose batch filled, ``flush``) never append a
  partition's later batch before its earlier one. Records enter a batch under the
  producer's lock, in the order senders took it.
- Memory: the serialized bytes (key, value, headers) of records sent and not yet
  appended never exceed ``buffer_memory``; a ``send`` that would exceed it wakes the
  linger thread and blocks up to ``max_block_ms``, then raises KafkaTimeoutError.
- Close: ``send`` checks ``closed`` under the same lock that adds to a batch, and
  ``close`` sets it under that lock before its last drain, so a send racing close is
  either appended and resolved by that drain or refused with StoreClosedError.
  ``close(timeout)`` fails what it could not append in time (force close), so no
  future is left unresolved.

Crash policy: buffered records live in memory only. A process that dies before a
batch is appended loses that batch, as a Kafka client does; a future resolves only
after ``append_records`` returned, so a resolved future is in the store.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from mqstore.commitlog.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidTypeError,
    KafkaTimeoutError,
    LimitExceededError,
    StoreClosedError,
    UnknownTopicError,
)
from mqstore.engine import Engine, ProducerRecord

__all__ = [
    "FutureRecordMetadata",
    "KafkaProducer",
    "KafkaTimeoutError",
    "RecordMetadata",
    "TopicPartition",
    "default_partitioner",
    "murmur2",
]

log = logging.getLogger(__name__)

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (per send)


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    topic_partition: TopicPartition
    offset: int
    timestamp: int
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's ``Utils.murmur2``), as a signed int32, so
    that a key lands on the same partition as with Kafka's default partitioner."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    tail = length & ~3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def default_partitioner(key: bytes, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """Kafka's: murmur2(key) made positive, modulo the partition count."""
    return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]


class FutureRecordMetadata:
    """The result of ``send``: resolved at once (linger_ms=0) or when its batch is
    appended (or fails).

    The Event a waiter blocks on is made only when someone waits on an unresolved
    future, so the common linger_ms=0 send pays for no lock. A callback that raises
    is logged, as kafka-python does, so it cannot stop the batch's other futures
    from resolving."""

    __slots__ = ("_callbacks", "_done", "_event", "exception", "value")

    def __init__(self) -> None:
        self._done = False
        self._event: threading.Event | None = None
        self.value: RecordMetadata | None = None
        self.exception: BaseException | None = None
        self._callbacks: list[tuple[Callable[..., Any], bool]] | None = None

    def _resolve(self, value: RecordMetadata | None, error: BaseException | None) -> None:
        assert not self._done, "a future resolves once"
        self.value, self.exception = value, error
        self._done = True
        event = self._event
        if event is not None:
            event.set()
        for callback, on_error in self._callbacks or ():
            self._run(callback, on_error)

    def _run(self, callback: Callable[..., Any], on_error: bool) -> None:
        try:
            if on_error and self.exception is not None:
                callback(self.exception)
            elif not on_error and self.exception is None:
                callback(self.value)
        except Exception:  # a user's callback: logged, never raised into the drain
            log.exception("error in a send callback %r", callback)

    @property
    def is_done(self) -> bool:
        return self._done

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata.

        Raises:
            KafkaTimeoutError: not resolved within ``timeout`` seconds.
            StoreError: the send's own error (the store refused the batch, or the
                producer was force-closed before appending it).
        """
        if not self._done:
            if self._event is None:
                self._event = threading.Event()
                if self._done:  # resolved between the two checks
                    self._event.set()
            if not self._event.wait(timeout):
                raise KafkaTimeoutError(f"the record was not sent within {timeout} s")
        if self.exception is not None:
            raise self.exception
        assert self.value is not None
        return self.value

    def add_callback(self, callback: Callable[[RecordMetadata], Any]) -> FutureRecordMetadata:
        self._callbacks = [*(self._callbacks or ()), (callback, False)]
        if self.is_done:
            self._run(callback, False)
        return self

    def add_errback(self, errback: Callable[[BaseException], Any]) -> FutureRecordMetadata:
        self._callbacks = [*(self._callbacks or ()), (errback, True)]
        if self.is_done:
            self._run(errback, True)
        return self


#: kafka-python settings that concern brokers, the network or security: accepted (so
#: code written for kafka-python runs unchanged) and ignored, as there is no broker.
#: Shared by the producer and the consumer (mqstore.kafka).
IGNORED_CONFIGS = frozenset(
    [
        "bootstrap_servers",
        "client_id",
        "group_instance_id",
        "enable_incremental_fetch_sessions",
        "fetch_min_bytes",
        "fetch_max_bytes",
        "max_partition_fetch_bytes",
        "request_timeout_ms",
        "retry_backoff_ms",
        "max_in_flight_requests_per_connection",
        "check_crcs",
        "isolation_level",
        "allow_auto_create_topics",
        "metadata_max_age_ms",
        "partition_assignment_strategy",
        "max_poll_interval_ms",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "receive_buffer_bytes",
        "send_buffer_bytes",
        "socket_options",
        "security_protocol",
        "api_version",
        "api_version_auto_timeout_ms",
        "connections_max_idle_ms",
        "selector",
        "exclude_internal_topics",
        "default_offset_commit_callback",
        "enable_idempotence",
        "transactional_id",
        "transaction_timeout_ms",
        "delivery_timeout_ms",
        "bootstrap_topics_filter",
        "compression_type",
        "retries",
        "max_request_size",
        "kafka_client",
    ]
)
IGNORED_PREFIXES = ("ssl_", "sasl_", "metric", "reconnect_", "sock_")


def check_configs(configs: dict[str, Any], known: dict[str, Any], kind: str) -> None:
    """Refuse config names that are neither ``known`` nor an ignored kafka-python one."""
    unknown = {
        name for name in configs
        if name not in known and name not in IGNORED_CONFIGS
        and not name.startswith(IGNORED_PREFIXES)
    }  # fmt: skip
    if unknown:
        raise InvalidArgumentError(f"unrecognized {kind} configs: {sorted(unknown)}")


_PRODUCER_DEFAULTS: dict[str, Any] = {
    "key_serializer": None,
    "value_serializer": None,
    "partitioner": default_partitioner,
    "linger_ms": 0,
    "batch_size": 16384,
    # kafka-python's default (32 MiB): bytes of records sent and not yet appended.
    "buffer_memory": 32 * 1024 * 1024,
    # kafka-python's default: how long send blocks while buffer_memory is full.
    "max_block_ms": 60_000,
    "acks": 1,
    "client_id": "mqstore-producer",
}

#: The longest wait a timeout may ask for (threading's own limit).
_TIMEOUT_MAX_S = threading.TIMEOUT_MAX


def _check_int(config: dict[str, Any], name: str, minimum: int) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}: {value!r}")
    return value


def _check_timeout(timeout: float | None) -> float:
    """A caller's timeout in seconds as ``Lock.acquire`` takes it (-1: no limit)."""
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidTypeError(f"timeout must be a number of seconds: {timeout!r}")
    if not 0 <= timeout <= _TIMEOUT_MAX_S:  # kafka-python's check
        raise InvalidArgumentError(f"invalid timeout: {timeout}")
    return float(timeout)


#: Records in send order, each with the future its append resolves.
_Items = list[tuple[ProducerRecord, FutureRecordMetadata]]


class _Batch:
    """The records waiting for one partition, in send order, and their bytes."""

    __slots__ = ("items", "size_bytes")

    def __init__(self) -> None:
        self.items: _Items = []
        self.size_bytes = 0


class KafkaProducer:
    """Sends records to an engine; ``linger_ms`` > 0 batches them per partition.

    Configs beyond the serializers and partitioner (kafka-python's names, defaults):
        linger_ms (0): how long records wait for more; 0 appends in ``send``.
        batch_size (16384): bytes at which a partition's batch is appended at once.
        buffer_memory (32 MiB): bytes of records sent and not yet appended. An
            approximation, as in kafka-python: serialized keys, values and headers.
        max_block_ms (60000): how long ``send`` waits for buffer_memory to free.

    See the module docstring for the order, memory and close invariants.
    """

    def __init__(self, store: Engine, **configs: Any) -> None:
        check_configs(configs, _PRODUCER_DEFAULTS, "producer")
        if not isinstance(store, Engine):
            raise InvalidTypeError("store must be an open MessageStore or SegmentedStore")
        self.config = {**_PRODUCER_DEFAULTS, **configs}
        linger_ms = self.config["linger_ms"]
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, int | float) or linger_ms < 0:
            raise ConfigError(f"linger_ms must be a number >= 0: {linger_ms!r}")
        self._batch_size_bytes = _check_int(self.config, "batch_size", 1)
        self._buffer_memory_bytes = _check_int(self.config, "buffer_memory", 1)
        self._max_block_s = _check_int(self.config, "max_block_ms", 0) / 1000
        self._store = store
        self._lock = threading.Lock()  # guards the batches, the byte count and closed
        self._space = threading.Condition(self._lock)  # bytes freed, or closed
        self._batches: dict[TopicPartition, _Batch] = {}
        self._buffered_bytes = 0  # in _batches and in batches being appended
        # Held from popping batches to appending them: what keeps a partition's order.
        self._drain_lock = threading.Lock()
        self._drain_owner: int | None = None  # the thread holding _drain_lock
        self._drain_again = False  # flush/close from a callback: drain once more
        self._round_robin: dict[str, Iterator[int]] = {}
        self._closed = False
        self._linger_s = linger_ms / 1000
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()
        self._metrics_lock = threading.Lock()  # the counters metrics() reports
        self._records_sent = 0  # appended
        self._record_errors = 0  # refused by the store
        if self._linger_s > 0:
            self._flusher = threading.Thread(
                target=self._linger_loop, name="mqstore-producer-linger", daemon=True
            )
            self._flusher.start()

    def partitions_for(self, topic: str) -> set[int]:
        return set(range(self._store.describe_topic(topic).partitions))

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Send one record; returns a future whose ``get()`` gives RecordMetadata.

        Raises:
            StoreClosedError: the producer is closed (also when it closes while this
                send waits for buffer memory).
            KafkaTimeoutError: buffer_memory stayed full for max_block_ms.
            LimitExceededError: the record alone is larger than buffer_memory.
            UnknownTopicError: no such topic or partition.
            InvalidArgumentError, InvalidTypeError: bad key, value, headers or timestamp.
        """
        if self._closed:
            raise StoreClosedError("the producer is closed")
        if value is None and key is None:
            raise InvalidArgumentError("need at least one of key and value")
        key_bytes = self._serialize("key_serializer", topic, key)
        value_bytes = self._serialize("value_serializer", topic, value)
        if timestamp_ms is not None and (
            isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0
        ):
            raise InvalidArgumentError(f"timestamp_ms must be a non-negative int: {timestamp_ms!r}")
        header_list = _check_headers(headers)
        chosen = self._choose_partition(topic, key_bytes, partition)
        record = _new_tuple(ProducerRecord, (key_bytes, value_bytes, header_list, timestamp_ms))
        future = FutureRecordMetadata()
        tp = _new_tuple(TopicPartition, (topic, chosen))
        if self._linger_s <= 0:
            self._append(tp, [(record, future)])
            if future.exception is not None:
                raise future.exception
            return future
        size_bytes = len(key_bytes or b"") + len(value_bytes or b"")
        if header_list:
            size_bytes += sum(len(name.encode()) + len(v) for name, v in header_list)
        if size_bytes > self._buffer_memory_bytes:
            raise LimitExceededError(
                f"the record is {size_bytes} bytes serialized, more than buffer_memory "
                f"({self._buffer_memory_bytes})"
            )
        with self._lock:
            if self._closed or self._buffered_bytes + size_bytes > self._buffer_memory_bytes:
                self._reserve(size_bytes)  # raises, or waits for room
            else:
                self._buffered_bytes += size_bytes
            batch = self._batches.get(tp)
            if batch is None:
                batch = self._batches[tp] = _Batch()
            batch.items.append((record, future))
            batch.size_bytes += size_bytes
            full = batch.size_bytes >= self._batch_size_bytes
        if full:
            self._drain([tp])
        return future

    def _reserve(self, size_bytes: int) -> None:
        """Count ``size_bytes`` as buffered, waiting up to max_block_ms for room.

        Called with ``_lock`` held; ``_space.wait`` releases it while waiting."""
        if self._closed:
            raise StoreClosedError("the producer is closed")
        limit_bytes = self._buffer_memory_bytes
        assert size_bytes <= limit_bytes
        if self._buffered_bytes + size_bytes > limit_bytes:
            deadline = time.monotonic() + self._max_block_s
            self._wake.set()  # the linger thread appends (and frees) what is buffered
            while self._buffered_bytes + size_bytes > limit_bytes:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise KafkaTimeoutError(
                        "Failed to allocate memory within the configured max blocking "
                        f"time {self.config['max_block_ms']} ms (buffer_memory {limit_bytes})"
                    )
                self._space.wait(remaining_s)
                if self._closed:
                    raise StoreClosedError("the producer closed while send waited for memory")
        self._buffered_bytes += size_bytes

    def send_batch(
        self, topic: str, partition: int, values: Sequence[Any], keys: Sequence[Any] | None = None
    ) -> list[RecordMetadata]:
        """Append many values to one partition in one ``put_batch`` (no linger).

        In linger mode the partition's buffered records are appended first, so the
        batch lands after every earlier ``send`` to that partition.

        Raises:
            StoreClosedError: the producer is closed.
        """
        if self._closed:
            raise StoreClosedError("the producer is closed")
        if keys is not None and len(keys) != len(values):
            raise InvalidArgumentError("keys and values differ in length")
        records = [
            ProducerRecord(
                self._serialize("key_serializer", topic, None if keys is None else keys[i]),
                self._serialize("value_serializer", topic, value),
                [],
                None,
            )
            for i, value in enumerate(values)
        ]
        tp = TopicPartition(topic, self._choose_partition(topic, None, partition))
        items = [(record, FutureRecordMetadata()) for record in records]
        if self._linger_s <= 0 or self._drain_owner == threading.get_ident():
            self._append(tp, items)  # nothing buffered, or called from a send callback
        else:
            self._drain([tp], then=(tp, items))
        return [future.get() for _, future in items]

    def _serialize(self, name: str, topic: str, value: Any) -> bytes | None:
        serializer = self.config[name]
        if serializer is not None and value is not None:
            value = serializer(value)
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidTypeError(
                f"{name.split('_')[0]} must be bytes (or set {name}), not {type(value).__name__}"
            )
        return None if value is None else bytes(value)

    def _choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        # An unknown topic is created here when the store auto-creates topics (Kafka's
        # broker does so on the producer's metadata request), else UnknownTopicError.
        count = self._store.topic_for_write(topic).partitions
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise InvalidTypeError("partition must be an int")
            if not 0 <= partition < count:
                raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
            return partition
        all_partitions = list(range(count))
        if key is not None:
            return int(self.config["partitioner"](key, all_partitions, all_partitions))
        cycle = self._round_robin.get(topic)
        if cycle is None:
            cycle = self._round_robin[topic] = itertools.cycle(range(1 << 30))
        return next(cycle) % count

    def _append(self, tp: TopicPartition, items: _Items) -> None:
        try:
            records = [items[0][0]] if len(items) == 1 else [r for r, _ in items]
            appended = self._store.append_records(tp.topic, tp.partition, records)
        except Exception as error:  # every future of the batch carries the error
            with self._metrics_lock:
                self._record_errors += len(items)
            for _, future in items:
                future._resolve(None, error)
            return
        assert len(appended) == len(items)
        with self._metrics_lock:
            self._records_sent += len(items)
        topic, partition = tp
        for (_, future), result in zip(items, appended, strict=True):
            offset, timestamp_ms, key_size, value_size, header_size = result
            future._resolve(
                _new_tuple(RecordMetadata, (topic, partition, tp, offset, timestamp_ms, None,
                                            key_size, value_size, header_size)),
                None,
            )  # fmt: skip

    # ------------------------------------------------------------------ draining

    def _drain(
        self,
        tps: Iterable[TopicPartition] | None = None,
        timeout_s: float = -1,
        then: tuple[TopicPartition, _Items] | None = None,
    ) -> bool:
        """Append the buffered batches of ``tps`` (default: all), then the unbuffered
        records ``then`` (send_batch's); False when the drain lock was not had in time.

        A callback of a batch being appended runs in the draining thread: asking it
        to drain again re-entrantly could append a partition's newer batch before the
        older one it holds, so the running drain is told to go round once more."""
        if self._drain_owner == threading.get_ident():
            assert then is None, "send_batch appends directly from a callback"
            self._drain_again = True
            return True
        if not self._drain_lock.acquire(timeout=timeout_s):
            return False
        self._drain_owner = threading.get_ident()
        try:
            self._drain_locked(tps)
            if then is not None:
                self._append(*then)
            while self._drain_again:
                self._drain_again = False
                self._drain_locked(None)
        finally:
            self._drain_owner = None
            self._drain_lock.release()
        return True

    def _drain_locked(self, tps: Iterable[TopicPartition] | None) -> None:
        assert self._drain_owner == threading.get_ident()
        with self._lock:
            chosen = (
                list(self._batches) if tps is None else [tp for tp in tps if tp in self._batches]
            )
            popped = [(tp, self._batches.pop(tp)) for tp in chosen]
        for tp, batch in popped:
            try:
                self._append(tp, batch.items)
            finally:
                self._release(batch.size_bytes)

    def _release(self, size_bytes: int) -> None:
        with self._lock:
            self._buffered_bytes -= size_bytes
            assert self._buffered_bytes >= 0
            self._space.notify_all()

    def _linger_loop(self) -> None:
        while True:
            self._wake.wait(self._linger_s)
            self._wake.clear()
            if self._closed:  # close() does the last drain itself, within its timeout
                return
            self._drain()

    def _abort_buffered(self, error: BaseException) -> None:
        """Fail every batch still buffered (force close)."""
        with self._lock:
            batches = list(self._batches.values())
            self._batches.clear()
        for batch in batches:
            for _, future in batch.items:
                future._resolve(None, error)
            self._release(batch.size_bytes)

    def flush(self, timeout: float | None = None) -> None:
        """Append every record sent before this call; on return their futures are done.

        ``timeout`` (seconds) bounds the wait for a drain already running in another
        thread; an append once started runs to its end. From a send callback, flush
        cannot wait on the drain it runs in: the records are appended right after.

        Raises:
            KafkaTimeoutError: another drain still ran after ``timeout``; the records
                stay buffered and are appended later.
        """
        if not self._drain(None, _check_timeout(timeout)):
            raise KafkaTimeoutError(f"Timeout waiting for the flush ({timeout} s)")

    def close(self, timeout: float | None = None) -> None:
        """Refuse further sends, append what is buffered, stop the linger thread.

        With ``timeout`` (seconds), what could not be appended in time is failed with
        StoreClosedError (kafka-python's force close), so no future stays pending.
        From a send callback close does not wait; the running drain appends the rest.

        Raises:
            InvalidArgumentError: a negative timeout.
        """
        timeout_s = _check_timeout(timeout)
        deadline = None if timeout_s < 0 else time.monotonic() + timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._space.notify_all()  # senders waiting for memory raise StoreClosedError
        self._wake.set()
        if self._drain_owner == threading.get_ident():
            self._drain_again = True  # the drain this callback runs in appends the rest
            return
        if not self._drain(None, timeout_s):
            log.info("closing the producer: forcing close, pending records were not appended")
            self._abort_buffered(StoreClosedError("the producer was closed before the append"))
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(None if deadline is None else max(deadline - time.monotonic(), 0))

    def metrics(self, raw: bool = False) -> dict[str, Any]:
        """kafka-python's shape ({group: {name: value}}), with the values this
        producer knows exactly; rates and network figures are left out (no broker).
        ``raw`` is accepted for kafka-python's signature; the values are the same."""
        with self._lock:
            buffered_bytes = self._buffered_bytes
        with self._metrics_lock:
            sent, errors = self._records_sent, self._record_errors
        return {
            "producer-metrics": {
                "record-send-total": sent,
                "record-error-total": errors,
                "buffer-total-bytes": self._buffer_memory_bytes,
                "buffer-available-bytes": self._buffer_memory_bytes - buffered_bytes,
            }
        }

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_headers(headers: Sequence[tuple[str, bytes]] | None) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    checked = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise InvalidTypeError("headers must be (str, bytes) pairs") from None
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray):
            raise InvalidTypeError("headers must be (str, bytes) pairs")
        checked.append((name, bytes(value)))
    return checked
