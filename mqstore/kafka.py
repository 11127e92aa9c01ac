"""A Kafka-style producer and consumer over any engine (mqstore.engine).

Names, shapes and semantics follow kafka-python, so that its users feel at home:

    producer = KafkaProducer(store, value_serializer=str.encode)
    producer.send("orders", "created", key=b"order-1").get()
    consumer = KafkaConsumer("orders", store=store, group_id="billing",
                             auto_offset_reset="earliest")
    for tp, records in consumer.poll(timeout_ms=500).items(): ...

There is no broker and no network: ``store`` is an open ``MessageStore`` (or a
``segmented.SegmentedStore``) in this process. Groups have a single member: a
``subscribe``d consumer owns every partition of its topics (no rebalance protocol).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from commitlog.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    OffsetOutOfRangeError,
    StoreClosedError,
    UnknownTopicError,
)
from mqstore.engine import Engine, ProducerRecord
from mqstore.offsets import validate_group

__all__ = [
    "ConsumerRecord",
    "FutureRecordMetadata",
    "KafkaConsumer",
    "KafkaProducer",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
    "murmur2",
]

log = logging.getLogger(__name__)


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str
    leader_epoch: int = -1


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int | None = None


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    leader_epoch: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes]]
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


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
    """The result of ``send``: resolved at once (linger_ms=0) or at the next flush.

    The Event a waiter blocks on is made only when someone waits on an unresolved
    future, so the common linger_ms=0 send pays for no lock."""

    __slots__ = ("_callbacks", "_done", "_event", "exception", "value")

    def __init__(self) -> None:
        self._done = False
        self._event: threading.Event | None = None
        self.value: RecordMetadata | None = None
        self.exception: BaseException | None = None
        self._callbacks: list[tuple[Callable[..., Any], bool]] | None = None

    def _resolve(self, value: RecordMetadata | None, error: BaseException | None) -> None:
        self.value, self.exception = value, error
        self._done = True
        event = self._event
        if event is not None:
            event.set()
        for callback, on_error in self._callbacks or ():
            self._run(callback, on_error)

    def _run(self, callback: Callable[..., Any], on_error: bool) -> None:
        if on_error and self.exception is not None:
            callback(self.exception)
        elif not on_error and self.exception is None:
            callback(self.value)

    @property
    def is_done(self) -> bool:
        return self._done

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata; raises the send's error, or TimeoutError."""
        if not self._done:
            if self._event is None:
                self._event = threading.Event()
                if self._done:  # resolved between the two checks
                    self._event.set()
            if not self._event.wait(timeout):
                raise TimeoutError("the record was not sent within the timeout")
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
_IGNORED_CONFIGS = frozenset(
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
        "max_block_ms",
        "max_request_size",
        "kafka_client",
    ]
)
_IGNORED_PREFIXES = ("ssl_", "sasl_", "metric", "reconnect_", "sock_")


def _check_configs(configs: dict[str, Any], known: dict[str, Any], kind: str) -> None:
    unknown = {
        name for name in configs
        if name not in known and name not in _IGNORED_CONFIGS
        and not name.startswith(_IGNORED_PREFIXES)
    }  # fmt: skip
    if unknown:
        raise InvalidArgumentError(f"unrecognized {kind} configs: {sorted(unknown)}")


_PRODUCER_DEFAULTS: dict[str, Any] = {
    "key_serializer": None,
    "value_serializer": None,
    "partitioner": default_partitioner,
    "linger_ms": 0,
    "batch_size": 16384,
    "acks": 1,
    "client_id": "mqstore-producer",
}


