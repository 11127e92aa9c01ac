"""The request handlers that run on a worker thread: one method per API, request
object in, response object out (mqstore.broker.protocol encodes it).

Each handler reaches storage through ``PartitionLog`` (mqstore.broker.log) and the
engine's ``offsets``, and turns every store error into Kafka's error code for
the partition, topic or group it concerns: a bad partition never fails the others
of its request, and no handler lets a StoreError escape. An exception that is not a
StoreError is a bug; the server logs it and closes that one connection.

Threads: ``produce`` runs on the broker's one produce thread (the sequence checks of
the idempotent producer and the appends they guard stay in order); the rest run on
the read threads. Fetch's long poll and the group APIs are coroutines in
mqstore.broker.server and mqstore.broker.groups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from kafka.protocol.consumer import (
    FetchResponse,
    ListOffsetsResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from mqstore.broker.admin import Admin
from mqstore.broker.batch import InvalidBatchError, check_produced
from mqstore.broker.config import BrokerConfig
from mqstore.broker.log import PartitionLog
from mqstore.broker.producers import ProducerIds, ProducerState
from mqstore.broker.protocol import APIS, ErrorCode, api_versions_body
from mqstore.broker.zero_copy import SegmentLog
from mqstore.commitlog.errors import (
    DiskFullError,
    FlushTimeoutError,
    InvalidArgumentError,
    InvalidRecordError,
    LimitExceededError,
    NotLeaderError,
    OffsetOutOfRangeError,
    StoreError,
    UnknownTopicError,
)
from mqstore.commitlog.record import validate_topic
from mqstore.internal_log import INTERNAL_TOPICS, InternalLog
from mqstore.offsets import CommittedOffsets, validate_group
from mqstore.replication.leader import ReplicaLeader
from mqstore.segmented.file_records import FileSlices
from mqstore.topics import (
    KAFKA_TOPIC_CONFIGS,
    TopicConfig,
    check_topic_config,
    parse_kafka_configs,
)

__all__ = ["FetchPass", "Handlers"]

log = logging.getLogger(__name__)

LATEST_TIMESTAMP: Final = -1  # ListOffsets' special timestamps
EARLIEST_TIMESTAMP: Final = -2
ACKS: Final = (0, 1, -1)
CLUSTER_ID: Final = "mqstore"
NO_OFFSET: Final = -1
#: Kafka's offset.metadata.max.bytes: committed metadata (stored in the group's
#: offsets file, which every commit rewrites) longer than this, in UTF-8, is refused.
OFFSET_METADATA_BYTES_MAX: Final = 4096
TIMESTAMP_TYPES: Final = {"CreateTime", "LogAppendTime"}

_MetadataTopic = MetadataResponse.MetadataResponseTopic
_MetadataPartition = _MetadataTopic.MetadataResponsePartition
_ProduceTopic = ProduceResponse.TopicProduceResponse
_ProducePartition = _ProduceTopic.PartitionProduceResponse
_FetchTopic = FetchResponse.FetchableTopicResponse
_FetchPartition = _FetchTopic.PartitionData
_ListTopic = ListOffsetsResponse.ListOffsetsTopicResponse
_ListPartition = _ListTopic.ListOffsetsPartitionResponse
_CommitTopic = OffsetCommitResponse.OffsetCommitResponseTopic
_CommitPartition = _CommitTopic.OffsetCommitResponsePartition
_FetchedTopic = OffsetFetchResponse.OffsetFetchResponseTopic
_FetchedPartition = _FetchedTopic.OffsetFetchResponsePartition


class FetchPass(NamedTuple):
    """One pass over a Fetch's partitions: the response, the bytes it holds, the
    positions a long poll waits on, and the zero-copy partitions' pinned file ranges
    by (topic index, partition index): their ``records`` in ``response`` are empty."""

    response: Any
    records_bytes: int
    waiting: list[tuple[str, int, int]]
    files: dict[tuple[int, int], FileSlices]

    def release(self) -> None:
        """Unpin the file ranges (a pass that is not sent)."""
        for slices in self.files.values():
            slices.release()


def error_for(error: StoreError) -> int:
    """Kafka's error code for a store error on a partition."""
    if isinstance(error, InvalidBatchError):
        return error.error_code
    if isinstance(error, InvalidRecordError):  # a keyless record on a compacted topic
        return ErrorCode.INVALID_RECORD
    if isinstance(error, UnknownTopicError):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, InvalidRecordError):  # e.g. no key on a compacted topic
        return ErrorCode.INVALID_RECORD
    if isinstance(error, NotLeaderError):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if isinstance(error, OffsetOutOfRangeError):
        return ErrorCode.OFFSET_OUT_OF_RANGE
    if isinstance(error, LimitExceededError):
        return ErrorCode.MESSAGE_TOO_LARGE
    if isinstance(error, FlushTimeoutError):
        return ErrorCode.REQUEST_TIMED_OUT
    if isinstance(error, DiskFullError):
        return ErrorCode.KAFKA_STORAGE_ERROR
    if isinstance(error, InvalidArgumentError):
        return ErrorCode.INVALID_REQUEST
    return ErrorCode.KAFKA_STORAGE_ERROR


