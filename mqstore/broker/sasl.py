"""SASL on the broker: SaslHandshake (v0-1), SaslAuthenticate (v0-1), and the server
side of PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677).

A connection's ``Authenticator`` walks: handshake (the client names a mechanism) ->
authenticate (one or two token exchanges) -> done. Handshake v1 carries the tokens in
SaslAuthenticate requests; after a v0 handshake the tokens come as raw size-prefixed
frames with no Kafka header (KIP-152), and the answers go back the same way.

Until ``done``, the server (mqstore.broker.server) answers only ApiVersions,
SaslHandshake and SaslAuthenticate; anything else closes the connection. A failed
authentication is answered (SASL_AUTHENTICATION_FAILED, v1) and the connection closed.

SCRAM: the server nonce comes from ``secrets``; the proof is checked as
``H(ClientProof XOR HMAC(StoredKey, AuthMessage)) == StoredKey`` with
``hmac.compare_digest``. An unknown user gets a made-up salt derived from a per-broker
secret, so the first exchange does not tell which users exist; the proof then fails.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any, Final

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from mqstore.broker.credentials import (
    ITERATIONS_MIN,
    MECHANISMS_SCRAM,
    CredentialStore,
    ScramCredential,
)
from mqstore.broker.protocol import Api
from mqstore.commitlog.errors import StoreError

__all__ = [
    "MECHANISMS",
    "SASL_APIS",
    "Authenticator",
    "SaslAuthenticationError",
]

SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
#: Served (and advertised only when SASL is on), both v0-1.
SASL_APIS: Final = {
    SASL_HANDSHAKE: Api(SASL_HANDSHAKE, SaslHandshakeRequest, SaslHandshakeResponse, 0, 0, 1),
    SASL_AUTHENTICATE: Api(
        SASL_AUTHENTICATE, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 0, 1
    ),
}
MECHANISMS: Final = ("PLAIN", *MECHANISMS_SCRAM)
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
SASL_AUTHENTICATION_FAILED: Final = 58
TOKEN_BYTES_MAX: Final = 4096  # a SASL token beyond this is refused (ours are < 300 bytes)


class SaslAuthenticationError(StoreError):
    """A SASL exchange failed: the connection is answered, then closed."""


class Authenticator:
    """The SASL state of one connection."""

    def __init__(self, credentials: CredentialStore, mechanisms: tuple[str, ...], secret: bytes):
        self.credentials = credentials
        self.mechanisms = mechanisms
        self.secret = secret  # per broker: unknown users' fake salts
        self.mechanism: str | None = None
        self.raw_tokens = False  # a v0 handshake: tokens come as raw frames
        self.user: str | None = None
        self.failed = False
        self._scram: _ScramExchange | None = None

    @property
    def done(self) -> bool:
        return self.user is not None

    def handshake(self, request: Any, version: int) -> Any:
        """The SaslHandshake answer; a mechanism we serve starts an exchange."""
        code = 0
        if self.mechanism is not None or self.done:
            code = ILLEGAL_SASL_STATE
            self.failed = True
        elif request.mechanism not in self.mechanisms:
            code = UNSUPPORTED_SASL_MECHANISM
        else:
            self.mechanism = request.mechanism
            self.raw_tokens = version == 0
        return SaslHandshakeResponse(
            version=version, error_code=code, mechanisms=list(self.mechanisms)
        )

    def authenticate(self, request: Any, version: int) -> Any:
        """The SaslAuthenticate answer (run on a worker thread: PLAIN derives keys)."""
        try:
            reply = self.step(bytes(request.auth_bytes))
            code, message = 0, None
        except SaslAuthenticationError as error:
            reply, code, message = b"", SASL_AUTHENTICATION_FAILED, str(error)
        fields: dict[str, Any] = {"session_lifetime_ms": 0} if version >= 1 else {}
        return SaslAuthenticateResponse(
            version=version, error_code=code, error_message=message, auth_bytes=reply, **fields
        )

    def step(self, token: bytes) -> bytes:
        """One token in, one out; sets ``user`` on success.

        Raises:
            SaslAuthenticationError: a bad token, an unknown user or a wrong password
                (``failed`` is then set: the connection closes).
        """
        try:
            if self.mechanism is None or self.done:
                raise SaslAuthenticationError("SaslAuthenticate before SaslHandshake")
            if len(token) > TOKEN_BYTES_MAX:
                raise SaslAuthenticationError(f"a SASL token of {len(token)} bytes")
            if self.mechanism == "PLAIN":
                return self._plain(token)
            if self._scram is None:
                self._scram = _ScramExchange(self.mechanism, self.credentials, self.secret)
                return self._scram.first(token)
            reply = self._scram.final(token)
            self.user = self._scram.user
            return reply
        except SaslAuthenticationError:
            self.failed = True
            raise

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationError("a PLAIN token is authzid NUL user NUL password")
        authzid, user_bytes, password_bytes = parts
        try:
            user, password = user_bytes.decode(), password_bytes.decode()
        except UnicodeDecodeError:
            raise SaslAuthenticationError("a PLAIN token that is not UTF-8") from None
        if authzid and authzid != user_bytes:
            raise SaslAuthenticationError("PLAIN authorization id differs from the user")
        credential = self.credentials.lookup(user, "PLAIN")
        if credential is None or not credential.matches_password(password):
            raise SaslAuthenticationError(f"authentication failed for user {user!r}")
        self.user = user
        return b""


class _ScramExchange:
    """The server side of one SCRAM exchange (RFC 5802 section 5)."""

    def __init__(self, mechanism: str, credentials: CredentialStore, secret: bytes) -> None:
        self.digest = MECHANISMS_SCRAM[mechanism]
        self.mechanism = mechanism
        self.credentials = credentials
        self.secret = secret
        self.user = ""
        self.credential: ScramCredential | None = None
        self.gs2_header = ""
        self.nonce = ""
        self.client_first_bare = ""
        self.server_first = ""

    def first(self, token: bytes) -> bytes:
        """client-first-message -> server-first-message."""
        text = _text(token)
        gs2, sep, bare = _split_gs2(text)
        if not sep:
            raise SaslAuthenticationError("a SCRAM client-first message without a GS2 header")
        attributes = _attributes(bare)
        if "n" not in attributes or "r" not in attributes or not attributes["r"]:
            raise SaslAuthenticationError("a SCRAM client-first message needs n= and r=")
        if "m" in attributes:
            raise SaslAuthenticationError("SCRAM extensions (m=) are not supported")
        self.user = _unescape(attributes["n"])
        self.gs2_header = gs2
        self.client_first_bare = bare
        self.nonce = attributes["r"] + base64.b64encode(secrets.token_bytes(18)).decode()
        self.credential = self.credentials.lookup(self.user, self.mechanism)
        salt, iterations = self._salt()
        self.server_first = f"r={self.nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self.server_first.encode()

    def _salt(self) -> tuple[bytes, int]:
        if self.credential is not None:
            return self.credential.salt, self.credential.iterations
        fake = hmac.digest(self.secret, self.user.encode(), "sha256")
        return fake, ITERATIONS_MIN

    def final(self, token: bytes) -> bytes:
        """client-final-message -> server-final-message (proof checked)."""
        if not self.server_first:
            raise SaslAuthenticationError("a SCRAM exchange out of order")
        text = _text(token)
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep:
            raise SaslAuthenticationError("a SCRAM client-final message without a proof")
        attributes = _attributes(without_proof)
        binding = base64.b64encode(self.gs2_header.encode()).decode()
        if not hmac.compare_digest(attributes.get("c", ""), binding):
            raise SaslAuthenticationError("SCRAM channel binding does not match")
        if not hmac.compare_digest(attributes.get("r", ""), self.nonce):
            raise SaslAuthenticationError("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise SaslAuthenticationError("a SCRAM proof that is not base64") from None
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        credential = self.credential
        if credential is None:
            raise SaslAuthenticationError(f"authentication failed for user {self.user!r}")
        signature = hmac.digest(credential.stored_key, auth_message, self.digest)
        if len(proof) != len(signature):
            raise SaslAuthenticationError(f"authentication failed for user {self.user!r}")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored = hashlib.new(self.digest, client_key).digest()
        if not hmac.compare_digest(stored, credential.stored_key):
            raise SaslAuthenticationError(f"authentication failed for user {self.user!r}")
        verifier = hmac.digest(credential.server_key, auth_message, self.digest)
        return b"v=" + base64.b64encode(verifier)


def _text(token: bytes) -> str:
    try:
        return token.decode()
    except UnicodeDecodeError:
        raise SaslAuthenticationError("a SCRAM message that is not UTF-8") from None


def _split_gs2(text: str) -> tuple[str, str, str]:
    """("n,," or "n,a=authzid,", sep, client-first-message-bare)."""
    flag, sep1, rest = text.partition(",")
    authzid, sep2, bare = rest.partition(",")
    if flag not in ("n", "y") or not sep1 or not sep2:
        if flag.startswith("p="):
            raise SaslAuthenticationError("SCRAM channel binding (-PLUS) is not supported")
        return "", "", ""
    return f"{flag},{authzid},", ",", bare


def _attributes(text: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise SaslAuthenticationError(f"a malformed SCRAM attribute {item[:20]!r}")
        attributes.setdefault(key, value)
    return attributes


def _unescape(name: str) -> str:
    """RFC 5802's saslname: "=2C" is ",", "=3D" is "=", any other "=" is an error."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise SaslAuthenticationError("a malformed SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")
