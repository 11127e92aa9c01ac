"""PowerFS: a FUSE pass-through filesystem that loses what a power cut loses.

    python -m bench.powerfs BACKING MOUNTPOINT      # serve (foreground) until unmounted

The harness (bench.powerloss) mounts it, runs a store on it, SIGKILLs the writer,
writes ``cut <seed>`` to ``<mount>/.powerfs``, unmounts, and mounts the same backing
directory again: the new mount sees only what a real disk would hold after the cut.

Backing layout::

    BACKING/manifest.json   the namespace: {"next_ino", "inodes": {ino: {dir, mode, entries}}}
    BACKING/inodes/<ino>    one plain file per regular-file inode (its current content)
    BACKING/cut.json        figures of the last cut (written by the cut)

Inodes have our own ids, so a rename changes only directory entries. Everything
present at mount time is durable (it is the previous cut's result).

The model (strict POSIX; what no sync covered is lost):

- File data. A WRITE goes through to the inode file at once (reads see it), but a
  page (4 KiB) written since the inode's last FSYNC is *dirty*: before the first
  write to a durable page its durable content is saved (an undo page). A shared
  writable mmap reaches us the same way: msync / fdatasync / writeback arrive as
  WRITEs of the dirty pages, then FSYNC.
- FSYNC (fsync or fdatasync, ``datasync`` ignored) of an inode makes its current
  content and size durable: the undo pages are dropped.
- File size. The size after a cut is the size at the inode's last FSYNC (0 if it was
  never synced): an unsynced extension (write past the end, ftruncate,
  posix_fallocate) is lost, an unsynced shrink is undone (the cut pages were saved).
- Directory entries. FSYNCDIR of a directory makes its current entries (name ->
  inode) durable. create, unlink, rename and mkdir not followed by an FSYNCDIR of
  the parent(s) are undone: the file is absent, or back under its old name with its
  durable content. A new directory is durable only through its parent's FSYNCDIR, and
  its own entries only through its own. A file's FSYNC does not make its name durable.
- The cut. From the control write on, every WRITE and FSYNC is discarded and every
  other change fails with EIO, so the killed writer's dirty pages still in the kernel
  page cache are lost as in a real cut. Each dirty page below the durable size is then,
  with a seeded random choice, left at its durable content (REVERT_PERCENT), kept at its
  newest content (the disk wrote it before the cut), or torn: each 512-byte sector
  old or new (TORN_PERCENT). The inode files are rewritten in place to that state, the
  durable namespace becomes the namespace, and unreachable inodes are deleted.
- The control file takes ``cut <seed> <lose>``: ``lose`` is "all" (the model above),
  or "data", "names" or "nothing" to narrow the loss when looking for a cause.
- Not modelled: metadata other than size and entries (mode, times), hard links,
  xattrs, reordering inside one FSYNC (an FSYNC completes whole or not at all), a
  sync that reports an error.

flock works (it is kernel-local on FUSE). Single-threaded (``-s``): every operation
runs alone, so the cut sees a consistent state.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import subprocess
import sys
import time
from typing import Any

import attrs

# mfusepy loads libfuse2 if it finds one; PowerFS is written and tested against libfuse3.
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
try:
    import mfusepy  # type: ignore[import-untyped]  # FUSE bindings: no stubs, no py.typed
except (ImportError, OSError, AttributeError):  # no library, or no libfuse on this machine
    mfusepy = None

__all__ = ["CONTROL_NAME", "CutFigures", "Mount", "PowerFS", "available"]

PAGE_BYTES = 4096  # the kernel's page: the unit msync and writeback send
SECTOR_BYTES = 512  # the unit a disk writes atomically: a torn page mixes sectors
ROOT_INO = 1
CONTROL_NAME = ".powerfs"  # write "cut <seed>" here; lives only in the mount root
MANIFEST_NAME = "manifest.json"
REPORT_NAME = "cut.json"
INODES_DIR = "inodes"
REVERT_PERCENT = 45  # dirty page left at its durable content
TORN_PERCENT = 10  # dirty page torn by sectors; the rest (45 %) kept at its new content
LOSE_MODES = ("all", "data", "names", "nothing")  # what a cut may lose (see PowerFS.cut)
MOUNT_WAIT_S = 20.0  # a mount or unmount slower than this is a failure
LAZY_UNMOUNT_WAIT_S = 2.0  # then the process is killed (the mount is already detached)
assert PAGE_BYTES % SECTOR_BYTES == 0


def available() -> str | None:
    """None if PowerFS can run here, else why not (no /dev/fuse, no library, ...)."""
    if mfusepy is None:
        return "mfusepy (or libfuse3) is not installed"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent"
    if not any(os.access(os.path.join(d, "fusermount3"), os.X_OK) for d in _path_dirs()):
        return "fusermount3 is not installed (Debian: fuse3)"
    return None


def _path_dirs() -> list[str]:
    return os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)


@attrs.define
class Inode:
    """One file or directory; ``entries`` is the live namespace, ``durable_entries``
    what the last FSYNCDIR made durable (directories only)."""

    ino: int
    is_dir: bool
    mode: int
    durable_size: int = 0  # files: size at the last FSYNC
    undo: dict[int, bytes] = attrs.field(factory=dict)  # page -> durable content
    entries: dict[str, int] = attrs.field(factory=dict)
    durable_entries: dict[str, int] = attrs.field(factory=dict)


@attrs.define
class CutFigures:
    seed: int = 0
    files: int = 0  # regular files in the crash state
    dirty_pages: int = 0  # pages written since their file's last FSYNC
    pages_reverted: int = 0
    pages_kept: int = 0
    pages_torn: int = 0
    sizes_reverted: int = 0  # files whose size differed from the durable size
    names_undone: int = 0  # live entries absent, or different, in the crash state
    names_restored: int = 0  # durable entries that were gone from the live namespace
    inodes_dropped: int = 0
    writes: int = 0  # counted since the mount
    fsyncs: int = 0
    fsyncdirs: int = 0
    discarded_writes: int = 0  # arrived after the cut


_STATVFS_FIELDS = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                   "f_files", "f_flag", "f_frsize", "f_namemax")  # fmt: skip
_Base: Any = mfusepy.Operations if mfusepy is not None else object


class PowerFS(_Base):
    """The filesystem; see the module docstring for the model."""

    use_ns = True  # mfusepy: times in nanoseconds

    def __init__(self, backing: str) -> None:
        self.backing = backing
        self.inode_dir = os.path.join(backing, INODES_DIR)
        os.makedirs(self.inode_dir, exist_ok=True)
        self.inodes: dict[int, Inode] = {}
        self.next_ino = ROOT_INO + 1
        self.handles: dict[int, tuple[int, int]] = {}  # fh -> (backing fd, ino)
        self.next_fh = 1
        self.cut_done = False
        self.figures = CutFigures()
        self._load()

    # ------------------------------------------------------------ manifest

    def _load(self) -> None:
        path = os.path.join(self.backing, MANIFEST_NAME)
        if not os.path.exists(path):
            self.inodes[ROOT_INO] = Inode(ROOT_INO, is_dir=True, mode=0o755)
            return
        with open(path) as handle:
            document = json.load(handle)
        self.next_ino = document["next_ino"]
        for key, meta in document["inodes"].items():
            ino = int(key)
            entries = {name: int(child) for name, child in meta["entries"].items()}
            inode = Inode(ino, is_dir=meta["dir"], mode=meta["mode"], entries=entries)
            inode.durable_entries = dict(entries)  # all of a mounted state is durable
            if not inode.is_dir:
                inode.durable_size = os.path.getsize(self._data(ino))
            self.inodes[ino] = inode
        assert ROOT_INO in self.inodes and self.inodes[ROOT_INO].is_dir

    def _save(self) -> None:
        document = {
            "next_ino": self.next_ino,
            "inodes": {
                str(ino): {"dir": inode.is_dir, "mode": inode.mode, "entries": inode.entries}
                for ino, inode in self.inodes.items()
            },
        }
        _write_json(os.path.join(self.backing, MANIFEST_NAME), document)

    def _data(self, ino: int) -> str:
        return os.path.join(self.inode_dir, str(ino))

    # ------------------------------------------------------------ lookup

    def _resolve(self, path: str | None) -> Inode:
        if path is None:
            raise mfusepy.FuseOSError(errno.EIO)  # an unlinked open file without its fh
        inode = self.inodes[ROOT_INO]
        for part in path.split("/"):
            if not part:
                continue
            if not inode.is_dir or part not in inode.entries:
                raise mfusepy.FuseOSError(errno.ENOENT)
            inode = self.inodes[inode.entries[part]]
        return inode

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, name = os.path.split(path.rstrip("/"))
        parent = self._resolve(head)
        if not parent.is_dir:
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _mutable(self) -> None:
        if self.cut_done:
            raise mfusepy.FuseOSError(errno.EIO)

    def _new_inode(self, is_dir: bool, mode: int) -> Inode:
        inode = Inode(self.next_ino, is_dir=is_dir, mode=mode & 0o7777)
        self.next_ino += 1
        self.inodes[inode.ino] = inode
        if not is_dir:
            os.close(os.open(self._data(inode.ino), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        return inode

    def _open_fh(self, inode: Inode) -> int:
        if inode.is_dir:
            raise mfusepy.FuseOSError(errno.EISDIR)
        fd = os.open(self._data(inode.ino), os.O_RDWR | os.O_CLOEXEC)  # mmap needs RDWR
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = (fd, inode.ino)
        return fh

    # ------------------------------------------------------------ attributes

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        if path == "/" + CONTROL_NAME:
            return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": 0}
        if fh is not None and fh in self.handles:
            inode = self.inodes[self.handles[fh][1]]
        else:
            inode = self._resolve(path)
        if inode.is_dir:
            return {"st_mode": stat.S_IFDIR | inode.mode, "st_nlink": 2, "st_ino": inode.ino}
        st = os.stat(self._data(inode.ino))
        return {
            "st_mode": stat.S_IFREG | inode.mode,
            "st_nlink": 1,
            "st_ino": inode.ino,
            "st_size": st.st_size,
            "st_blocks": st.st_blocks,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
            "st_atime": st.st_atime_ns,
        }

    def access(self, path: str, amode: int) -> int:
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        self._mutable()
        self._resolve(path).mode = mode & 0o7777
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        return {name: getattr(st, name) for name in _STATVFS_FIELDS}

    # ------------------------------------------------------------ namespace

    def readdir(self, path: str, fh: int) -> list[str]:
        inode = self._resolve(path)
        extra = [CONTROL_NAME] if inode.ino == ROOT_INO else []
        return [".", "..", *extra, *inode.entries]

    def mkdir(self, path: str, mode: int) -> int:
        self._mutable()
        parent, name = self._parent(path)
        if name in parent.entries:
            raise mfusepy.FuseOSError(errno.EEXIST)
        parent.entries[name] = self._new_inode(is_dir=True, mode=mode).ino
        return 0

    def rmdir(self, path: str) -> int:
        self._mutable()
        parent, name = self._parent(path)
        inode = self._resolve(path)
        if not inode.is_dir:
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        if inode.entries:
            raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        del parent.entries[name]
        return 0

    def unlink(self, path: str) -> int:
        self._mutable()
        parent, name = self._parent(path)
        if self._resolve(path).is_dir:
            raise mfusepy.FuseOSError(errno.EISDIR)
        del parent.entries[name]  # the inode file stays: a durable entry may still name it
        return 0

    def rename(self, old: str, new: str) -> int:
        self._mutable()
        old_parent, old_name = self._parent(old)
        new_parent, new_name = self._parent(new)
        inode = self._resolve(old)
        target = new_parent.entries.get(new_name)
        if target is not None and self.inodes[target].is_dir:
            if not inode.is_dir:
                raise mfusepy.FuseOSError(errno.EISDIR)
            if self.inodes[target].entries:
                raise mfusepy.FuseOSError(errno.ENOTEMPTY)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = inode.ino
        return 0

    def link(self, target: str, source: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)  # hard links are not modelled

    def symlink(self, target: str, source: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)

    # ------------------------------------------------------------ files

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        self._mutable()
        parent, name = self._parent(path)
        if name in parent.entries:
            return self.open(path, flags)
        inode = self._new_inode(is_dir=False, mode=mode)
        parent.entries[name] = inode.ino
        return self._open_fh(inode)

    def open(self, path: str, flags: int) -> int:
        if path == "/" + CONTROL_NAME:
            return 0  # fh 0 is the control file
        inode = self._resolve(path)
        fh = self._open_fh(inode)
        if flags & os.O_TRUNC:
            self._mutable()
            self._truncate(inode, self.handles[fh][0], 0)
        return fh

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        if fh == 0:
            return b""
        return os.pread(self.handles[fh][0], size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        if fh == 0:
            return self._control(data)
        if self.cut_done:
            self.figures.discarded_writes += 1
            return len(data)  # the power is off: the write reaches no disk
        fd, ino = self.handles[fh]
        self._save_pages(self.inodes[ino], fd, offset, offset + len(data))
        self.figures.writes += 1
        written = os.pwrite(fd, data, offset)
        assert written == len(data)
        return written

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._mutable()
        inode = self._resolve(path)
        fd = os.open(self._data(inode.ino), os.O_RDWR | os.O_CLOEXEC)
        try:
            self._truncate(inode, fd, length)
        finally:
            os.close(fd)
        return 0

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        self._mutable()
        if mode != 0:
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)  # only plain allocation
        os.posix_fallocate(self.handles[fh][0], offset, size)  # never changes content
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        if self.cut_done or fh == 0:
            return 0
        fd, ino = self.handles[fh]
        inode = self.inodes[ino]
        inode.durable_size = os.fstat(fd).st_size
        inode.undo.clear()
        self.figures.fsyncs += 1
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        if self.cut_done:
            return 0
        inode = self._resolve(path)
        inode.durable_entries = dict(inode.entries)
        self.figures.fsyncdirs += 1
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        if fh != 0:
            os.close(self.handles.pop(fh)[0])
        return 0

    def _save_pages(self, inode: Inode, fd: int, start: int, end: int) -> None:
        """Save the durable content of durable pages in [start, end) about to change."""
        for page in range(start // PAGE_BYTES, (end + PAGE_BYTES - 1) // PAGE_BYTES):
            position = page * PAGE_BYTES
            if position >= inode.durable_size or page in inode.undo:
                continue
            inode.undo[page] = os.pread(fd, PAGE_BYTES, position)

    def _truncate(self, inode: Inode, fd: int, length: int) -> None:
        size = os.fstat(fd).st_size
        if length < size:
            self._save_pages(inode, fd, length, size)  # a shrink destroys durable pages
        os.ftruncate(fd, length)

    # ------------------------------------------------------------ the cut

    def _control(self, data: bytes) -> int:
        words = data.decode().split()
        if len(words) != 3 or words[0] != "cut" or words[2] not in LOSE_MODES:
            raise mfusepy.FuseOSError(errno.EINVAL)
        if self.cut_done:
            raise mfusepy.FuseOSError(errno.EALREADY)
        self.cut(int(words[1]), lose=words[2])
        return len(data)

    def cut(self, seed: int, lose: str = "all") -> CutFigures:
        """Lose power: from now on nothing is written; rewrite the backing to the
        crash state (see the module docstring) and save the manifest and figures.

        ``lose`` narrows what is lost, to tell which kind of loss a store mishandles:
        "data" (every name is kept), "names" (all data and sizes are kept), "nothing"
        (the control experiment: as if everything had been synced before the cut)."""
        assert lose in LOSE_MODES
        self.cut_done = True
        self._sync_everything(names=lose in ("data", "nothing"), data=lose in ("names", "nothing"))
        rng = random.Random(seed)
        figures = self.figures
        figures.seed = seed
        reachable = self._durable_tree(figures)
        for ino in sorted(reachable):
            inode = self.inodes[ino]
            if not inode.is_dir:
                figures.files += 1
                self._crash_file(inode, rng, figures)
        for ino in sorted(set(self.inodes) - reachable):
            if not self.inodes[ino].is_dir:
                fds = [fd for fd, open_ino in self.handles.values() if open_ino == ino]
                for fd in fds:
                    os.ftruncate(fd, 0)  # its open handles read nothing any more
                os.unlink(self._data(ino))
            del self.inodes[ino]
            figures.inodes_dropped += 1
        self._save()
        _write_json(os.path.join(self.backing, REPORT_NAME), attrs.asdict(figures))
        return figures

    def _sync_everything(self, names: bool, data: bool) -> None:
        for inode in self.inodes.values():
            if inode.is_dir and names:
                inode.durable_entries = dict(inode.entries)
            if not inode.is_dir and data:
                inode.undo.clear()
                inode.durable_size = os.path.getsize(self._data(inode.ino))

    def _durable_tree(self, figures: CutFigures) -> set[int]:
        """Make every reachable directory's durable entries its entries; returns the
        reachable inodes. A directory reachable twice keeps its first name."""
        reachable = {ROOT_INO}
        pending = [ROOT_INO]
        while pending:
            directory = self.inodes[pending.pop()]
            entries = {}
            for name, ino in sorted(directory.durable_entries.items()):
                child = self.inodes[ino]
                if child.is_dir and ino in reachable:
                    continue
                entries[name] = ino
                if ino not in reachable:
                    reachable.add(ino)
                    if child.is_dir:
                        pending.append(ino)
            figures.names_undone += sum(
                1 for name, ino in directory.entries.items() if entries.get(name) != ino
            )
            figures.names_restored += sum(1 for name in entries if name not in directory.entries)
            directory.entries = entries
            directory.durable_entries = dict(entries)
        return reachable

    def _crash_file(self, inode: Inode, rng: random.Random, figures: CutFigures) -> None:
        fd = os.open(self._data(inode.ino), os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size != inode.durable_size:
                figures.sizes_reverted += 1
            if size < inode.durable_size:
                os.ftruncate(fd, inode.durable_size)  # a shrink is undone below
            for page, old in sorted(inode.undo.items()):
                figures.dirty_pages += 1
                position = page * PAGE_BYTES
                roll = rng.randrange(100)
                if roll < REVERT_PERCENT:
                    figures.pages_reverted += 1
                    os.pwrite(fd, old, position)
                elif roll < REVERT_PERCENT + TORN_PERCENT:
                    figures.pages_torn += 1
                    new = os.pread(fd, PAGE_BYTES, position)
                    mixed = bytearray(new)
                    for sector in range(0, len(old), SECTOR_BYTES):
                        if rng.randrange(2):
                            mixed[sector : sector + SECTOR_BYTES] = old[
                                sector : sector + SECTOR_BYTES
                            ]
                    os.pwrite(fd, bytes(mixed), position)
                else:
                    figures.pages_kept += 1
            os.ftruncate(fd, inode.durable_size)
            os.fsync(fd)  # the host's disk: the next mount must read this state
        finally:
            os.close(fd)
        inode.undo.clear()


def _write_json(path: str, document: Any) -> None:
    tmp_path = path + ".tmp"
    with open(tmp_path, "w") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_path, path)


# ---------------------------------------------------------------------- mounting


class Mount:
    """A PowerFS process serving ``backing`` at ``mountpoint`` (a context manager).

    ``cut(seed)`` loses power and unmounts; ``mount()`` again serves the crash state.
    """

    def __init__(self, backing: str, mountpoint: str) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.process: subprocess.Popen[bytes] | None = None
        self.lazy_unmounts = 0
        os.makedirs(backing, exist_ok=True)
        os.makedirs(mountpoint, exist_ok=True)

    def mount(self) -> None:
        assert self.process is None
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        command = [sys.executable, "-m", "bench.powerfs", self.backing, self.mountpoint]
        self.process = subprocess.Popen(command, cwd=root)
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                self.process = None
                raise RuntimeError(f"powerfs exited before mounting {self.mountpoint}")
            if time.monotonic() > deadline:
                self.unmount()
                raise RuntimeError(f"powerfs did not mount {self.mountpoint}")
            time.sleep(0.01)

    def cut(self, seed: int, lose: str = "all") -> CutFigures:
        """Lose power now, unmount, and return the cut's figures (``lose``: see
        PowerFS.cut)."""
        fd = os.open(os.path.join(self.mountpoint, CONTROL_NAME), os.O_WRONLY)
        try:
            os.write(fd, f"cut {seed} {lose}".encode())
        finally:
            os.close(fd)
        self.unmount()
        with open(os.path.join(self.backing, REPORT_NAME)) as handle:
            return CutFigures(**json.load(handle))

    def unmount(self) -> None:
        """Unmount (lazily if busy) and wait for the process; the state is saved only
        by ``cut``."""
        if self.process is None:
            return
        for lazy in (False, True):
            flags = ["-u", "-z"] if lazy else ["-u"]
            done = subprocess.run(["fusermount3", *flags, self.mountpoint], capture_output=True)
            if done.returncode == 0:
                break
        self.lazy_unmounts += lazy  # something still held the mount: worth a look
        try:
            # After a lazy unmount the process serves until the last user lets go; the
            # crash state is already written (by the cut), so it need not wait long.
            self.process.wait(timeout=LAZY_UNMOUNT_WAIT_S if lazy else MOUNT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> Mount:
        self.mount()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unmount()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.split("\n")[2].strip(), file=sys.stderr)
        return 2
    if mfusepy is None:
        print("powerfs: mfusepy (libfuse3) is not available", file=sys.stderr)
        return 2
    backing, mountpoint = argv
    mfusepy.FUSE(
        PowerFS(os.path.abspath(backing)),
        mountpoint,
        foreground=True,
        nothreads=True,  # one operation at a time: the cut sees a consistent state
        attr_timeout=0,  # sizes change under mmap writeback; never serve stale attrs
        entry_timeout=0,
        negative_timeout=0,
        hard_remove=True,  # no .fuse_hidden renames: unlinked open files keep their fh
        fsname="powerfs",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
