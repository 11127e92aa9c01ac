"""Offset planning for the Spark source, with Kafka's option semantics, without Spark.

Given the read options and the store's state (topics, partitions, earliest and latest
offsets, offset-for-timestamp), compute where each (topic, partition) starts and ends
and cut that into the offset ranges Spark reads as input partitions.

Offsets JSON is Kafka's: ``{"t": {"0": 23, "1": -2}}`` with -2 = earliest and
-1 = latest; a streaming offset is ``{"topic": {"partition": next_offset}}`` with
sorted keys, so Spark's JSON comparison of offsets is deterministic.

Invariants: every range has ``0 <= start <= end``; ranges of one partition never
overlap; split ranges cover their parent exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

import attrs

from mqstore.commitlog.errors import InvalidArgumentError, OffsetOutOfRangeError

__all__ = [
    "EARLIEST",
    "LATEST",
    "DataLossError",
    "OffsetRange",
    "ReadOptions",
    "StoreState",
    "TopicPartition",
    "ending_offsets",
    "offsets_from_json",
    "offsets_to_json",
    "plan_ranges",
    "rate_limit",
    "split_ranges",
    "starting_offsets",
    "subscribed_partitions",
]

EARLIEST: Final = -2  # Kafka's sentinel in offsets JSON
LATEST: Final = -1
MAX_BYTES_PER_BATCH_DEFAULT: Final = 16 << 20  # Arrow batch: 16 MiB of values keeps workers small
MAX_BYTES_PER_BATCH_MAX: Final = (1 << 31) - 1  # binary offsets are int32
MIN_PARTITIONS_MAX: Final = 1 << 16  # more splits than this is a typo, not a plan

TopicPartition = tuple[str, int]


class DataLossError(OffsetOutOfRangeError):
    """Offsets a query needs are gone (retention) and failOnDataLoss is true."""


class StoreState(Protocol):
    """What planning needs to know about a store (a MessageStore satisfies it)."""

    def list_topics(self) -> Mapping[str, Any]: ...  # values have ``.partitions``
    def earliest_offset(self, topic: str, partition: int) -> int: ...
    def latest_offset(self, topic: str, partition: int) -> int: ...
    def offset_for_timestamp(
        self, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[int, int] | None: ...


@attrs.frozen
class OffsetRange:
    """Queue offsets [start, end) of one partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgumentError(f"option {name} must be true or false, not {raw!r}")
    return text == "true"


def _int(options: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"option {name} must be in [{low}, {high}], not {value}")
    return value


def _json(options: Mapping[str, str], name: str) -> Any:
    raw = options[name.lower()]
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidArgumentError(f"option {name} is not valid JSON: {raw!r}") from None


def _offset_spec(options: Mapping[str, str], name: str) -> str | dict[TopicPartition, int] | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    return _partition_map(_json(options, name), name)


def _partition_map(document: Any, name: str) -> dict[TopicPartition, int]:
    if not isinstance(document, dict):
        raise InvalidArgumentError(f'option {name} must look like {{"topic": {{"0": 23}}}}')
    out: dict[TopicPartition, int] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise InvalidArgumentError(f"option {name}: topic {topic!r} needs a partition map")
        for partition, value in partitions.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"option {name}: {topic}/{partition} is not an int")
            try:
                out[(str(topic), int(partition))] = value
            except ValueError:
                raise InvalidArgumentError(f"option {name}: bad partition {partition!r}") from None
    return out


def _assign(document: Any) -> tuple[TopicPartition, ...]:
    """Kafka's assign JSON: ``{"topicA": [0, 1], "topicB": [2]}``."""
    if not isinstance(document, dict):
        raise InvalidArgumentError('option assign must look like {"topic": [0, 1]}')
    out: set[TopicPartition] = set()
    for topic, partitions in document.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise InvalidArgumentError(f"option assign: {topic!r} needs a list of partitions")
        out.update((str(topic), p) for p in partitions)
    if not out:
        raise InvalidArgumentError("option assign names no partition")
    return tuple(sorted(out))


def _has(spec: object, sentinel: int) -> bool:
    return isinstance(spec, dict) and sentinel in spec.values()


