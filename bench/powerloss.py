"""Power-loss harness: the crash harness's workload and checks over PowerFS power cuts.

    python -m bench.powerloss --cuts 200 [--seed 1] [--path DIR] [--json FILE]

Each cut runs the bench.crash_harness child (same workload: Kafka sends and batches,
keyed puts, a consumer that commits, retention over 64 KiB CommitLog files) on a store
inside a PowerFS mount (bench.powerfs), flush mode alternating sync / async. After a
seeded random delay the child is SIGKILLed and the power is cut: whatever no
fsync / fdatasync / msync / directory fsync covered is lost, dirty pages are kept,
dropped or torn at random (seeded). The crash state is then mounted fresh and
checked with the crash harness's verifier, plus:

- the store opens: a refusal (StoreError on open) is counted, reported with its seed,
  and the store is recreated so the run goes on;
- under sync flush no acknowledged message may be missing (every ack was synced);
- under async flush, messages the killed child acknowledged may be missing, but only
  as the unflushed tail: in every queue the missing ones must be the child's *last*
  acks of that queue (the CommitLog is durable as a prefix; a queue's records are in
  log order; ack order across queues is not, since two writer threads report acks
  independently). And no lost ack may lie below the last completed flush: the child
  reports "F <position>" whenever the CommitLog's flushed position grows, and the
  write position before ("B") and after ("W") each append, so an ack with W <= the
  last F before the kill was durable, and its loss is a bug
  (``async_losses_below_flush``) unless B lies below the recovered log's start
  (retention deleted its file). The age of the oldest lost ack is a figure, counted
  against ``LOSS_WINDOW_MS`` (``async_old_losses``), not a bound: it includes the
  duration of the flush in progress, which grows with the machine's load. Any message
  from an earlier child, which survived an earlier check, is durable and may never go
  missing;
- no corrupt read, dense queues, valid committed offsets, key look-ups: as the crash
  harness. A commit stored past the partition's end after an async loss (the offsets
  file is fsynced, the records it counted were not) is counted on its own line, and
  the floor of reported commits is dropped after such a loss (a consumer whose commit
  lies past the new end rewinds by ``auto_offset_reset``).

Recovery repairs derived data only when the page cache may have been lost, which it
tells by the boot id recorded in ``abort`` (commitlog/lock.py); a PowerFS cut does not
reboot the machine, so the harness turns that shortcut off in its processes too.

syncfs(2) is invisible to a FUSE daemon (Linux sends FUSE_SYNCFS to virtiofs only): a
store that made data durable with one syncfs would look lossy here although a real disk
keeps that data. The harness therefore turns the ConsumeQueue's syncfs shortcut off
(``mqstore.consumequeue.file_cache.SYNCFS_MIN_PATHS``) in its own process and in the child, so
the store syncs path by path, which PowerFS sees.

Figures are printed and optionally saved as JSON; exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import attrs

from bench import crash_harness
from bench.crash_harness import KAFKA_PARTITIONS, KAFKA_TOPIC, Harness, config_for
from bench.powerfs import LOSE_MODES, CutFigures, Mount, available
from mqstore import MessageStore, StoreConfig, StoreError, TopicPartition
from mqstore.commitlog.durable import fsync_directory

__all__ = ["PowerFigures", "PowerHarness", "run"]

FLUSH_INTERVAL_MS = 200  # async flusher period: the unflushed tail is about this long
FLUSH_SLACK_MS = 1_300  # the flush itself (WRITEs + FSYNC through FUSE) and scheduling
LOSS_WINDOW_MS = FLUSH_INTERVAL_MS + FLUSH_SLACK_MS
KILL_DELAY_S_MAX = 2.5  # longer than the loss window, so the bound can be violated
OVERRIDES: dict[str, Any] = {
    "flush_interval_ms": FLUSH_INTERVAL_MS,
    "flush_least_pages": 0,  # flush whatever is dirty every interval: a time bound
}
PROBLEMS_MAX = 1_000


@attrs.define
class PowerFigures:
    cuts: int = 0
    sync_cuts: int = 0
    async_cuts: int = 0
    refusals: int = 0  # the store refused to open after a cut
    async_lost: int = 0  # acked by an async child, gone after the cut (allowed tail)
    async_cuts_with_loss: int = 0
    async_lost_max: int = 0  # most messages one async cut lost
    async_loss_age_ms_max: float = 0.0  # oldest lost ack, before the kill
    loss_window_ms: int = LOSS_WINDOW_MS  # the bound on that age
    async_bound_violations: int = 0  # a loss that is not the tail of its queue
    async_old_losses: int = 0  # cuts whose oldest lost ack is older than the window
    async_lost_checked: int = 0  # lost acks whose place in the log was known (B, W)
    async_losses_below_flush: int = 0  # lost acks a completed flush had covered: a bug
    async_commits_past_end: int = 0
    dirty_pages: int = 0
    pages_reverted: int = 0
    pages_kept: int = 0
    pages_torn: int = 0
    sizes_reverted: int = 0
    names_undone: int = 0
    names_restored: int = 0
    fsyncs: int = 0
    fsyncdirs: int = 0
    lazy_unmounts: int = 0  # the mount was still busy at a cut (e.g. a leaked mapping)
    failing_seeds: list[int] = attrs.field(factory=list)  # cut seeds with a violation


class PowerHarness(Harness):
    """The crash harness, with a PowerFS cut between the kill and the check."""

    def __init__(self, root: str, seed: int) -> None:
        self.mount = Mount(os.path.join(root, "backing"), os.path.join(root, "mnt"))
        super().__init__(os.path.join(self.mount.mountpoint, "store"), seed)
        self.power = PowerFigures()
        self.config_overrides = dict(OVERRIDES)
        self.kill_delay_s_max = KILL_DELAY_S_MAX
        self.child_module = "bench.powerloss"  # main(["--child", ...]) below
        self.flush_mode = "sync"
        # this child's acks: (topic, queue, offset) -> (ack order, monotonic receive time)
        self.child_acks: dict[tuple[str, int, int], tuple[int, float]] = {}
        # ack -> ("B", "W"): the log's write positions around its append
        self.ack_spans: dict[tuple[str, int, int], tuple[int, int]] = {}
        self.flushed_mark = 0  # the last "F" the child reported: durable up to here
        self.cut_lost: list[tuple[str, int, int]] = []
        # partition -> a commit left past the end by an async loss (see _on_commit_past_end)
        self.commits_past_lost_end: dict[tuple[str, int], int] = {}
        self.verbose = False
        self.lose = "all"  # "nothing": the control run, any violation is the harness's own
        self.keep_refused: str | None = None  # copy refused crash states under here
        # copy the crash state of every failing cut here, as the cut left it (before
        # the check's open recovered it): <keep_failed>/<cut seed>
        self.keep_failed: str | None = None

    # ---------------------------------------------------------- one cut

    def create_store(self) -> None:
        """A fresh store; its directory entry is made durable as a user would."""
        if os.path.exists(self.path):
            shutil.rmtree(self.path)
        os.makedirs(self.path)
        fsync_directory(self.mount.mountpoint)
        with MessageStore.open(self.path, self._config()) as store:
            store.create_topic(KAFKA_TOPIC, partitions=KAFKA_PARTITIONS)
        self.acked.clear()
        self.keys.clear()
        self.committed.clear()
        self.commits_past_lost_end.clear()

    def run_cut(self, index: int) -> None:
        power = self.power
        self.flush_mode = "sync" if index % 2 == 0 else "async"
        child_seed = self.seed * 1_000_003 + index
        cut_seed = child_seed * 7 + 1
        problems_before = self._violations()
        started = time.monotonic()
        self._run_child(self.flush_mode, child_seed)
        self.figures.iterations += 1
        cut = self.mount.cut(cut_seed, lose=self.lose)
        self._add_cut(cut)
        self.power.lazy_unmounts = self.mount.lazy_unmounts
        self.mount.mount()
        power.cuts += 1
        if self.flush_mode == "sync":
            power.sync_cuts += 1
        else:
            power.async_cuts += 1
        self.cut_lost = []
        crash_state = self._save_crash_state()
        try:
            self.verify()
        except StoreError as error:
            power.refusals += 1
            self._problem(f"cut seed {cut_seed}: the store refused to open: {error!r}")
            if self.keep_refused:  # the crash state, for a post-mortem
                shutil.copytree(self.path, os.path.join(self.keep_refused, str(cut_seed)))
            # The refused open's files and mappings live on in reference cycles with its
            # traceback until collected, and would keep the mount busy.
            gc.collect()
            self.create_store()
        else:
            self._check_tail()
            if self.cut_lost:  # commits counted lost messages; a consumer may now rewind
                self.committed.clear()
        if self._violations() != problems_before:
            power.failing_seeds.append(cut_seed)
            if crash_state is not None:
                os.replace(crash_state, os.path.join(self.keep_failed or "", str(cut_seed)))
                crash_state = None
        if crash_state is not None:
            shutil.rmtree(crash_state)
        if self.verbose:
            print(
                f"cut {index} {self.flush_mode:>5} seed {cut_seed}: {len(self.child_acks)} acked, "
                f"{len(self.cut_lost)} lost, {cut.dirty_pages} dirty pages "
                f"({cut.pages_torn} torn), {cut.names_undone} names undone, "
                f"violation={self._violations() != problems_before}, "
                f"{time.monotonic() - started:.1f} s",
                flush=True,
            )

    def _save_crash_state(self) -> str | None:
        """With ``keep_failed``: copy the store as the cut left it (the check's open
        recovers it in place); run_cut keeps the copy if the cut fails."""
        if not self.keep_failed:
            return None
        os.makedirs(self.keep_failed, exist_ok=True)
        copy = os.path.join(self.keep_failed, "pending")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.path, copy)
        return copy

    def _config(self) -> StoreConfig:
        return config_for("sync", self.config_overrides)

    def _violations(self) -> tuple[int, ...]:
        f, p = self.figures, self.power
        return (
            f.losses, f.corrupt_reads, f.wrong_content, f.gaps, f.duplicates,
            f.commit_violations, f.key_misses, f.child_failures,
            p.refusals, p.async_bound_violations, p.async_losses_below_flush,
        )  # fmt: skip

    def _add_cut(self, cut: CutFigures) -> None:
        power = self.power
        for name in ("dirty_pages", "pages_reverted", "pages_kept", "pages_torn"):
            setattr(power, name, getattr(power, name) + getattr(cut, name))
        for name in ("sizes_reverted", "names_undone", "names_restored", "fsyncs", "fsyncdirs"):
            setattr(power, name, getattr(power, name) + getattr(cut, name))

    # ---------------------------------------------------------- hooks

    def _absorb(self, data: bytes) -> None:
        """Note the order and receive time of this child's acks, then absorb them."""
        self.child_acks = {}
        self.ack_spans = {}
        self.flushed_mark = 0
        pending: list[tuple[str, int, int]] = []  # acks before the next "W" line
        before = -1  # the last "B": the write position before those acks' append
        position = 0
        chunk = 0
        for line in data.split(b"\n"):
            position += len(line) + 1
            while chunk < len(self.received) and self.received[chunk][0] < position:
                chunk += 1
            at = self.received[chunk][1] if chunk < len(self.received) else self.kill_time
            parts = line.split()
            if not parts:
                continue
            if parts[0] == b"A":
                where = (parts[1].decode(), int(parts[2]), int(parts[3]))
                self.child_acks[where] = (len(self.child_acks), at)
                pending.append(where)
            elif parts[0] == b"B":  # the log's write position before an append
                before = int(parts[1])
                pending.clear()
            elif parts[0] == b"W":  # ... and after its acks: the records lie in between
                if before >= 0:
                    for where in pending:
                        self.ack_spans[where] = (before, int(parts[1]))
                pending.clear()
                before = -1
            elif parts[0] == b"F":  # a flush completed: the log is durable up to here
                self.flushed_mark = max(self.flushed_mark, int(parts[1]))
        super()._absorb(data)

    def _on_missing(self, topic: str, queue: int, offset: int) -> None:
        where = (topic, queue, offset)
        if self.flush_mode == "async" and where in self.child_acks:
            self.cut_lost.append(where)
            del self.acked[(topic, queue)][offset]  # gone for good: later checks skip it
            return
        super()._on_missing(topic, queue, offset)

    def _on_commit_past_end(self, tp: TopicPartition, committed: int, end: int) -> None:
        """Past the end because an async cut lost what it counted: its own figure,
        until the partition grows past it again."""
        key = (tp.topic, tp.partition)
        if self.flush_mode == "async" and self.cut_lost:
            self.commits_past_lost_end[key] = committed
        if committed <= self.commits_past_lost_end.get(key, -1):
            self.power.async_commits_past_end += 1
            self._problem(f"after an async loss: {tp} committed {committed} past the end {end}")
            return
        super()._on_commit_past_end(tp, committed, end)

    def _check_tail(self) -> None:
        """Async losses must be, in every queue, the tail of what the child acked; and
        the oldest must be young (see LOSS_WINDOW_MS)."""
        if not self.cut_lost:
            return
        power = self.power
        power.async_cuts_with_loss += 1
        power.async_lost += len(self.cut_lost)
        power.async_lost_max = max(power.async_lost_max, len(self.cut_lost))
        # The CommitLog is durable as a prefix, so a queue (whose records are in log
        # order) loses a suffix of its acked offsets. Ack order across queues is not
        # log order (two writer threads report acks independently), so the check is
        # per queue: every acked offset after a queue's first lost one is lost too.
        lost_by_queue: dict[tuple[str, int], list[int]] = {}
        for topic, queue, offset in self.cut_lost:
            lost_by_queue.setdefault((topic, queue), []).append(offset)
        for (topic, queue), lost in lost_by_queue.items():
            first = min(lost)
            acked_after = [
                offset
                for (t, q, offset) in self.child_acks
                if t == topic and q == queue and offset >= first
            ]
            if len(acked_after) != len(lost):
                power.async_bound_violations += 1
                self._problem(
                    f"async loss in {topic}/{queue} is not its tail: "
                    f"{len(acked_after) - len(lost)} later acks kept"
                )
        # A completed flush made the log durable up to its mark: an ack whose record
        # lay below the mark (its "W" bound) and at or past the recovered log's start
        # (its "B" bound; below it, retention deleted the file) must have survived.
        log_start = self._log_start()
        covered = [
            where
            for where in self.cut_lost
            if where in self.ack_spans
            and self.ack_spans[where][1] <= self.flushed_mark
            and self.ack_spans[where][0] >= log_start
        ]
        power.async_lost_checked += sum(1 for where in self.cut_lost if where in self.ack_spans)
        if covered:
            power.async_losses_below_flush += len(covered)
            self._problem(
                f"async loss of {len(covered)} ack(s) a completed flush covered "
                f"(mark {self.flushed_mark}): {covered[:3]}"
            )
        # The age of the oldest loss: a figure (it grows with the flush's own duration,
        # which depends on the machine's load), not a bound.
        oldest = min(self.child_acks[where][1] for where in self.cut_lost)
        age_ms = (self.kill_time - oldest) * 1000
        power.async_loss_age_ms_max = max(power.async_loss_age_ms_max, round(age_ms, 1))
        if age_ms > LOSS_WINDOW_MS:
            power.async_old_losses += 1

    def _log_start(self) -> int:
        """The recovered CommitLog's first position (its oldest file's name)."""
        directory = os.path.join(self.path, "commitlog")
        names = (
            [n for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) else []
        )
        return min((int(name) for name in names), default=0)

    @property
    def failed(self) -> bool:
        power = self.power
        return bool(
            self.figures.failed
            or power.refusals
            or power.async_bound_violations
            or power.async_losses_below_flush
        )

    def summary(self) -> dict[str, Any]:
        data = {**attrs.asdict(self.power), **self.figures.summary()}
        data["sync_losses"] = self.figures.losses  # every non-tail loss counts here
        data["problems"] = self.figures.problems  # all (at most 1,000); 20 are printed
        return data


