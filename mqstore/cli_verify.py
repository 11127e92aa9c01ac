"""The checks behind ``mqstore verify``: every CommitLog record and every
ConsumeQueue unit of a store, read straight from its files.

What is checked:
- CommitLog: every record's checksum, size, magic and claimed physical offset
  (``mqstore.commitlog.record.decode``); files of one size, without gaps; no records after
  the end of the log (the first run of zeros that is not followed by a blank record).
  A corrupt record whose size field is sane is stepped over, so every corrupt
  position is reported.
- ConsumeQueue: every written unit points at a record that exists, verifies, and has
  the unit's topic, queue, queue offset and size; its timestamp is the record's born
  or store time; CommitLog offsets increase with the queue offset; every unit file
  has its time file, whose header checks.
- Checkpoint, topics and offsets files, index file headers: what a store checks when
  it opens.

Nothing is opened as a store and nothing is written: a writer's open would cut a
corrupt tail, and verify must report it instead. Run it on a closed store; with a
writer running, a record being appended at the tail can show as corrupt.
"""

from __future__ import annotations

import collections
import json
import mmap
import os
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from mqstore.cli_dump import companion_times, dump_index, time_header, walk_commitlog
from mqstore.cli_dump_kafka import walk_batches
from mqstore.cli_files import close_map, is_digits, mapped, read_bytes
from mqstore.commitlog import checkpoint as ckpt
from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.record import BLANK_SIZE, decode
from mqstore.consumequeue.format import (
    FILE_NAME_DIGITS,
    SHARED_DIRECTORY,
    SHARED_RECORD,
    TIME_FILE_SUFFIX,
    TIME_HEADER_SIZE_BYTES,
    UNIT,
    UNIT_SIZE_BYTES,
    check_time_header,
)
from mqstore.indexfile import format as ix
from mqstore.layout import load_layout
from mqstore.offsets import OffsetStore
from mqstore.topics import TopicRegistry

__all__ = [
    "Finding",
    "VerifyReport",
    "disk_layout",
    "file_stats",
    "print_report",
    "tree_size",
    "verify_commitlog_store",
    "verify_segmented_store",
]

Progress = Callable[[int], None]  # advances a progress bar by n (bytes or files)
ProgressFactory = Callable[[str, int], Progress]  # (label, total) -> a bar's advance
MAPS_OPEN_MAX = 64  # CommitLog files mapped at once (each map holds an fd)
PROGRESS_EVERY_RECORDS = 4096  # records between two progress updates


@attrs.frozen
class Finding:
    """One corrupt spot: the file, the byte position in it, what is wrong."""

    path: str
    position: int
    reason: str


@attrs.define
class VerifyReport:
    findings: list[Finding] = attrs.field(factory=list)
    counts: dict[str, int] = attrs.field(factory=lambda: collections.defaultdict(int))

    def add(self, path: str, position: int, reason: str) -> None:
        self.findings.append(Finding(path, position, reason))


