"""A Kafka-style producer and consumer over any engine (mqstore.engine).

Names, shapes and semantics follow kafka-python, so that its users feel at home:

    producer = KafkaProducer(store, value_serializer=str.encode)
    producer.send("orders", "created", key=b"order-1").get()
    consumer = KafkaConsumer("orders", store=store, group_id="billing",
                             auto_offset_reset="earliest")
    for tp, records in consumer.poll(timeout_ms=500).items(): ...

There is no broker and no network: ``store`` is an open ``MessageStore`` (or a
``segmented.SegmentedStore``) in this process. Groups have a single member: a
``subscribe``d consumer owns every partition of its topics (no rebalance protocol):
its ``ConsumerRebalanceListener`` hears of the whole old assignment being revoked
and the whole new one assigned (kafka-python's eager protocol) whenever a subscribe,
a topic created or grown (seen at the next poll) or unsubscribe changes it.
``assign`` and ``subscribe`` are exclusive (IllegalStateError, as kafka-python).
This module holds the consumer; the producer lives in mqstore.kafka_producer and is
re-exported here, so ``from mqstore.kafka import KafkaProducer`` keeps working.
"""

from __future__ import annotations

import abc
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from mqstore.commitlog.columns import tuples
from mqstore.commitlog.errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidTypeError,
    OffsetOutOfRangeError,
    StoreClosedError,
    UnknownTopicError,
)
from mqstore.engine import NO_HEADERS, Engine, EngineBatch
from mqstore.kafka_producer import (
    FutureRecordMetadata,
    KafkaProducer,
    RecordMetadata,
    TopicPartition,
    check_configs,
    murmur2,
)
from mqstore.offsets import validate_group