@contextlib.contextmanager
def per_path_syncs() -> Iterator[None]:
    """Turn off the ConsumeQueue's syncfs shortcut, which PowerFS cannot observe; and
    tell recovery that an unclean stop on this boot may still be a power cut (PowerFS
    cuts power without rebooting the machine, so the boot id cannot tell)."""
    from mqstore.commitlog import lock
    from mqstore.consumequeue import file_cache

    saved = file_cache.SYNCFS_MIN_PATHS, lock.trust_same_boot
    setattr(file_cache, "SYNCFS_MIN_PATHS", sys.maxsize)  # noqa: B010 (Final in the module)
    lock.trust_same_boot = False
    try:
        yield
    finally:
        setattr(file_cache, "SYNCFS_MIN_PATHS", saved[0])  # noqa: B010
        lock.trust_same_boot = saved[1]


def run(
    cuts: int,
    seed: int = 1,
    path: str | None = None,
    progress: bool = False,
    verbose: bool = False,
    lose: str = "all",
    keep_failed: str | None = None,
    key_samples: int | None = None,
) -> PowerHarness:
    """Run ``cuts`` power cuts; returns the harness (figures in ``figures``, ``power``).

    Raises:
        RuntimeError: PowerFS cannot run here (see bench.powerfs.available).
    """
    reason = available()
    if reason is not None:
        raise RuntimeError(f"powerloss needs FUSE: {reason}")
    owned = path is None
    root = path or tempfile.mkdtemp(prefix="mqstore-powerloss-")
    harness = PowerHarness(root, seed)
    harness.verbose = verbose
    harness.lose = lose
    harness.keep_failed = keep_failed
    if key_samples is not None:
        harness.key_samples = key_samples
    with contextlib.ExitStack() as stack:
        stack.enter_context(per_path_syncs())
        if owned:  # callbacks run last first: unmount, then remove
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        stack.callback(harness.mount.unmount)
        harness.mount.mount()
        harness.create_store()
        for index in range(cuts):
            harness.run_cut(index)
            if progress and (index + 1) % 10 == 0:
                _print_progress(harness, index + 1)
    return harness


