"""The ``mqstore`` command line, run as users run it: ``python -m mqstore`` in a subprocess.

Stores are small (1 MiB CommitLog files, no pre-warm, small index and queue files, set
in ``$MQSTORE_CONFIG`` as a user's shell would) so that each run takes about the
interpreter's start-up time.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = (
    "commitlog_file_size_bytes=1048576 consumequeue_units_per_file=1024 "
    "index_slot_count=1024 index_entry_count=4096 prewarm=false"
)
RUN_TIMEOUT_S = 60


def mqstore(
    store: Path,
    *args: str,
    stdin: bytes | None = None,
    code: int | None = 0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m mqstore --store STORE ARGS`` in the store's parent directory;
    check the exit code unless it is None."""
    result = subprocess.run(
        [sys.executable, "-m", "mqstore", "--store", str(store), *args],
        input=stdin,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        cwd=store.parent,
        env={**_env(), **(env or {})},
    )
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    return result


def spawn(store: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start ``python -m mqstore --store STORE ARGS`` with its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "mqstore", "--store", str(store), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "MQSTORE_STORE": "/nonexistent-mqstore-store",  # every run names its store
        "MQSTORE_CONFIG": SMALL,
    }


def json_lines(result: subprocess.CompletedProcess[bytes]) -> list[dict]:
    return [json.loads(line) for line in result.stdout.decode().splitlines()]


