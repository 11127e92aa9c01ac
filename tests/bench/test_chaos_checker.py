"""bench.chaos_checker over synthetic histories: each anomaly is found, exactly it, and
a clean history (any interleaving of consumers, rebalances and re-reads) reports none."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.chaos_checker import ANOMALY_KINDS, History, Observation, Send, check


def _clean(partitions: int = 2, per_partition: int = 5) -> History:
    """Every send acked, read once by one consumer, and all in the final read."""
    sends, seen, final = [], [], {}
    for p in range(partitions):
        final[p] = []
        for o in range(per_partition):
            value = b"v-%d-%d" % (p, o)
            sends.append(Send(value=value, partition=p, outcome="acked", offset=o))
            seen.append(
                Observation(consumer="c0", assignment=0, partition=p, offset=o, value=value)
            )
            final[p].append((o, value))
    return History(sends=sends, observations=seen, final=final)


def _only(report, kind: str, count: int = 1) -> None:
    expected = dict.fromkeys(ANOMALY_KINDS, 0)
    expected[kind] = count
    assert report.counts == expected, report.examples
    assert [a.kind for a in report.examples] == [kind] * count


def test_a_clean_history_reports_nothing():
    report = check(_clean())
    assert report.counts == dict.fromkeys(ANOMALY_KINDS, 0)
    assert (report.acked, report.failed, report.unknown) == (10, 0, 0)
    assert report.observed == 10
    assert report.final_records == 10
    assert report.anomalies == 0


def test_an_acked_value_missing_from_the_final_read_is_lost():
    history = _clean()
    final = {0: history.final[0], 1: history.final[1][:-1]}  # 1/4 truncated away
    report = check(History(sends=history.sends, observations=[], final=final))
    _only(report, "lost")
    assert (report.examples[0].partition, report.examples[0].offset) == (1, 4)


def test_an_acked_offset_skipped_while_consumers_read_past_it_is_lost():
    sends = [Send(value=b"a", partition=0, outcome="acked", offset=0)]
    seen = [Observation(consumer="c", assignment=0, partition=0, offset=1, value=b"b")]
    # "a" is in the final read, but at an offset nobody reported: the ack's offset is
    # empty in the final read, and a consumer went past it.
    history = History(sends=sends, observations=seen, final={0: [(1, b"b"), (2, b"a")]})
    report = check(history)
    assert report.counts["lost"] == 1
    assert report.counts["duplicate"] == 1  # "a" at 0 (its ack) and at 2: the same defect
    assert report.counts["inconsistent"] == 0


def test_an_implicit_ack_is_checked_against_the_final_read():
    """librdkafka acknowledges a message without an offset when a later batch of its
    producer succeeded after this one's request failed: it must be in the final read."""
    sends = [Send(value=b"a", partition=0, outcome="acked")]
    kept = check(History(sends=sends, observations=[], final={0: [(0, b"a")]}))
    assert kept.anomalies == 0
    assert kept.acked == kept.acked_without_offset == 1
    gone = check(History(sends=sends, observations=[], final={0: [(0, b"b")]}))
    _only(gone, "lost")
    assert gone.examples[0].offset == -1


def test_two_values_at_one_offset_are_inconsistent():
    history = _clean()
    seen = [
        *history.observations,
        Observation(consumer="c1", assignment=0, partition=1, offset=2, value=b"other"),
    ]
    report = check(History(sends=history.sends, observations=seen, final=history.final))
    _only(report, "inconsistent")
    assert (report.examples[0].partition, report.examples[0].offset) == (1, 2)


def test_an_ack_contradicting_the_log_is_inconsistent():
    sends = [
        Send(value=b"a", partition=0, outcome="acked", offset=0),
        Send(value=b"b", partition=0, outcome="unknown"),
    ]
    report = check(History(sends=sends, observations=[], final={0: [(0, b"b"), (1, b"a")]}))
    assert report.counts["inconsistent"] == 1
    assert report.counts["duplicate"] == 1  # "a" acked at 0, stored at 1


def test_one_value_at_two_offsets_is_a_duplicate():
    history = _clean()
    final = {0: [*history.final[0], (5, b"v-0-3")], 1: history.final[1]}
    report = check(History(sends=history.sends, observations=history.observations, final=final))
    _only(report, "duplicate")
    assert "v-0-3" in report.examples[0].detail


def test_a_retried_unknown_send_written_twice_is_a_duplicate():
    sends = [Send(value=b"x", partition=0, outcome="unknown")]
    report = check(History(sends=sends, observations=[], final={0: [(0, b"x"), (1, b"x")]}))
    _only(report, "duplicate")