def _print_progress(harness: PowerHarness, cuts: int) -> None:
    power = harness.power
    print(
        f"{cuts} cuts, {harness.figures.acked_checks} acks checked, "
        f"async lost {power.async_lost}, refusals {power.refusals}, failed={harness.failed}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":  # the crash harness's workload, syncfs off
        with per_path_syncs():
            return crash_harness.main(argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--cuts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--path", help="directory for the backing and mount (kept)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--verbose", action="store_true", help="one line per cut")
    parser.add_argument(
        "--lose",
        choices=LOSE_MODES,
        default="all",
        help="what cuts lose: all; only data or names (to find a cause); nothing (control)",
    )
    parser.add_argument(
        "--keep-failed",
        metavar="DIR",
        help="copy the crash state of each failing cut (before recovery) to DIR/<cut seed>",
    )
    parser.add_argument(
        "--key-samples",
        type=int,
        default=None,
        help=f"keys looked up per check (default {crash_harness.QUERY_SAMPLES}; 0: every live key)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    harness = run(
        args.cuts,
        args.seed,
        args.path,
        progress=True,
        verbose=args.verbose,
        lose=args.lose,
        keep_failed=args.keep_failed,
        key_samples=args.key_samples,
    )
    summary = harness.summary()
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["seed"] = args.seed
    summary["lose"] = args.lose
    crash_harness.report(summary, summary["problems"], args.json)
    return 1 if harness.failed else 0


if __name__ == "__main__":
    sys.exit(main())
