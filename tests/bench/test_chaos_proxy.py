"""bench.chaos_proxy on real sockets: it forwards both ways, a cut drops live
connections and refuses (or starves) new ones, heal restores the link, delay holds."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from bench.chaos_proxy import ChaosProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[ChaosProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    chaos = ChaosProxy("127.0.0.1", server.server_address[1]).start()
    yield chaos
    chaos.stop()
    server.shutdown()
    server.server_close()


def _connect(proxy: ChaosProxy) -> socket.socket:
    return socket.create_connection((proxy.host, proxy.port), timeout=2)


def _echo(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _dead(sock: socket.socket) -> bool:
    """The link through ``sock`` no longer echoes: closed or reset."""
    try:
        return _echo(sock, b"ping") != b"ping"
    except OSError:
        return True


def test_it_forwards_both_ways(proxy):
    with _connect(proxy) as sock:
        payload = bytes(range(256)) * 2000  # 512 KB: several chunks
        assert _echo(sock, payload) == payload
    deadline = time.monotonic() + 5  # the last chunk is counted just after it is sent
    while proxy.bytes_forwarded < 2 * len(payload) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.bytes_forwarded == 2 * len(payload)


def test_a_refusing_cut_drops_live_connections_and_resets_new_ones(proxy):
    live = _connect(proxy)
    assert _echo(live, b"before") == b"before"
    proxy.cut("refuse")
    assert _dead(live)  # reset (or closed) under the client
    live.close()
    try:
        new = _connect(proxy)  # the proxy accepts, then resets at once...
    except OSError:
        pass  # ...so fast, at times, that connect itself sees the reset
    else:
        with new:
            assert _dead(new)
    proxy.heal()
    with _connect(proxy) as healed:
        assert _echo(healed, b"after") == b"after"


def test_a_blackhole_starves_new_connections_until_heal(proxy):
    proxy.cut("blackhole")
    starved = _connect(proxy)
    starved.settimeout(0.5)
    starved.sendall(b"anyone?")
    with pytest.raises(TimeoutError):
        starved.recv(10)  # accepted, never forwarded, never answered
    proxy.heal()
    starved.settimeout(2)
    try:
        assert starved.recv(10) == b""  # dropped at heal: the client reconnects
    except ConnectionResetError:
        pass
    starved.close()
    with _connect(proxy) as healed:
        assert _echo(healed, b"after") == b"after"
    assert proxy.cuts_total == 1


def test_delay_holds_every_chunk(proxy):
    proxy.delay(200)
    with _connect(proxy) as sock:
        began = time.monotonic()
        assert _echo(sock, b"slow") == b"slow"
        assert time.monotonic() - began >= 0.4  # one hold each way
    proxy.delay(0)