class KafkaProducer:
    """Sends records to an engine; ``linger_ms`` > 0 batches them per partition.

    With ``linger_ms=0`` (the default) each ``send`` appends at once and its future
    is already resolved. With ``linger_ms`` > 0, records wait in a per-partition
    batch until ``batch_size`` bytes, the linger time, ``flush()`` or ``close()``;
    a batch is appended with one ``append_records`` (``put_batch``) call.
    """

    def __init__(self, store: Engine, **configs: Any) -> None:
        _check_configs(configs, _PRODUCER_DEFAULTS, "producer")
        if not isinstance(store, Engine):
            raise InvalidTypeError("store must be an open MessageStore or SegmentedStore")
        self.config = {**_PRODUCER_DEFAULTS, **configs}
        self._store = store
        self._lock = threading.Lock()
        self._batches: dict[TopicPartition, list[tuple[ProducerRecord, FutureRecordMetadata]]] = {}
        self._batch_bytes: dict[TopicPartition, int] = {}
        self._round_robin: dict[str, Iterator[int]] = {}
        self._closed = False
        self._linger_s = self.config["linger_ms"] / 1000
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()
        if self._linger_s > 0:
            self._flusher = threading.Thread(target=self._linger_loop, daemon=True)
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
            StoreClosedError: the producer is closed.
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
        record = ProducerRecord(key_bytes, value_bytes, header_list, timestamp_ms)
        future = FutureRecordMetadata()
        tp = TopicPartition(topic, chosen)
        if self._linger_s <= 0:
            self._append(tp, [(record, future)])
            if future.exception is not None:
                raise future.exception
            return future
        size = len(key_bytes or b"") + len(value_bytes or b"")
        with self._lock:
            self._batches.setdefault(tp, []).append((record, future))
            self._batch_bytes[tp] = self._batch_bytes.get(tp, 0) + size
            full = self._batch_bytes[tp] >= self.config["batch_size"]
        if full:
            self._drain([tp])
        return future

    def send_batch(
        self, topic: str, partition: int, values: Sequence[Any], keys: Sequence[Any] | None = None
    ) -> list[RecordMetadata]:
        """Append many values to one partition in one ``put_batch`` (no linger)."""
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
        chosen = self._choose_partition(topic, None, partition)
        futures = [FutureRecordMetadata() for _ in records]
        self._append(TopicPartition(topic, chosen), list(zip(records, futures, strict=True)))
        return [future.get() for future in futures]

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
        count = self._store.describe_topic(topic).partitions
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

    def _append(
        self, tp: TopicPartition, items: list[tuple[ProducerRecord, FutureRecordMetadata]]
    ) -> None:
        try:
            appended = self._store.append_records(tp.topic, tp.partition, [r for r, _ in items])
        except Exception as error:  # every future of the batch carries the error
            for _, future in items:
                future._resolve(None, error)
            return
        for (_, future), result in zip(items, appended, strict=True):
            future._resolve(
                RecordMetadata(
                    tp.topic, tp.partition, tp, result.offset, result.timestamp_ms, None,
                    result.serialized_key_size, result.serialized_value_size,
                    result.serialized_header_size,
                ),
                None,
            )  # fmt: skip

    def _drain(self, tps: Iterable[TopicPartition] | None = None) -> None:
        with self._lock:
            chosen = (
                list(self._batches) if tps is None else [tp for tp in tps if tp in self._batches]
            )
            batches = [(tp, self._batches.pop(tp)) for tp in chosen]
            for tp in chosen:
                self._batch_bytes.pop(tp, None)
        for tp, items in batches:
            self._append(tp, items)

    def _linger_loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._linger_s)
            self._drain()

    def flush(self, timeout: float | None = None) -> None:
        """Append every waiting record now."""
        self._drain()

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._drain()
        self._closed = True
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()

    def metrics(self) -> dict[str, Any]:
        return {}

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


_CONSUMER_DEFAULTS: dict[str, Any] = {
    "group_id": None,
    "key_deserializer": None,
    "value_deserializer": None,
    "auto_offset_reset": "latest",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "max_poll_records": 500,
    "consumer_timeout_ms": float("inf"),
    "client_id": "mqstore-consumer",
    "fetch_max_wait_ms": 500,
}


