"""The broker's network front: an asyncio event loop serving Kafka's protocol.

Seed 003's Reactor, in Python's terms:

- one event loop (its own thread, ``Broker.start``) accepts connections and reads
  and writes frames; nothing on it blocks on the disk;
- per connection, a reader task reads request frames ahead (pipelining) and queues
  one task per request, at most ``in_flight_per_connection_max``; a writer task
  sends the responses in request order (Kafka's rule), so a slow request delays
  only the responses behind it on its own connection;
- the work: Produce on one produce thread (appends and idempotence checks in
  order), the other APIs on ``read_threads``; a Fetch's long poll parks on the loop
  and one watcher thread wakes it from the engine's ``wait_for_data``
  (mqstore.broker.longpoll); the group APIs on the loop (mqstore.broker.groups),
  their directory listings on a read thread.

Bounds: frame size (``frame_bytes_max``: a larger frame closes the connection
unread), requests in flight per connection, request bytes read and not yet answered
across all connections (``queued_request_bytes_max``: readers wait), connections in
all and per address, idle connections (no request for ``idle_timeout_ms``) closed.

Bad input: a frame that is not a request we serve (unknown api key or version, a
body that does not decode, a negative size) closes that connection and nothing
else; an ApiVersions request above v3 is answered in v0 with error 35 (KIP-511).
A handler bug closes the connection and is logged with the client's address, as is
every connection closed for cause.

Security (docs/BROKER.md "Security"): TLS with the stdlib's ``ssl`` when the config
names a certificate; SASL (mqstore.broker.sasl) when it names mechanisms. Until a
connection authenticates, its requests are taken one at a time and only ApiVersions,
SaslHandshake and SaslAuthenticate are answered: any other request closes it unread.
Metrics (mqstore.broker.metrics) are counted here, per request and connection.

Zero copy (mqstore.broker.zero_copy): on the segmented engine over plaintext, a Fetch
pass returns pinned file ranges; the loop frames the response and the writer task
sends the ranges with ``loop.sendfile``. Every path that drops such a response (sent,
the client gone, a cancelled request, a long-poll pass not returned) releases its pins.

Shutdown (``Broker.stop``, SIGTERM under ``serve``): stop accepting, let the
requests already read finish and their responses go out (bounded by
``DRAIN_TIMEOUT_S``), close the connections, then the threads. The store is the
caller's to close (``serve`` closes the one it opened).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import ssl
import threading
import time
from collections import Counter
from functools import partial
from typing import Any, Final

from mqstore.broker.column_log import ColumnLog
from mqstore.broker.config import BrokerConfig
from mqstore.broker.credentials import CredentialStore
from mqstore.broker.groups import GroupCoordinator
from mqstore.broker.handlers import FetchPass, Handlers
from mqstore.broker.log import PartitionLog, RecordLog
from mqstore.broker.longpoll import LongPolls
from mqstore.broker.metrics import BrokerMetrics, MetricsServer, count_records, serve_metrics
from mqstore.broker.private_apis import answer_private
from mqstore.broker.protocol import (
    API_VERSIONS,
    FRAME_SIZE,
    Api,
    MalformedRequestError,
    RequestHead,
    decode_request,
    encode_response,
    peek,
    served,
    unsupported_api_versions,
)
from mqstore.broker.sasl import SASL_APIS, SASL_AUTHENTICATE, SASL_HANDSHAKE, Authenticator
from mqstore.broker.zero_copy import ZERO_COPY_VERSIONS, SegmentLog, ZeroCopyResponse, encode_fetch
from mqstore.commitlog.errors import ConfigError, StoreError
from mqstore.engine import Engine
from mqstore.replication.leader import ReplicationConfig
from mqstore.replication.node import ReplicaNode
from mqstore.replication.protocol import (
    LEADER_CHANGE_API_KEY,
    PROMOTE_API_KEY,
    REPLICA_FETCH_API_KEY,
)
from mqstore.segmented.store import SegmentedStore

__all__ = ["Broker"]

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S: Final = 10.0  # stop() waits this long for requests already read
START_TIMEOUT_S: Final = 30.0
PRODUCE: Final = 0
FETCH: Final = 1
OFFSET_COMMIT: Final = 8
#: Join, Heartbeat, Leave, SyncGroup, DescribeGroups, ListGroups
GROUP_APIS: Final = frozenset((11, 12, 13, 14, 15, 16))
#: What an unauthenticated connection may ask when SASL is on (Kafka's rule).
BEFORE_AUTHENTICATION: Final = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))
#: A request up to this size is decoded (and a Fetch's answer encoded) on the loop; a
#: larger one on a worker (8 MiB of Fetch partitions takes 0.3 s to decode).
LOOP_CODEC_BYTES_MAX: Final = 64 << 10
#: What a request task gives the sender: framed bytes, a zero-copy Fetch, or None.
_Response = bytes | ZeroCopyResponse | None

REPLICA_THREADS: Final = 8  # followers served at once; more wait for a thread
PRIVATE_APIS: Final = frozenset((REPLICA_FETCH_API_KEY, PROMOTE_API_KEY, LEADER_CHANGE_API_KEY))
#: What _read_frame returns when the peer closed (a request frame is never empty).
PEER_CLOSED: Final = b""


class Broker:
    """A Kafka-protocol server over one engine. ``start`` runs it on its own thread;
    the engine stays usable by the embedding process meanwhile."""

    def __init__(
        self,
        engine: Engine,
        config: BrokerConfig | None = None,
        *,
        log_: PartitionLog | None = None,
        replication: ReplicationConfig | None = None,
        follow: str | None = None,
    ) -> None:
        """``replication``: the leader's settings for its followers (which count for
        the HW, min.insync.replicas, replica.lag.time.max.ms); None: the defaults, no
        follower counts and acks=all waits for nobody but this broker. ``follow``:
        ``HOST:PORT`` of a leader this engine follows (mqstore.replication.node; a
        store recorded as a follower at its demotion follows its leader anyway)."""
        self.engine = engine
        self.config = config or BrokerConfig()
        self.log = log_ or _partition_log(engine)
        self.port = self.config.port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._per_address: Counter[str] = Counter()
        self._queued_bytes = 0  # request bytes read and not yet answered, all connections
        self._queued_room: asyncio.Event | None = None  # set when queued bytes went down
        self._produce_pool = concurrent.futures.ThreadPoolExecutor(1, "broker-produce")
        self._read_pool = concurrent.futures.ThreadPoolExecutor(
            self.config.read_threads, "broker-read"
        )
        #: Followers' ReplicaFetch long polls (mqstore.replication): one thread per
        #: follower at a time, in slices of LONG_POLL_SLICE_MS; clients' Fetches
        #: never wait here (mqstore.broker.longpoll).
        self._replica_pool = concurrent.futures.ThreadPoolExecutor(
            REPLICA_THREADS, "broker-replica"
        )
        self._long_polls: LongPolls | None = None  # made on the loop (_main)
        self.handlers: Handlers | None = None
        self.groups: GroupCoordinator | None = None
        self.metrics = BrokerMetrics(engine, self.log.high_watermark)
        self.metrics_server: MetricsServer | None = None
        self._tls = _tls_context(self.config)
        #: Fetch answers with sendfile from the segments (mqstore.broker.zero_copy):
        #: the segmented engine, and plaintext (TLS encrypts in user space).
        self.zero_copy = (
            self.config.zero_copy_fetch and self._tls is None and isinstance(self.log, SegmentLog)
        )
        self._credentials: CredentialStore | None = None
        if self.config.sasl_mechanisms:
            assert self.config.credentials_path is not None  # BrokerConfig checks it
            self._credentials = CredentialStore(self.config.credentials_path)
        self._sasl_secret = secrets.token_bytes(32)  # unknown users' fake SCRAM salts
        # Followers copy this engine's CommitLog through ReplicaFetch (a private api
        # key, never advertised): CommitLog engines only (mqstore.replication).
        if follow is not None and not hasattr(engine, "append_replica"):
            raise ConfigError("--follow needs the commitlog engine (one CommitLog to copy)")
        self._follow = follow
        self.node = (
            ReplicaNode(engine, replication, node_id=self.config.node_id)
            if hasattr(engine, "append_replica")
            else None
        )
        self.replicas = None if self.node is None else self.node.leader

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap(self) -> str:
        return f"{self.config.advertised}:{self.port}"

    def start(self) -> Broker:
        """Listen and serve on a new thread; return once the socket listens.

        Raises:
            OSError: the address cannot be bound.
        """
        assert self._thread is None, "a Broker starts once"
        self._thread = threading.Thread(target=self._run, name="broker-loop", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError("the broker did not start listening")
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self) -> None:
        """Drain and stop (idempotent). The engine stays open."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            stopping = self._stopping
            assert stopping is not None
            loop.call_soon_threadsafe(stopping.set)
            thread.join(DRAIN_TIMEOUT_S + 5)
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self._long_polls is not None:
            self._long_polls.close()
        for pool in (self._produce_pool, self._read_pool, self._replica_pool):
            pool.shutdown(wait=True, cancel_futures=True)
        if self.handlers is not None:
            self.handlers.close()  # the producers' journal, compacted
        if self.node is not None:
            self.node.close()  # readers of the store see its whole log again

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported to start(), or logged after it
            if not self._started.is_set():
                self._start_error = error
                self._started.set()
            else:
                log.exception("broker loop failed")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._queued_room = asyncio.Event()
        self._server = await asyncio.start_server(
            self._accept, self.config.host, self.config.port, limit=1 << 16, ssl=self._tls
        )
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(
                self.metrics, self.config.metrics_host, self.config.metrics_port
            )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.node is not None:  # its role (a leader's new epoch) before any request
            self.node.start(self.config.advertised, self.port, self._follow)
        self.handlers = Handlers(
            self.log, self.engine.offsets, self.config, self.port,
            state_directory=getattr(self.engine, "root", None),
            producer_log=getattr(self.engine, "producer_log", None),  # the CommitLog engine's
        )  # fmt: skip
        self.handlers.is_follower = lambda: bool(getattr(self.engine, "is_follower", False))
        self.handlers.replication = self.replicas
        if self.node is not None:
            node, handlers = self.node, self.handlers
            handlers.leader_address = lambda: node.leader_address
            handlers.leader_epoch = lambda: node.epoch

            # A promotion rebuilds the producers' state on the produce thread.
            def reload_producers() -> None:
                self._produce_pool.submit(handlers.reload_producers).result()

            node.on_lead = reload_producers
        self.groups = GroupCoordinator(self.config, self.engine.offsets, self._read_pool)
        self._long_polls = LongPolls(self.log, self._loop)
        expiry = asyncio.create_task(self.groups.expire_loop())
        self._started.set()
        log.info("broker listening on %s:%d", self.config.host, self.port)
        await self._stopping.wait()
        self._server.close()
        self._long_polls.close()  # parked Fetches answer now, with what they have
        for task in list(self._connections):
            task.cancel()  # each connection drains what it has read (see _connection)
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=DRAIN_TIMEOUT_S)
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        await self._server.wait_closed()

    # ------------------------------------------------------------------ connections

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        client = f"{address}:{peer[1] if peer else '?'}"
        if (
            len(self._connections) >= self.config.connections_max
            or self._per_address[address] >= self.config.connections_per_address_max
        ):
            log.warning("%s: connection refused: too many connections", client)
            self.metrics.closed_for_cause.labels("refused").inc()
            writer.close()
            return
        self.metrics.accepted.inc()
        self.metrics.connections_open.inc()
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._per_address[address] += 1
        try:
            await self._connection(reader, writer, client)
        except asyncio.CancelledError:
            pass
        finally:
            self.metrics.connections_open.dec()
            self.metrics.closed.inc()
            self._connections.discard(task)
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str
    ) -> None:
        """Read frames ahead; a writer task sends responses in request order."""
        pending: asyncio.Queue[asyncio.Task[_Response] | None] = asyncio.Queue(
            self.config.in_flight_per_connection_max
        )
        sender = asyncio.create_task(self._send(pending, writer, client))
        auth = self._authenticator()
        requests: set[asyncio.Task[_Response]] = set()  # this connection's, unanswered
        try:
            while not sender.done():
                payload = await self._read_frame(reader, client)
                if payload is PEER_CLOSED:
                    # Nobody reads the answers: stop the requests in flight now, so a
                    # long poll does not hold its bytes and this connection's slot
                    # until its deadline (a closing client's pipelined Fetches did).
                    for request in requests:
                        request.cancel()
                    break
                if payload is None:
                    break
                if auth is not None and not auth.done and not self._may_ask(auth, payload):
                    self._release(len(payload))
                    log.warning("%s: a request before authentication; closing", client)
                    self.metrics.closed_for_cause.labels("unauthenticated").inc()
                    break
                task = asyncio.create_task(self._respond(payload, client, auth))
                # A done callback, not a finally: a task cancelled before it starts
                # never runs its coroutine's finally.
                task.add_done_callback(partial(self._release, len(payload)))
                requests.add(task)
                task.add_done_callback(requests.discard)
                await pending.put(task)
                if auth is not None and not auth.done:
                    await asyncio.wait([task])  # authentication goes one request at a time
                    if auth.failed:
                        log.warning("%s: SASL authentication failed; closing", client)
                        self.metrics.closed_for_cause.labels("authentication").inc()
                        break
        except asyncio.CancelledError:
            pass  # shutdown: stop reading, answer what was read
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                pending.put_nowait(None)
            if pending.full():  # no room for the end marker: stop the sender at once
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(sender, DRAIN_TIMEOUT_S)
            _cancel_pending(pending)  # what the sender left: pins are released too

    def _authenticator(self) -> Authenticator | None:
        if self._credentials is None:
            return None
        return Authenticator(self._credentials, self.config.sasl_mechanisms, self._sasl_secret)

    @staticmethod
    def _may_ask(auth: Authenticator, payload: bytes) -> bool:
        """Whether an unauthenticated connection may send this frame."""
        if auth.raw_tokens:
            return True  # a v0 handshake: the next frame is a raw SASL token
        if len(payload) < 2:
            return False
        return int.from_bytes(payload[:2], "big", signed=True) in BEFORE_AUTHENTICATION

    async def _read_frame(self, reader: asyncio.StreamReader, client: str) -> bytes | None:
        """One request payload; PEER_CLOSED; or None: the peer went idle or sent a
        frame size out of bounds."""
        idle_s = self.config.idle_timeout_ms / 1000
        try:
            prefix = await asyncio.wait_for(reader.readexactly(FRAME_SIZE.size), idle_s)
            (size,) = FRAME_SIZE.unpack(prefix)
            if not 0 < size <= self.config.frame_bytes_max:
                log.warning("%s: frame of %d bytes refused; closing", client, size)
                self.metrics.closed_for_cause.labels("frame_size").inc()
                return None
            await self._reserve(size)
            body_s = min(idle_s, self.config.request_body_timeout_ms / 1000)
            try:
                return await asyncio.wait_for(reader.readexactly(size), body_s)
            except TimeoutError:
                log.warning(
                    "%s: %d-byte request not received within %d ms; closing",
                    client, size, body_s * 1000,
                )  # fmt: skip
                self.metrics.closed_for_cause.labels("body_timeout").inc()
                self._release(size)
                return None
            except BaseException:
                self._release(size)
                raise
        except TimeoutError:
            log.info("%s: idle for %d ms; closing", client, self.config.idle_timeout_ms)
            self.metrics.closed_for_cause.labels("idle").inc()
            return None
        except (asyncio.IncompleteReadError, ConnectionError):
            return PEER_CLOSED

    async def _send(
        self,
        pending: asyncio.Queue[asyncio.Task[_Response] | None],
        writer: asyncio.StreamWriter,
        client: str,
    ) -> None:
        while True:
            task = await pending.get()
            if task is None:
                return
            try:
                response = await task
            except Exception as error:
                if not isinstance(error, MalformedRequestError | StoreError):
                    log.exception("%s: request failed; closing", client)
                else:
                    log.warning("%s: %s; closing", client, error)
                _cancel_pending(pending)
                writer.close()  # the reader then sees the end of the stream
                return
            if response is None:
                continue  # acks=0 Produce: no response
            try:
                if isinstance(response, ZeroCopyResponse):
                    await self._send_zero_copy(response, writer)
                else:
                    writer.write(response)
                    await writer.drain()
            except (OSError, asyncio.SendfileNotAvailableError) as error:
                # A sendfile that fails before its first byte says "not available":
                # on a regular file to a TCP socket, that is the peer gone too.
                if isinstance(error, asyncio.SendfileNotAvailableError):
                    log.info("%s: gone during a sendfile: %s", client, error)
                elif not isinstance(error, ConnectionError):
                    log.warning("%s: sending a response failed: %s; closing", client, error)
                _cancel_pending(pending)
                writer.close()
                return

    async def _send_zero_copy(
        self, response: ZeroCopyResponse, writer: asyncio.StreamWriter
    ) -> None:
        """Write a FetchResponse's bytes and sendfile its file ranges, in order; the
        pins are released whatever happens (the client gone, a cancelled task).

        Raises:
            OSError: the connection failed (ConnectionError), or the file did.
            asyncio.SendfileNotAvailableError: sendfile failed before a byte went.
        """
        loop = asyncio.get_running_loop()
        transport = writer.transport
        try:
            for part in response.parts:
                if isinstance(part, bytes):
                    writer.write(part)
                    continue
                if transport.is_closing():
                    raise ConnectionResetError("the connection closed during a response")
                if part.segment.closed:  # the store closed under a serving broker
                    raise OSError(f"{part.segment.log_path} was closed before it was sent")
                # loop.sendfile waits for what was written to go, pauses reading, and
                # calls os.sendfile from the segment's descriptor to the socket.
                sent = await loop.sendfile(
                    transport,
                    part,  # type: ignore[arg-type]  # sendfile needs fileno() only
                    part.position,
                    part.size_bytes,
                    fallback=False,
                )
                self.metrics.sendfile_bytes.inc(sent)
                if sent != part.size_bytes:  # the frame is broken: close it
                    raise OSError(f"sendfile sent {sent} of {part.size_bytes} bytes")
            await writer.drain()
        finally:
            response.release()

    # ------------------------------------------------------------------ requests

    async def _reserve(self, size: int) -> None:
        """Wait until ``size`` more request bytes fit under queued_request_bytes_max
        (one request always fits when nothing else is queued)."""
        room = self._queued_room
        assert room is not None
        limit = self.config.queued_request_bytes_max
        while self._queued_bytes and self._queued_bytes + size > limit:
            room.clear()
            await room.wait()
        self._queued_bytes += size

    def _release(self, size: int, _task: object = None) -> None:
        """Give back a request's bytes (on the loop: a done callback or an error)."""
        self._queued_bytes -= size
        assert self._queued_bytes >= 0
        if self._queued_room is not None:
            self._queued_room.set()

    async def _respond(
        self, payload: bytes, client: str, auth: Authenticator | None = None
    ) -> _Response:
        """The framed response to one request (timed and counted), or None (acks=0);
        a zero-copy Fetch's is a ``ZeroCopyResponse`` (its pins for the sender)."""
        started = time.perf_counter()
        if auth is not None and auth.raw_tokens and not auth.done:
            return await self._raw_token(auth, payload, client)
        head = peek(payload)
        if head.api_key in PRIVATE_APIS and self.node is not None:
            assert self.node is not None
            return await answer_private(
                self.node, head.api_key, payload, self._replica_pool, self._is_stopping
            )
        api = served(head)
        if api is None and auth is not None and head.api_key in SASL_APIS:
            api = SASL_APIS[head.api_key]
            if not api.served_min <= head.api_version <= api.served_max:
                api = None
        if api is None:
            if head.api_key == API_VERSIONS and head.api_version > 3:
                return unsupported_api_versions(head.correlation_id)
            raise MalformedRequestError(f"api {head.api_key} v{head.api_version} is not served")
        response = await self._answer(api, head, payload, auth, client)
        if response is None:
            return None
        name = api.request.__name__.removesuffix("Request")
        if isinstance(response, FetchPass):  # zero copy: a small head, no records
            try:
                self.metrics.response_errors(response.response)
            except BaseException:
                response.release()
                raise
            framed = encode_fetch(response.response, head.correlation_id, response.files)
            seconds = time.perf_counter() - started
            self.metrics.request(
                name, head.api_version, seconds, len(payload) + 4, framed.size_bytes
            )
            return framed
        self.metrics.response_errors(response)
        if head.api_key == FETCH and len(payload) > LOOP_CODEC_BYTES_MAX:
            loop = asyncio.get_running_loop()  # as large to encode: off the loop too
            encoded = await loop.run_in_executor(
                self._read_pool, encode_response, response, head.correlation_id
            )
        else:
            encoded = encode_response(response, head.correlation_id)
        seconds = time.perf_counter() - started
        self.metrics.request(name, head.api_version, seconds, len(payload) + 4, len(encoded))
        return encoded

    async def _raw_token(self, auth: Authenticator, payload: bytes, client: str) -> bytes:
        """A SASL token after a v0 handshake: answered raw, size-prefixed (KIP-152)."""
        loop = asyncio.get_running_loop()
        try:
            reply = await loop.run_in_executor(self._read_pool, auth.step, payload)
        finally:
            self._count_authentication(auth, client)
        return FRAME_SIZE.pack(len(reply)) + reply

    def _count_authentication(self, auth: Authenticator, client: str) -> None:
        if auth.done:
            self.metrics.authentications.labels(auth.mechanism, "ok").inc()
            log.info("%s: authenticated as %r (%s)", client, auth.user, auth.mechanism)
        elif auth.failed:
            self.metrics.authentications.labels(auth.mechanism or "none", "failed").inc()

    async def _answer(
        self, api: Api, head: RequestHead, payload: bytes, auth: Authenticator | None, client: str
    ) -> Any:
        """The response object to one request, or None (acks=0)."""
        loop = asyncio.get_running_loop()
        if auth is not None and head.api_key in SASL_APIS:
            request = decode_request(api, head, payload)
            if head.api_key == SASL_HANDSHAKE:
                return auth.handshake(request, head.api_version)
            response = await loop.run_in_executor(
                self._read_pool, auth.authenticate, request, head.api_version
            )
            self._count_authentication(auth, client)
            return response
        if auth is not None and head.api_key == API_VERSIONS:
            response = await loop.run_in_executor(self._read_pool, self._handle, api, head, payload)
            for sasl in SASL_APIS.values():  # advertised only when SASL is on
                response.api_keys.append(
                    type(response).ApiVersion(
                        api_key=sasl.key, min_version=sasl.served_min, max_version=sasl.served_max
                    )
                )
            return response
        if head.api_key == FETCH:
            # Codec work grows with the request (its partitions): a large one is decoded
            # on a worker, not on the loop that every other connection waits for.
            request = await self._decode(api, head, payload)
            fetched = await self._fetch(request, head.api_version)
            response = fetched if fetched.files else fetched.response
        elif head.api_key in GROUP_APIS or head.api_key == OFFSET_COMMIT:
            response = await self._group_request(api, head, payload)
        else:
            pool = self._produce_pool if head.api_key == PRODUCE else self._read_pool
            response = await loop.run_in_executor(pool, self._handle, api, head, payload)
        return response

    async def _decode(self, api: Api, head: RequestHead, payload: bytes) -> Any:
        """``decode_request``, on a worker when the payload is large."""
        if len(payload) <= LOOP_CODEC_BYTES_MAX:
            return decode_request(api, head, payload)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, decode_request, api, head, payload)

    def _handle(self, api: Api, head: RequestHead, payload: bytes) -> Any:
        """Decode and handle on a worker thread (None: acks=0)."""
        request = decode_request(api, head, payload)
        handlers = self.handlers
        assert handlers is not None
        if head.api_key == PRODUCE:
            self.metrics.produced.inc(
                sum(count_records(p.records) for t in request.topic_data for p in t.partition_data)
            )
        method = _SYNC_HANDLERS[head.api_key]
        return getattr(handlers, method)(request, head.api_version)

    async def _fetch(self, request: Any, version: int) -> FetchPass:
        """One pass; if it holds fewer than min_bytes, long-poll and pass again.
        A pass that is not returned releases its file ranges."""
        handlers, long_polls = self.handlers, self._long_polls
        assert handlers is not None and long_polls is not None
        wait_ms = min(max(request.max_wait_ms, 0), self.config.fetch_wait_max_ms)
        deadline = time.monotonic() + wait_ms / 1000
        zero_copy = self.zero_copy and version in ZERO_COPY_VERSIONS
        while True:
            result = await self._fetch_pass(request, version, zero_copy)
            left_ms = int((deadline - time.monotonic()) * 1000)
            stopping = self._stopping is not None and self._stopping.is_set()
            done = result.records_bytes >= max(request.min_bytes, 1) or not result.waiting
            if done or left_ms <= 0 or stopping:
                self.metrics.fetched.inc(
                    sum(
                        count_records(p.records)
                        for t in result.response.responses
                        for p in t.partitions
                    )
                    + sum(slices.records_count for slices in result.files.values())
                )
                return result
            result.release()
            await long_polls.wait(result.waiting, left_ms)

    async def _fetch_pass(self, request: Any, version: int, zero_copy: bool) -> FetchPass:
        """``Handlers.fetch_pass`` on a read thread. Cancelled meanwhile (shutdown, a
        closed connection), the pass still finishes there: its pins are then released
        when it does."""
        handlers = self.handlers
        assert handlers is not None
        future = self._read_pool.submit(handlers.fetch_pass, request, version, True, zero_copy)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(_release_pass)
            raise

    def _is_stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    async def _group_request(self, api: Api, head: RequestHead, payload: bytes) -> Any:
        groups, handlers = self.groups, self.handlers
        assert groups is not None and handlers is not None
        request = await self._decode(api, head, payload)
        if head.api_key == OFFSET_COMMIT:
            verdict = groups.commit_allowed(
                request.group_id, request.generation_id_or_member_epoch, request.member_id
            )
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._read_pool, handlers.offset_commit, request, head.api_version, verdict
            )
        return await groups.handle(head.api_key, request, head.api_version)