class _CommitLogFiles:
    """The CommitLog files of a store, mapped read-only on demand (LRU-bounded)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        names = os.listdir(directory) if os.path.isdir(directory) else []
        self.starts = sorted(int(name) for name in names if is_digits(name, FILE_NAME_DIGITS))
        self._maps: collections.OrderedDict[int, mmap.mmap | bytes] = collections.OrderedDict()

    def path(self, start: int) -> str:
        return os.path.join(self.directory, f"{start:020d}")

    def buffer(self, start: int) -> mmap.mmap | bytes:
        buffer = self._maps.pop(start, None)
        if buffer is None:
            with open(self.path(start), "rb") as handle:
                empty = os.fstat(handle.fileno()).st_size == 0
                buffer = b"" if empty else mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            if len(self._maps) >= MAPS_OPEN_MAX:
                _, oldest = self._maps.popitem(last=False)
                if isinstance(oldest, mmap.mmap):
                    close_map(oldest)
        self._maps[start] = buffer
        return buffer

    def close(self) -> None:
        for buffer in self._maps.values():
            if isinstance(buffer, mmap.mmap):
                close_map(buffer)
        self._maps.clear()


def verify_commitlog_store(root: str, progress: ProgressFactory) -> VerifyReport:
    """Check every CommitLog record and every ConsumeQueue unit of the store at ``root``.

    Args:
        progress: ``progress(label, total)`` gives a function that advances a bar.
    """
    report = VerifyReport()
    files = _CommitLogFiles(os.path.join(root, "commitlog"))
    try:
        log_end = _verify_commitlog(files, report, progress)
        _verify_checkpoint(root, log_end, report)
        _verify_queues(root, files, report, progress)
    finally:
        files.close()
    _verify_metadata(root, report)
    return report


def _verify_commitlog(
    files: _CommitLogFiles, report: VerifyReport, progress: ProgressFactory
) -> int | None:
    """Walk every file; return the physical end of the log (None without files)."""
    starts = files.starts
    if not starts:
        return None
    file_size = os.path.getsize(files.path(starts[0]))
    advance = progress("CommitLog", file_size * len(starts))
    log_end: int | None = None
    for number, start in enumerate(starts):
        path = files.path(start)
        if os.path.getsize(path) != file_size:
            report.add(path, 0, f"file is {os.path.getsize(path)} bytes, the first {file_size}")
        if number and start != starts[number - 1] + file_size:
            report.add(path, 0, f"gap in the CommitLog before offset {start}")
        buffer = files.buffer(start)
        if log_end is not None:
            if len(buffer) >= BLANK_SIZE and any(buffer[:BLANK_SIZE]):
                report.add(path, 0, f"records after the end of the log at offset {log_end}")
            else:
                advance(file_size)
                continue
        reported = 0
        for step in walk_commitlog(buffer, path, start):
            if step.kind == "record":
                report.counts["records"] += 1
                if report.counts["records"] % PROGRESS_EVERY_RECORDS == 0:
                    advance(step.position - reported)
                    reported = step.position
            elif step.kind == "corrupt":
                report.counts["corrupt_records"] += 1
                report.add(path, step.position, step.reason)
            elif step.kind == "end" and step.position < len(buffer) and log_end is None:
                log_end = start + step.position  # where recovery would end the log
        report.counts["commitlog_files"] += 1
        advance(file_size - reported)
    if log_end is None:
        log_end = starts[-1] + file_size
    return log_end


def _verify_checkpoint(root: str, log_end: int | None, report: VerifyReport) -> None:
    checkpoint = ckpt.CheckpointFile(root, read_only=True).load()
    if checkpoint is None or log_end is None:
        return
    path = os.path.join(root, ckpt.CHECKPOINT_NAME)
    for name in ("flushed_position", "dispatched_position"):
        position = getattr(checkpoint, name)
        if position > log_end:
            report.add(path, 0, f"checkpoint {name} {position} is past the log end {log_end}")


def _queue_files(root: str) -> list[tuple[str, int, str]]:
    """(topic, queue id, unit file path) of every ConsumeQueue unit file."""
    found = []
    queues = os.path.join(root, "consumequeue")
    for topic in sorted(os.listdir(queues)) if os.path.isdir(queues) else []:
        topic_dir = os.path.join(queues, topic)
        for queue in sorted(os.listdir(topic_dir)) if os.path.isdir(topic_dir) else []:
            queue_dir = os.path.join(topic_dir, queue)
            if not queue.isdigit() or not os.path.isdir(queue_dir):
                continue
            for name in sorted(os.listdir(queue_dir)):
                if is_digits(name, FILE_NAME_DIGITS):
                    found.append((topic, int(queue), os.path.join(queue_dir, name)))
    return found


def _verify_queues(
    root: str,
    files: _CommitLogFiles,
    report: VerifyReport,
    progress: ProgressFactory,
) -> None:
    unit_files = _queue_files(root)
    advance = progress("ConsumeQueue", len(unit_files))
    seen = {(topic, queue) for topic, queue, _ in unit_files}
    file_size = os.path.getsize(files.path(files.starts[0])) if files.starts else 0
    for topic, queue_id, path in unit_files:
        _verify_unit_file(topic, queue_id, path, files, file_size, report)
        advance(1)
    queues = os.path.join(root, "consumequeue")
    for topic in sorted(os.listdir(queues)) if os.path.isdir(queues) else []:
        shared = os.path.join(queues, topic, SHARED_DIRECTORY)
        if os.path.isdir(shared):
            seen.update(_verify_shared_log(topic, shared, files, file_size, report))
    report.counts["queues"] = len(seen)


def _verify_shared_log(
    topic: str, directory: str, files: _CommitLogFiles, file_size: int, report: VerifyReport
) -> set[tuple[str, int]]:
    """Check the records of a topic's shared unit log (consumequeue/format.py): each
    written record against its CommitLog record, commitlog offsets increasing along
    the log. The ``ends`` file is read by the store itself (it checks its checksum)."""
    last_physical = -1
    log_start = files.starts[0] if files.starts else 0
    queues: set[tuple[str, int]] = set()
    for name in sorted(os.listdir(directory)):
        if not is_digits(name, FILE_NAME_DIGITS):
            continue
        path = os.path.join(directory, name)
        data = read_bytes(path, 0, os.path.getsize(path))
        if not data or len(data) % SHARED_RECORD.itemsize:
            report.add(path, 0, f"size {len(data)} is not a positive multiple of 40")
            continue
        records = np.frombuffer(data, dtype=SHARED_RECORD)
        written = np.flatnonzero(records["size"] != 0)
        for index in written.tolist():
            record = records[index]
            physical, size = int(record["commitlog_offset"]), int(record["size"])
            queue_id, queue_offset = int(record["queue_id"]), int(record["queue_offset"])
            position = index * SHARED_RECORD.itemsize
            report.counts["units"] += 1
            queues.add((topic, queue_id))
            if physical <= last_physical:
                report.add(path, position, "CommitLog offsets do not increase here")
            last_physical = physical
            if physical < log_start:
                report.counts["expired_units"] += 1
                continue
            reason = _unit_problem(
                files, file_size, physical, size, topic, queue_id, queue_offset,
                records["timestamp_ms"], index,
            )  # fmt: skip
            if reason:
                report.add(
                    path, position, f"shared unit {topic}/{queue_id}@{queue_offset}: {reason}"
                )
    return queues


def _verify_unit_file(
    topic: str,
    queue_id: int,
    path: str,
    files: _CommitLogFiles,
    file_size: int,
    report: VerifyReport,
) -> None:
    data = read_bytes(path, 0, os.path.getsize(path))
    if not data or len(data) % UNIT_SIZE_BYTES:
        report.add(path, 0, f"size {len(data)} is not a positive multiple of 20")
        return
    units = np.frombuffer(data, dtype=UNIT)
    times = _verified_times(path, len(units), report)
    first_offset = int(os.path.basename(path)) // UNIT_SIZE_BYTES
    written = np.flatnonzero(units["size"] != 0)
    physical = units["commitlog_offset"][written]
    for index in np.flatnonzero(np.diff(physical) <= 0).tolist():
        unit = int(written[index + 1])
        report.add(path, unit * UNIT_SIZE_BYTES, "CommitLog offsets do not increase here")
    log_start = files.starts[0] if files.starts else 0
    for unit, where, size in zip(
        written.tolist(), physical.tolist(), units["size"][written].tolist(), strict=True
    ):
        report.counts["units"] += 1
        if where < log_start:
            report.counts["expired_units"] += 1  # retention removed its CommitLog file
            continue
        queue_offset = first_offset + unit
        reason = _unit_problem(
            files, file_size, where, size, topic, queue_id, queue_offset, times, unit
        )
        if reason:
            report.add(
                path, unit * UNIT_SIZE_BYTES, f"unit {topic}/{queue_id}@{queue_offset}: {reason}"
            )


def _unit_problem(
    files: _CommitLogFiles,
    file_size: int,
    physical: int,
    size: int,
    topic: str,
    queue_id: int,
    queue_offset: int,
    times: np.ndarray | None,
    unit: int,
) -> str:
    """What is wrong with one unit against its record, or ""."""
    start = files.starts[0] + (physical - files.starts[0]) // file_size * file_size
    if start not in files.starts:
        return f"points at CommitLog offset {physical}, past the end of the log"
    try:
        record = decode(files.buffer(start), physical - start, file_size, files.path(start), start)
    except CorruptDataError as error:
        return f"its record at {error.path} position {error.position} is corrupt: {error.reason}"
    if record is None:
        return f"points at a blank record at CommitLog offset {physical}"
    claimed = (topic, queue_id, queue_offset, size)
    found = (record.topic, record.queue_id, record.queue_offset, record.size)
    stamps = (record.born_ts_ms, record.store_ts_ms)
    del record  # drop the view into the map before it may be evicted
    if claimed != found:
        return (
            f"the record at CommitLog offset {physical} is (topic, queue, offset, size) "
            f"{found}, the unit says {claimed}"
        )
    if times is not None and int(times[unit]) not in stamps:
        return f"timestamp {int(times[unit])} is neither the record's born nor store time"
    return ""


def _verified_times(path: str, units_per_file: int, report: VerifyReport) -> np.ndarray | None:
    time_path = path + TIME_FILE_SUFFIX
    if not os.path.exists(time_path):
        report.add(time_path, 0, "the time file of this unit file is missing")
        return None
    try:
        header, _ = time_header(time_path)
        interval = int(header["time_index_interval_units"][0])
        check_time_header(time_path, header, units_per_file, interval)
    except CorruptDataError as error:
        report.add(time_path, error.position, error.reason)
        return None
    times = companion_times(time_path, units_per_file)
    if times is None:
        report.add(time_path, TIME_HEADER_SIZE_BYTES, "time file cut off")
    return times


def _verify_metadata(root: str, report: VerifyReport) -> None:
    """The topics and committed offsets files load (they carry checksums)."""
    try:
        TopicRegistry(root, read_only=True)
    except CorruptDataError as error:
        report.add(error.path, error.position, error.reason)
    offsets = OffsetStore(root, read_only=True)
    for group in offsets.groups():
        try:
            offsets.load(group)
        except CorruptDataError as error:
            report.add(error.path, error.position, error.reason)
    index_dir = os.path.join(root, "index")
    for name in sorted(os.listdir(index_dir)) if os.path.isdir(index_dir) else []:
        if ix.parse_file_name(name) is not None:
            report.counts["index_files"] += 1
            path = os.path.join(index_dir, name)
            for line in dump_index(path, print_data=False):
                if "corrupt" in line:
                    report.add(path, line["position"], line["corrupt"])
                if "entry" in line or "corrupt" in line:
                    break  # the header is what a store checks at open


def verify_segmented_store(root: str, progress: ProgressFactory) -> VerifyReport:
    """Check the CRC of every batch of every .log of a segmented store, and that
    offsets never go back (compaction leaves gaps; they are legal)."""
    report = VerifyReport()
    logs = []
    for directory in sorted(os.listdir(root)):
        partition_dir = os.path.join(root, directory)
        if "-" in directory and os.path.isdir(partition_dir):
            logs += [
                os.path.join(partition_dir, name)
                for name in sorted(os.listdir(partition_dir))
                if name.endswith(".log")
            ]
    advance = progress("segments", sum(os.path.getsize(path) for path in logs))
    expected: dict[str, int] = {}
    for path in logs:
        partition = os.path.dirname(path)
        with mapped(path) as buffer:
            for batch in walk_batches(buffer):
                if batch.reason:
                    report.add(path, batch.position, batch.reason)
                if not batch.header:
                    break
                report.counts["batches"] += 1
                base_offset, last_delta = batch.header[0], batch.header[6]
                if partition in expected and base_offset < expected[partition]:  # gaps: compaction
                    reason = f"batch starts at offset {base_offset}, expected {expected[partition]}"
                    report.add(path, batch.position, reason)
                expected[partition] = base_offset + last_delta + 1
        report.counts["segments"] += 1
        advance(os.path.getsize(path))
    return report


def print_report(report: VerifyReport, as_json: bool) -> None:
    """One line per finding and a summary, or one JSON document."""
    counts = dict(report.counts)
    if as_json:
        findings = [attrs.asdict(finding) for finding in report.findings]
        document = {"ok": not report.findings, "findings": findings, "counts": counts}
        print(json.dumps(document, ensure_ascii=False))
        return
    for finding in report.findings:
        print(f"corrupt: {finding.path} position {finding.position}: {finding.reason}")
    checked = " ".join(f"{name}={value}" for name, value in counts.items())
    print(f"checked {checked or 'nothing'}: {len(report.findings) or 'no'} problem(s)")


# ---------------------------------------------------------------- stats from the files


def tree_size(path: str) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    files = size_bytes = 0
    for directory, _, names in os.walk(path):
        for name in names:
            files += 1
            size_bytes += os.path.getsize(os.path.join(directory, name))
    return files, size_bytes


def file_stats(root: str, log_end: int) -> dict[str, Any]:
    """Sizes per part, queues, and the dispatch lag the checkpoint shows against
    ``log_end`` (the CommitLog's end as a read-only open found it)."""
    out: dict[str, Any] = {}
    for part in ("commitlog", "consumequeue", "index", "compaction"):
        out[f"{part}_files"], out[f"{part}_bytes"] = tree_size(os.path.join(root, part))
    out["queues"] = len({(topic, queue) for topic, queue, _ in _queue_files(root)})
    checkpoint = ckpt.CheckpointFile(root, read_only=True).load()
    out["log_end_position"] = log_end
    flushed = None if checkpoint is None else checkpoint.flushed_position
    dispatched = None if checkpoint is None else checkpoint.dispatched_position
    out["checkpoint_flushed_position"] = flushed
    out["checkpoint_dispatched_position"] = dispatched
    out["dispatch_lag_bytes"] = None if dispatched is None else max(0, log_end - dispatched)
    out["writer_open_or_crashed"] = os.path.exists(os.path.join(root, "abort"))
    # The compacted topics' cleaner, as its last round left its figures (the
    # writer's totals since it opened; mqstore.compaction).
    try:
        with open(os.path.join(root, "compaction", "cleaner-stats.json"), encoding="utf-8") as f:
            cleaner = json.load(f)
    except (OSError, ValueError):
        cleaner = {}
    if isinstance(cleaner, dict):
        out.update((f"compaction_{k}", v) for k, v in cleaner.items() if k.startswith("cleaner"))
    return out


def disk_layout(root: str) -> dict[str, int]:
    """The StoreConfig fields fixed by existing files: CommitLog file size,
    ConsumeQueue units per file, and the newest index file's slots and entries."""
    layout: dict[str, int] = dict(load_layout(root) or {})  # recorded by the writer
    commitlog = _CommitLogFiles(os.path.join(root, "commitlog"))
    if commitlog.starts and "commitlog_file_size_bytes" not in layout:
        size_bytes = os.path.getsize(commitlog.path(commitlog.starts[0]))
        layout["commitlog_file_size_bytes"] = size_bytes
    unit_files = _queue_files(root)
    if unit_files and "consumequeue_units_per_file" not in layout:
        layout["consumequeue_units_per_file"] = os.path.getsize(unit_files[0][2]) // UNIT_SIZE_BYTES
    index_dir = os.path.join(root, "index")
    names = os.listdir(index_dir) if os.path.isdir(index_dir) else []
    newest = max((name for name in names if ix.parse_file_name(name) is not None), default=None)
    if newest is not None:  # new index files continue the newest one's layout
        header = next(dump_index(os.path.join(index_dir, newest), print_data=False))
        size_bytes = os.path.getsize(os.path.join(index_dir, newest))
        entry_count = ix.entry_count_for_size(max(header.get("slot_count", 0), 1), size_bytes)
        if "corrupt" not in header and entry_count is not None:
            layout["index_slot_count"] = header["slot_count"]
            layout["index_entry_count"] = entry_count
    return layout
