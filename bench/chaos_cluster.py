"""The chaos suite's cluster: two ``mqstore serve`` processes on loopback, a proxy on
the replication link, and the nemesis's operations on them.

Node A serves ``--replica-id 0 --replica-ids 1``; node B ``--follow <proxy to A>
--replica-id 1 --replica-ids 0``; both ``--min-insync-replicas 2
--replica-lag-time-max-ms 2000`` over a sync-flush store (``flush_mode=sync``: a put,
and a follower's copy, returns only once durable) with 1 MiB CommitLog files (many
rolls). Each store may sit on its own PowerFS mount (bench.powerfs), so a power cut
of one node loses what no fsync covered. A node keeps its port across restarts, and
its arguments: after a promotion the nodes persist their roles themselves.

Faults (each applied, then healed, by ``Cluster``): SIGKILL and restart; SIGSTOP then
SIGCONT; a cut of the proxy (refused or blackholed) then heal; a power cut (SIGKILL,
PowerFS cut, remount, restart); a promotion of the follower (``mqstore promote``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Final

from bench.chaos_proxy import ChaosProxy, CutMode
from bench.powerfs import Mount
from mqstore.commitlog.durable import fsync_directory

__all__ = ["Cluster", "Node", "free_port"]

FILE_BYTES: Final = 1 << 20  # 1 MiB CommitLog files: the copy crosses many rolls
START_TIMEOUT_S: Final = 120.0  # a restart on PowerFS recovers through FUSE: slow
STOP_TIMEOUT_S: Final = 60.0
LAG_TIME_MAX_MS: Final = 2000
PROMOTE_TIMEOUT_S: Final = 60.0
ROOT: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    """A loopback port free now (the node binds it at once, and keeps it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Node:
    """One ``mqstore serve`` process over ``store`` on a fixed port."""

    def __init__(
        self, name: str, store: str, port: int, args: list[str], mount: Mount | None
    ) -> None:
        self.name = name
        self.store = store
        self.port = port
        self.args = args
        self.mount = mount
        self.process: subprocess.Popen[str] | None = None
        self.paused = False
        self.log_path = f"{store.rstrip('/')}.{name}.stderr" if mount is None else ""
        if mount is not None:  # the log must not sit on the filesystem we cut
            self.log_path = os.path.join(os.path.dirname(mount.backing), f"{name}.stderr")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        assert not self.alive
        command = [
            sys.executable,
            "-m",
            "mqstore" if self.mount is None else "bench.chaos_node",
            "--store",
            self.store,
            "--config",
            f"commitlog_file_size_bytes={FILE_BYTES}",
            "--config",
            "flush_mode=sync",
            "--config",
            "prewarm=false",
            "serve",
            "--listen",
            self.address,
            *self.args,
        ]
        with open(self.log_path, "a") as errors:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # EOF if it died first
        if re.search(r" on (\S+:\d+)$", line.strip()) is None:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"{self.name} did not start: {line!r} {self.log_tail()}")
        self.paused = False

    def signal(self, number: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(number)

    def kill(self) -> None:
        """SIGKILL (a paused process dies too) and reap."""
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        self.paused = False

    def stop(self) -> int:
        """SIGTERM (a clean shutdown: checkpoint written); the exit status."""
        assert self.process is not None
        if self.paused:
            self.signal(signal.SIGCONT)
            self.paused = False
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.process.returncode)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError), open(self.log_path) as logged:
            return logged.read()[-chars:]
        return ""


