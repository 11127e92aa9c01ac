"""``mqstore compact`` and ``topics create|alter --topic-config`` (mqstore.cli_compact),
run as a user runs them: ``python -m mqstore`` in a child process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mqstore.test_cli import assert_one_line_error, json_lines, mqstore

SEGMENTED = ("--engine", "segmented")
SMALL_SEGMENTS = ("--config", "segment_bytes=1024")


def test_a_compacted_topic_from_the_shell(tmp_path: Path) -> None:
    pytest.importorskip("mqstore.segmented")
    store = tmp_path / "k"
    engine = (*SEGMENTED, *SMALL_SEGMENTS)
    mqstore(store, *engine, "topics", "create", "cfg", "--topic-config", "cleanup.policy=compact")
    for start in range(0, 200, 25):  # batches under segment_bytes: several segments
        lines = b"".join(b"key-%d:value-%03d\n" % (i % 4, i) for i in range(start, start + 25))
        mqstore(store, *engine, "produce", "cfg", "--key-separator", ":", stdin=lines)
    altered = mqstore(
        store, *engine, "topics", "alter", "cfg", "--topic-config", "max.compaction.lag.ms=2000"
    )
    assert b"max.compaction.lag.ms=2000" in altered.stdout
    described = mqstore(store, *engine, "topics", "describe", "cfg", "--json")
    (data,) = json_lines(described)
    assert data["configs"]["cleanup.policy"] == "compact"
    assert data["configs"]["max.compaction.lag.ms"] == 2000
    text = mqstore(store, *engine, "topics", "describe", "cfg").stdout.decode()
    assert "CleanupPolicy: compact" in text and "max.compaction.lag.ms: 2000" in text
    (result,) = json_lines(mqstore(store, *engine, "compact", "cfg", "--json"))
    assert result["partition"] == 0 and result["keys"] == 4
    assert result["bytes_read"] > result["bytes_written"] > 0
    consumed = mqstore(store, *engine, "consume", "cfg", "--from", "earliest", "--json")
    values = [json.loads(line)["value"] for line in consumed.stdout.decode().splitlines()]
    assert values[-4:] == ["value-196", "value-197", "value-198", "value-199"]
    assert len(values) < 50  # the active segment's records, and one per key before it
    stats = mqstore(store, *engine, "stats").stdout.decode()
    assert "cleaner_passes" in stats
    verified = mqstore(store, *engine, "verify").stdout.decode()  # gaps are not corruption
    assert "no problem" in verified


def test_a_compacted_topic_on_the_commitlog_engine_from_the_shell(tmp_path: Path) -> None:
    """The default engine: the topic's queues are copied and the copies compacted
    (mqstore.compaction); ``compact`` cleans everything copied."""
    store = tmp_path / "c"
    mqstore(store, "topics", "create", "cfg", "--topic-config", "cleanup.policy=compact")
    lines = b"".join(b"key-%d:value-%03d\n" % (i % 4, i) for i in range(200))
    mqstore(store, "produce", "cfg", "--key-separator", ":", stdin=lines)
    described = mqstore(store, "topics", "describe", "cfg", "--json")
    (data,) = json_lines(described)
    assert data["configs"]["cleanup.policy"] == "compact"
    (result,) = json_lines(mqstore(store, "compact", "cfg", "--json"))
    assert result["partition"] == 0 and result["keys"] == 4
    assert result["bytes_read"] > result["bytes_written"] > 0
    consumed = mqstore(store, "consume", "cfg", "--from", "earliest", "--json")
    records = [json.loads(line) for line in consumed.stdout.decode().splitlines()]
    assert [r["value"] for r in records] == ["value-196", "value-197", "value-198", "value-199"]
    assert [r["offset"] for r in records] == [196, 197, 198, 199]
    stats = mqstore(store, "stats").stdout.decode()
    assert "compaction_files" in stats and "compaction_bytes" in stats
    # The cleaner's figures, as its last round wrote them for readers like this one.
    (figures,) = json_lines(mqstore(store, "stats", "--json"))
    assert figures["compaction_cleaner_passes"] == 1
    assert figures["compaction_cleaner_last_keys"] == 4
    assert figures["compaction_cleaner_bytes_read"] == result["bytes_read"]


def test_keyless_records_and_bad_settings_are_one_line_errors(tmp_path: Path) -> None:
    pytest.importorskip("mqstore.segmented")
    store = tmp_path / "k"
    mqstore(
        store, *SEGMENTED, "topics", "create", "cfg", "--topic-config", "cleanup.policy=compact"
    )
    result = mqstore(store, *SEGMENTED, "produce", "cfg", stdin=b"no key\n", code=1)
    assert_one_line_error(result, "without a key")
    result = mqstore(store, *SEGMENTED, "topics", "alter", "cfg", "--topic-config", "x", code=1)
    assert_one_line_error(result, "KEY=VALUE")
    result = mqstore(store, *SEGMENTED, "topics", "alter", "cfg", code=1)
    assert_one_line_error(result, "--topic-config")
    mqstore(store, *SEGMENTED, "topics", "create", "plain")
    result = mqstore(store, *SEGMENTED, "compact", "plain", code=1)
    assert_one_line_error(result, "nothing to compact")
    commitlog = tmp_path / "c"
    mqstore(commitlog, "topics", "create", "t", "--topic-config", "cleanup.policy=compact")
    result = mqstore(commitlog, "produce", "t", stdin=b"no key\n", code=1)
    assert_one_line_error(result, "without a key")
    mqstore(commitlog, "topics", "create", "plain")
    result = mqstore(commitlog, "compact", "plain", code=1)
    assert_one_line_error(result, "nothing to compact")
