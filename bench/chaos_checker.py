"""The chaos suite's history checker: pure functions over a recorded history.

A history (``History``) holds three kinds of events:

- ``Send``: one produced value (unique across the run) with its outcome: ``acked``
  (the broker's partition and offset; no offset when librdkafka acknowledged it
  implicitly, because a later batch of the same producer succeeded after this one's
  request failed), ``failed`` (it never left the client) or ``unknown`` (an error or
  no answer: it may or may not have been written).
- ``Observation``: a consumer poll returned ``value`` at (partition, offset);
  ``assignment`` numbers the consumer's continuous assignments (a new number after
  every rebalance, so a re-read after a rebalance is not an offset going backwards).
- ``final``: every partition read from its earliest offset on the final leader, after
  the replicas converged: {partition: [(offset, value), ...]}.

``check`` reports the anomalies (Jepsen's kafka workload, narrowed to what a log
without transactions promises):

- ``lost``: an acked value absent from the final read, or absent at its acked offset
  while some consumer read that partition past that offset (Jepsen's lost-write);
- ``inconsistent``: two different values at one (partition, offset) across the acks,
  the observations and the final read;
- ``duplicate``: one value at two different (partition, offset) places;
- ``backwards``: within one consumer's continuous assignment of a partition, a poll
  returned an offset not above the previous one.

Values whose loss a step allowed (an unclean promotion) are listed in
``History.loss_allowed``: their losses and the inconsistencies they take part in are
counted apart (``allowed_lost``, ``allowed_inconsistent``), never as anomalies.
Nothing here reads a clock or a file: the same history gives the same report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import attrs

__all__ = ["ANOMALY_KINDS", "Anomaly", "History", "Observation", "Report", "Send", "check"]

Outcome = Literal["acked", "failed", "unknown"]
ANOMALY_KINDS = ("lost", "inconsistent", "duplicate", "backwards")
#: At most this many examples of each kind are kept in a report (the counts are exact).
EXAMPLES_MAX = 20


@attrs.frozen(kw_only=True)
class Send:
    value: bytes
    partition: int
    outcome: Outcome = attrs.field(validator=attrs.validators.in_(("acked", "failed", "unknown")))
    offset: int | None = None  # when acked, unless acknowledged implicitly

    def __attrs_post_init__(self) -> None:
        assert self.offset is None or self.outcome == "acked", self


@attrs.frozen(kw_only=True)
class Observation:
    consumer: str
    assignment: int  # the consumer's continuous-assignment number
    partition: int
    offset: int
    value: bytes


@attrs.frozen(kw_only=True)
class History:
    sends: Sequence[Send]
    observations: Sequence[Observation]
    final: Mapping[int, Sequence[tuple[int, bytes]]]
    loss_allowed: frozenset[bytes] = frozenset()


@attrs.frozen(kw_only=True)
class Anomaly:
    kind: str
    partition: int
    offset: int | None
    detail: str


@attrs.frozen(kw_only=True)
class Report:
    counts: dict[str, int]  # every kind of ANOMALY_KINDS, 0 included
    examples: list[Anomaly]
    acked: int
    acked_without_offset: int  # implicit acks: checked against the final read only
    failed: int
    unknown: int
    observed: int  # observations
    final_records: int
    allowed_lost: int
    allowed_inconsistent: int

    @property
    def anomalies(self) -> int:
        return sum(self.counts.values())


def check(history: History) -> Report:
    """Every anomaly of ``history`` (see the module docstring)."""
    found: list[Anomaly] = []
    allowed = {"lost": 0, "inconsistent": 0}
    places = _places(history)
    found += _lost(history, allowed)
    found += _inconsistent(places, history.loss_allowed, allowed)
    found += _duplicates(places)
    found += _backwards(history.observations)
    counts = dict.fromkeys(ANOMALY_KINDS, 0)
    examples: list[Anomaly] = []
    for anomaly in found:
        counts[anomaly.kind] += 1
        if counts[anomaly.kind] <= EXAMPLES_MAX:
            examples.append(anomaly)
    outcomes: dict[str, int] = defaultdict(int)
    for send in history.sends:
        outcomes[send.outcome] += 1
    return Report(
        counts=counts,
        examples=examples,
        acked=outcomes["acked"],
        acked_without_offset=sum(
            1 for send in history.sends if send.outcome == "acked" and send.offset is None
        ),
        failed=outcomes["failed"],
        unknown=outcomes["unknown"],
        observed=len(history.observations),
        final_records=sum(len(records) for records in history.final.values()),
        allowed_lost=allowed["lost"],
        allowed_inconsistent=allowed["inconsistent"],
    )


def _places(history: History) -> dict[tuple[int, int], set[bytes]]:
    """(partition, offset) -> every value some source put there."""
    places: dict[tuple[int, int], set[bytes]] = defaultdict(set)
    for send in history.sends:
        if send.offset is not None:
            places[(send.partition, send.offset)].add(send.value)
    for seen in history.observations:
        places[(seen.partition, seen.offset)].add(seen.value)
    for partition, records in history.final.items():
        for offset, value in records:
            places[(partition, offset)].add(value)
    return places


def _lost(history: History, allowed: dict[str, int]) -> list[Anomaly]:
    final_at = {
        (partition, offset): value
        for partition, records in history.final.items()
        for offset, value in records
    }
    final_values = set(final_at.values())
    observed_past: dict[int, int] = {}  # partition -> highest offset any consumer read
    for seen in history.observations:
        observed_past[seen.partition] = max(observed_past.get(seen.partition, -1), seen.offset)
    lost = []
    for send in history.sends:
        if send.outcome != "acked":
            continue
        if send.value not in final_values:
            why = "absent from the final read"
        elif (
            send.offset is not None
            and observed_past.get(send.partition, -1) > send.offset
            and final_at.get((send.partition, send.offset)) != send.value
        ):
            why = "absent at its acked offset, which consumers read past"
        else:
            continue
        if send.value in history.loss_allowed:
            allowed["lost"] += 1
            continue
        offset = -1 if send.offset is None else send.offset
        detail = f"{send.value!r} acked at {send.partition}/{offset}: {why}"
        lost.append(Anomaly(kind="lost", partition=send.partition, offset=offset, detail=detail))
    return lost


def _inconsistent(
    places: Mapping[tuple[int, int], set[bytes]],
    loss_allowed: frozenset[bytes],
    allowed: dict[str, int],
) -> list[Anomaly]:
    found = []
    for (partition, offset), values in sorted(places.items()):
        if len(values) < 2:
            continue
        if len(values - loss_allowed) < 2:
            allowed["inconsistent"] += 1  # an unclean promotion replaced a value there
            continue
        detail = f"{len(values)} values: {sorted(values)[:4]!r}"
        found.append(
            Anomaly(kind="inconsistent", partition=partition, offset=offset, detail=detail)
        )
    return found


def _duplicates(places: Mapping[tuple[int, int], set[bytes]]) -> list[Anomaly]:
    where: dict[bytes, set[tuple[int, int]]] = defaultdict(set)
    for place, values in places.items():
        for value in values:
            where[value].add(place)
    found = []
    for value, spots in sorted(where.items()):
        if len(spots) < 2:
            continue
        first = min(spots)
        detail = f"{value!r} at {sorted(spots)[:4]}"
        found.append(Anomaly(kind="duplicate", partition=first[0], offset=first[1], detail=detail))
    return found


def _backwards(observations: Iterable[Observation]) -> list[Anomaly]:
    last: dict[tuple[str, int, int], int] = {}  # (consumer, assignment, partition) -> offset
    found = []
    for seen in observations:
        key = (seen.consumer, seen.assignment, seen.partition)
        previous = last.get(key)
        if previous is not None and seen.offset <= previous:
            detail = (
                f"{seen.consumer} (assignment {seen.assignment}) read {seen.offset} "
                f"after {previous}"
            )
            found.append(
                Anomaly(
                    kind="backwards", partition=seen.partition, offset=seen.offset, detail=detail
                )
            )
        last[key] = seen.offset
    return found