__all__ = [
    "ConsumerRebalanceListener",
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


class ConsumerRebalanceListener(abc.ABC):
    """kafka-python's callback interface for ``subscribe(listener=...)``: told of the
    partitions taken away and given when the subscription's assignment changes."""

    @abc.abstractmethod
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Called before the assignment changes, with the partitions that were owned."""

    @abc.abstractmethod
    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Called after the assignment changed, with the partitions now owned."""


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
        check_configs(configs, _CONSUMER_DEFAULTS, "consumer")
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
        self._user_assigned = False  # assign() was called (exclusive with subscribe)
        self._listener: ConsumerRebalanceListener | None = None
        self._records_consumed = 0  # for metrics()
        self._fetches = 0
        self._commits = 0
        if topics:
            self.subscribe(topics)

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Take exactly these partitions (no group membership).

        Raises:
            IllegalStateError: the consumer is subscribed (unsubscribe first).
            UnknownTopicError: a partition that does not exist.
        """
        self._check_open()
        if self._subscription or self._pattern is not None:
            raise IllegalStateError(
                "assign() after subscribe(): subscription to topics, partitions and pattern "
                "are mutually exclusive (call unsubscribe() first)"
            )
        chosen = []
        for tp in partitions:
            tp = TopicPartition(*tp)
            self._check_partition(tp)
            chosen.append(tp)
        self._user_assigned = bool(chosen)  # assign([]) is unsubscribe(), as kafka-python
        self._set_assignment(chosen)

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics (or a regex): this single member owns all partitions.

        A topic not yet created is waited for (picked up by a later poll) when the
        store creates topics on their first write; else it is refused.

        Raises:
            IllegalStateError: partitions were assigned with assign().
            UnknownTopicError: a named topic does not exist and the store does not
                auto-create topics.
            InvalidTypeError: ``listener`` is not a ConsumerRebalanceListener.
        """
        self._check_open()
        if self._user_assigned:
            raise IllegalStateError(
                "subscribe() after assign(): subscription to topics, partitions and pattern "
                "are mutually exclusive (call unsubscribe() first)"
            )
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            raise InvalidTypeError("listener must be a ConsumerRebalanceListener")
        if isinstance(topics, str):
            topics = [topics]
        names = set(topics)
        if pattern is None and not self._store.auto_create_topics:
            unknown = sorted(names - set(self._store.list_topics()))
            if unknown:
                raise UnknownTopicError(
                    f"unknown topic(s) {', '.join(map(repr, unknown))} (the store does not "
                    "auto-create topics: create them first)"
                )
        self._listener = listener
        if pattern is not None:
            self._pattern = re.compile(pattern)
            self._subscription = set()
        else:
            self._subscription = names
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
            self._rebalance(chosen)

    def _rebalance(self, chosen: list[TopicPartition]) -> None:
        """Change the subscription's assignment, telling the listener (eager protocol:
        all old partitions revoked, then all new ones assigned)."""
        listener = self._listener
        if listener is not None and self._assignment:
            listener.on_partitions_revoked(set(self._assignment))
        self._set_assignment(chosen)
        if listener is not None and chosen:
            listener.on_partitions_assigned(set(chosen))

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._assignment = partitions
        keep = self._assigned = set(partitions)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in keep}
        self._paused &= keep
        self._active = None

    def unsubscribe(self) -> None:
        """Drop the subscription or the assigned partitions."""
        if not self._user_assigned and self._assignment:
            self._rebalance([])
        self._subscription = set()
        self._pattern = None
        self._user_assigned = False
        self._listener = None
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
            self._fetches += 1
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
                batch = self._store.read_batch(tp.topic, tp.partition, position, limit - count)
            except OffsetOutOfRangeError:  # retention moved the log start meanwhile
                self._reset(tp, position)
                continue
            if not len(batch):
                continue
            result[tp] = self._consumer_records(tp, batch)
            count += len(batch)
            self._records_consumed += len(batch)
            if update_offsets:
                self._positions[tp] = batch.offsets[-1] + 1
        # The next poll goes on after the last partition this one visited (Kafka's
        # fetch order), instead of re-reading the partitions it just drained.
        self._next_partition = start + max(visited, 1)
        return result

    def _active_partitions(self) -> list[TopicPartition]:
        active = self._active
        if active is None:
            active = self._active = [tp for tp in self._assignment if tp not in self._paused]
        return active

    def _consumer_records(self, tp: TopicPartition, batch: EngineBatch) -> list[ConsumerRecord]:
        """The batch's records as ConsumerRecords, deserialized: made column by
        column (``tuples``, C when built), no Python frame per record."""
        count = len(batch)
        keys, values = batch.keys, batch.values
        key_deserializer = self.config["key_deserializer"]
        value_deserializer = self.config["value_deserializer"]
        if key_deserializer is not None:
            keys = [None if key is None else key_deserializer(key) for key in keys]
        if value_deserializer is not None:
            values = [None if value is None else value_deserializer(value) for value in values]
        constants = [tp.topic] * count, [tp.partition] * count, [-1] * count
        return tuples(ConsumerRecord, (
            *constants, batch.offsets, batch.timestamps_ms, batch.timestamp_types, keys, values,
            batch.headers, batch.checksums, batch.serialized_key_sizes,
            batch.serialized_value_sizes, batch.serialized_header_sizes,
        ), NO_HEADERS)  # fmt: skip

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
            self._commits += 1
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

    # ------------------------------------------------------------------ metrics

    def metrics(self, raw: bool = False) -> dict[str, dict[str, Any]]:
        """kafka-python's shape ({group: {name: value}}), with the values this
        consumer knows exactly; rates, latencies and network figures are left out
        (no broker). ``raw`` is accepted for kafka-python's signature."""
        return {
            "consumer-fetch-manager-metrics": {
                "records-consumed-total": self._records_consumed,
                "fetch-total": self._fetches,
            },
            "consumer-coordinator-metrics": {
                "assigned-partitions": len(self._assignment),
                "commit-total": self._commits,
            },
        }

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