_SYNC_HANDLERS: Final = {
    0: "produce",
    2: "list_offsets",
    3: "metadata",
    9: "offset_fetch",
    10: "find_coordinator",
    18: "api_versions",
    19: "create_topics",
    20: "delete_topics",
    21: "delete_records",
    22: "init_producer_id",
    32: "describe_configs",
    37: "create_partitions",
}


def _tls_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The server's TLS context (TLS 1.2 at least), or None without a certificate.

    Raises:
        OSError, ssl.SSLError: the certificate or key cannot be read.
    """
    if config.tls_cert_path is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert_path, config.tls_key_path)
    return context


def _partition_log(engine: Engine) -> PartitionLog:
    """The storage adapter of an engine: the segmented engine's stored batches, the
    CommitLog engine's columnar reads (``get_batch``), else per record."""
    if isinstance(engine, SegmentedStore):
        return SegmentLog(engine)
    if callable(getattr(engine, "get_batch", None)):
        return ColumnLog(engine)
    return RecordLog(engine)


def _cancel_pending(pending: asyncio.Queue[asyncio.Task[_Response] | None]) -> None:
    """Cancel the requests not sent; a zero-copy response already built (or built
    after all) gives its pins back."""
    while not pending.empty():
        task = pending.get_nowait()
        if task is not None:
            task.cancel()
            task.add_done_callback(_release_response)


def _release_response(task: asyncio.Task[_Response]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    response = task.result()
    if isinstance(response, ZeroCopyResponse):
        response.release()


def _release_pass(future: concurrent.futures.Future[FetchPass]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    future.result().release()