class KafkaConsumer:
    """Reads partitions of an engine with kafka-python's API (see module docs)."""

    def __init__(self, *topics: str, store: Engine, **configs: Any) -> None:
        _check_configs(configs, _CONSUMER_DEFAULTS, "consumer")
        if not isinstance(store, Engine):
            raise InvalidTypeError("store must be an open MessageStore or SegmentedStore")
        self.config = {**_CONSUMER_DEFAULTS, **configs}
        if self.config["auto_offset_reset"] not in ("earliest", "latest", "none"):
            raise InvalidArgumentError("auto_offset_reset must be earliest, latest or none")
        group_id = self.config["group_id"]
        if group_id is not None:
            validate_group(group_id)
        self._store = store
        self._group_id: str | None = group_id
        self._assignment: list[TopicPartition] = []
        self._subscription: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._assigned: set[TopicPartition] = set()  # _assignment, for O(1) membership
        self._active: list[TopicPartition] | None = None  # assigned and not paused
        self._next_partition = 0
        self._last_commit = time.monotonic()
        self._closed = False
        self._iterator: Iterator[ConsumerRecord] | None = None
        if topics:
            self.subscribe(topics)

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Take exactly these partitions (no group membership)."""
        self._check_open()
        if self._subscription or self._pattern is not None:
            raise InvalidArgumentError("assign() and subscribe() cannot be mixed")
        chosen = []
        for tp in partitions:
            tp = TopicPartition(*tp)
            self._check_partition(tp)
            chosen.append(tp)
        self._set_assignment(chosen)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        """Subscribe to topics (or a regex): this single member owns all partitions."""
        self._check_open()
        if isinstance(topics, str):
            topics = [topics]
        if pattern is not None:
            self._pattern = re.compile(pattern)
            self._subscription = set()
        else:
            self._subscription = set(topics)
            self._pattern = None
        self._refresh_subscription()

    def _refresh_subscription(self) -> None:
        if not self._subscription and self._pattern is None:
            return
        known = self._store.list_topics()
        names = sorted(self._subscription & set(known))
        if self._pattern is not None:
            names = sorted(name for name in known if self._pattern.fullmatch(name))
        chosen = [TopicPartition(name, p) for name in names for p in range(known[name].partitions)]
        if chosen != self._assignment:
            self._set_assignment(chosen)

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._assignment = partitions
        keep = self._assigned = set(partitions)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in keep}
        self._paused &= keep
        self._active = None

    def unsubscribe(self) -> None:
        self._subscription = set()
        self._pattern = None
        self._set_assignment([])

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscription(self) -> set[str] | None:
        return set(self._subscription) or None

    def topics(self) -> set[str]:
        return set(self._store.list_topics())

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        try:
            return set(range(self._store.describe_topic(topic).partitions))
        except UnknownTopicError:
            return None

    def _check_partition(self, tp: TopicPartition) -> None:
        if (
            not isinstance(tp.topic, str)
            or isinstance(tp.partition, bool)
            or not isinstance(tp.partition, int)
        ):
            raise InvalidTypeError("a TopicPartition is (str topic, int partition)")
        count = self._store.describe_topic(tp.topic).partitions
        if not 0 <= tp.partition < count:
            raise UnknownTopicError(f"topic {tp.topic!r} has no partition {tp.partition}")

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._assigned:
            raise InvalidArgumentError(f"{tp} is not assigned to this consumer")
        return tp

    # ------------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` at the next poll."""
        tp = self._check_assigned(partition)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidTypeError("offset must be an int")
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        self._positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._assignment):
            tp = self._check_assigned(tp)
            self._positions[tp] = self._store.earliest_offset(tp.topic, tp.partition)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._assignment):
            tp = self._check_assigned(tp)
            self._positions[tp] = self._store.latest_offset(tp.topic, tp.partition)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record to fetch (resolving it if needed)."""
        tp = self._check_assigned(partition)
        return self._resolve_position(tp)

    def highwater(self, partition: TopicPartition) -> int:
        tp = self._check_assigned(partition)
        return self._store.latest_offset(tp.topic, tp.partition)

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._paused.add(self._check_assigned(tp))
            self._active = None

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._paused.discard(self._check_assigned(tp))
            self._active = None

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def _resolve_position(self, tp: TopicPartition) -> int:
        """The fetch position, from a seek, the group's commit, or the reset policy.

        A position below the log start (retention) or above the log end is reset by
        ``auto_offset_reset``, or raises OffsetOutOfRangeError when it is "none".
        """
        position = self._positions.get(tp)
        if position is None and self._group_id is not None:
            committed = self._store.offsets.load(self._group_id).get((tp.topic, tp.partition))
            if committed is not None:
                position = committed[0]
        if position is not None:
            earliest = self._store.earliest_offset(tp.topic, tp.partition)
            if earliest <= position <= self._store.latest_offset(tp.topic, tp.partition):
                self._positions[tp] = position
                return position
        return self._reset(tp, position)

    def _reset(self, tp: TopicPartition, position: int | None) -> int:
        """Apply ``auto_offset_reset`` to a missing or out-of-range position."""
        earliest = self._store.earliest_offset(tp.topic, tp.partition)
        latest = self._store.latest_offset(tp.topic, tp.partition)
        policy = self.config["auto_offset_reset"]
        if policy == "none":
            if position is None:
                raise OffsetOutOfRangeError(f"{tp} has no committed offset and reset is 'none'")
            raise OffsetOutOfRangeError(
                f"{tp} position {position} is outside [{earliest}, {latest}]"
            )
        reset = earliest if policy == "earliest" else latest
        if position is not None:
            log.info(
                "%s: position %d outside [%d, %d]; reset to %d",
                tp,
                position,
                earliest,
                latest,
                reset,
            )
        self._positions[tp] = reset
        return reset

    # ------------------------------------------------------------------ poll

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Fetch records from the assigned, unpaused partitions.

        Blocks up to ``timeout_ms`` (a long poll woken by new data) when nothing is
        available. Partitions are served round-robin, at most ``max_records`` in all.
        """
        self._check_open()
        limit = max_records if max_records is not None else self.config["max_poll_records"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgumentError("max_records must be a positive int")
        self._refresh_subscription()
        self._maybe_auto_commit()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            fetched = self._fetch(limit, update_offsets)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if fetched or remaining_ms <= 0:
                return fetched
            active = self._active_partitions()
            if not active:
                time.sleep(remaining_ms / 1000)
                return {}
            positions = [(tp.topic, tp.partition, self._resolve_position(tp)) for tp in active]
            self._store.wait_for_data(positions, remaining_ms)

    def _fetch(
        self, limit: int, update_offsets: bool
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        active = self._active_partitions()
        result: dict[TopicPartition, list[ConsumerRecord]] = {}
        if not active:
            return result
        count = 0
        start = self._next_partition % len(active)
        visited = 0
        for i in range(len(active)):
            if count >= limit:
                break
            visited = i + 1
            tp = active[(start + i) % len(active)]
            # A position this consumer holds (a seek, or the end of its last fetch) is
            # read as is: an out-of-range one raises below and is reset there.
            position = self._positions.get(tp)
            if position is None:
                position = self._resolve_position(tp)
            try:
                records = self._store.read_records(tp.topic, tp.partition, position, limit - count)
            except OffsetOutOfRangeError:  # retention moved the log start meanwhile
                self._reset(tp, position)
                continue
            if not records:
                continue
            result[tp] = [self._to_consumer_record(tp, record) for record in records]
            count += len(records)
            if update_offsets:
                self._positions[tp] = records[-1].offset + 1
        # The next poll goes on after the last partition this one visited (Kafka's
        # fetch order), instead of re-reading the partitions it just drained.
        self._next_partition = start + max(visited, 1)
        return result

    def _active_partitions(self) -> list[TopicPartition]:
        active = self._active
        if active is None:
            active = self._active = [tp for tp in self._assignment if tp not in self._paused]
        return active

    def _to_consumer_record(self, tp: TopicPartition, record: Any) -> ConsumerRecord:
        key_deserializer = self.config["key_deserializer"]
        value_deserializer = self.config["value_deserializer"]
        key = record.key
        value = record.value
        if key is not None and key_deserializer is not None:
            key = key_deserializer(key)
        if value is not None and value_deserializer is not None:
            value = value_deserializer(value)
        return ConsumerRecord(
            tp.topic, tp.partition, -1, record.offset, record.timestamp_ms,
            record.timestamp_type, key, value, record.headers, record.checksum,
            record.serialized_key_size, record.serialized_value_size,
            record.serialized_header_size,
        )  # fmt: skip

    def __iter__(self) -> KafkaConsumer:
        return self

    def __next__(self) -> ConsumerRecord:
        if self._iterator is None:
            self._iterator = self._records()
        return next(self._iterator)

    def _records(self) -> Iterator[ConsumerRecord]:
        timeout = self.config["consumer_timeout_ms"]
        idle_since = time.monotonic()
        while True:
            batch = self.poll(
                timeout_ms=min(self.config["fetch_max_wait_ms"], 1_000_000), max_records=None
            )
            if batch:
                idle_since = time.monotonic()
                for records in batch.values():
                    yield from records
            elif (time.monotonic() - idle_since) * 1000 >= timeout:
                return

    # ------------------------------------------------------------------ offsets

    def _check_group(self) -> str:
        if self._group_id is None:
            raise InvalidArgumentError("this consumer has no group_id: nothing to commit")
        return self._group_id

    def commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None
    ) -> None:
        """Commit ``offsets`` (default: the current positions) for the group, durably
        and atomically."""
        group = self._check_group()
        if offsets is None:
            offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in self._positions.items()}
        entries = {}
        for tp, value in offsets.items():
            tp = TopicPartition(*tp)
            if isinstance(value, int) and not isinstance(value, bool):
                offset, metadata = value, ""
            elif isinstance(value, tuple) and len(value) >= 2:
                offset, metadata = value[0], value[1] or ""
            else:
                raise InvalidTypeError(
                    f"commit offsets are ints or OffsetAndMetadata, not {type(value).__name__}"
                )
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgumentError(f"cannot commit offset {offset!r} for {tp}")
            self._check_partition(tp)
            entries[(tp.topic, tp.partition)] = (offset, str(metadata))
        if entries:
            self._store.offsets.commit(group, entries)
        self._last_commit = time.monotonic()

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        """Commits synchronously (there is no broker to wait for), then calls back."""
        error: BaseException | None = None
        try:
            self.commit(offsets)
        except Exception as failure:  # handed to the callback, as kafka-python does
            error = failure
        if callback is not None:
            callback(offsets, error)
        elif error is not None:
            raise error

    def committed(self, partition: TopicPartition, metadata: bool = False) -> Any:
        """The group's committed offset (or OffsetAndMetadata), or None."""
        group = self._check_group()
        tp = TopicPartition(*partition)
        entry = self._store.offsets.load(group).get((tp.topic, tp.partition))
        if entry is None:
            return None
        return OffsetAndMetadata(entry[0], entry[1], -1) if metadata else entry[0]

    def _maybe_auto_commit(self) -> None:
        if not self.config["enable_auto_commit"] or self._group_id is None or not self._positions:
            return
        if (time.monotonic() - self._last_commit) * 1000 >= self.config["auto_commit_interval_ms"]:
            self.commit()

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            self._check_partition(tp)
            out[tp] = self._store.earliest_offset(tp.topic, tp.partition)
        return out

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            self._check_partition(tp)
            out[tp] = self._store.latest_offset(tp.topic, tp.partition)
        return out

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the first offset whose timestamp is >= the given one
        (None when there is none).

        Raises:
            ValueError: a negative timestamp (as kafka-python).
        """
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, timestamp in timestamps.items():
            tp = TopicPartition(*tp)
            if isinstance(timestamp, bool) or not isinstance(timestamp, int):
                raise InvalidTypeError("timestamps must be int ms")
            if timestamp < 0:
                raise InvalidArgumentError(
                    f"the target time for {tp} cannot be negative: {timestamp}"
                )
            self._check_partition(tp)
            found = self._store.offset_for_timestamp(tp.topic, tp.partition, timestamp)
            out[tp] = None if found is None else OffsetAndTimestamp(found[0], found[1], None)
        return out

    # ------------------------------------------------------------------ close

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the consumer is closed")

    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        if autocommit and self.config["enable_auto_commit"] and self._group_id is not None:
            self.commit()
        self._closed = True

    def __enter__(self) -> KafkaConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
