"""The broker's metrics, in Prometheus' text format, through prometheus_client.

Each Broker has its own ``CollectorRegistry`` (several brokers in one process do not
mix their figures). Counted as requests go by: requests per API and version with a
latency histogram, request and response bytes, connections (open, accepted, closed,
refused), error codes in responses, SASL outcomes, messages produced and fetched.
Read at scrape time (``_ScrapeCollector``): each group's lag per topic and partition
(log end offset minus committed offset) and the engine's ``stats()`` figures (flush
and dispatch positions, lag, files...).

``serve_metrics`` serves ``/metrics`` over HTTP on its own thread (off by default);
``mqstore stats --broker HOST:PORT`` reads it.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mqstore.engine import Engine

__all__ = ["BrokerMetrics", "MetricsServer", "count_records", "serve_metrics"]

log = logging.getLogger(__name__)

#: Record batch v2: records_count int32 sits after baseOffset int64, batchLength
#: int32, leaderEpoch int32, magic int8, crc uint32, attributes int16, lastOffsetDelta
#: int32, first/maxTimestamp int64 x2, producerId int64, epoch int16, baseSequence int32.
BATCH_LENGTH: Final = struct.Struct(">q i")  # baseOffset, batchLength
RECORDS_COUNT_AT: Final = 57
RECORDS_COUNT: Final = struct.Struct(">i")
BATCH_OVERHEAD: Final = 12  # baseOffset + batchLength precede the counted length
assert RECORDS_COUNT_AT + RECORDS_COUNT.size == 61  # the v2 header is 61 bytes
LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
#: Group-lag series per scrape, at most: a scrape stays small with 100,000 queues.
LAG_SERIES_MAX: Final = 10_000


def count_records(data: Any) -> int:
    """Records in a run of v2 record batches (a partial tail batch is not counted)."""
    if data is None:
        return 0
    if isinstance(data, list | tuple):
        return sum(count_records(part) for part in data)
    view = memoryview(data)
    count, position = 0, 0
    while position + RECORDS_COUNT_AT + RECORDS_COUNT.size <= len(view):
        _, length = BATCH_LENGTH.unpack_from(view, position)
        if length <= 0 or position + BATCH_OVERHEAD + length > len(view):
            break
        (records,) = RECORDS_COUNT.unpack_from(view, position + RECORDS_COUNT_AT)
        count += max(records, 0)
        position += BATCH_OVERHEAD + length
    return count


def error_codes(message: Any, depth: int = 0) -> Iterator[int]:
    """Every non-zero ``error_code`` in a response object, nested ones included."""
    fields = getattr(message, "fields", None)
    if not isinstance(fields, dict) or depth > 4:
        return
    for name in fields:
        value = getattr(message, name, None)
        if name == "error_code" and value:
            yield int(value)
        elif isinstance(value, list):
            for item in value:
                yield from error_codes(item, depth + 1)


class BrokerMetrics:
    """The counters one broker updates (thread-safe: prometheus_client locks)."""

    def __init__(self, engine: Engine, high_watermark: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mqstore_broker_requests", "Requests answered", ["api", "version"], registry=r
        )
        self.latency = Histogram(
            "mqstore_broker_request_seconds",
            "Request latency, read to response built",
            ["api"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.bytes_in = Counter(
            "mqstore_broker_request_bytes", "Request bytes read", ["api"], registry=r
        )
        self.bytes_out = Counter(
            "mqstore_broker_response_bytes", "Response bytes sent", ["api"], registry=r
        )
        self.errors = Counter(
            "mqstore_broker_response_errors", "Error codes in responses", ["code"], registry=r
        )
        self.connections_open = Gauge(
            "mqstore_broker_connections_open", "Connections open", registry=r
        )
        self.accepted = Counter(
            "mqstore_broker_connections_accepted", "Connections accepted", registry=r
        )
        self.closed = Counter(
            "mqstore_broker_connections_closed", "Accepted connections closed", registry=r
        )
        self.closed_for_cause = Counter(
            "mqstore_broker_connections_closed_for_cause",
            "Connections refused or closed by the broker, by cause",
            ["reason"],
            registry=r,
        )
        self.authentications = Counter(
            "mqstore_broker_sasl_authentications",
            "SASL authentications",
            ["mechanism", "result"],
            registry=r,
        )
        self.produced = Counter(
            "mqstore_broker_produced_messages", "Records in Produce requests", registry=r
        )
        self.fetched = Counter(
            "mqstore_broker_fetched_messages", "Records in Fetch responses", registry=r
        )
        self.sendfile_bytes = Counter(
            "mqstore_broker_sendfile_bytes",
            "Fetch bytes sent by sendfile from the segment files (zero copy)",
            registry=r,
        )
        r.register(_ScrapeCollector(engine, high_watermark))

    def request(self, api: str, version: int, seconds: float, size_in: int, size_out: int) -> None:
        self.requests.labels(api, str(version)).inc()
        self.latency.labels(api).observe(seconds)
        self.bytes_in.labels(api).inc(size_in)
        self.bytes_out.labels(api).inc(size_out)

    def response_errors(self, response: Any) -> None:
        for code in error_codes(response):
            self.errors.labels(str(code)).inc()


class _ScrapeCollector(Collector):
    """Figures read when scraped: group lag and the engine's stats()."""

    def __init__(self, engine: Engine, high_watermark: Any) -> None:
        self.engine = engine
        self.high_watermark = high_watermark  # (topic, partition) -> log end offset

    def describe(self) -> Iterable[Any]:
        return []  # read at scrape time only: do not run collect() at registration

    def collect(self) -> Iterable[Any]:
        try:
            yield from self._lag()
            yield from self._store()
        except Exception:  # a scrape never takes the broker down; the log says why
            log.exception("metrics scrape failed")

    def _lag(self) -> Iterator[Any]:
        names = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            "mqstore_broker_group_lag", "Log end offset minus committed offset", labels=names
        )
        committed = GaugeMetricFamily(
            "mqstore_broker_group_committed_offset", "Committed offset", labels=names
        )
        series = 0
        for group in self.engine.offsets.groups():
            for (topic, partition), (offset, _) in sorted(self.engine.offsets.load(group).items()):
                if series >= LAG_SERIES_MAX:
                    break
                series += 1
                end = self.high_watermark(topic, partition)
                labels = [group, topic, str(partition)]
                committed.add_metric(labels, offset)
                lag.add_metric(labels, max(end - offset, 0))
        yield lag
        yield committed

    def _store(self) -> Iterator[Any]:
        stats = getattr(self.engine, "stats", None)  # both engines have it; the protocol not
        for name, value in sorted((stats() if stats else {}).items()):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            yield GaugeMetricFamily(f"mqstore_store_{name}", f"engine stats() {name}", value)


class MetricsServer:
    """``/metrics`` over HTTP on its own daemon thread."""

    def __init__(self, metrics: BrokerMetrics, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, host, metrics.registry)
        self.host = host
        self.port = int(self._server.server_port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(metrics: BrokerMetrics, host: str, port: int) -> MetricsServer:
    """Serve ``metrics`` on HOST:PORT (0: a free port; see ``MetricsServer.port``).

    Raises:
        OSError: the address cannot be bound.
    """
    server = MetricsServer(metrics, host, port)
    log.info("metrics on http://%s:%d/metrics", host, server.port)
    return server
