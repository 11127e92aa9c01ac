"""The power-loss harness as a test: a short run of PowerFS cuts under the crash
harness's workload, every acknowledged message checked.

``make powerloss`` runs 200 cuts and prints the figures. Skipped without /dev/fuse or
mfusepy, unless MQSTORE_REQUIRE_FUSE=1 (``make test``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.powerfs import available
from bench.powerloss import LOSS_WINDOW_MS, PowerHarness, run

REASON = available()
REQUIRED = os.environ.get("MQSTORE_REQUIRE_FUSE") == "1"
needs_fuse = pytest.mark.skipif(
    REASON is not None and not REQUIRED, reason=f"PowerFS cannot run here: {REASON}"
)
CUTS = 16  # about 30 s on this 2-core machine: 8 sync and 8 async cuts
SEED = 3


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> PowerHarness:
    """One short run shared by the assertions below (about 30 s)."""
    return run(CUTS, seed=SEED, path=str(tmp_path_factory.mktemp("powerloss")), key_samples=0)


@needs_fuse
def test_power_cuts_lose_no_acknowledged_sync_record_and_corrupt_nothing(short_run):
    harness = short_run
    figures, power = harness.figures, harness.power
    problems = figures.problems
    assert power.cuts == CUTS
    assert figures.acked_messages > 1_000  # the workload really ran
    assert figures.acked_checks > 0
    assert power.dirty_pages > 0  # the cuts really lost data
    assert figures.losses == 0, problems  # under sync flush, and anything older
    assert figures.corrupt_reads == 0, problems
    assert figures.wrong_content == 0, problems
    assert figures.gaps == 0, problems
    assert figures.duplicates == 0, problems
    assert figures.commit_violations == 0, problems
    assert power.async_cuts_with_loss > 0  # the simulation is real: async loses its tail


@needs_fuse
def test_every_power_cut_reopens_and_async_loses_only_each_queues_tail(short_run):
    harness = short_run
    power, problems = harness.power, harness.figures.problems
    assert power.refusals == 0, problems
    assert harness.figures.child_failures == 0, problems
    assert power.async_bound_violations == 0, problems


@needs_fuse
def test_key_look_ups_find_every_record_after_power_cuts(short_run):
    """Every live key is looked up after every cut (issue 13: stale index entries past
    the count, counted again by a later cut, cut chains; see
    test_stale_entries_past_the_count_are_never_counted_again)."""
    assert short_run.figures.key_queries > 0
    assert short_run.figures.key_misses == 0, short_run.figures.problems


@needs_fuse
def test_async_losses_lie_above_the_last_completed_flush(short_run):
    """An ack whose record a completed flush covered is never lost (issue 13: the old
    check held losses to an age window, which the flush's own duration exceeds under
    load; the oldest loss's age is now a figure)."""
    power = short_run.power
    assert power.async_lost_checked > 0  # the losses had known ends: the check ran
    assert power.async_losses_below_flush == 0, short_run.figures.problems


@needs_fuse
def test_the_control_run_loses_nothing(tmp_path):
    """Cuts that keep everything: any violation would be the harness's own."""
    harness = run(2, seed=SEED, path=str(tmp_path), lose="nothing")
    assert harness.power.cuts == 2
    assert harness.figures.acked_checks > 0
    assert harness.power.async_lost == 0
    assert not harness.failed, harness.figures.problems


def test_the_tail_check_can_fail(tmp_path):
    """A loss that is not the tail of its queue is a violation; an old one is counted."""
    harness = PowerHarness(str(tmp_path), seed=1)
    harness.kill_time = 100.0
    acks = [("crash", 0, offset) for offset in range(4)] + [("raw", 0, 0)]
    harness.child_acks = {where: (order, 99.9) for order, where in enumerate(acks)}
    harness.cut_lost = acks[2:4]  # the tail of crash/0, 100 ms old: allowed
    harness._check_tail()
    assert harness.power.async_bound_violations == 0
    assert harness.power.async_lost == 2
    harness.cut_lost = acks[1:2]  # crash/0 offsets 2 and 3 kept after a lost 1
    harness._check_tail()
    assert harness.power.async_bound_violations == 1
    assert harness.failed
    harness.child_acks[acks[3]] = (3, 100.0 - (LOSS_WINDOW_MS + 1) / 1000)
    harness.cut_lost = acks[3:4]  # the tail, older than the window: a figure only
    harness._check_tail()
    assert harness.power.async_bound_violations == 1
    assert harness.power.async_old_losses == 1
    assert harness.power.async_losses_below_flush == 0


def test_the_flushed_mark_check_can_fail(tmp_path):
    """A lost ack that a completed flush covered ("W" <= the last "F") is a violation;
    one past the mark is the unflushed tail."""
    harness = PowerHarness(str(tmp_path), seed=1)
    harness.kill_time = 100.0
    harness.received = [(10_000, 99.9)]
    log = Path(harness.path) / "commitlog"
    log.mkdir(parents=True)
    (log / f"{300:020d}").write_bytes(b"")  # the recovered log starts at 300
    lines = b"B 400\nA crash 0 0 1\nW 500\nF 800\nB 500\nA crash 0 1 2\nW 900\n"
    harness._absorb(lines)
    assert harness.ack_spans == {("crash", 0, 0): (400, 500), ("crash", 0, 1): (500, 900)}
    assert harness.flushed_mark == 800
    harness.cut_lost = [("crash", 0, 1)]  # ended past the mark: may be lost
    harness._check_tail()
    assert harness.power.async_losses_below_flush == 0
    assert not harness.failed
    (log / f"{300:020d}").rename(log / f"{600:020d}")
    harness.cut_lost = [("crash", 0, 0), ("crash", 0, 1)]  # offset 0: retention took it
    harness._check_tail()
    assert harness.power.async_losses_below_flush == 0
    (log / f"{600:020d}").rename(log / f"{300:020d}")
    harness._check_tail()  # offset 0 was flushed and its file kept: a violation
    assert harness.power.async_losses_below_flush == 1
    assert harness.failed


_PHASE = """
import sys, time
from bench.powerloss import per_path_syncs
from mqstore import MessageStore, StoreConfig

path, phase = sys.argv[1], sys.argv[2]
config = StoreConfig(
    flush_mode="sync", prewarm=False, commitlog_file_size_bytes=1 << 20,
    checkpoint_interval_ms=100 if phase == "reopen" else 600_000,
    consumequeue_flush_interval_ms=3_600_000,
)
with per_path_syncs():
    store = MessageStore.open(path, config)
    first, end = {"seed": (0, 10), "write": (10, 300)}.get(phase, (0, 0))
    for i in range(first, end):
        store.put("topic", 0, b"m%d" % i)
    if phase == "seed":
        store.close()  # the topic's directories are durable from here on
        raise SystemExit(0)
    if phase == "reopen":  # until a checkpoint claims every unit
        deadline = time.monotonic() + 30
        while store._checkpoint.dispatched_position < store.commitlog.write_position:
            assert time.monotonic() < deadline, "no checkpoint claimed the units"
            time.sleep(0.01)
    print(store.max_offset("topic", 0), flush=True)
    time.sleep(60)  # until killed
"""


@needs_fuse
def test_a_queue_directory_made_before_a_kill_survives_a_later_power_cut(tmp_path):
    """The chaos suite's stalled dispatcher, replayed: a queue graduates to its own
    directory (at 256 units), the writer is SIGKILLed before any checkpoint synced
    that directory's entry in its parent, the next writer writes a checkpoint that
    vouches for the units in it, and the power then goes. The store must still hold
    every unit: after an unclean stop, the first checkpoint syncs what the dead
    process left unsynced (``ConsumeQueueStore.sync_everything``) before it claims.
    Without it the cut takes the directory and the queue ends at 256 with 300 records
    in the log (the dispatcher then refused the next unit as a gap)."""
    import subprocess
    import sys

    from bench.powerfs import Mount
    from mqstore import MessageStore
    from mqstore.commitlog.durable import fsync_directory

    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    store = os.path.join(mount.mountpoint, "store")
    os.makedirs(store)
    fsync_directory(mount.mountpoint)

    def phase(name: str) -> str:
        child = subprocess.Popen(
            [sys.executable, "-c", _PHASE, store, name], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        said = child.stdout.readline().strip()
        child.kill()
        child.wait(30)
        return said

    try:
        phase("seed")
        assert phase("write") == "300"  # graduated; killed with nothing synced since
        assert phase("reopen") == "300"  # recovered; a checkpoint claims them all
        mount.cut(seed=1)
        mount.mount()
        with MessageStore.open(store) as reopened:
            assert reopened.max_offset("topic", 0) == 300
            bodies = [bytes(m.body) for m in reopened.get("topic", 0, 0, 300)]
        assert bodies == [b"m%d" % i for i in range(300)]
    finally:
        mount.unmount()


_CLAIM_PHASE = """
import sys, time
from bench.powerloss import per_path_syncs
from mqstore import MessageStore, StoreConfig
from mqstore.commitlog.checkpoint import CheckpointFile

path, phase = sys.argv[1], sys.argv[2]
config = StoreConfig(
    flush_mode="async" if phase == "write" else "sync", prewarm=False,
    commitlog_file_size_bytes=1 << 20,
    checkpoint_interval_ms=100 if phase == "write" else 600_000,
    flush_interval_ms=60_000, flush_thorough_interval_ms=3_600_000,
    consumequeue_flush_interval_ms=100,
)
with per_path_syncs():
    claim = CheckpointFile(path, read_only=True).load()
    store = MessageStore.open(path, config)
    if phase == "seed":
        store.create_topic("topic", 1)
        store.put("topic", 0, b"seed")
        store.close()
        raise SystemExit(0)
    if phase == "write":  # async: a checkpoint claims units whose records are unsynced
        for i in range(300):
            store.put("topic", 0, b"m%d " % i + bytes(1000))
        deadline = time.monotonic() + 30
        while store._checkpoint.dispatched_position < store.commitlog.write_position:
            assert time.monotonic() < deadline, "no checkpoint claimed the units"
            time.sleep(0.01)
        print(store._checkpoint.dispatched_position, store.commitlog.flushed_position,
              flush=True)
    if phase == "reopen":  # sync: every put below is acknowledged as durable
        print(claim.dispatched_position, store.commitlog.write_position, flush=True)
        first = store.max_offset("topic", 0)
        for i in range(30):
            store.put("topic", 0, b"s%d" % i)
        deadline = time.monotonic() + 30
        while store.max_offset("topic", 0) < first + 30:  # their units are written
            assert time.monotonic() < deadline, "not dispatched"
            time.sleep(0.01)
        print(store.commitlog.write_position, store.max_offset("topic", 0), flush=True)
    time.sleep(60)  # until killed
"""


@needs_fuse
def test_acknowledged_puts_survive_a_second_cut_after_a_reopen_below_the_claim(tmp_path):
    """The claim fix (b764ae5), against real power cuts. An async writer's checkpoint
    claims units whose records the flusher never synced; the power goes, so the log
    ends below the claim. The next writer (sync flush, no checkpoint of its own after
    the open's) recovers, writes 30 puts it acknowledges as durable, all below the old
    claim, and is killed; the power goes again, taking their unsynced queue units.
    Every acknowledged put must be readable from its queue: the reopen below the claim
    must not leave the old claim vouching for units it never synced."""
    import subprocess
    import sys

    from bench.powerfs import Mount
    from mqstore import MessageStore
    from mqstore.commitlog.durable import fsync_directory

    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    store = os.path.join(mount.mountpoint, "store")
    os.makedirs(store)
    fsync_directory(mount.mountpoint)

    def phase(name: str, lines: int = 1) -> list[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", _CLAIM_PHASE, store, name], stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert child.stdout is not None
        said = [child.stdout.readline().strip() for _ in range(lines)]
        if lines:
            child.kill()
        assert child.wait(30) == (-9 if lines else 0)
        return said

    try:
        phase("seed", lines=0)
        claimed, flushed = map(int, phase("write")[0].split())
        assert flushed < claimed  # the claim covers records that were never synced
        mount.cut(seed=1)
        mount.mount()
        (below, acknowledged) = phase("reopen", lines=2)
        old_claim, log_end = map(int, below.split())
        assert log_end < old_claim  # the cut took the log below the claim
        new_end, _ = map(int, acknowledged.split())
        assert new_end < old_claim  # the acknowledged puts lie below the old claim
        mount.cut(seed=2)
        mount.mount()
        with MessageStore.open(store) as reopened:
            end = reopened.max_offset("topic", 0)
            bodies = [bytes(m.body) for m in reopened.get("topic", 0, 0, end + 1)]
        assert bodies[-30:] == [b"s%d" % i for i in range(30)], bodies[-35:]
        assert bodies[0] == b"seed" and len(bodies) == end
    finally:
        mount.unmount()


_GROWING_WRITER = """
import sys, time
from bench.powerloss import per_path_syncs
from mqstore import MessageStore, StoreConfig

config = StoreConfig(
    flush_mode="async", prewarm=False, commitlog_file_size_bytes=1 << 20,
    flush_interval_ms=60_000, checkpoint_interval_ms=600_000,
)
with per_path_syncs():
    store = MessageStore.open(sys.argv[1], config)
    store.create_topic("grown", 1)
    for queue_id in range(1, 600):  # each put grows the topic, in memory
        store.put("grown", queue_id, b"q%d" % queue_id)
    store.commitlog.flush_to(store.commitlog.write_position)  # every record is durable
    print(store.commitlog.flushed_position, flush=True)
    time.sleep(60)  # until killed
"""


@needs_fuse
def test_partitions_a_put_grew_survive_a_power_cut_with_their_records(tmp_path):
    """A put that grows a topic leaves the registry file to the next dispatch round
    (TopicRegistry.grow). Records made durable before the cut must come back with
    their partitions, whether or not the registry file followed before it."""
    import subprocess
    import sys

    from bench.powerfs import Mount
    from mqstore import MessageStore
    from mqstore.commitlog.durable import fsync_directory

    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    store = os.path.join(mount.mountpoint, "store")
    os.makedirs(store)
    fsync_directory(mount.mountpoint)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _GROWING_WRITER, store], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert int(child.stdout.readline()) > 0
        child.kill()
        child.wait(30)
        mount.cut(seed=2)
        mount.mount()
        with MessageStore.open(store) as reopened:
            assert reopened.describe_topic("grown").partitions == 600
            for queue_id in range(1, 600):
                got = [bytes(m.body) for m in reopened.get("grown", queue_id, 0, 2)]
                assert got == [b"q%d" % queue_id]
    finally:
        mount.unmount()
