"""BrokerConfig: the broker's one frozen, keyword-only config, every field bounded.

Defaults follow Kafka's broker settings where one exists (named in each comment).
"""

from __future__ import annotations

from typing import Any, Final

import attrs
from attrs.validators import and_, deep_iterable, ge, in_, instance_of, le, optional

from mqstore.broker.protocol import FRAME_BYTES_MAX
from mqstore.commitlog.errors import ConfigError

__all__ = ["BrokerConfig"]

PORT_MAX: Final = 65_535
CONNECTIONS_LIMIT: Final = 100_000  # the fds of one process bound it long before this


def _checked(*validators: Any) -> Any:
    """attrs validators whose failure is a ConfigError naming the field."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        for validator in validators:
            try:
                validator(instance, attribute, value)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"BrokerConfig.{attribute.name}: {error}") from None

    return check


def _int(low: int, high: int) -> Any:
    return _checked(instance_of(int), ge(low), le(high))


_STR = _checked(instance_of(str))
_BOOL = _checked(instance_of(bool))
_OPTIONAL_STR = _checked(optional(instance_of(str)))
#: The SASL mechanisms served (mqstore.broker.sasl), named as Kafka names them.
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """Settings of one broker.

    Raises ConfigError (a ValueError) on construction when a field is out of range.
    """

    host: str = attrs.field(default="127.0.0.1", validator=_STR)
    port: int = attrs.field(default=9092, validator=_int(0, PORT_MAX))  # 0: any free port
    #: The host Metadata advertises; None: ``host``, or 127.0.0.1 when host is a
    #: wildcard (librdkafka may resolve "localhost" to ::1).
    advertised_host: str | None = attrs.field(
        default=None, validator=_checked(optional(instance_of(str)))
    )
    node_id: int = attrs.field(default=0, validator=_int(0, 2**31 - 1))
    #: socket.request.max.bytes: a larger request frame closes its connection.
    frame_bytes_max: int = attrs.field(default=FRAME_BYTES_MAX, validator=_int(64, 1 << 30))
    #: Requests of one connection read ahead of their responses (pipelining); the
    #: connection stops reading past it. Kafka's clients keep at most 5 in flight.
    in_flight_per_connection_max: int = attrs.field(default=16, validator=_int(1, 1024))
    #: queued.max.request.bytes: request bytes read and not yet answered, over all
    #: connections; past it connections stop reading (one request always proceeds).
    queued_request_bytes_max: int = attrs.field(default=256 << 20, validator=_int(64, 1 << 34))
    #: max.connections and max.connections.per.ip (Kafka: unbounded; bounded here).
    connections_max: int = attrs.field(default=2048, validator=_int(1, CONNECTIONS_LIMIT))
    connections_per_address_max: int = attrs.field(
        default=1024, validator=_int(1, CONNECTIONS_LIMIT)
    )
    #: connections.max.idle.ms: a connection with no request for this long is closed.
    idle_timeout_ms: int = attrs.field(default=600_000, validator=_int(100, 2**31 - 1))
    #: From a frame's size to its last byte: a client that announces a frame and stalls
    #: holds its bytes of queued_request_bytes_max (every connection's room) only this long.
    request_body_timeout_ms: int = attrs.field(default=30_000, validator=_int(100, 2**31 - 1))
    #: auto.create.topics.enable and num.partitions: Metadata creates unknown topics.
    auto_create_topics: bool = attrs.field(default=True, validator=_BOOL)
    default_partitions: int = attrs.field(default=1, validator=_int(1, 10_000))
    #: A Fetch waits at most this long for min_bytes, whatever max_wait_ms asks.
    fetch_wait_max_ms: int = attrs.field(default=30_000, validator=_int(0, 300_000))
    #: On the segmented engine, answer Fetch by sendfile from the segment files
    #: (mqstore.broker.zero_copy); TLS connections copy whatever this says.
    zero_copy_fetch: bool = attrs.field(default=True, validator=_BOOL)
    #: Threads that read for Fetch and ListOffsets (the produce path has one thread,
    #: which keeps each partition's appends and sequence checks in order).
    read_threads: int = attrs.field(default=4, validator=_int(1, 64))
    #: group.initial.rebalance.delay.ms: a new group waits this long for more members.
    initial_rebalance_delay_ms: int = attrs.field(default=100, validator=_int(0, 300_000))
    #: group.min/max.session.timeout.ms.
    session_timeout_min_ms: int = attrs.field(default=1_000, validator=_int(1, 2**31 - 1))
    session_timeout_max_ms: int = attrs.field(default=1_800_000, validator=_int(1, 2**31 - 1))
    #: TLS (stdlib ssl): a PEM certificate chain and its key; both or neither.
    tls_cert_path: str | None = attrs.field(default=None, validator=_OPTIONAL_STR)
    tls_key_path: str | None = attrs.field(default=None, validator=_OPTIONAL_STR)
    #: sasl.enabled.mechanisms: empty means no authentication. When set, a connection
    #: gets only ApiVersions, SaslHandshake and SaslAuthenticate until it authenticates.
    sasl_mechanisms: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=_checked(deep_iterable(in_(SASL_MECHANISMS)))
    )
    #: The credentials file (mqstore.broker.credentials); None: credentials.json in
    #: the store folder (serve) - required when sasl_mechanisms is set.
    credentials_path: str | None = attrs.field(default=None, validator=_OPTIONAL_STR)
    #: PLAIN sends the password in clear: refused without TLS unless this is set
    #: (loopback tests only).
    sasl_plain_without_tls: bool = attrs.field(default=False, validator=_BOOL)
    #: The Prometheus text endpoint (``/metrics``); port None: off. Port 0: any free one.
    metrics_host: str = attrs.field(default="127.0.0.1", validator=_STR)
    metrics_port: int | None = attrs.field(
        default=None, validator=_checked(optional(and_(instance_of(int), ge(0), le(PORT_MAX))))
    )

    def __attrs_post_init__(self) -> None:
        if self.session_timeout_min_ms > self.session_timeout_max_ms:
            raise ConfigError("session_timeout_min_ms is above session_timeout_max_ms")
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ConfigError("tls_cert_path and tls_key_path go together")
        if self.sasl_mechanisms and self.credentials_path is None:
            raise ConfigError("sasl_mechanisms needs a credentials_path")
        if "PLAIN" in self.sasl_mechanisms and not self.tls and not self.sasl_plain_without_tls:
            raise ConfigError(
                "SASL PLAIN sends passwords in clear: give a TLS certificate, "
                "or set sasl_plain_without_tls (loopback tests only)"
            )

    @property
    def tls(self) -> bool:
        return self.tls_cert_path is not None

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        return "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