def test_offsets_going_backwards_within_one_assignment():
    history = _clean(partitions=1)
    reread = Observation(consumer="c0", assignment=0, partition=0, offset=2, value=b"v-0-2")
    seen = [*history.observations, reread]
    report = check(History(sends=history.sends, observations=seen, final=history.final))
    _only(report, "backwards")
    assert "read 2 after 4" in report.examples[0].detail


def test_a_reread_after_a_rebalance_is_not_backwards():
    history = _clean(partitions=1)
    reread = [
        Observation(consumer="c0", assignment=1, partition=0, offset=o, value=b"v-0-%d" % o)
        for o in (2, 3, 4)
    ]
    report = check(
        History(
            sends=history.sends, observations=[*history.observations, *reread], final=history.final
        )
    )
    assert report.anomalies == 0


def test_unknown_and_failed_sends_may_be_absent():
    history = _clean()
    sends = [
        *history.sends,
        Send(value=b"u", partition=0, outcome="unknown"),
        Send(value=b"f", partition=1, outcome="failed"),
    ]
    report = check(History(sends=sends, observations=history.observations, final=history.final))
    assert report.anomalies == 0
    assert (report.acked, report.failed, report.unknown) == (10, 1, 1)


def test_losses_an_unclean_step_allowed_are_counted_apart():
    sends = [
        Send(value=b"a", partition=0, outcome="acked", offset=0),
        Send(value=b"b", partition=0, outcome="acked", offset=1),
    ]
    seen = [Observation(consumer="c", assignment=0, partition=0, offset=1, value=b"b")]
    final = {0: [(0, b"a"), (1, b"c")]}  # "b" replaced by "c" after an unclean promotion
    report = check(
        History(sends=sends, observations=seen, final=final, loss_allowed=frozenset({b"b"}))
    )
    assert report.anomalies == 0
    assert (report.allowed_lost, report.allowed_inconsistent) == (1, 1)
    report = check(History(sends=sends, observations=seen, final=final))
    assert (report.counts["lost"], report.counts["inconsistent"]) == (1, 1)


@st.composite
def _clean_histories(draw: st.DrawFn) -> History:
    """A log per partition; consumers read runs of it in order, each run a new
    assignment (rebalances re-read); some sends unknown, some never written."""
    partitions = draw(st.integers(1, 3))
    final: dict[int, list[tuple[int, bytes]]] = {}
    sends: list[Send] = []
    for p in range(partitions):
        length = draw(st.integers(0, 12))
        final[p] = [(o, b"%d:%d" % (p, o)) for o in range(length)]
        for o, value in final[p]:
            acked = draw(st.booleans())
            sends.append(
                Send(
                    value=value,
                    partition=p,
                    outcome="acked" if acked else "unknown",
                    offset=o if acked else None,
                )
            )
        sends.append(Send(value=b"never-%d" % p, partition=p, outcome="unknown"))
    observations: list[Observation] = []
    for consumer in ("c0", "c1"):
        for assignment in range(draw(st.integers(0, 3))):
            p = draw(st.integers(0, partitions - 1))
            if not final[p]:
                continue
            start = draw(st.integers(0, len(final[p]) - 1))
            stop = draw(st.integers(start, len(final[p])))
            observations += [
                Observation(
                    consumer=consumer, assignment=assignment, partition=p, offset=o, value=v
                )
                for o, v in final[p][start:stop]
            ]
    # Interleave the consumers, each keeping its own order (as recording threads do).
    queues = {c: [s for s in observations if s.consumer == c] for c in ("c0", "c1")}
    merged: list[Observation] = []
    while queues["c0"] or queues["c1"]:
        pick = draw(st.sampled_from([c for c in ("c0", "c1") if queues[c]]))
        merged.append(queues[pick].pop(0))
    return History(sends=sends, observations=merged, final=final)


@settings(max_examples=200, deadline=None)
@given(_clean_histories())
def test_any_clean_history_reports_no_anomaly(history):
    report = check(history)
    assert report.counts == dict.fromkeys(ANOMALY_KINDS, 0), report.examples


@settings(max_examples=200, deadline=None)
@given(_clean_histories(), st.data())
def test_a_value_moved_in_the_final_read_is_always_found(history, data):
    acked = [s for s in history.sends if s.outcome == "acked"]
    if not acked:
        return
    victim = data.draw(st.sampled_from(acked))
    assert victim.offset is not None
    records = list(history.final[victim.partition])
    records[victim.offset] = (victim.offset, b"intruder")  # the acked value is gone
    final = {**history.final, victim.partition: records}
    report = check(History(sends=history.sends, observations=[], final=final))
    assert report.counts["lost"] == 1
    assert report.counts["inconsistent"] == 1  # the ack and the log disagree there
    assert report.counts["duplicate"] == report.counts["backwards"] == 0
