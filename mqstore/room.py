"""Room on disk for a new store's first files, checked before the store is created.

A writer that opens a store with no CommitLog file yet creates one at once (at its
full size: posix_fallocate), and the first keyed message creates an index file (in
full too). When the filesystem cannot hold both, opening fails with a DiskFullError
that names the bytes needed, the bytes free and the settings that size the files,
before anything is recorded: the caller can lower a setting and open again (the
layout is fixed only once a store records it, mqstore.layout).

An existing store is never refused here: its files are there, and its readers and
retention need it open. A later file that does not fit fails where it is made (a
put raises DiskFullError).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from mqstore.commitlog.errors import DiskFullError
from mqstore.commitlog.mapped_file import parse_file_name as parse_commitlog_name
from mqstore.config import StoreConfig
from mqstore.indexfile.format import file_size_bytes
from mqstore.indexfile.format import parse_file_name as parse_index_name

__all__ = ["check_room_for_first_files"]

MIB = 1 << 20


def check_room_for_first_files(root: str, config: StoreConfig) -> None:
    """Refuse a new store whose first CommitLog and index files do not fit.

    Args:
        root: the store directory (it exists).
        config: the config the store opens with (its recorded layout adopted).

    Raises:
        DiskFullError: the store has no CommitLog file yet and the filesystem has
            less free space than the first CommitLog file and index file need.
    """
    if _holds_a_file(os.path.join(root, "commitlog"), parse_commitlog_name):
        return
    defaults = StoreConfig()
    size_bytes = config.commitlog_file_size_bytes
    needs = [
        f"a {_mib(size_bytes)} CommitLog file (StoreConfig.commitlog_file_size_bytes="
        f"{size_bytes}; default {defaults.commitlog_file_size_bytes})"
    ]
    needed_bytes = size_bytes
    if not _holds_a_file(os.path.join(root, "index"), parse_index_name):
        index_bytes = file_size_bytes(config.index_slot_count, config.index_entry_count)
        needs.append(
            f"a {_mib(index_bytes)} index file (index_slot_count={config.index_slot_count}, "
            f"index_entry_count={config.index_entry_count}; defaults "
            f"{defaults.index_slot_count}, {defaults.index_entry_count})"
        )
        needed_bytes += index_bytes
    stats = os.statvfs(root)
    free_bytes = stats.f_bavail * stats.f_frsize
    assert needed_bytes > 0
    if free_bytes >= needed_bytes:
        return
    raise DiskFullError(
        errno.ENOSPC,
        f"no room for a new store at {root}: its first files need {needed_bytes} bytes, "
        f"{' and '.join(needs)}, and the filesystem has {free_bytes} bytes "
        f"({_mib(free_bytes)}) free: lower those settings or free space",
    )


def _holds_a_file(directory: str, parse_name: Callable[[str], int | None]) -> bool:
    """Whether ``directory`` holds a file whose name ``parse_name`` accepts."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    return any(parse_name(name) is not None for name in names)


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / MIB:,.1f} MiB"
