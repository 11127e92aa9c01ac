"""The cleaner service (segmented.log_cleaner): which log is cleaned when, its
checkpoint, failures retried with a bound, figures in stats()."""

from __future__ import annotations

import os
import time

from mqstore.segmented import SegmentedConfig, SegmentedStore
from mqstore.segmented.checkpoint import read_offsets
from mqstore.segmented.cleaner import Cleaner

from .conftest import SMALL, record

COMPACT = {"cleanup.policy": "compact"}


def _config(**overrides: object) -> SegmentedConfig:
    values = {**SMALL, "segment_bytes": 1024, "index_interval_bytes": 64, **overrides}
    return SegmentedConfig(**values)  # type: ignore[arg-type]


def _fill(store: SegmentedStore, topic: str, count: int, keys: int) -> None:
    for i in range(count):
        store.append_records(topic, 0, [record(b"value-%04d" % i, b"k%d" % (i % keys))])
    store._logs[(topic, 0)].roll()


def test_the_dirtiest_log_is_cleaned_first_and_clean_logs_wait(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        for name in ("a", "b", "c"):
            store.create_topic(name, topic_configs=COMPACT)
        _fill(store, "a", 60, 50)  # few duplicates
        _fill(store, "b", 60, 2)  # many
        results = store.cleaner.run()
        assert [r.topic for r in results] == ["a", "b"]  # both due: a 1.0 ratio each
        _fill(store, "a", 10, 50)  # a little dirt on a, much on b
        _fill(store, "b", 200, 2)
        results = store.cleaner.run()
        assert [r.topic for r in results] == ["b"]  # a's ratio is below 0.5
        assert store.cleaner.run() == []  # idle: nothing dirty
        point = read_offsets(os.path.join(tmp_path, "cleaner-offset-checkpoint"))
        assert point[("b", 0)] == store.latest_offset("b", 0)
        assert point[("a", 0)] == 60


def test_a_failing_log_is_retried_with_a_backoff_and_reported(tmp_path, clock, monkeypatch):
    config = _config(cleaner_backoff_ms=1_000)
    with SegmentedStore.open(tmp_path, config, clock_ms=clock) as store:
        store.create_topic("a", topic_configs=COMPACT)
        store.create_topic("b", topic_configs=COMPACT)
        _fill(store, "a", 60, 2)
        _fill(store, "b", 60, 2)
        real_clean = Cleaner.clean
        failing = {"a"}

        def clean(self, partition_log, *args, **kwargs):
            if partition_log.topic in failing:
                raise OSError(5, "injected I/O error")
            return real_clean(self, partition_log, *args, **kwargs)

        monkeypatch.setattr(Cleaner, "clean", clean)
        assert [r.topic for r in store.cleaner.run()] == ["b"]  # one failure stops no one
        stats = store.stats()
        assert stats["cleaner_failing_partitions"] == ["a-0"]
        assert "injected I/O error" in stats["cleaner_last_error"]
        assert stats["cleaner_failures"] == 1
        assert store.cleaner.run() == []  # backing off
        clock.advance(2_001)
        assert store.cleaner.run() == []  # retried, failed again: the backoff doubles
        assert store.stats()["cleaner_failures"] == 2
        clock.advance(2_001)
        assert store.cleaner.run() == []
        assert store.stats()["cleaner_failures"] == 2
        failing.clear()  # the cause goes away: the next retry cleans it
        clock.advance(2_000)
        assert [r.topic for r in store.cleaner.run()] == ["a"]
        assert store.stats()["cleaner_failing_partitions"] == []


def test_altering_the_topic_retries_a_failed_log_at_once(tmp_path, clock, monkeypatch):
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("a", topic_configs=COMPACT)
        _fill(store, "a", 60, 2)
        real_clean = Cleaner.clean
        monkeypatch.setattr(Cleaner, "clean", lambda *a, **k: (_ for _ in ()).throw(OSError()))
        assert store.cleaner.run() == []
        monkeypatch.setattr(Cleaner, "clean", real_clean)
        assert store.cleaner.run() == []  # backing off
        store.alter_topic("a", {"min.cleanable.dirty.ratio": "0.3"})
        assert [r.topic for r in store.cleaner.run()] == ["a"]


def test_the_cleaner_runs_on_its_schedule_and_reports_figures(tmp_path) -> None:
    config = _config(cleaner_backoff_ms=50)
    with SegmentedStore.open(tmp_path, config) as store:
        store.create_topic("a", topic_configs=COMPACT)
        _fill(store, "a", 100, 3)
        expected = [b"value-0097", b"value-0098", b"value-0099"]

        def head() -> list:
            return [r.value for r in store.read_records("a", 0, 0, 1000)][:3]

        # Under load a scheduled pass may run while _fill still appends: wait for the
        # pass that saw all of it (each later pass only cleans what is new).
        deadline = time.monotonic() + 30
        while head() != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = store.stats()
        assert stats["cleaner_passes"] >= 1
        assert stats["cleaner_bytes_read"] > stats["cleaner_bytes_written"] > 0
        assert stats["cleaner_last_keys"] == 3
        assert head() == expected


def test_the_cleaner_point_survives_a_reopen(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("a", topic_configs=COMPACT)
        _fill(store, "a", 60, 2)
        store.compact("a")
        point = store.cleaner.checkpoint("a", 0)
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        assert store.cleaner.checkpoint("a", 0) == point == 60
        assert store.cleaner.run() == []


def test_a_corrupt_cleaner_checkpoint_starts_over(tmp_path, clock) -> None:
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic("a", topic_configs=COMPACT)
        _fill(store, "a", 60, 2)
        store.compact("a")
    with open(os.path.join(tmp_path, "cleaner-offset-checkpoint"), "wb") as handle:
        handle.write(b"\xff garbage")
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        assert store.cleaner.checkpoint("a", 0) == 0
        assert len(store.compact("a")) == 1
        assert [r.offset for r in store.read_records("a", 0, 0, 100)] == [58, 59]


def test_retention_deleting_a_segment_mid_pass_aborts_that_group_quietly(tmp_path, clock):
    with SegmentedStore.open(tmp_path, _config(), clock_ms=clock) as store:
        store.create_topic(
            "a", cleanup_policy="compact,delete", topic_configs={"retention.ms": "60000"}
        )
        _fill(store, "a", 60, 2)
        clock.advance(30_000)
        _fill(store, "a", 60, 2)  # younger segments retention keeps
        deleted = []

        def hook(stage: str) -> None:
            if stage == "cleaned" and not deleted:
                clock.advance(40_000)  # the first 60 records are now past retention
                deleted.append(store.enforce_retention())

        store.cleaner.cleaner.stage_hook = hook
        results = store.cleaner.run()
        assert deleted[0] > 0 and len(results) == 1
        assert store.stats()["cleaner_failures"] == 0
        got = [r.offset for r in store.read_records("a", 0, store.earliest_offset("a", 0), 1000)]
        assert got == sorted(set(got)) and got[-2:] == [118, 119]
        assert not [n for n in os.listdir(tmp_path / "a-0") if n.endswith((".cleaned", ".swap"))]
