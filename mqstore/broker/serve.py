"""``serve``: run a broker in the foreground until SIGTERM or SIGINT, and the CLI's
``mqstore serve`` command on top of it.

SIGTERM and SIGINT drain the broker (mqstore.broker.server) and then close the
store cleanly (checkpoint written, ``abort`` marker removed). SIGKILL is a crash the
store recovers from at its next open.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, Final

from mqstore.broker.config import BrokerConfig
from mqstore.broker.credentials import CREDENTIALS_FILE
from mqstore.broker.server import Broker
from mqstore.commitlog.errors import ConfigError
from mqstore.engine import Engine

__all__ = ["cmd_serve", "parse_listen", "serve"]

log = logging.getLogger(__name__)

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def serve(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    config: BrokerConfig | None = None,
    on_listening: Callable[[Broker], None] | None = None,
) -> None:
    """Serve ``engine`` over Kafka's protocol until SIGTERM or SIGINT (main thread
    only: it installs the signal handlers), then drain. The engine stays open: the
    caller closes it.

    Raises:
        OSError: the address cannot be bound.
    """
    import attrs

    config = attrs.evolve(config or BrokerConfig(), host=host, port=port)
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in STOP_SIGNALS}
    try:
        with Broker(engine, config) as broker:
            if on_listening is not None:
                on_listening(broker)
            while not stop.wait(1.0):
                pass
            log.info("stopping: draining connections")
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9092`` for IPv6) as (host, port).

    Raises:
        ConfigError: not HOST:PORT with a port from 0 to 65535.
    """
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65_535:
        raise ConfigError(f"{listen!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def cmd_serve(args: argparse.Namespace) -> int:
    """``mqstore serve``: open the store as its writer and serve it."""
    from mqstore.cli_store import open_store

    host, port = parse_listen(args.listen)
    metrics_host, metrics_port = (
        parse_listen(args.metrics_listen) if args.metrics_listen else ("127.0.0.1", None)
    )
    config = BrokerConfig(
        host=host,
        port=port,
        auto_create_topics=not args.no_auto_create,
        tls_cert_path=args.tls_cert,
        tls_key_path=args.tls_key,
        sasl_mechanisms=tuple(args.sasl_mechanism),
        credentials_path=(
            (args.credentials or os.path.join(args.store, CREDENTIALS_FILE))
            if args.sasl_mechanism
            else None
        ),
        sasl_plain_without_tls=args.sasl_plain_without_tls,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
    )

    def listening(broker: Broker) -> None:
        # One line on stdout, so a script (or a test) learns the port when it asked for 0.
        print(f"mqstore: serving {args.store} on {broker.bootstrap}", flush=True)
        if broker.metrics_server is not None:
            server = broker.metrics_server
            print(f"mqstore: metrics on http://{server.host}:{server.port}/metrics", flush=True)

    store: Any
    with open_store(args, write=True) as store:
        serve(store, host, port, config=config, on_listening=listening)
    return 0
