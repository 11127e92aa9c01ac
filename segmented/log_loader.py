"""Loading one partition directory at open (Kafka's LogLoader).

1. Remove leftovers: ``*.deleted`` files (a deletion the last run did not finish),
   ``*.cleaned`` files (a cleaning pass cut short before its commit point) and index
   files without their ``.log``; complete every ``*.swap`` (a cleaned segment that
   was committed): delete the segment files whose base offset lies in the swapped
   segment's offset range, then drop the ``.swap`` suffix (Kafka's LogLoader).
2. Load every segment in base offset order; a missing or insane index is rebuilt
   from its ``.log`` (``LogSegment.load``).
3. After a clean shutdown, trust the files: the log end offset is read by scanning
   the active segment from its last index entry, and the recovery point is the log
   end offset. If that tail scan meets a bad batch, the active segment is recovered.
4. After a crash, recover every segment from the one holding the recovery point:
   validate each batch, rebuild the indexes, truncate at the first bad batch, and
   delete all later segments once one was truncated or ends short of the next base
   offset (offsets stay dense). The recovery point becomes min(checkpoint, log end):
   it only advances when a flush makes the bytes durable.
5. The log start offset is max(checkpoint, first base offset); if it lies past the
   log end (the tail was lost), the log is emptied and starts there (Kafka's
   truncateFullyAndStartAt).
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from typing import Final

import attrs

from mqstore.commitlog.durable import makedirs_durable
from mqstore.commitlog.errors import CorruptDataError
from mqstore.segmented.files import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    fsync_directory,
    parse_base_offset,
    segment_path,
)
from mqstore.segmented.index_file import MappedIndexCache
from mqstore.segmented.record_batch import HEADER, HEADER_SIZE, MAGIC, BatchHeader
from mqstore.segmented.segment import LogSegment, SegmentSettings

__all__ = ["LoadedLog", "load_partition"]

log = logging.getLogger(__name__)

OFFSET_MAX: Final = 2**63 - 1


@attrs.frozen(kw_only=True)
class LoadedLog:
    segments: list[LogSegment]
    next_offset: int
    log_start_offset: int
    recovery_point: int


def load_partition(
    directory: str,
    settings: SegmentSettings,
    cache: MappedIndexCache,
    *,
    clean_shutdown: bool,
    recovery_point: int,
    log_start_offset: int,
) -> LoadedLog:
    """Open (or create) the partition in ``directory`` and recover it if needed.

    The returned last segment is active (indexes mapped writable).

    Raises:
        CorruptDataError: only if a segment that must be kept cannot be read at all.
    """
    makedirs_durable(directory)  # its entry in the store's directory survives a power cut
    bases = _remove_leftovers(directory)
    # After a crash, segments from the one holding the recovery point are rebuilt
    # anyway: checking their indexes first would only scan them twice.
    first_recovered = len(bases) if clean_shutdown else _holding(bases, recovery_point)
    segments = [
        LogSegment.load(
            directory, base, settings, cache, _next_base(bases, i), i >= first_recovered
        )
        for i, base in enumerate(bases)
    ]
    if not segments:
        segments = [LogSegment.create(directory, log_start_offset, settings, cache)]
        fsync_directory(directory)  # the segment's names: an append's sync covers data only
        return LoadedLog(
            segments=segments,
            next_offset=log_start_offset,
            log_start_offset=log_start_offset,
            recovery_point=log_start_offset,
        )
    next_offset = None
    if clean_shutdown:
        try:
            next_offset = segments[-1].read_next_offset()
            recovery_point = next_offset
        except CorruptDataError as error:
            log.warning("%s after a clean shutdown: %s; recovering it", directory, error)
            recovery_point = min(recovery_point, segments[-1].base_offset)
    if next_offset is None:
        next_offset = _recover(segments, recovery_point)
        recovery_point = min(recovery_point, next_offset)
    segments[-1].become_active()
    log_start_offset = max(log_start_offset, segments[0].base_offset)
    if log_start_offset > next_offset:
        log.warning("%s: log start %d is past the log end %d; emptying the log",
                    directory, log_start_offset, next_offset)  # fmt: skip
        _delete(segments)
        segments = [LogSegment.create(directory, log_start_offset, settings, cache)]
        fsync_directory(directory)
        next_offset = recovery_point = log_start_offset
    return LoadedLog(
        segments=segments,
        next_offset=next_offset,
        log_start_offset=log_start_offset,
        recovery_point=recovery_point,
    )


def _holding(bases: list[int], offset: int) -> int:
    """Index of the segment holding ``offset`` (the first one if it is before all)."""
    return max(0, bisect_right(bases, offset) - 1)


def _next_base(bases: list[int], i: int) -> int:
    return bases[i + 1] if i + 1 < len(bases) else OFFSET_MAX


def _recover(segments: list[LogSegment], recovery_point: int) -> int:
    """Recover ``segments`` (in place) from the one holding the recovery point;
    return the log end offset."""
    first = _holding([s.base_offset for s in segments], recovery_point)
    next_offset = segments[first].base_offset
    for i in range(first, len(segments)):
        segment = segments[i]
        result = segment.recover()
        next_offset = result.next_offset
        if i == len(segments) - 1:
            break
        if result.truncated_bytes or next_offset != segments[i + 1].base_offset:
            log.warning(
                "%s: recovery stopped at offset %d; deleting %d later segments",
                segment.log_path, next_offset, len(segments) - i - 1,
            )  # fmt: skip
            _delete(segments[i + 1 :])
            del segments[i + 1 :]
            break
        segment.become_inactive()
    return next_offset


def _delete(segments: list[LogSegment]) -> None:
    for segment in segments:
        segment.mark_deleted()
        destroyed = segment.destroy()
        assert destroyed  # nobody reads while the store opens


def _complete_swaps(directory: str) -> None:
    """Delete ``*.cleaned`` files; finish the swap of every ``<base>.log.swap``."""
    names = os.listdir(directory)
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            log.info("removing unfinished cleaning output %s", os.path.join(directory, name))
            os.unlink(os.path.join(directory, name))
    swapped = [name for name in names if name.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    for name in sorted(swapped):
        base = parse_base_offset(name[: -len(SWAP_SUFFIX)], LOG_SUFFIX)
        if base is None:
            continue
        last_offset = _last_offset(os.path.join(directory, name), base)
        for other in os.listdir(directory):
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                other_base = parse_base_offset(other, suffix)
                if other_base is not None and base <= other_base <= last_offset:
                    os.unlink(os.path.join(directory, other))  # replaced by the swap
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX):  # the .log last
            final = segment_path(directory, base, suffix)
            if os.path.exists(final + SWAP_SUFFIX):
                os.rename(final + SWAP_SUFFIX, final)
        log.warning("%s: completed the swap of a cleaned segment", os.path.join(directory, name))
    for name in os.listdir(directory):
        if name.endswith(SWAP_SUFFIX):  # an index swap whose .log never reached .swap
            os.unlink(os.path.join(directory, name))
    fsync_directory(directory)


def _last_offset(path: str, base_offset: int) -> int:
    """The last offset of the batches in the file at ``path`` (``base_offset`` if it
    holds none); stops at the first batch that does not validate."""
    last_offset = base_offset
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        position = 0
        while position + HEADER_SIZE <= size:  # headers only: a segment may be 1 GiB
            header = BatchHeader._make(
                HEADER.unpack(os.pread(handle.fileno(), HEADER_SIZE, position))
            )
            if header.magic != MAGIC or header.size < HEADER_SIZE or position + header.size > size:
                break
            last_offset = max(last_offset, header.last_offset)
            position += header.size
    return last_offset


def _remove_leftovers(directory: str) -> list[int]:
    """Delete ``*.deleted``, ``*.cleaned`` and orphaned index files, complete the
    swaps; return the base offsets of the ``.log`` files, sorted."""
    _complete_swaps(directory)
    names = os.listdir(directory)
    bases = {parse_base_offset(name, LOG_SUFFIX) for name in names} - {None}
    for name in names:
        orphan = any(
            parse_base_offset(name, suffix) not in (None, *bases)
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
        )
        if name.endswith(DELETED_SUFFIX) or orphan:
            log.info("removing leftover %s", os.path.join(directory, name))
            os.unlink(os.path.join(directory, name))
    return sorted(base for base in bases if base is not None)
