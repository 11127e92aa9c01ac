"""``mqstore credentials`` and the credentials file (mqstore.broker.credentials), run
as users run them; ``mqstore serve`` with SASL and metrics as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from mqstore.broker.credentials import CredentialStore, scram_credential
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError
from tests.mqstore.test_cli import mqstore


def test_add_list_remove(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mqstore(store, "credentials", "add", "alice", stdin=b"pencil-123\n")
    mqstore(store, "credentials", "add", "bob", "--mechanism", "SCRAM-SHA-512", stdin=b"pw\n")
    listed = mqstore(store, "credentials", "list").stdout.decode().splitlines()
    assert listed == ["alice\tSCRAM-SHA-256,SCRAM-SHA-512", "bob\tSCRAM-SHA-512"]
    path = store / "credentials.json"
    text = path.read_text()
    assert "pencil" not in text and "pencil-123" not in text  # keys only
    assert os.stat(path).st_mode & 0o077 == 0
    credential = CredentialStore(str(path)).lookup("alice", "SCRAM-SHA-256")
    assert credential is not None and credential.matches_password("pencil-123")
    assert not credential.matches_password("pencil-124")
    mqstore(store, "credentials", "remove", "alice")
    assert mqstore(store, "credentials", "list").stdout.decode().splitlines() == [
        "bob\tSCRAM-SHA-512"
    ]
    assert b"no user" in mqstore(store, "credentials", "remove", "alice", code=1).stderr


@pytest.mark.parametrize("stdin", [b"\n", b""])
def test_an_empty_password_is_refused(tmp_path: Path, stdin: bytes) -> None:
    store = tmp_path / "store"
    mqstore(store, "credentials", "add", "alice", stdin=stdin, code=1)
    assert not (store / "credentials.json").exists()


def test_a_password_is_never_an_argument(tmp_path: Path) -> None:
    result = mqstore(tmp_path / "s", "credentials", "add", "alice", "secret", stdin=b"", code=1)
    assert b"unrecognized arguments" in result.stderr


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # torn
        lambda text: text.replace('"iterations": 4096', '"iterations": 4097'),  # checksum
        lambda text: "[]",
        lambda text: text.replace('"format": 1', '"format": 9'),
    ],
)
def test_a_damaged_file_is_a_typed_error(tmp_path: Path, damage: object) -> None:
    path = tmp_path / "credentials.json"
    CredentialStore(str(path)).add("alice", "pw", ["SCRAM-SHA-256"], 4096)
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    with pytest.raises(CorruptDataError):
        CredentialStore(str(path))
    result = mqstore(tmp_path / "s", "credentials", "list", "--file", str(path), code=None)
    assert result.returncode != 0 and b"Traceback" not in result.stderr


def test_bad_arguments_are_typed(tmp_path: Path) -> None:
    store = CredentialStore(str(tmp_path / "c.json"))
    for user in ("", "x" * 300, "tab\there"):
        with pytest.raises(InvalidArgumentError):
            store.add(user, "pw", ["SCRAM-SHA-256"], 4096)
    with pytest.raises(InvalidArgumentError):
        store.add("alice", "pw", ["SCRAM-SHA-1"], 4096)
    with pytest.raises(InvalidArgumentError):
        scram_credential("SCRAM-SHA-256", "pw", iterations=100)
    assert not (tmp_path / "c.json").exists()


def test_rfc7677_vector() -> None:
    """RFC 7677's example: user, pencil, the salt W22ZaJ0SNY7soEsUEjb6gQ== and 4096
    iterations give the ServerSignature the RFC prints for its exchange."""
    import base64
    import hmac

    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = scram_credential("SCRAM-SHA-256", "pencil", salt, 4096)
    auth_message = (
        b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    signature = hmac.digest(credential.server_key, auth_message, "sha256")
    assert base64.b64encode(signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_serve_with_scram_and_metrics(tmp_path: Path) -> None:
    """The process: credentials added by the CLI, a SCRAM client served, the metrics
    endpoint printed and counting, a wrong password refused; SIGTERM stops it."""
    store = tmp_path / "store"
    mqstore(store, "credentials", "add", "alice", stdin=b"pw-1\n")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "mqstore", "--store", str(store), "serve"),
            *("--listen", "127.0.0.1:0", "--sasl-mechanism", "SCRAM-SHA-512"),
            *("--metrics-listen", "127.0.0.1:0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        bootstrap = process.stdout.readline().decode().split(" on ")[1].strip()
        metrics_url = process.stdout.readline().decode().split(" on ")[1].strip()
        config = {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
        }
        producer = Producer({**config, "sasl.password": "pw-1"})
        producer.produce("t", b"one")
        assert producer.flush(15) == 0
        errors: list[object] = []
        wrong = Producer({**config, "sasl.password": "pw-2", "error_cb": errors.append})
        wrong.produce("t", b"two")
        wrong.flush(3)
        assert any("auth" in str(error).lower() for error in errors)
        with urllib.request.urlopen(metrics_url, timeout=10) as page:
            text = page.read().decode()
        assert 'result="ok"' in text and 'result="failed"' in text
        assert "mqstore_broker_produced_messages_total 1.0" in text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert process.returncode == 0
    listed = mqstore(store, "consume", "t", "--json").stdout.decode().splitlines()
    assert [json.loads(line)["value"] for line in listed] == ["one"]
