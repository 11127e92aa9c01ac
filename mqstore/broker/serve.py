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
from mqstore.replication.leader import ReplicationConfig
from mqstore.replication.node import ReplicaNode, parse_address

__all__ = ["cmd_serve", "parse_listen", "serve", "start_following"]

log = logging.getLogger(__name__)

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def serve(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    config: BrokerConfig | None = None,
    on_listening: Callable[[Broker], None] | None = None,
    follow: str | None = None,
    replica_id: int | None = None,
    replication: ReplicationConfig | None = None,
) -> None:
    """Serve ``engine`` over Kafka's protocol until SIGTERM or SIGINT (main thread
    only: it installs the signal handlers), then drain. The engine stays open: the
    caller closes it.

    Args:
        follow: ``HOST:PORT`` of a leader broker: the engine (a CommitLog store)
            becomes its follower, copying the leader's CommitLog from its own end
            (mqstore.replication) and refusing writes with NOT_LEADER_OR_FOLLOWER.
            Without it, a store demoted earlier follows the leader it recorded;
            any other starts leading with a new leader epoch.
        replica_id: this node's id (Metadata's node id, and its replica id in its
            requests to a leader); None: ``config.node_id``.
        replication: as a leader, which followers count for the high watermark and
            acks=all, min.insync.replicas and replica.lag.time.max.ms.

    Raises:
        OSError: the address cannot be bound.
        ConfigError: ``follow`` is not HOST:PORT, or the engine cannot follow.
    """
    import attrs

    config = attrs.evolve(config or BrokerConfig(), host=host, port=port)
    if replica_id is not None:
        if replica_id < 0:
            raise ConfigError(f"replica id {replica_id} must be >= 0")
        config = attrs.evolve(config, node_id=replica_id)
    if follow is not None:
        parse_listen(follow)  # a bad address fails before the broker starts
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in STOP_SIGNALS}
    try:
        with Broker(engine, config, replication=replication, follow=follow) as broker:
            if on_listening is not None:
                on_listening(broker)
            while not stop.wait(1.0):
                pass
            log.info("stopping: draining connections")
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def start_following(engine: Engine, leader: str, replica_id: int = 1) -> ReplicaNode:
    """Make ``engine`` a follower of the broker at ``leader`` (HOST:PORT), without a
    broker of its own, and start its fetcher; returns the node (its ``fetcher``), which
    the caller closes (``ReplicaNode.close``) before closing the engine.

    Raises:
        ConfigError: ``leader`` is not HOST:PORT, the replica id is out of 0..1023,
            or the engine cannot follow (the segmented engine has no single
            CommitLog to copy).
    """
    parse_listen(leader)
    if not hasattr(engine, "become_follower"):
        raise ConfigError("--follow needs the commitlog engine (one CommitLog to copy)")
    node = ReplicaNode(engine, node_id=replica_id)
    node.start("127.0.0.1", 0, follow=leader)
    return node


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9092`` for IPv6) as (host, port): the one parser the
    replication node uses too (``mqstore.replication.node.parse_address``).

    Raises:
        ConfigError: not HOST:PORT with a port from 0 to 65535.
    """
    return parse_address(listen)


def cmd_serve(args: argparse.Namespace) -> int:
    """``mqstore serve``: open the store as its writer and serve it."""
    from mqstore.cli_store import open_store

    host, port = parse_listen(args.listen)
    metrics_host, metrics_port = (
        parse_listen(args.metrics_listen) if args.metrics_listen else ("127.0.0.1", None)
    )
    limits = {
        name: value
        for name, value in (
            ("connections_max", args.max_connections),
            ("connections_per_address_max", args.max_connections_per_ip),
        )
        if value is not None
    }  # Kafka's max.connections and max.connections.per.ip; BrokerConfig bounds them
    config = BrokerConfig(
        **limits,
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
        node = broker.node  # the role last: scripts read the lines above by position
        if node is not None and node.fetcher is not None:
            print(f"mqstore: following {node.fetcher.host}:{node.fetcher.port}", flush=True)
        elif node is not None:
            print(f"mqstore: leading at epoch {node.epoch}", flush=True)

    try:
        replica_ids: list[int] = [int(n) for n in args.replica_ids.split(",") if n.strip()]
        replication = ReplicationConfig(
            replica_ids=replica_ids,
            min_insync_replicas=args.min_insync_replicas,
            replica_lag_time_max_ms=args.replica_lag_time_max_ms,
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(f"replication settings: {error}") from None
    store: Any
    # replicated: a restarted leader shows readers no more than its last HW
    # (MessageStore.open, held_at_open) until its followers are heard again.
    with open_store(args, write=True, replicated=bool(replica_ids)) as store:
        serve(
            store, host, port, config=config, on_listening=listening, follow=args.follow,
            replica_id=(1 if args.follow else 0) if args.replica_id is None else args.replica_id,
            replication=replication,
        )  # fmt: skip
    return 0
