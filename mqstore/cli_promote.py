"""``mqstore promote``: tell a running follower broker to become the leader.

The request is replication's private Promote API (mqstore.replication.protocol) on
the broker's port. The follower refuses when it is not in the in-sync set as far as
it knows, unless ``--unclean``; then the answer says what may be lost. On success
the new leader tells its former leader the new epoch (mqstore.replication.node).
"""

from __future__ import annotations

import argparse
import sys

from mqstore.replication.node import control_request, parse_address
from mqstore.replication.protocol import (
    ReplicationProtocolError,
    decode_promote_response,
    encode_promote,
)

__all__ = ["cmd_promote"]


def cmd_promote(args: argparse.Namespace) -> int:
    """0 and the new epoch on stdout; 1 and the broker's reason on stderr."""
    host, port = parse_address(args.broker)
    try:
        payload = control_request(
            host, port, encode_promote(args.unclean, 1), args.timeout_ms / 1000
        )
        _, error, epoch, message = decode_promote_response(payload)
    except OSError as error_:
        print(f"mqstore promote: cannot reach {args.broker}: {error_}", file=sys.stderr)
        return 1
    except ReplicationProtocolError as error_:
        print(f"mqstore promote: {args.broker} answered badly: {error_}", file=sys.stderr)
        return 1
    if error:
        print(f"mqstore promote: refused (error {error}, epoch {epoch}): {message}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"mqstore: {args.broker} is the leader at epoch {epoch}: {message}", flush=True)
    return 0
