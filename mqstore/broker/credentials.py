"""SCRAM credentials of the broker's users, in one JSON file written atomically.

File format (``credentials.json`` under the store folder unless a path is given)::

    {"format": 1,
     "users": {"alice": {"SCRAM-SHA-256": {"salt": b64, "iterations": int,
                                            "stored_key": b64, "server_key": b64},
                         "SCRAM-SHA-512": {...}}},
     "checksum": xxh3_64 of the canonical JSON of "users"}

Only the RFC 5802 derived keys are stored, never the password:
``SaltedPassword = PBKDF2-HMAC(H, password, salt, iterations)``,
``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``,
``ServerKey = HMAC(SaltedPassword, "Server Key")``. PLAIN is checked against the same
keys (the password is derived again and StoredKey compared in constant time).

Crash policy: writes go through ``write_json_atomically`` (old file or new file, never a
mix). A file that does not parse or whose checksum is wrong raises CorruptDataError;
the broker then refuses to start (it never serves with half a user list).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
from typing import Any, Final

import attrs

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.errors import CorruptDataError, InvalidArgumentError

__all__ = [
    "CREDENTIALS_FILE",
    "MECHANISMS_SCRAM",
    "CredentialStore",
    "ScramCredential",
    "scram_credential",
]

CREDENTIALS_FILE: Final = "credentials.json"
FORMAT: Final = 1
#: mechanism name -> hashlib name. RFC 7677 (SHA-256) and Kafka's SCRAM-SHA-512.
MECHANISMS_SCRAM: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS_MIN: Final = 4096  # RFC 7677's minimum, and Kafka's
ITERATIONS_MAX: Final = 1 << 20  # PLAIN re-derives per login: bound the CPU it costs
SALT_BYTES: Final = 32
USER_BYTES_MAX: Final = 256  # a user name beyond this is refused (names go in a JSON key)


@attrs.frozen(kw_only=True)
class ScramCredential:
    """One user's keys for one SCRAM mechanism (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @property
    def digest(self) -> str:
        return MECHANISMS_SCRAM[self.mechanism]

    def matches_password(self, password: str) -> bool:
        """Whether ``password`` derives this StoredKey (PLAIN's check; constant time)."""
        again = scram_credential(self.mechanism, password, self.salt, self.iterations)
        return hmac.compare_digest(again.stored_key, self.stored_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }


def scram_credential(
    mechanism: str, password: str, salt: bytes | None = None, iterations: int = ITERATIONS_MIN
) -> ScramCredential:
    """Derive the stored keys of ``password``.

    Raises:
        InvalidArgumentError: an unknown mechanism, or iterations out of bounds.
    """
    digest = MECHANISMS_SCRAM.get(mechanism)
    if digest is None:
        raise InvalidArgumentError(f"unknown SCRAM mechanism {mechanism!r}")
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise InvalidArgumentError(
            f"iterations {iterations} outside [{ITERATIONS_MIN}, {ITERATIONS_MAX}]"
        )
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    return ScramCredential(
        mechanism=mechanism,
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.new(digest, client_key).digest(),
        server_key=hmac.digest(salted, b"Server Key", digest),
    )


def check_user(user: object) -> str:
    """Raises InvalidArgumentError unless ``user`` is a usable name."""
    if not isinstance(user, str) or not user:
        raise InvalidArgumentError("a user name is a non-empty string")
    if len(user.encode()) > USER_BYTES_MAX or any(ord(c) < 0x20 for c in user):
        raise InvalidArgumentError(f"user name {user[:40]!r}... is too long or has controls")
    return user


class CredentialStore:
    """The users of one credentials file. The broker reads it again when the file
    changes (``mqstore credentials add`` takes effect without a restart)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._refresh()

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism`` (PLAIN: any SCRAM one), or None."""
        self._refresh()
        entries = self._users.get(user, {})
        if mechanism == "PLAIN":
            return next(iter(entries.values()), None)
        return entries.get(mechanism)

    def users(self) -> dict[str, list[str]]:
        self._refresh()
        return {name: sorted(entries) for name, entries in sorted(self._users.items())}

    def add(self, user: str, password: str, mechanisms: list[str], iterations: int) -> None:
        """Add or replace ``user``'s credentials for each mechanism.

        Raises:
            InvalidArgumentError: a bad user name, mechanism or iteration count, or an
                empty password.
        """
        check_user(user)
        if not password:
            raise InvalidArgumentError("an empty password is refused")
        derived = {m: scram_credential(m, password, iterations=iterations) for m in mechanisms}
        with self._lock:
            self._refresh()
            users = dict(self._users)
            users[user] = {**users.get(user, {}), **derived}
            self._write(users)

    def remove(self, user: str) -> bool:
        """Remove ``user``; False when there was no such user."""
        with self._lock:
            self._refresh()
            if user not in self._users:
                return False
            users = {name: e for name, e in self._users.items() if name != user}
            self._write(users)
            return True

    def _write(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        body = {u: {m: c.to_json() for m, c in e.items()} for u, e in users.items()}
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        write_json_atomically(
            self.path, {"format": FORMAT, "users": body, "checksum": json_checksum(body)}
        )
        os.chmod(self.path, 0o600)  # keys are not the password, but still not for all
        self._stamp = None
        self._refresh()

    def _refresh(self) -> None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._users = None, {}
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._users = _parse(self.path)
            self._stamp = stamp


def _parse(path: str) -> dict[str, dict[str, ScramCredential]]:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        if document.get("format") != FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {FORMAT}")
        body = document["users"]
        if json_checksum(body) != document["checksum"]:
            raise ValueError("checksum mismatch")
        return {
            check_user(user): {
                mechanism: ScramCredential(
                    mechanism=mechanism,
                    salt=base64.b64decode(entry["salt"], validate=True),
                    iterations=int(entry["iterations"]),
                    stored_key=base64.b64decode(entry["stored_key"], validate=True),
                    server_key=base64.b64decode(entry["server_key"], validate=True),
                )
                for mechanism, entry in entries.items()
                if mechanism in MECHANISMS_SCRAM
            }
            for user, entries in body.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptDataError(path, 0, f"credentials file: {error}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
