"""Power cuts during a compaction pass, on both engines (issue 17): a child writes
keyed records durably, starts a pass and is SIGKILLed at a stage of it; PowerFS then
loses what no sync covered (unsynced pages reverted, kept or torn; unsynced renames
and creations undone) and the store must open with every record the model keeps.

The first stage, ``appended``, kills before any pass: in sync mode every append was
acknowledged durable, so the segment files' names must be too (the segmented engine
lost whole partitions to a power cut until a new segment's directory was synced).
The other stages are the cleaner's (segmented.cleaner: ``cleaned`` written and synced,
``swap`` renamed, old segments ``deleted``, ``swapped`` into place) and, on the
CommitLog engine, ``copied`` (the queue copied into its compaction log, not yet
cleaned). Skipped without /dev/fuse or mfusepy, unless MQSTORE_REQUIRE_FUSE=1
(``make test``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bench.powerfs import Mount, available
from mqstore.commitlog.durable import fsync_directory

REASON = available()
REQUIRED = os.environ.get("MQSTORE_REQUIRE_FUSE") == "1"
pytestmark = pytest.mark.skipif(
    REASON is not None and not REQUIRED, reason=f"PowerFS cannot run here: {REASON}"
)

RECORDS = 300
KEYS = 7
NOW_MS = 1_700_000_000_000
SEEDS = (11, 12)  # two different cuts (revert / keep / tear choices) per stage

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    engine, root, stage = sys.argv[1], sys.argv[2], sys.argv[3]
    def kill(reached):
        if reached == stage:
            os.kill(os.getpid(), signal.SIGKILL)
    if engine == "segmented":
        from mqstore.engine import ProducerRecord
        from mqstore.segmented import SegmentedConfig, SegmentedStore
        config = SegmentedConfig(segment_bytes=4096, index_interval_bytes=64,
                                 index_max_bytes=4096, file_delete_delay_ms=0,
                                 cleaner_enable=False, flush_mode="sync")
        store = SegmentedStore.open(root, config, clock_ms=lambda: __NOW__)
        store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
        for i in range(__RECORDS__):
            value = None if i % 17 == 0 else b"value-%d" % i
            key = b"k%d" % (i % __KEYS__)
            store.append_records("c", 0, [ProducerRecord(key, value, [], None)])
        kill("appended")  # sync mode: every append above was acknowledged durable
        store.flush()
        store.roll("c", 0)
        store.cleaner.cleaner.stage_hook = kill
        store.compact("c")
    else:
        from mqstore import MessageStore, StoreConfig
        config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False,
                             flush_mode="sync")
        store = MessageStore.open(root, config, clock_ms=lambda: __NOW__)
        store.create_topic("c", topic_configs={"cleanup.policy": "compact"})
        for i in range(__RECORDS__):
            body = None if i % 17 == 0 else b"value-%d" % i
            store.put("c", 0, body, keys="k%d" % (i % __KEYS__))
        kill("appended")
        compaction = store._open_compaction()
        compaction.copy_all()
        kill("copied")
        compaction.store.cleaner.cleaner.stage_hook = kill
        store.compact("c")
    print("no kill")
    """
)
CHILD = (
    CHILD.replace("__NOW__", str(NOW_MS))
    .replace("__RECORDS__", str(RECORDS))
    .replace("__KEYS__", str(KEYS))
)
CLEANER_STAGES = ["cleaned", "swap", "deleted", "swapped"]


def _produced() -> dict[int, tuple[bytes, bytes | None]]:
    return {
        i: (b"k%d" % (i % KEYS), None if i % 17 == 0 else b"value-%d" % i) for i in range(RECORDS)
    }


def _read(engine: str, root: str) -> tuple[list[tuple[int, bytes | None, bytes | None]], int]:
    """Every record from the start, after a reopen (the crash recovery), then again
    after one more pass: (offset, key, value) and the log end."""
    if engine == "segmented":
        from mqstore.segmented import SegmentedConfig, SegmentedStore

        config = SegmentedConfig(
            segment_bytes=4096, index_interval_bytes=64, index_max_bytes=4096,
            file_delete_delay_ms=0, cleaner_enable=False,
        )  # fmt: skip
        store = SegmentedStore.open(root, config, clock_ms=lambda: NOW_MS)
    else:
        from mqstore import MessageStore, StoreConfig

        config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
        store = MessageStore.open(root, config, clock_ms=lambda: NOW_MS)
    try:
        found = []
        offset = store.earliest_offset("c", 0)
        while True:
            records = store.read_records("c", 0, offset, 1000)
            if not records:
                break
            found += [(r.offset, r.key, r.value) for r in records]
            offset = records[-1].offset + 1
        return found, store.latest_offset("c", 0)
    finally:
        store.close()


def _check(engine: str, root: str) -> None:
    """What the model keeps: offsets increase, each record is the one produced at its
    offset, the latest of every key is there (tombstones are inside their horizon),
    and nothing acknowledged was lost from the log end."""
    produced = _produced()
    found, end = _read(engine, root)
    assert end == RECORDS
    offsets = [offset for offset, _, _ in found]
    assert offsets == sorted(set(offsets))
    for offset, key, value in found:
        if engine == "segmented":
            assert (key, value) == produced[offset], offset
        else:  # CommitLog engine: the Kafka key is not set by put(keys=...)
            assert value == produced[offset][1], offset
    latest = {key: offset for offset, (key, _) in sorted(produced.items())}
    assert set(latest.values()) <= set(offsets), (sorted(latest.values()), offsets)


@pytest.mark.parametrize(
    ("engine", "stage"),
    [("segmented", s) for s in ["appended", *CLEANER_STAGES]]
    + [("commitlog", s) for s in ["appended", "copied", *CLEANER_STAGES]],
)
def test_a_power_cut_at_each_stage_of_a_pass_loses_nothing(tmp_path, engine, stage) -> None:
    mount = Mount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    mount.mount()
    try:
        for seed in SEEDS:
            root = os.path.join(mount.mountpoint, f"store-{seed}")
            os.makedirs(root)
            fsync_directory(mount.mountpoint)
            child = subprocess.run(
                [sys.executable, "-c", CHILD, engine, root, stage],
                capture_output=True,
                timeout=300,
            )
            assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
            cut = mount.cut(seed)
            mount.mount()
            lost = cut.dirty_pages + cut.names_undone + cut.sizes_reverted
            assert lost > 0 or stage == "swapped", cut  # the cut took something
            _check(engine, root)  # the crash state, recovered by the open
            _compact_again(engine, root)
            _check(engine, root)
    finally:
        mount.unmount()


def _compact_again(engine: str, root: str) -> None:
    """The next pass completes the work: one record per key is left (the store is
    then closed cleanly)."""
    if engine == "segmented":
        from mqstore.segmented import SegmentedConfig, SegmentedStore

        config = SegmentedConfig(
            segment_bytes=4096, index_interval_bytes=64, index_max_bytes=4096,
            file_delete_delay_ms=0, cleaner_enable=False,
        )  # fmt: skip
        with SegmentedStore.open(root, config, clock_ms=lambda: NOW_MS) as store:
            store.roll("c", 0)
            store.compact("c")
    else:
        from mqstore import MessageStore, StoreConfig

        config = StoreConfig(commitlog_file_size_bytes=64 * 1024, prewarm=False)
        with MessageStore.open(root, config, clock_ms=lambda: NOW_MS) as store:
            store.compact("c")
    found, _ = _read(engine, root)
    assert len(found) <= KEYS
