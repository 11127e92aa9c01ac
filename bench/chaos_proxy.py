"""A TCP proxy the chaos suite controls: the replication link between two brokers.

    proxy = ChaosProxy("127.0.0.1", leader_port).start()   # listens on proxy.port
    proxy.cut("refuse")     # drop every connection; new ones are reset at once
    proxy.cut("blackhole")  # drop every connection; new ones are accepted and starved
    proxy.heal()            # forward again (starved connections are dropped first)
    proxy.delay(50)         # hold every forwarded chunk 50 ms (0: no delay)
    proxy.stop()

A follower's ``--follow`` address names the proxy, so a cut is a network partition of
the replication link only (clients reach both brokers directly).

Threads: one accepts, two pump each connection (one per direction). A cut shuts both
sockets of every connection down, which wakes the pumps; they then close them. A
blackholed connection is accepted and never forwarded: its client learns nothing until
its own timeout, as behind a dropped route. Nothing here touches the brokers' files.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from typing import Final, Literal

__all__ = ["CutMode", "ChaosProxy"]

CutMode = Literal["refuse", "blackhole"]
#: One recv at most this many bytes: the forwarding granularity (and a delay's unit).
CHUNK_BYTES: Final = 256 * 1024
#: Connections held at once; past it new ones are reset (a runaway reconnect loop).
CONNECTIONS_MAX: Final = 256
#: The accept loop wakes this often to notice stop().
ACCEPT_POLL_S: Final = 0.2
DELAY_MS_MAX: Final = 60_000
#: SO_LINGER on, 0 s: close() sends a RST, as a refused or dropped link does.
_LINGER_RESET: Final = struct.pack("ii", 1, 0)


class ChaosProxy:
    """Forwards ``listen_host:listen_port`` (0: any free port) to ``target``."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        assert 0 < target_port < 65_536
        self.target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, listen_port), reuse_port=False)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._starved: set[socket.socket] = set()
        self._mode: CutMode | None = None
        self._delay_s = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="chaos-proxy", daemon=True)
        self.connections_total = 0
        self.cuts_total = 0
        self.bytes_forwarded = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._mode is not None

    def start(self) -> ChaosProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self._drop_all()

    def cut(self, mode: CutMode = "refuse") -> None:
        """Partition the link: every connection dropped (RST), and new ones reset
        ("refuse") or accepted and never forwarded ("blackhole") until heal()."""
        assert mode in ("refuse", "blackhole")
        with self._lock:
            self._mode = mode
            self.cuts_total += 1
        self._drop_all()

    def heal(self) -> None:
        """Forward again; connections starved by a blackhole are dropped, so their
        clients reconnect instead of waiting out their timeout."""
        with self._lock:
            self._mode = None
            starved, self._starved = self._starved, set()
        for sock in starved:
            _reset(sock)

    def delay(self, delay_ms: int) -> None:
        """Hold every forwarded chunk ``delay_ms`` (0 turns it off)."""
        assert 0 <= delay_ms <= DELAY_MS_MAX
        self._delay_s = delay_ms / 1000.0

    # ------------------------------------------------------------------ internals

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed by stop()
            self.connections_total += 1
            with self._lock:
                mode = self._mode
                full = len(self._pairs) >= CONNECTIONS_MAX
                if mode == "blackhole" and not full:
                    self._starved.add(client)
                    continue
            if mode == "refuse" or full:
                _reset(client)
                continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)  # the target is down: so is the link
            return
        upstream.settimeout(None)
        client.settimeout(None)
        pair = (client, upstream)
        with self._lock:
            if self._mode is not None:  # cut while connecting
                _reset(client)
                _reset(upstream)
                return
            self._pairs.add(pair)
        for source, sink in (pair, pair[::-1]):
            threading.Thread(
                target=self._pump, args=(pair, source, sink), name="chaos-pump", daemon=True
            ).start()

    def _pump(
        self,
        pair: tuple[socket.socket, socket.socket],
        source: socket.socket,
        sink: socket.socket,
    ) -> None:
        try:
            while True:
                chunk = source.recv(CHUNK_BYTES)
                if not chunk:
                    break
                if self._delay_s:
                    time.sleep(self._delay_s)
                if self._mode is not None:
                    break  # cut while this chunk was in flight: it is lost
                sink.sendall(chunk)
                with self._lock:  # two pumps per link: += is not atomic across threads
                    self.bytes_forwarded += len(chunk)
        except OSError:
            pass  # reset by a cut, or by either end
        self._drop(pair)

    def _drop(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.discard(pair)
        for sock in pair:
            _reset(sock)

    def _drop_all(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)


def _reset(sock: socket.socket) -> None:
    """Close with a RST; the other pump of the pair then fails and returns."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
