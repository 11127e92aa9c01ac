"""Offset planning without Spark, against a fake store state."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mqstore import InvalidArgumentError
from mqstore.spark import offsets as plan


class FakeState:
    def __init__(self, bounds, stamps=None):
        self.bounds = bounds  # (topic, partition) -> (earliest, latest)
        self.stamps = stamps or {}  # (topic, partition) -> [timestamp per offset]

    def list_topics(self):
        counts = {}
        for topic, partition in self.bounds:
            counts[topic] = max(counts.get(topic, 0), partition + 1)
        return {t: SimpleNamespace(partitions=n) for t, n in counts.items()}

    def earliest_offset(self, topic, partition):
        return self.bounds[(topic, partition)][0]

    def latest_offset(self, topic, partition):
        return self.bounds[(topic, partition)][1]

    def offset_for_timestamp(self, topic, partition, timestamp_ms):
        for offset, stamp in enumerate(self.stamps.get((topic, partition), [])):
            if stamp >= timestamp_ms and offset >= self.earliest_offset(topic, partition):
                return offset, stamp
        return None


STATE = FakeState(
    {("a", 0): (0, 100), ("a", 1): (10, 50), ("b", 0): (0, 0), ("ab", 0): (0, 5)},
    {("a", 0): [i * 10 for i in range(100)], ("a", 1): [i * 10 for i in range(50)]},
)


def _plan(**raw):
    options = plan.ReadOptions.parse({"path": "/x", **raw})
    tps = plan.subscribed_partitions(options, STATE)
    start = plan.starting_offsets(options, STATE, tps)
    end = plan.ending_offsets(options, STATE, tps)
    return plan.plan_ranges(start, end, STATE, options.fail_on_data_loss)


def test_subscriptions():
    assert [r.topic for r in _plan(subscribe="a,b")] == ["a", "a"]  # b is empty
    assert {r.topic for r in _plan(subscribePattern="a.*")} == {"a", "ab"}
    assert _plan(assign=json.dumps({"a": [1]})) == [plan.OffsetRange("a", 1, 10, 50)]
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        plan.ReadOptions.parse({"path": "/x", "subscribe": "a", "assign": "{}"})
    with pytest.raises(InvalidArgumentError, match="do not exist"):
        _plan(subscribe="nope")


def test_offsets_json_with_sentinels_and_case_insensitive_names():
    ranges = _plan(
        subscribe="a",
        STARTINGOFFSETS=json.dumps({"a": {"0": 23, "1": -2}}),
        endingoffsets=json.dumps({"a": {"0": -1, "1": 20}}),
    )
    assert ranges == [plan.OffsetRange("a", 0, 23, 100), plan.OffsetRange("a", 1, 10, 20)]
    with pytest.raises(InvalidArgumentError, match="latest"):
        _plan(subscribe="a", startingOffsets="latest")


def test_timestamps_and_strategy():
    ranges = _plan(subscribe="a", startingTimestamp="200", endingTimestamp="305")
    assert ranges == [plan.OffsetRange("a", 0, 20, 31), plan.OffsetRange("a", 1, 20, 31)]
    by_ts = json.dumps({"a": {"0": 990}})
    assert _plan(assign='{"a": [0]}', startingOffsetsByTimestamp=by_ts) == [
        plan.OffsetRange("a", 0, 99, 100)
    ]
    with pytest.raises(InvalidArgumentError, match="no offset"):
        _plan(assign='{"a": [0]}', startingTimestamp="5000")
    assert (
        _plan(
            assign='{"a": [0]}',
            startingTimestamp="5000",
            startingOffsetsByTimestampStrategy="latest",
        )
        == []
    )


def test_data_loss():
    starting = json.dumps({"a": {"1": 0}})
    with pytest.raises(plan.DataLossError):
        _plan(assign='{"a": [1]}', startingOffsets=starting)
    assert _plan(assign='{"a": [1]}', startingOffsets=starting, failOnDataLoss="false") == [
        plan.OffsetRange("a", 1, 10, 50)
    ]


def test_split_ranges_cover_parents_proportionally():
    ranges = [plan.OffsetRange("a", 0, 0, 90), plan.OffsetRange("a", 1, 0, 10)]
    split = plan.split_ranges(ranges, 10)
    assert len(split) == 10
    assert sum(r.size for r in split if r.partition == 0) == 90
    assert [r for r in split if r.partition == 1] == [ranges[1]]
    assert plan.split_ranges(ranges, 2) == ranges
    assert plan.split_ranges([plan.OffsetRange("a", 0, 0, 3)], 8) == [
        plan.OffsetRange("a", 0, i, i + 1) for i in range(3)
    ]


def test_rate_limit_and_json_round_trip():
    start = {("a", 0): 0, ("a", 1): 0}
    latest = {("a", 0): 90, ("a", 1): 10}
    assert plan.rate_limit(start, latest, 10) == {("a", 0): 9, ("a", 1): 1}
    assert plan.rate_limit(start, latest, 1000) == latest
    document = plan.offsets_to_json({("t", 10): 5, ("t", 2): 7})
    assert list(document["t"]) == ["2", "10"]
    assert plan.offsets_from_json(json.loads(json.dumps(document))) == {("t", 2): 7, ("t", 10): 5}