def assert_one_line_error(result: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    err = result.stderr.decode()
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mqstore: error: ")
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0x01]))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store: topic ``orders`` (2 partitions) with keyed records."""
    store = tmp_path_factory.mktemp("populated") / "store"
    mqstore(store, "topics", "create", "orders", "--partitions", "2")
    lines = b"".join(b"order-%d:amount %d\n" % (i, i) for i in range(20))
    mqstore(store, "produce", "orders", "--key-separator", ":", "--header", "src=test", stdin=lines)
    return store


# ---------------------------------------------------------------- a newcomer's session


def test_newcomer_session(tmp_path: Path) -> None:
    store = tmp_path / "store"
    create = ["topics", "create", "orders", "--partitions", "3"]
    created = mqstore(store, "--config", "flush_mode=sync", *create)
    assert b"created topic orders with 3 partition(s)" in created.stdout

    events = tmp_path / "events.txt"
    lines = [f'order-{i}:{{"amount": {i}}}' for i in range(50)]
    events.write_text("\n".join(lines) + "\n")
    produced = mqstore(store, "produce", "orders", "--file", str(events), "--key-separator", ":")
    assert b"produced 50 record(s) to orders" in produced.stdout

    consumed = mqstore(store, "consume", "orders", "--print-key", "--key-separator", ":")
    assert sorted(consumed.stdout.decode().splitlines()) == sorted(lines)
    assert "Processed a total of 50 messages" in consumed.stderr.decode()

    found = json_lines(mqstore(store, "query-key", "orders", "order-7", "--json"))
    assert [(hit["key"], hit["value"]) for hit in found] == [("order-7", '{"amount": 7}')]
    assert found[0]["keys"] == ["order-7"]

    segment = store / "commitlog" / f"{0:020d}"
    dumped = mqstore(store, "dump", str(segment), "--print-data").stdout.decode().splitlines()
    assert dumped[0] == f"Dumping {segment} (commitlog, 1048576 bytes)"
    assert dumped[1].startswith("position: 0 physical_offset: 0 size: ")
    assert "checksum: valid" in dumped[1]
    assert "end: zeros records: 50" in dumped[-1]

    records = [line for line in json_lines(mqstore(store, "dump", str(segment), "--json"))]
    victim = next(line for line in records if line.get("keys") == ["order-7"])
    assert mqstore(store, "verify").stdout.decode().endswith(": no problem(s)\n")

    # The store is closed (every command above exited): flip a bit in a record body.
    flip_byte(segment, victim["position"] + victim["size"] - 1)
    before = digest(segment)
    verified = mqstore(store, "verify", code=2)
    out = verified.stdout.decode()
    assert f"corrupt: {segment} position {victim['position']}: checksum mismatch" in out
    assert digest(segment) == before  # verify never repairs what it checks
    assert (store / "abort").exists() is False

    report = json.loads(mqstore(store, "verify", "--json", code=2).stdout)
    assert report["ok"] is False
    assert {
        "path": str(segment),
        "position": victim["position"],
        "reason": "checksum mismatch",
    } in (report["findings"])
    partition = str(victim["queue_id"])
    consumed = mqstore(store, "consume", "orders", "--partition", partition, code=2)
    assert_one_line_error(consumed, str(segment), f"at position {victim['position']}")
    dumped = mqstore(store, "dump", str(segment), code=2).stdout.decode()
    assert f"position: {victim['position']} " in dumped
    assert "corrupt: checksum mismatch" in dumped


@pytest.mark.parametrize("shared", [True, False], ids=["shared-log", "own-files"])
def test_verify_checks_consumequeue_units_against_the_commitlog(
    tmp_path: Path, shared: bool
) -> None:
    """A queue's first units live in its topic's shared log (the default), or in files
    of its own from the first (consumequeue_shared_units_max=0)."""
    store = tmp_path / "store"
    config = [] if shared else ["--config", "consumequeue_shared_units_max=0"]
    mqstore(store, *config, "topics", "create", "t")
    mqstore(store, *config, "produce", "t", "--key", "k", stdin=b"a\nb\nc\n")
    if shared:
        unit_file = store / "consumequeue" / "t" / ".shared" / f"{0:020d}"
        position, label = 40, "shared unit t/0@1"
    else:
        unit_file = store / "consumequeue" / "t" / "0" / f"{0:020d}"
        position, label = 20, "unit t/0@1: the record at CommitLog"
    flip_byte(unit_file, position + 8)  # unit 1: the size field
    out = mqstore(store, *config, "verify", code=2).stdout.decode()
    assert f"corrupt: {unit_file} position {position}: {label}" in out
    assert "1 problem(s)" in out


# ---------------------------------------------------------------- errors and exit codes


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["consume", "nope"], ["unknown topic 'nope'"]),
        (["query-key", "nope", "k"], ["unknown topic 'nope'"]),
        (["consume"], ["required: topic", "mqstore consume --help"]),
        (["consume", "orders", "--partition", "9"], ["no partition 9"]),
        (["consume", "orders", "--from", "banana"], ["use earliest, latest or an offset"]),
        (["consume", "orders", "--from", "99"], ["offset 99 is outside partition 0's [0, 10]"]),
        (["topics", "create", "orders"], ["already exists"]),
        (["--config", "bogus=1", "stats"], ["bad --config 'bogus=1'"]),
        (["--config", "commitlog_file_size_bytes=2097152", "stats"], ["does not match"]),
        (
            ["--config", "profile=broker", "stats"],
            ["--config profile=broker (commitlog_file_size_bytes=1073741824) does not match"],
        ),
        (["--config", "profile=huge", "stats"], ["bad --config 'profile=huge'", "are broker"]),
        (["dump", "no/such/file"], ["no such file"]),
    ],
)
def test_user_errors_exit_1_with_one_line(
    populated: Path, args: list[str], needles: list[str]
) -> None:
    assert_one_line_error(mqstore(populated, *args, code=1), *needles)


def test_produce_file_states_what_it_wrote_before_a_bad_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mqstore(store, "topics", "create", "orders")
    events = tmp_path / "events.txt"
    events.write_bytes(b"a:1\nb:2\nno separator\nc:3\n")
    result = mqstore(store, "produce", "orders", "--file", str(events), "--key-separator", ":",
                     code=1)  # fmt: skip
    assert b"produced 2 record(s) to orders before the error (partition 0 offsets 0-1)" in (
        result.stdout
    )
    assert_one_line_error(result, "line 3 has no key separator")
    assert mqstore(store, "consume", "orders").stdout == b"1\n2\n"  # as stated
    again = mqstore(store, "produce", "orders", "--json", "--key-separator", ":",
                    stdin=b"d:4\nbad\n", code=1)  # fmt: skip
    [partial] = json_lines(again)
    assert partial["complete"] is False
    assert partial["partitions"] == {"0": {"records": 1, "first_offset": 2, "last_offset": 2}}


@pytest.mark.parametrize("content", ["empty", "foreign"])
def test_verify_on_a_directory_that_is_not_a_store_fails(tmp_path: Path, content: str) -> None:
    directory = tmp_path / "not-a-store"
    directory.mkdir()
    if content == "foreign":
        (directory / "notes.txt").write_text("hello")
    result = mqstore(directory, "verify", code=1)
    assert_one_line_error(result, "no store at", "nothing to verify")
    assert b"no problems" not in result.stdout


def test_cli_follows_the_one_topic_rule(tmp_path: Path) -> None:
    store = tmp_path / "store"
    off = ("--config", "auto_create_topics=false")
    mqstore(store, "topics", "create", "seed")
    assert_one_line_error(
        mqstore(store, *off, "produce", "audit", stdin=b"x\n", code=1), "unknown topic 'audit'"
    )
    assert b"audit" not in mqstore(store, "topics", "list").stdout
    mqstore(store, "produce", "audit", "--key", "k1", stdin=b"x\n")  # auto-created
    assert mqstore(store, "topics", "list").stdout.split() == [b"audit", b"seed"]
    assert mqstore(store, "consume", "audit").stdout == b"x\n"
    assert b"Keys:k1" in mqstore(store, "query-key", "audit", "k1").stdout
    assert b"audit" in mqstore(store, "offsets", "audit").stdout
    for command in (["consume", "nope"], ["offsets", "nope"], ["query-key", "nope", "k"]):
        assert_one_line_error(mqstore(store, *command, code=1), "unknown topic 'nope'")
    assert b"nope" not in mqstore(store, "topics", "list").stdout  # reads never create


def test_missing_store_is_a_user_error(tmp_path: Path) -> None:
    result = mqstore(tmp_path / "absent", "topics", "list", code=1)
    assert_one_line_error(result, "no store at")
    assert not (tmp_path / "absent").exists()  # reading never creates a store


def test_a_service_store_opens_under_another_mqstore_config(tmp_path: Path) -> None:
    """The README's order: the service example creates ./data with its sizes, then the
    CLI section exports MQSTORE_CONFIG with other ones (here 1 MiB files)."""
    from mqstore import MessageStore, StoreConfig

    store = tmp_path / "data"
    service = StoreConfig(
        commitlog_file_size_bytes=2 * 1048576, consumequeue_units_per_file=2048,
        index_slot_count=1024, index_entry_count=4096, prewarm=False, flush_mode="sync",
    )  # fmt: skip
    with MessageStore.open(store, service) as opened:
        opened.create_topic("orders", partitions=2)
        opened.put("orders", 0, b"from the service")
    described = mqstore(store, "topics", "describe", "orders").stdout.decode()
    assert described.startswith("Topic: orders\tPartitions: 2")
    mqstore(store, "produce", "orders", stdin=b"a\nb\n")
    consumed = mqstore(store, "consume", "orders").stdout.decode()
    assert sorted(consumed.splitlines()) == ["a", "b", "from the service"]
    assert (store / "commitlog" / f"{0:020d}").stat().st_size == 2 * 1048576
    # Only an explicit --config that contradicts the layout is refused, and named.
    refused = mqstore(store, "--config", "commitlog_file_size_bytes=1048576", "stats", code=1)
    assert_one_line_error(
        refused,
        "--config commitlog_file_size_bytes=1048576 does not match",
        "created with commitlog_file_size_bytes=2097152",
    )


def test_config_profile_broker_creates_a_store_with_rocketmqs_sizes(tmp_path: Path) -> None:
    """--config profile=broker after $MQSTORE_CONFIG's small sizes: RocketMQ's sizes
    for a new store, recorded; later runs adopt them whatever $MQSTORE_CONFIG says."""
    stats = os.statvfs(tmp_path)
    if stats.f_bavail * stats.f_frsize < 3 << 30:
        pytest.skip("needs 3 GiB free: two 1 GiB CommitLog files and a 420 MB index")
    store = tmp_path / "store"
    broker = ("--config", "profile=broker", "--config", "prewarm=false")
    mqstore(store, *broker, "topics", "create", "orders")
    assert (store / "commitlog" / f"{0:020d}").stat().st_size == 1 << 30
    mqstore(store, *broker, "produce", "orders", "--key", "k", stdin=b"a\n")  # it agrees
    [index_file] = os.listdir(store / "index")
    assert (store / "index" / index_file).stat().st_size == 420_000_048
    mqstore(store, "produce", "orders", stdin=b"b\n")  # $MQSTORE_CONFIG's 1 MiB yields
    assert sorted(os.listdir(store / "commitlog"))[0] == f"{0:020d}"
    assert (store / "commitlog" / f"{0:020d}").stat().st_size == 1 << 30
    assert mqstore(store, "consume", "orders").stdout == b"a\nb\n"


def test_a_profile_in_mqstore_config_yields_to_a_stores_layout(populated: Path) -> None:
    env = {"MQSTORE_CONFIG": f"{SMALL} profile=broker"}
    assert b"orders" in mqstore(populated, "topics", "list", env=env).stdout
    stats = json_lines(mqstore(populated, "stats", "--json", env=env))
    assert stats  # opened with the store's own (1 MiB) layout


def test_a_profile_in_mqstore_config_is_skipped_by_the_segmented_engine(tmp_path: Path) -> None:
    pytest.importorskip("mqstore.segmented")
    env = {"MQSTORE_CONFIG": "profile=broker"}
    mqstore(tmp_path / "kafka", "--engine", "segmented", "topics", "create", "k", env=env)


@pytest.mark.parametrize(
    "setting", ["commitlog_file_size=67108864", "prewarm", "prewarm=maybe", "profile=tiny"]
)
def test_a_bad_mqstore_config_is_a_one_line_error(tmp_path: Path, setting: str) -> None:
    store = tmp_path / "s"
    env = {"MQSTORE_CONFIG": f"prewarm=false {setting}"}
    result = mqstore(store, "topics", "create", "t", env=env, code=1)
    assert_one_line_error(result, f"bad $MQSTORE_CONFIG item {setting!r}")
    assert not store.exists()  # nothing was created with a misread config


def test_topics_show_the_retention_in_force(tmp_path: Path) -> None:
    store = tmp_path / "s"
    created = mqstore(store, "topics", "create", "usual").stdout.decode()
    assert "retention_ms 259200000 (store default, retention_hours=72.0)" in created
    mqstore(store, "topics", "create", "forever", "--retention-ms", "-1")
    text = mqstore(store, "topics", "describe", "forever", "usual").stdout.decode()
    assert "RetentionMs: -1 (forever, topic)\tRetentionBytes: -1 (no limit, default)" in text
    assert "RetentionMs: 259200000 (store default, retention_hours=72.0)" in text
    described = json_lines(mqstore(store, "topics", "describe", "usual", "--json"))[0]
    assert described["retention_ms"] is None  # as created: left out
    assert described["effective_retention_ms"] == 259200000
    assert described["effective_retention_ms_source"] == "store default, retention_hours=72.0"


def test_debug_shows_the_traceback(populated: Path) -> None:
    err = mqstore(populated, "--debug", "consume", "nope", code=1).stderr.decode()
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "mqstore: error: unknown topic 'nope'"


# ---------------------------------------------------------------- output


def test_json_output_parses(populated: Path) -> None:
    topics = json_lines(mqstore(populated, "topics", "list", "--json"))
    assert [topic["name"] for topic in topics] == ["orders"]
    [described] = json_lines(mqstore(populated, "topics", "describe", "orders", "--json"))
    assert described["partitions"] == 2
    assert sum(p["latest"] for p in described["offsets"]) == 20

    records = json_lines(mqstore(populated, "consume", "orders", "--json"))
    assert len(records) == 20
    first = records[0]
    assert set(first) == {
        "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers"
    }  # fmt: skip
    assert first["timestamp_type"] == "CreateTime"
    assert first["headers"] == [{"key": "src", "value": "test"}]
    by_key = {record["key"]: record["value"] for record in records}
    assert by_key["order-3"] == "amount 3"

    rows = json_lines(mqstore(populated, "offsets", "orders", "--time", "0", "--json"))
    assert [(row["partition"], row["earliest"], row["offset_for_time"]) for row in rows] == [
        (0, 0, 0),
        (1, 0, 0),
    ]
    [stats] = json_lines(mqstore(populated, "stats", "--json"))
    assert stats["dispatch_lag_bytes"] == 0
    assert stats["topics"] == 1
    assert stats["queues"] == 2
    assert stats["commitlog_bytes"] >= 1048576
    [report] = json_lines(mqstore(populated, "verify", "--json"))
    assert report["ok"] is True
    assert report["counts"]["records"] == 20
    assert report["counts"]["units"] == 20


def test_binary_values_come_back_as_base64(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mqstore(store, "topics", "create", "bin")
    mqstore(store, "produce", "bin", stdin=b"\xff\xfe\n")
    [record] = json_lines(mqstore(store, "consume", "bin", "--json"))
    assert record["value_base64"] == "//4="
    assert record["key"] is None
    assert mqstore(store, "consume", "bin").stdout == b"\xff\xfe\n"


def test_consume_positions_times_and_groups(populated: Path) -> None:
    out = mqstore(populated, "consume", "orders", "--partition", "0", "--from", "latest").stdout
    assert out == b""
    future = mqstore(populated, "consume", "orders", "--from-time", "2999-01-01T00:00:00Z")
    assert future.stdout == b""
    past = mqstore(
        populated, "consume", "orders", "--from-time", "2000-01-01", "--max-messages", "3"
    )
    assert len(past.stdout.splitlines()) == 3
    meta = mqstore(populated, "consume", "orders", "--partition", "1", "--print-metadata")
    assert meta.stdout.decode().startswith("Partition:1\tOffset:0\tCreateTime:")


def test_global_options_work_after_the_command(populated: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mqstore", "topics", "list", "--store", str(populated), "--json"],
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "orders"


def test_help_reads_well(populated: Path) -> None:
    text = mqstore(populated, "--help").stdout.decode()
    for command in ("topics", "produce", "consume", "offsets", "query-key", "dump", "verify"):
        assert command in text
    assert "exit codes: 0 success, 1 user error, 2 corrupt data found." in text
    assert "--follow" in mqstore(populated, "consume", "--help").stdout.decode()


# ---------------------------------------------------------------- --follow


def test_follow_stops_after_the_idle_timeout(populated: Path) -> None:
    started = time.monotonic()
    result = mqstore(populated, "consume", "orders", "--follow", "--timeout-ms", "600")
    assert len(result.stdout.splitlines()) == 20
    assert time.monotonic() - started >= 0.6


def test_follow_sees_records_a_writer_appends(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mqstore(store, "topics", "create", "live", "--partitions", "2")
    mqstore(store, "produce", "live", "--partition", "0", stdin=b"first\n")
    # An idle timeout far above a loaded machine's CLI start-up (over 1 s was seen):
    # the test stops the follower with SIGINT once it printed both records.
    follower = spawn(store, "consume", "live", "--follow", "--timeout-ms", "60000")
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"first\n"  # it is polling now
        mqstore(store, "produce", "live", "--key-separator", "=", stdin=b"a=1\nb=2\n")
        lines = [follower.stdout.readline(), follower.stdout.readline()]
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert sorted(b"".join(lines).decode().splitlines()) == ["1", "2"]
    assert out == b""
    assert b"Processed a total of 3 messages" in err


def test_sigint_stops_follow_and_commits_the_group(populated: Path) -> None:
    follower = spawn(populated, "consume", "orders", "--follow", "--group", "billing")
    try:
        assert follower.stdout is not None
        received = [follower.stdout.readline() for _ in range(20)]
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert all(received)
    assert b"Processed a total of 20 messages" in err
    rows = json_lines(mqstore(populated, "offsets", "orders", "--group", "billing", "--json"))
    assert [(row["committed"], row["lag"]) for row in rows] == [
        (rows[0]["latest"], 0),
        (rows[1]["latest"], 0),
    ]


# ---------------------------------------------------------------- dump


def test_dump_decodes_every_file_of_a_store(populated: Path) -> None:
    lines = json_lines(mqstore(populated, "dump", str(populated), "--json"))
    kinds = {line["kind"] for line in lines if "kind" in line}
    # Earlier tests' commits made __consumer_offsets, a compacted topic: its copy's
    # segments (compaction/) are dumped too.
    copies = {"segment-log", "segment-index", "segment-timeindex"}
    assert kinds - copies == {"checkpoint", "commitlog", "consumequeue-shared", "index"}
    # Units of the orders' records (earlier tests' commits add __consumer_offsets')
    orders = {line["physical_offset"] for line in lines if line.get("topic") == "orders"}
    units = [line for line in lines if line.get("commitlog_offset") in orders]
    assert len(units) == 20
    assert all(line["timestamp_ms"] > 0 for line in units)
    entries = [line for line in lines if "key_hash" in line]
    assert len(entries) == 20
    [valid] = [line for line in lines if line.get("state") == "valid" and line["sequence"] > 1][:1]
    assert valid["dispatched_position"] == valid["flushed_position"] > 0
    assert not [line for line in lines if "corrupt" in line]


def test_dump_decodes_queues_with_files_of_their_own(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = ["--config", "consumequeue_shared_units_max=0"]
    mqstore(store, *config, "produce", "t", "--key", "k", stdin=b"a\nb\n")
    lines = json_lines(mqstore(store, "dump", str(store / "consumequeue"), "--json"))
    kinds = {line["kind"] for line in lines if "kind" in line}
    assert kinds == {"consumequeue", "consumequeue-time"}
    units = [line for line in lines if "commitlog_offset" in line]
    assert [unit["queue_offset"] for unit in units] == [0, 1]
    assert all(unit["timestamp_ms"] > 0 for unit in units)


def test_dump_refuses_a_file_it_cannot_place(populated: Path) -> None:
    result = mqstore(populated, "dump", str(populated / "topics"), code=1)
    assert_one_line_error(result, "cannot tell what kind of file", "--kind")


# ---------------------------------------------------------------- the segmented engine


def test_segmented_engine_round_trip_dump_and_verify(tmp_path: Path) -> None:
    pytest.importorskip("segmented")
    store = tmp_path / "kafka"
    engine = ["--engine", "segmented"]
    mqstore(store, *engine, "topics", "create", "k")
    mqstore(store, *engine, "produce", "k", "--key", "id", "--header", "h=v", stdin=b"x\ny\n")
    records = json_lines(mqstore(store, *engine, "consume", "k", "--json"))
    assert [(r["key"], r["value"], r["headers"]) for r in records] == [
        ("id", "x", [{"key": "h", "value": "v"}]),
        ("id", "y", [{"key": "h", "value": "v"}]),
    ]
    log_file = store / "k-0" / f"{0:020d}.log"
    dumped = mqstore(store, "dump", str(log_file), "--print-data").stdout.decode().splitlines()
    assert dumped[1].startswith("baseOffset: 0 lastOffset: 1 count: 2 position: 0 ")
    assert "isvalid: true" in dumped[1]
    assert dumped[2].startswith("| offset: 0 position: 61 CreateTime: ")
    assert dumped[2].endswith("key: id payload: x headers: [h=v]")
    assert mqstore(store, *engine, "verify").stdout.decode().endswith(": no problem(s)\n")
    flip_byte(log_file, log_file.stat().st_size - 1)
    out = mqstore(store, *engine, "verify", code=2).stdout.decode()
    assert f"corrupt: {log_file} position 0: CRC-32C mismatch" in out
