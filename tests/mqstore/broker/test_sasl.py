"""SASL and TLS with real clients: librdkafka (SASL_SSL, SASL_PLAINTEXT; PLAIN and
SCRAM-SHA-256/512) and kafka-python 3 (SCRAM); wrong passwords refused; nothing but
ApiVersions and SASL before authentication."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from mqstore.broker import Broker, BrokerConfig
from mqstore.broker.credentials import CredentialStore
from mqstore.broker.sasl import Authenticator, SaslAuthenticationError
from tests.mqstore.broker.conftest import read_frame
from tests.mqstore.broker.test_protocol import api_versions, request_frame
from tests.mqstore.engines import open_engine

PASSWORD = "s3cret-pässword"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: Any) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (openssl: cryptography is not installed)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def secured(tmp_path: Any, tls: tuple[str, str] | None, **extra: Any) -> Iterator[Broker]:
    credentials = str(tmp_path / "credentials.json")
    CredentialStore(credentials).add("alice", PASSWORD, ["SCRAM-SHA-256", "SCRAM-SHA-512"], 4096)
    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(
        port=0,
        sasl_mechanisms=MECHANISMS,
        credentials_path=credentials,
        tls_cert_path=tls[0] if tls else None,
        tls_key_path=tls[1] if tls else None,
        sasl_plain_without_tls=tls is None,
        **extra,
    )
    with Broker(store, config) as broker:
        yield broker
    store.close()


@pytest.fixture
def tls_broker(tmp_path: Any, certificate: tuple[str, str]) -> Iterator[Broker]:
    yield from secured(tmp_path, certificate)


@pytest.fixture
def plain_broker(tmp_path: Any) -> Iterator[Broker]:
    yield from secured(tmp_path, None)


def client_config(broker: Broker, protocol: str, mechanism: str, password: str) -> dict[str, Any]:
    config = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        "sasl.username": "alice",
        "sasl.password": password,
    }
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = broker.config.tls_cert_path
    return config


def produce_and_consume(config: dict[str, Any], topic: str) -> list[bytes]:
    producer = Producer({**config, "linger.ms": 0})
    for i in range(5):
        producer.produce(topic, value=b"v%d" % i)
    assert producer.flush(15) == 0
    consumer = Consumer({**config, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 5:
                break
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_sasl_ssl(tls_broker: Broker, mechanism: str) -> None:
    config = client_config(tls_broker, "SASL_SSL", mechanism, PASSWORD)
    assert produce_and_consume(config, "t") == [b"v%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_sasl_plaintext(plain_broker: Broker, mechanism: str) -> None:
    config = client_config(plain_broker, "SASL_PLAINTEXT", mechanism, PASSWORD)
    assert produce_and_consume(config, "t") == [b"v%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_wrong_password_is_refused(plain_broker: Broker, mechanism: str) -> None:
    errors: list[Any] = []
    config = client_config(plain_broker, "SASL_PLAINTEXT", mechanism, "wrong")
    producer = Producer({**config, "error_cb": errors.append, "message.timeout.ms": 3000})
    producer.produce("t", b"x")
    producer.flush(5)
    assert any("auth" in str(error).lower() for error in errors), errors
    assert plain_broker.engine.list_topics() == {}  # nothing created, nothing written


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_scram(plain_broker: Broker, mechanism: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError

    common = {
        "bootstrap_servers": plain_broker.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
    }
    producer = KafkaProducer(**common, sasl_plain_password=PASSWORD)
    producer.send("k", b"hello").get(timeout=15)
    producer.close()
    consumer = KafkaConsumer(
        "k", **common, sasl_plain_password=PASSWORD, auto_offset_reset="earliest"
    )
    values = [r.value for rs in consumer.poll(10_000, max_records=1).values() for r in rs]
    consumer.close()
    assert values == [b"hello"]
    with pytest.raises(KafkaError):
        KafkaProducer(**common, sasl_plain_password="wrong", request_timeout_ms=3000)


def test_kafka_python_sasl_ssl_scram(tls_broker: Broker) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=tls_broker.bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=tls_broker.config.tls_cert_path,
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORD,
    )
    producer.send("k", b"over tls").get(timeout=15)
    producer.close()
    assert tls_broker.log.high_watermark("k", 0) == 1


def test_unauthenticated_produce_closes_and_writes_nothing(
    plain_broker: Broker, caplog: Any
) -> None:
    from kafka.protocol.producer import ProduceRequest

    versions = api_versions(plain_broker.port, 3)
    assert {17, 36} <= {k.api_key for k in versions.api_keys}  # advertised when SASL is on
    request = ProduceRequest(
        version=8,
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="t",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"")
                ],
            )
        ],
    )
    caplog.set_level(logging.WARNING, logger="mqstore.broker.server")
    with socket.create_connection(("127.0.0.1", plain_broker.port), timeout=5) as conn:
        conn.sendall(request_frame(request, correlation_id=7))
        assert read_frame(conn) is None  # closed, unanswered
        client = f"127.0.0.1:{conn.getsockname()[1]}"
    assert plain_broker.engine.list_topics() == {}
    assert any(
        client in r.getMessage() and "authentication" in r.getMessage() for r in caplog.records
    )


def test_sasl_apis_not_advertised_without_sasl(commitlog_broker: Broker) -> None:
    keys = {k.api_key for k in api_versions(commitlog_broker.port, 3).api_keys}
    assert not {17, 36} & keys


def test_scram_exchange_by_hand(tmp_path: Any) -> None:
    """The RFC 7677 exchange through a hand-written client; a tampered proof fails."""
    import base64
    import hashlib
    import hmac

    store = CredentialStore(str(tmp_path / "c.json"))
    store.add("us=er,x", "pencil", ["SCRAM-SHA-256"], 4096)

    def exchange(tamper: bool) -> bool:
        auth = Authenticator(store, MECHANISMS, b"k" * 32)
        auth.mechanism = "SCRAM-SHA-256"
        bare = "n=us=3Der=2Cx,r=abc"
        first = auth.step(("n,," + bare).encode()).decode()
        fields = dict(item.split("=", 1) for item in first.split(","))
        salted = hashlib.pbkdf2_hmac(
            "sha256", b"pencil", base64.b64decode(fields["s"]), int(fields["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        final_bare = f"c=biws,r={fields['r']}"
        message = f"{bare},{first},{final_bare}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if tamper:
            proof = bytes([proof[0] ^ 1]) + proof[1:]
        try:
            last = auth.step(f"{final_bare},p={base64.b64encode(proof).decode()}".encode())
        except SaslAuthenticationError:
            assert auth.failed and not auth.done
            return False
        server_key = hmac.digest(salted, b"Server Key", "sha256")
        assert last == b"v=" + base64.b64encode(hmac.digest(server_key, message, "sha256"))
        assert auth.user == "us=er,x"
        return True

    assert exchange(tamper=False)
    assert not exchange(tamper=True)


@pytest.mark.parametrize(
    "token",
    [b"", b"\xff\xfe", b"n,,", b"n,,r=x", b"x,,n=a,r=b", b"n,,n=a=b,r=c", b"n,,n=a,r=b,m=ext"],
)
def test_malformed_scram_tokens_are_refused(tmp_path: Any, token: bytes) -> None:
    auth = Authenticator(CredentialStore(str(tmp_path / "c.json")), MECHANISMS, b"k" * 32)
    auth.mechanism = "SCRAM-SHA-512"
    with pytest.raises(SaslAuthenticationError):
        auth.step(token)
    assert auth.failed


def test_unknown_user_gets_a_salt_then_fails(tmp_path: Any) -> None:
    auth = Authenticator(CredentialStore(str(tmp_path / "c.json")), MECHANISMS, b"k" * 32)
    auth.mechanism = "SCRAM-SHA-256"
    first = auth.step(b"n,,n=nobody,r=abc").decode()
    assert ",s=" in first and first.startswith("r=abc")
    nonce = first.split(",")[0][2:]
    with pytest.raises(SaslAuthenticationError):
        auth.step(f"c=biws,r={nonce},p=AAAA".encode())


def test_plain_token_checks(tmp_path: Any) -> None:
    store = CredentialStore(str(tmp_path / "c.json"))
    store.add("bob", "pw", ["SCRAM-SHA-512"], 4096)
    for token, ok in [
        (b"\x00bob\x00pw", True),
        (b"bob\x00bob\x00pw", True),
        (b"eve\x00bob\x00pw", False),
        (b"\x00bob\x00nope", False),
        (b"\x00bob", False),
    ]:
        auth = Authenticator(store, MECHANISMS, b"k" * 32)
        auth.mechanism = "PLAIN"
        if ok:
            auth.step(token)
            assert auth.user == "bob"
        else:
            with pytest.raises(SaslAuthenticationError):
                auth.step(token)


def test_handshake_v0_then_raw_tokens(plain_broker: Broker) -> None:
    """KIP-152's old path: after SaslHandshake v0 the token goes as a raw frame and
    the answer comes back raw; then the connection is served."""
    import struct

    from kafka.protocol.metadata import MetadataRequest
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    with socket.create_connection(("127.0.0.1", plain_broker.port), timeout=5) as conn:
        conn.sendall(request_frame(SaslHandshakeRequest(version=0, mechanism="PLAIN"), 1))
        payload = read_frame(conn)
        assert payload is not None
        answer = SaslHandshakeResponse.decode(payload[4:], version=0)
        assert answer.error_code == 0 and "SCRAM-SHA-512" in answer.mechanisms
        token = b"\x00alice\x00" + PASSWORD.encode()
        conn.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(conn) == b""  # PLAIN's empty server answer, raw
        conn.sendall(request_frame(MetadataRequest(version=8, topics=[]), 2))
        payload = read_frame(conn)
        assert payload is not None and struct.unpack_from(">i", payload)[0] == 2


def test_handshake_v0_wrong_password_closes(plain_broker: Broker) -> None:
    import struct

    from kafka.protocol.sasl import SaslHandshakeRequest

    with socket.create_connection(("127.0.0.1", plain_broker.port), timeout=5) as conn:
        conn.sendall(request_frame(SaslHandshakeRequest(version=0, mechanism="PLAIN"), 1))
        assert read_frame(conn) is not None
        token = b"\x00alice\x00wrong"
        conn.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(conn) is None


def test_unsupported_mechanism_is_answered_with_the_list(plain_broker: Broker) -> None:
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    with socket.create_connection(("127.0.0.1", plain_broker.port), timeout=5) as conn:
        conn.sendall(request_frame(SaslHandshakeRequest(version=1, mechanism="GSSAPI"), 1))
        payload = read_frame(conn)
        assert payload is not None
        answer = SaslHandshakeResponse.decode(payload[4:], version=1)
        assert answer.error_code == 33 and list(answer.mechanisms) == list(MECHANISMS)


def test_tls_without_sasl(tmp_path: Any, certificate: tuple[str, str]) -> None:
    """security.protocol=SSL: TLS only; a plaintext client gets nothing."""
    from kafka.protocol.metadata import ApiVersionsRequest

    store = open_engine("commitlog", tmp_path / "store")
    config = BrokerConfig(port=0, tls_cert_path=certificate[0], tls_key_path=certificate[1])
    with Broker(store, config) as broker:
        tls = {"bootstrap.servers": broker.bootstrap, "security.protocol": "SSL"}
        assert produce_and_consume({**tls, "ssl.ca.location": certificate[0]}, "s") == [
            b"v%d" % i for i in range(5)
        ]
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as conn:
            conn.sendall(request_frame(ApiVersionsRequest(version=0), 1))
            assert read_frame(conn) is None  # not a TLS handshake: closed
    store.close()


def test_authentication_outcomes_are_counted(plain_broker: Broker) -> None:
    from prometheus_client import generate_latest

    config = client_config(plain_broker, "SASL_PLAINTEXT", "SCRAM-SHA-256", PASSWORD)
    assert produce_and_consume(config, "c") == [b"v%d" % i for i in range(5)]
    wrong = Producer({**client_config(plain_broker, "SASL_PLAINTEXT", "PLAIN", "no")})
    wrong.produce("c", b"x")
    wrong.flush(3)
    text = generate_latest(plain_broker.metrics.registry).decode()
    assert 'mechanism="SCRAM-SHA-256",result="ok"' in text
    assert 'mechanism="PLAIN",result="failed"' in text
    assert 'closed_for_cause_total{reason="authentication"}' in text