class Cluster:
    """Nodes A (the first leader) and B (its follower through ``proxy``) under
    ``workdir``; ``powerfs``: each store on its own PowerFS mount."""

    def __init__(self, workdir: str, *, powerfs: bool) -> None:
        self.workdir = workdir
        port_a, port_b = free_port(), free_port()
        self.proxy = ChaosProxy("127.0.0.1", port_a).start()
        common = ["--min-insync-replicas", "2", "--replica-lag-time-max-ms", str(LAG_TIME_MAX_MS)]
        args = {
            "A": ["--replica-id", "0", "--replica-ids", "1", *common],
            "B": [
                "--follow",
                self.proxy.address,
                "--replica-id",
                "1",
                "--replica-ids",
                "0",
                *common,
            ],
        }
        self.nodes: dict[str, Node] = {}
        for name, port in (("A", port_a), ("B", port_b)):
            mount = None
            store = os.path.join(workdir, f"store-{name}")
            if powerfs:
                mount = Mount(
                    os.path.join(workdir, f"backing-{name}"), os.path.join(workdir, f"mnt-{name}")
                )
                store = os.path.join(mount.mountpoint, "store")
            self.nodes[name] = Node(name, store, port, args[name], mount)
        self.leader = "A"
        self.promotions = 0

    @property
    def follower(self) -> str:
        return "B" if self.leader == "A" else "A"

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes.values())

    def start(self) -> None:
        for node in self.nodes.values():
            if node.mount is not None:
                node.mount.mount()
                os.makedirs(node.store, exist_ok=True)
                fsync_directory(node.mount.mountpoint)  # else a cut may undo the store
            node.start()

    def close(self) -> None:
        """Kill what still runs, unmount, stop the proxy (idempotent)."""
        for node in self.nodes.values():
            node.kill()
            if node.mount is not None:
                node.mount.unmount()
        self.proxy.stop()

    # ------------------------------------------------------------------ faults

    def kill(self, name: str, down_s: float) -> None:
        node = self.nodes[name]
        node.kill()
        time.sleep(down_s)
        node.start()

    def pause(self, name: str, paused_s: float) -> None:
        node = self.nodes[name]
        node.signal(signal.SIGSTOP)
        node.paused = True
        time.sleep(paused_s)
        node.signal(signal.SIGCONT)
        node.paused = False

    def partition(self, mode: CutMode, cut_s: float) -> None:
        self.proxy.cut(mode)
        time.sleep(cut_s)
        self.proxy.heal()

    def power_cut(self, name: str, seed: int) -> dict[str, Any]:
        """SIGKILL, lose what no fsync covered, remount, restart; the cut's figures."""
        node = self.nodes[name]
        assert node.mount is not None, "power cuts need the stores on PowerFS"
        node.kill()
        figures = node.mount.cut(seed)
        node.mount.mount()
        node.start()
        return {
            "dirty_pages": figures.dirty_pages,
            "names_undone": figures.names_undone,
            "sizes_reverted": figures.sizes_reverted,
        }

    def promote(self, *, unclean: bool) -> tuple[bool, str]:
        """``mqstore promote --broker <follower>``: (accepted, what it printed). On
        success the follower is the leader from now on."""
        target = self.nodes[self.follower]
        command = [sys.executable, "-m", "mqstore", "promote", "--broker", target.address]
        if unclean:
            command.append("--unclean")
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=ROOT, timeout=PROMOTE_TIMEOUT_S
        )
        said = (done.stdout + done.stderr).strip()[-500:]
        if done.returncode != 0:
            return False, said
        # It leads from now on: restarted, it must not follow its old leader again
        # (the old leader records its own demotion and follows it across restarts).
        args = target.args
        if "--follow" in args:
            at = args.index("--follow")
            del args[at : at + 2]
        self.leader = self.follower
        self.promotions += 1
        return True, said

    def heal_all(self) -> None:
        """Every node running and not paused, the link open."""
        self.proxy.heal()
        self.proxy.delay(0)
        for node in self.nodes.values():
            if node.paused:
                node.signal(signal.SIGCONT)
                node.paused = False
            if not node.alive:
                node.start()

    def commitlog_files(self, name: str) -> dict[str, bytes]:
        directory = os.path.join(self.nodes[name].store, "commitlog")
        files = {}
        for entry in sorted(os.listdir(directory)):
            with open(os.path.join(directory, entry), "rb") as handle:
                files[entry] = handle.read()
        return files