@attrs.frozen(kw_only=True)
class ReadOptions:
    """The source's options, parsed once (Spark hands them over as case-insensitive
    strings). Names and semantics are those of Spark's Kafka source."""

    path: str
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    assign: tuple[TopicPartition, ...] | None = None
    starting_offsets: str | dict[TopicPartition, int] | None = None
    ending_offsets: str | dict[TopicPartition, int] | None = None
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    starting_offsets_by_timestamp: dict[TopicPartition, int] | None = None
    starting_by_timestamp_strategy: str = "error"
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    include_rocketmq_columns: bool = False
    verify_checksums: bool = True
    max_bytes_per_batch: int = MAX_BYTES_PER_BATCH_DEFAULT
    max_offsets_per_trigger: int | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
        """Parse and validate; raise InvalidArgumentError naming the bad option."""
        options = {str(k).lower(): v for k, v in raw.items()}
        path = options.get("path")
        if not path:
            raise InvalidArgumentError("option path (the store directory) is required")
        given = [name for name in ("subscribe", "subscribepattern", "assign") if name in options]
        if len(given) != 1:
            raise InvalidArgumentError(
                "exactly one of subscribe, subscribePattern, assign is required"
            )
        subscribe = assign = pattern = None
        if "subscribe" in options:
            subscribe = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
            if not subscribe:
                raise InvalidArgumentError("option subscribe names no topic")
        elif "subscribepattern" in options:
            pattern = options["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as error:
                raise InvalidArgumentError(f"bad subscribePattern: {error}") from None
        else:
            assign = _assign(_json(options, "assign"))
        starting = _offset_spec(options, "startingOffsets")
        ending = _offset_spec(options, "endingOffsets")
        if streaming and ending is not None:
            raise InvalidArgumentError("endingOffsets is not allowed in a streaming query")
        if not streaming and (starting == "latest" or _has(starting, LATEST)):
            raise InvalidArgumentError(
                "startingOffsets latest (-1) is not allowed in a batch query"
            )
        if ending == "earliest" or _has(ending, EARLIEST):
            raise InvalidArgumentError("endingOffsets earliest (-2) is not allowed")
        by_timestamp = None
        if "startingoffsetsbytimestamp" in options:
            by_timestamp = _partition_map(
                _json(options, "startingOffsetsByTimestamp"), "startingOffsetsByTimestamp"
            )
        strategy = str(options.get("startingoffsetsbytimestampstrategy", "error")).lower()
        if strategy not in ("error", "latest"):
            raise InvalidArgumentError("startingOffsetsByTimestampStrategy is error or latest")
        if "endingtimestamp" in options and streaming:
            raise InvalidArgumentError("endingTimestamp is not allowed in a streaming query")
        max_bytes = _int(options, "maxBytesPerBatch", 1 << 10, MAX_BYTES_PER_BATCH_MAX)
        return cls(
            path=str(path),
            subscribe=subscribe,
            subscribe_pattern=pattern,
            assign=assign,
            starting_offsets=starting,
            ending_offsets=ending,
            starting_timestamp_ms=_int(options, "startingTimestamp", 0, 2**63 - 1),
            ending_timestamp_ms=_int(options, "endingTimestamp", 0, 2**63 - 1),
            starting_offsets_by_timestamp=by_timestamp,
            starting_by_timestamp_strategy=strategy,
            min_partitions=_int(options, "minPartitions", 1, MIN_PARTITIONS_MAX),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            include_headers=_bool(options, "includeHeaders", False),
            include_rocketmq_columns=_bool(options, "includeRocketMQColumns", False),
            verify_checksums=_bool(options, "verifyChecksums", True),
            max_bytes_per_batch=max_bytes or MAX_BYTES_PER_BATCH_DEFAULT,
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", 1, 2**62),
        )


# ---------------------------------------------------------------------- partitions


def subscribed_partitions(options: ReadOptions, state: StoreState) -> list[TopicPartition]:
    """The (topic, partition) pairs the query reads, sorted.

    Raises:
        InvalidArgumentError: an assigned or subscribed topic or partition does not exist.
    """
    topics = state.list_topics()
    if options.assign is not None:
        for topic, partition in options.assign:
            config = topics.get(topic)
            if config is None or partition >= config.partitions:
                raise InvalidArgumentError(f"assigned partition {topic}/{partition} does not exist")
        return list(options.assign)
    if options.subscribe is not None:
        missing = [t for t in options.subscribe if t not in topics]
        if missing:
            raise InvalidArgumentError(f"subscribed topics do not exist: {', '.join(missing)}")
        names: Iterable[str] = options.subscribe
    else:
        assert options.subscribe_pattern is not None
        pattern = re.compile(options.subscribe_pattern)
        names = [t for t in topics if pattern.fullmatch(t)]
    return sorted((t, p) for t in set(names) for p in range(topics[t].partitions))


def _by_timestamp(
    state: StoreState, tp: TopicPartition, timestamp_ms: int, strategy: str, what: str
) -> int:
    found = state.offset_for_timestamp(tp[0], tp[1], timestamp_ms)
    if found is not None:
        return found[0]
    if strategy == "latest":
        return state.latest_offset(*tp)
    raise InvalidArgumentError(
        f"{what}: no offset of {tp[0]}/{tp[1]} has a timestamp >= {timestamp_ms} "
        "(set startingOffsetsByTimestampStrategy=latest to start at the end)"
    )


def starting_offsets(
    options: ReadOptions,
    state: StoreState,
    partitions: Iterable[TopicPartition],
    *,
    streaming: bool = False,
) -> dict[TopicPartition, int]:
    """Where each partition starts, unresolved against retention (see plan_ranges).

    Precedence is Kafka's: startingTimestamp, then startingOffsetsByTimestamp, then
    startingOffsets (default earliest for batch, latest for streaming). A partition
    missing from a JSON map starts at the default.
    """
    default = "latest" if streaming else "earliest"
    spec = options.starting_offsets if options.starting_offsets is not None else default
    out: dict[TopicPartition, int] = {}
    for tp in partitions:
        if options.starting_timestamp_ms is not None:
            out[tp] = _by_timestamp(
                state,
                tp,
                options.starting_timestamp_ms,
                options.starting_by_timestamp_strategy,
                "startingTimestamp",
            )
            continue
        by_ts = options.starting_offsets_by_timestamp
        if by_ts is not None and tp in by_ts:
            out[tp] = _by_timestamp(
                state,
                tp,
                by_ts[tp],
                options.starting_by_timestamp_strategy,
                "startingOffsetsByTimestamp",
            )
            continue
        value = (
            spec.get(tp, EARLIEST if default == "earliest" else LATEST)
            if isinstance(spec, dict)
            else (EARLIEST if spec == "earliest" else LATEST)
        )
        out[tp] = _resolve_sentinel(state, tp, value)
    return out


def ending_offsets(
    options: ReadOptions, state: StoreState, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """Where each partition ends (exclusive) in a batch query: endingTimestamp, then
    endingOffsets (default latest). A timestamp past every record means latest."""
    spec = options.ending_offsets if options.ending_offsets is not None else "latest"
    out: dict[TopicPartition, int] = {}
    for tp in partitions:
        if options.ending_timestamp_ms is not None:
            out[tp] = _by_timestamp(state, tp, options.ending_timestamp_ms, "latest", "")
            continue
        value = spec.get(tp, LATEST) if isinstance(spec, dict) else LATEST
        out[tp] = _resolve_sentinel(state, tp, value)
    return out


def _resolve_sentinel(state: StoreState, tp: TopicPartition, value: int) -> int:
    if value == EARLIEST:
        return state.earliest_offset(*tp)
    if value == LATEST:
        return state.latest_offset(*tp)
    if value < 0:
        raise InvalidArgumentError(f"offset {value} of {tp[0]}/{tp[1]} is not -2, -1 or >= 0")
    return value


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    state: StoreState,
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """One range per partition, checked against what the store still holds.

    A start below the earliest offset (retention deleted it) or past the latest is
    data loss: DataLossError when ``fail_on_data_loss``, else the start moves to
    earliest (or to latest). Empty ranges are dropped.
    """
    ranges = []
    for tp in sorted(end):
        first = start.get(tp, state.earliest_offset(*tp))
        last = end[tp]
        earliest = state.earliest_offset(*tp)
        latest = state.latest_offset(*tp)
        if first < earliest or first > latest or last > latest:
            if fail_on_data_loss:
                raise DataLossError(
                    f"{tp[0]}/{tp[1]}: offsets [{first}, {last}) requested but the store holds "
                    f"[{earliest}, {latest}); some data may have been lost (retention). Set "
                    "failOnDataLoss=false to read what is left."
                )
            first = min(max(first, earliest), latest)
            last = min(last, latest)
        if last > first:
            ranges.append(OffsetRange(tp[0], tp[1], first, last))
    return ranges


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Kafka's KafkaOffsetRangeCalculator: with fewer ranges than ``min_partitions``,
    cut each range into parts proportional to its share of all offsets."""
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions))
        parts = min(parts, r.size)
        step, extra = divmod(r.size, parts)
        first = r.start
        for i in range(parts):
            last = first + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, first, last))
            first = last
        assert first == r.end
    return out


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """Kafka's maxOffsetsPerTrigger: share ``max_rows`` across partitions in
    proportion to their backlog (a share below one offset rounds up, as Kafka does)."""
    backlog = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_rows * backlog[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(begin + step, end)
    return out


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": next_offset}}`` with sorted keys (numeric partitions)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(document: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }
