"""Fixtures shared across test packages."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for every Spark test (startup costs ~5 s), configured as in
    notes/spark.md: loopback only, no UI, 2 shuffle partitions, UTC."""
    pytest.importorskip("pyspark")  # here, so tests without Spark run without it
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need this venv (mqstore, xxhash)
    from pyspark.sql import SparkSession

    import mqstore.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(session)
    yield session
    session.stop()


class SyscallLog:
    """Records renames, unlinks and syncs by path, in call order, so that a test can
    check the durability rule: a name created, renamed or removed in a directory is
    durable only after an fsync of that directory (commitlog/durable.py)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        self._paths: dict[int, str] = {}
        real_open, real_rename, real_unlink = os.open, os.rename, os.unlink
        real_fsync, real_fdatasync = os.fsync, os.fdatasync

        def open_(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            self._paths[fd] = os.path.abspath(os.fspath(path))
            return fd

        def rename(src, dst, **kwargs):  # type: ignore[no-untyped-def]
            real_rename(src, dst, **kwargs)
            self.events.append(("rename", os.path.abspath(os.fspath(dst))))

        def unlink(path, **kwargs):  # type: ignore[no-untyped-def]
            real_unlink(path, **kwargs)
            self.events.append(("unlink", os.path.abspath(os.fspath(path))))

        def fsync(fd):  # type: ignore[no-untyped-def]
            real_fsync(fd)
            self.events.append(("fsync", self._paths.get(fd, f"fd {fd}")))

        def fdatasync(fd):  # type: ignore[no-untyped-def]
            real_fdatasync(fd)
            self.events.append(("fdatasync", self._paths.get(fd, f"fd {fd}")))

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)

    def undurable_names(self) -> list[tuple[str, str]]:
        """Every rename or unlink not followed by an fsync of its directory."""
        missing = []
        for index, (kind, path) in enumerate(self.events):
            if kind not in ("rename", "unlink"):
                continue
            directory = os.path.dirname(path)
            if ("fsync", directory) not in self.events[index + 1 :]:
                missing.append((kind, path))
        return missing


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> SyscallLog:
    return SyscallLog(monkeypatch)