class Handlers:
    """The worker-thread half of the broker's APIs."""

    def __init__(
        self,
        log_: PartitionLog,
        offsets: CommittedOffsets,
        config: BrokerConfig,
        port: int,
        *,
        state_directory: str | None = None,
        producer_log: InternalLog | None = None,
    ) -> None:
        """``producer_log``: the engine's topic for the idempotent producers' state
        (the CommitLog engine's, so followers have it); else ``state_directory``:
        where their journal lives (the store's root); None for both keeps that
        state in memory only.

        Raises:
            StoreError: the journal cannot be written.
        """
        self.log = log_
        self.offsets = offsets
        self.config = config
        self.port = port
        self.producer_ids = ProducerIds()
        self.producers = ProducerState(state_directory, producer_log)
        self.producers.prune(self._end_offset)
        #: True while the engine is a replication follower: writes are refused with
        #: NOT_LEADER_OR_FOLLOWER (the Broker sets it; mqstore.replication).
        self.is_follower: Callable[[], bool] = lambda: False
        #: The leader's replication state (the Broker sets it): acks=all waits for its HW.
        self.replication: ReplicaLeader | None = None
        #: (node id, host, port) of the partitions' leader (a follower names its
        #: leader; None: not known yet), and its epoch. The Broker sets both.
        self.leader_address: Callable[[], tuple[int, str, int] | None] = lambda: (
            self.config.node_id,
            self.config.advertised,
            self.port,
        )
        self.leader_epoch: Callable[[], int] = lambda: 0
        self.admin = Admin(log_, config)
        # The admin APIs (mqstore.broker.admin), on the read threads like the rest.
        self.delete_topics = self.admin.delete_topics
        self.create_partitions = self.admin.create_partitions
        self.delete_records = self.admin.delete_records
        self.describe_configs = self.admin.describe_configs

    def _end_offset(self, topic: str, partition: int) -> int | None:
        """The partition's end in the log, for ``ProducerState.prune`` (None: gone)."""
        if not 0 <= partition < self._partitions(topic):
            return None
        try:
            return self.log.log_end_offset(topic, partition)
        except StoreError:
            return None

    def reload_producers(self) -> int:
        """Rebuild the idempotent producers' state from the log (after a promotion
        or a truncation; on the produce thread, or while it is idle). Returns the
        records read (0 when the state is not in the log)."""
        folded = self.producers.reload()
        self.producers.prune(self._end_offset)
        return folded

    def close(self) -> None:
        """Write the producers' state out (after the produce thread stopped)."""
        self.producers.close()

    def _partitions(self, topic: str) -> int:
        """The topic's partition count, 0 when it does not exist."""
        config = self.log.topics().get(topic)
        return 0 if config is None else config.partitions

    # ------------------------------------------------------------------ meta

    def api_versions(self, request: Any, version: int) -> Any:
        return api_versions_body(version)

    def metadata(self, request: Any, version: int) -> Any:
        topics = self.log.topics()
        names: list[str]
        if request.topics is None or (version == 0 and not request.topics):
            names = sorted(topics)
        else:
            names = [topic.name for topic in request.topics]
        allow = version < 4 or bool(request.allow_auto_topic_creation)
        leader = self.leader_address()
        answered = [self._metadata_topic(name, topics, allow, leader) for name in names]
        node = self.config.node_id
        brokers = [
            MetadataResponse.MetadataResponseBroker(
                node_id=node, host=self.config.advertised, port=self.port, rack=None
            )
        ]
        if leader is not None and leader[0] != node:  # a follower names its leader too
            brokers.append(
                MetadataResponse.MetadataResponseBroker(
                    node_id=leader[0], host=leader[1], port=leader[2], rack=None
                )
            )
        return MetadataResponse(
            version=version, throttle_time_ms=0, brokers=brokers, cluster_id=CLUSTER_ID,
            controller_id=node if leader is None else leader[0], topics=answered,
        )  # fmt: skip

    def _metadata_topic(
        self, name: str, topics: dict[str, Any], allow_create: bool,
        leader: tuple[int, str, int] | None,
    ) -> Any:  # fmt: skip
        config = topics.get(name)
        internal = name in INTERNAL_TOPICS  # not listed, but answered when named, as Kafka
        if config is None and internal:
            try:
                config = self.log.describe_topic(name)
            except StoreError:  # not made yet (the first commit makes it): never by a client
                return _MetadataTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]
                )
        if config is None:
            try:
                validate_topic(name)
            except StoreError:
                return _MetadataTopic(
                    error_code=ErrorCode.INVALID_TOPIC_EXCEPTION, name=name, partitions=[]
                )
            creates = allow_create and self.config.auto_create_topics
            if not creates or self.is_follower():  # a follower's topics are its leader's
                return _MetadataTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]
                )
            config = self._create(name, self.config.default_partitions, "CreateTime")
        node = self.config.node_id
        leader_id = -1 if leader is None else leader[0]
        replicas = [node] if leader_id in (node, -1) else [leader_id, node]
        partitions = [
            _MetadataPartition(
                error_code=ErrorCode.LEADER_NOT_AVAILABLE if leader is None else 0,
                partition_index=index,
                leader_id=leader_id,
                leader_epoch=self.leader_epoch(),
                replica_nodes=replicas,
                isr_nodes=replicas,
                offline_replicas=[],
            )
            for index in range(config.partitions)
        ]
        return _MetadataTopic(error_code=0, name=name, is_internal=internal, partitions=partitions)

    def _create(self, name: str, partitions: int, timestamp_type: str) -> Any:
        """Create a topic; one created meanwhile (another connection) is returned."""
        try:
            return self.log.create_topic(name, partitions, timestamp_type)
        except InvalidArgumentError:
            existing = self.log.topics().get(name)
            if existing is None:
                raise
            return existing

    def find_coordinator(self, request: Any, version: int) -> Any:
        leader = self.leader_address()  # the groups' coordinator is the leader
        if leader is None:
            return FindCoordinatorResponse(
                version=version, throttle_time_ms=0,
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, error_message=None,
                node_id=-1, host="", port=-1,
            )  # fmt: skip
        return FindCoordinatorResponse(
            version=version, throttle_time_ms=0, error_code=0, error_message=None,
            node_id=leader[0], host=leader[1], port=leader[2],
        )  # fmt: skip

    def init_producer_id(self, request: Any, version: int) -> Any:
        if request.transactional_id is not None:  # transactions are not served
            return InitProducerIdResponse(
                version=version, throttle_time_ms=0,
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, producer_id=-1, producer_epoch=-1,
            )  # fmt: skip
        return InitProducerIdResponse(
            version=version, throttle_time_ms=0, error_code=0,
            producer_id=self.producer_ids.next(), producer_epoch=0,
        )  # fmt: skip

    def create_topics(self, request: Any, version: int) -> Any:
        response_class = APIS[19].response
        result_class = response_class.CreatableTopicResult
        results = []
        for topic in request.topics:
            code, message = self._create_one(topic, bool(request.validate_only))
            results.append(result_class(name=topic.name, error_code=code, error_message=message))
        return response_class(version=version, throttle_time_ms=0, topics=results)

    def _create_one(self, topic: Any, validate_only: bool) -> tuple[int, str | None]:
        partitions = topic.num_partitions
        if partitions == -1:
            partitions = self.config.default_partitions
        timestamp_type = "CreateTime"
        configs: dict[str, str] = {}
        for entry in topic.configs or ():
            if entry.name == "message.timestamp.type" and entry.value in TIMESTAMP_TYPES:
                timestamp_type = entry.value
            elif entry.name in KAFKA_TOPIC_CONFIGS and entry.value is not None:
                configs[entry.name] = entry.value  # cleanup.policy=compact...
            else:
                return ErrorCode.INVALID_CONFIG, f"config {entry.name}={entry.value} not served"
        try:  # the settings alone, before any other check
            fields = parse_kafka_configs(topic.name, configs)
            check_topic_config(TopicConfig(name="t", partitions=1, **fields))
        except StoreError as error:
            return ErrorCode.INVALID_CONFIG, str(error)
        if topic.replication_factor not in (-1, 1) or topic.assignments:
            return ErrorCode.INVALID_REPLICATION_FACTOR, "one broker: replication factor 1"
        try:
            validate_topic(topic.name)
        except StoreError as error:
            return ErrorCode.INVALID_TOPIC_EXCEPTION, str(error)
        if topic.name in self.log.topics():
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists"
        if not 1 <= partitions <= 10_000:
            return ErrorCode.INVALID_PARTITIONS, f"{partitions} partitions"
        if validate_only:
            return 0, None
        try:
            self.log.create_topic(topic.name, partitions, timestamp_type, configs)
        except StoreError as error:
            if isinstance(error, NotLeaderError):
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, str(error)
            if topic.name in self.log.topics():
                return ErrorCode.TOPIC_ALREADY_EXISTS, str(error)
            return ErrorCode.INVALID_REQUEST, str(error)
        return 0, None

    # ------------------------------------------------------------------ produce

    def produce(self, request: Any, version: int) -> Any:
        """Append each partition's batch; None for acks=0 (Kafka sends nothing)."""
        acks = request.acks
        responses = []
        for topic in request.topic_data:
            parts = [
                self._produce_partition(
                    topic.name, data.index, data.records, acks, request.timeout_ms
                )
                for data in topic.partition_data
            ]
            responses.append(_ProduceTopic(name=topic.name, partition_responses=parts))
        if acks == 0:
            return None
        return ProduceResponse(version=version, responses=responses, throttle_time_ms=0)

    def _produce_partition(
        self, topic: str, partition: int, records: Any, acks: int, timeout_ms: int = 30_000
    ) -> Any:
        def answer(code: int, base: int = -1, stamp: int = -1, start: int = -1) -> Any:
            return _ProducePartition(
                index=partition, error_code=code, base_offset=base, log_append_time_ms=stamp,
                log_start_offset=start, record_errors=[], error_message=None,
            )  # fmt: skip

        if acks not in ACKS:
            return answer(ErrorCode.INVALID_REQUIRED_ACKS)
        if self.is_follower():
            return answer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if not 0 <= partition < self._partitions(topic):
            return answer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        replication = self.replication if acks == -1 else None
        try:
            batch = check_produced(records)
            header = batch.header
            identity = (header.producer_id, header.producer_epoch, topic, partition)
            check = self.producers.check(*identity, header.base_sequence, header.records_count)
            if check.error:
                return answer(check.error)
            if check.duplicate_offset is not None:
                # Before the in-sync check: a retry of an appended batch is answered
                # as what it is (NOT_ENOUGH_REPLICAS_AFTER_APPEND when the in-sync set
                # is short), never "not appended" (NOT_ENOUGH_REPLICAS).
                start = self.log.log_start_offset(topic, partition)
                return answer(self._replicated(replication, timeout_ms), check.duplicate_offset,
                              -1, start)  # fmt: skip
            if replication is not None and not replication.enough_in_sync():
                refusal = ErrorCode.NOT_ENOUGH_REPLICAS  # refused before the append
                self.producers.refused(*identity, header.base_sequence, refusal)
                return answer(refusal)
            # The batch and its state record: one append group (a crash keeps both or
            # neither) in one append call, so one sync.
            trailer = self.producers.trailer(*identity, header.base_sequence, header.records_count)
            appended = self.log.append(topic, partition, batch, trailer)
            self.producers.appended(
                *identity, header.base_sequence, header.records_count, appended.base_offset
            )
        except FlushTimeoutError as error:
            if error.first_queue_offset is not None:  # appended, not yet durable: a retry
                self.producers.appended(  # must be answered as a duplicate
                    *identity, header.base_sequence, header.records_count,
                    error.first_queue_offset,
                )  # fmt: skip
            return answer(error_for(error))
        except StoreError as error:
            log.info("produce to %s-%d refused: %s", topic, partition, error)
            return answer(error_for(error))
        return answer(self._replicated(replication, timeout_ms), *appended)

    @staticmethod
    def _replicated(replication: ReplicaLeader | None, timeout_ms: int) -> int:
        """acks=all with followers configured: wait until the high watermark passes
        what was just appended (every in-sync replica has it); the error code then."""
        if replication is None or not replication.configured:
            return 0
        appended_end = replication.source.commitlog.write_position  # >= the batch's end
        passed = replication.wait_for_high_watermark(appended_end, max(timeout_ms, 0))
        # Kafka's rule (checkEnoughReplicasReachOffset): the HW passing is not enough;
        # it also moves when a follower leaves the in-sync set, and then the batch is
        # on fewer replicas than min.insync.replicas: not acknowledged.
        if not replication.enough_in_sync():
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return 0 if passed else ErrorCode.REQUEST_TIMED_OUT

    # ------------------------------------------------------------------ fetch

    def fetch_pass(
        self, request: Any, version: int, must_fill: bool, zero_copy: bool = False
    ) -> FetchPass:
        """Read every partition of a Fetch once. ``must_fill`` False: only the
        offsets are checked (a long poll's first look when nothing is there).
        ``zero_copy`` (a ``SegmentLog``, a plaintext connection): the partitions'
        records are pinned file ranges in ``FetchPass.files``, for the caller to
        send and release (mqstore.broker.zero_copy)."""
        budget = request.max_bytes if version >= 3 else 2**31 - 1
        total = 0
        waiting: list[tuple[str, int, int]] = []
        topics = []
        files: dict[tuple[int, int], FileSlices] = {}
        slices_log = self.log if zero_copy and isinstance(self.log, SegmentLog) else None
        try:
            for t, topic in enumerate(request.topics):
                parts: list[Any] = []
                for wanted in topic.partitions:
                    part, size, slices = self._fetch_partition(
                        topic.topic, wanted, budget, total == 0, slices_log
                    )
                    if slices is not None:
                        files[(t, len(parts))] = slices
                    parts.append(part)
                    total += size
                    budget -= size
                    if part.error_code == 0 and size == 0:
                        waiting.append((topic.topic, wanted.partition, wanted.fetch_offset))
                topics.append(_FetchTopic(topic=topic.topic, partitions=parts))
        except BaseException:
            for slices in files.values():
                slices.release()
            raise
        response = FetchResponse(
            version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=topics
        )
        return FetchPass(response, total, waiting, files)

    def _fetch_partition(
        self, topic: str, wanted: Any, budget: int, first: bool, slices_log: SegmentLog | None
    ) -> tuple[Any, int, FileSlices | None]:
        partition = wanted.partition
        offset = wanted.fetch_offset
        start = end = -1
        records: bytes = b""
        slices: FileSlices | None = None
        size = 0
        code = 0
        try:
            start = self.log.log_start_offset(topic, partition)
            end = self.log.high_watermark(topic, partition)
            # Kafka: out of range only outside [log start, log end]; between the high
            # watermark and the log end (a restarted leader's HW starts below what
            # consumers read before it stopped) the fetch waits for the HW.
            if offset < start or (
                offset > end and offset > self.log.log_end_offset(topic, partition)
            ):
                code = ErrorCode.OFFSET_OUT_OF_RANGE
            elif offset < end and (budget > 0 or first):
                limit = min(wanted.partition_max_bytes, max(budget, 1))
                if slices_log is not None:
                    slices = slices_log.fetch_slices(topic, partition, offset, limit)
                    size = slices.size_bytes
                else:
                    records = b"".join(self.log.fetch(topic, partition, offset, limit))
                    size = len(records)
        except StoreError as error:
            code = error_for(error)
        part = _FetchPartition(
            partition_index=partition, error_code=code, high_watermark=end,
            last_stable_offset=end, log_start_offset=start, aborted_transactions=None,
            preferred_read_replica=-1, records=records,
        )  # fmt: skip
        if slices is not None and not size:
            slices.release()  # nothing there yet: the long poll waits for it
            slices = None
        return part, size, slices

    # ------------------------------------------------------------------ offsets

    def list_offsets(self, request: Any, version: int) -> Any:
        topics = []
        for topic in request.topics:
            parts = [self._list_offset(topic.name, p) for p in topic.partitions]
            topics.append(_ListTopic(name=topic.name, partitions=parts))
        return ListOffsetsResponse(version=version, throttle_time_ms=0, topics=topics)

    def _list_offset(self, topic: str, wanted: Any) -> Any:
        partition = wanted.partition_index
        stamp = offset = NO_OFFSET
        code = 0
        try:
            if wanted.timestamp == LATEST_TIMESTAMP:
                offset = self.log.high_watermark(topic, partition)
            elif wanted.timestamp == EARLIEST_TIMESTAMP:
                offset = self.log.log_start_offset(topic, partition)
            elif wanted.timestamp < 0:
                code = ErrorCode.UNSUPPORTED_VERSION  # -3 (max timestamp) and later: v7+
            else:
                found = self.log.offset_for_time(topic, partition, wanted.timestamp)
                if found is not None:
                    offset, stamp = found
        except StoreError as error:
            code = error_for(error)
        return _ListPartition(
            partition_index=partition, error_code=code, timestamp=stamp, offset=offset,
            leader_epoch=0 if code == 0 else -1,
        )  # fmt: skip

    def offset_commit(self, request: Any, version: int, group_error: int) -> Any:
        """Commit (``group_error`` is the coordinator's verdict on the member)."""
        code = group_error
        if code == 0 and self.is_follower():
            # Offsets are records of the leader's log (mqstore.offsets_log): a
            # follower takes them only from its leader, as Kafka's do.
            code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        if code == 0:
            try:
                validate_group(request.group_id)
            except StoreError:
                code = ErrorCode.INVALID_GROUP_ID
        wanted: dict[tuple[str, int], tuple[int, str]] = {}
        for topic in request.topics:
            for p in topic.partitions:
                wanted[(topic.name, p.partition_index)] = (
                    p.committed_offset,
                    p.committed_metadata or "",
                )
        codes = dict.fromkeys(wanted, code)
        if code == 0:
            codes = self._commit(request.group_id, wanted)
        topics = []
        for topic in request.topics:
            parts = [
                _CommitPartition(
                    partition_index=p.partition_index,
                    error_code=codes[(topic.name, p.partition_index)],
                )
                for p in topic.partitions
            ]
            topics.append(_CommitTopic(name=topic.name, partitions=parts))
        return OffsetCommitResponse(version=version, throttle_time_ms=0, topics=topics)

    def _commit(
        self, group: str, wanted: dict[tuple[str, int], tuple[int, str]]
    ) -> dict[tuple[str, int], int]:
        codes = {}
        valid = {}
        for (topic, partition), (offset, metadata) in wanted.items():
            if not 0 <= partition < self._partitions(topic):
                codes[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif offset < 0:
                codes[(topic, partition)] = ErrorCode.OFFSET_OUT_OF_RANGE
            elif len(metadata.encode()) > OFFSET_METADATA_BYTES_MAX:
                codes[(topic, partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                codes[(topic, partition)] = 0
                valid[(topic, partition)] = (offset, metadata)
        if valid:
            try:
                self.offsets.commit(group, valid)
            except StoreError as error:
                log.warning("commit of group %s failed: %s", group, error)
                for key in valid:
                    codes[key] = ErrorCode.KAFKA_STORAGE_ERROR
        return codes

    def offset_fetch(self, request: Any, version: int) -> Any:
        group_code = 0
        committed: dict[tuple[str, int], tuple[int, str]] = {}
        try:
            committed = self.offsets.load(validate_group(request.group_id))
        except StoreError as error:
            group_code = error_for(error)
            if isinstance(error, InvalidArgumentError):
                group_code = ErrorCode.INVALID_GROUP_ID
        if request.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in request.topics}
        topics = []
        for name, partitions in wanted.items():
            parts = []
            for partition in partitions:
                offset, metadata = committed.get((name, partition), (NO_OFFSET, ""))
                parts.append(
                    _FetchedPartition(
                        partition_index=partition,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        metadata=metadata,
                        error_code=group_code if version < 2 else 0,
                    )
                )
            topics.append(_FetchedTopic(name=name, partitions=parts))
        return OffsetFetchResponse(
            version=version, throttle_time_ms=0, topics=topics, error_code=group_code
        )
