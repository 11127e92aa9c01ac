"""The CLI's broker security and metrics commands.

- ``mqstore credentials add|remove|list [USER] [--mechanism M] [--file PATH]``: the SASL
  users of ``mqstore serve`` (mqstore.broker.credentials). The password is read from
  stdin when it is not a terminal, else prompted for twice; never from argv, where
  ``ps`` and shell history would show it.
- ``mqstore serve`` options: ``--tls-cert/--tls-key``, ``--sasl-mechanism``,
  ``--credentials``, ``--sasl-plain-without-tls``, ``--metrics-listen``.
- ``mqstore stats --broker HOST:PORT``: reads a broker's Prometheus endpoint.

Importing this module loads nothing of the broker: those imports happen in the
commands.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import urllib.request
from typing import Any, Final

from mqstore.commitlog.errors import InvalidArgumentError

__all__ = [
    "add_credentials_options",
    "add_security_options",
    "cmd_credentials",
    "credentials_path",
    "print_broker_metrics",
    "read_password",
]

MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAPE_TIMEOUT_S: Final = 10.0
PASSWORD_BYTES_MAX: Final = 1024  # a longer stdin is not a password


def add_security_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate")
    serve.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    serve.add_argument(
        "--sasl-mechanism",
        action="append",
        choices=MECHANISMS,
        default=[],
        help="require SASL with this mechanism (repeatable)",
    )
    serve.add_argument(
        "--credentials", metavar="PATH", help="the users file (default: STORE/credentials.json)"
    )
    serve.add_argument(
        "--sasl-plain-without-tls",
        action="store_true",
        help="allow PLAIN without TLS (passwords in clear: loopback tests only)",
    )
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics here (default: off)"
    )


def add_credentials_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("add", "remove", "list"))
    parser.add_argument("user", nargs="?", help="the user (add, remove)")
    parser.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM,
        default=[],
        help="store keys for this SCRAM mechanism (repeatable; default: both). "
        "PLAIN logins are checked against them.",
    )
    parser.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations")
    parser.add_argument(
        "--file", metavar="PATH", help="the users file (default: STORE/credentials.json)"
    )


def credentials_path(args: argparse.Namespace, given: str | None) -> str:
    from mqstore.broker.credentials import CREDENTIALS_FILE

    return given or os.path.join(args.store, CREDENTIALS_FILE)


def read_password() -> str:
    """The password from stdin (one line), or prompted for twice on a terminal.

    Raises:
        InvalidArgumentError: empty, too long, or the two entries differ.
    """
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise InvalidArgumentError("the passwords differ")
    else:
        password = sys.stdin.readline(PASSWORD_BYTES_MAX + 1).rstrip("\r\n")
    if not password or len(password) > PASSWORD_BYTES_MAX:
        raise InvalidArgumentError(f"a password is 1 to {PASSWORD_BYTES_MAX} characters")
    return password


def cmd_credentials(args: argparse.Namespace) -> int:
    from mqstore.broker.credentials import CredentialStore

    store = CredentialStore(credentials_path(args, args.file))
    if args.action == "list":
        for user, mechanisms in store.users().items():
            if args.json:
                print(json.dumps({"user": user, "mechanisms": mechanisms}))
            else:
                print(f"{user}\t{','.join(mechanisms)}")
        return 0
    if not args.user:
        raise InvalidArgumentError(f"credentials {args.action} needs a USER")
    if args.action == "add":
        store.add(args.user, read_password(), args.mechanism or list(SCRAM), args.iterations)
        print(f"mqstore: user {args.user!r} saved in {store.path}", file=sys.stderr)
        return 0
    if not store.remove(args.user):
        raise InvalidArgumentError(f"no user {args.user!r} in {store.path}")
    print(f"mqstore: user {args.user!r} removed from {store.path}", file=sys.stderr)
    return 0


def print_broker_metrics(address: str, as_json: bool) -> int:
    """Scrape ``http://ADDRESS/metrics`` and print one line per sample.

    Raises:
        InvalidArgumentError: the endpoint cannot be read.
    """
    from prometheus_client.parser import text_string_to_metric_families

    url = address if "://" in address else f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode()
    except (OSError, ValueError) as error:
        raise InvalidArgumentError(f"cannot read {url}: {error}") from None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue  # the histogram's buckets and the creation stamps: too much
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            if as_json:
                print(
                    json.dumps(
                        {"name": sample.name, "labels": sample.labels, "value": sample.value}
                    )
                )
            else:
                print(f"{sample.name}{{{labels}}} {_number(sample.value)}")
    return 0


def _number(value: Any) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
