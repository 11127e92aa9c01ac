"""mqstore: an embedded, persistent message store in the design of RocketMQ's engine.

from mqstore import MessageStore, StoreConfig

with MessageStore.open("./data", StoreConfig(flush_mode="sync")) as store:
    result = store.put("orders", 0, b"payload", keys=["order-1"])
    messages = store.get("orders", 0, result.queue_offset, 10)
"""

from commitlog.errors import (
    ConfigError,
    CorruptDataError,
    DiskFullError,
    DispatchFailedError,
    FlushFailedError,
    FlushTimeoutError,
    IllegalStateError,
    InvalidArgumentError,
    InvalidTypeError,
    KafkaTimeoutError,
    LimitExceededError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
    TopicDeletionDisabledError,
    UnknownTopicError,
)
from mqstore.config import StoreConfig
from mqstore.kafka import (
    ConsumerRebalanceListener,
    ConsumerRecord,
    KafkaConsumer,
    KafkaProducer,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)
from mqstore.kafka_admin import KafkaAdminClient, NewPartitions, NewTopic
from mqstore.message import Message, PutResult
from mqstore.store import MessageStore
from mqstore.topics import TopicConfig

__all__ = [
    "ConfigError",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "CorruptDataError",
    "DiskFullError",
    "DispatchFailedError",
    "FlushFailedError",
    "FlushTimeoutError",
    "IllegalStateError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaProducer",
    "KafkaTimeoutError",
    "LimitExceededError",
    "Message",
    "MessageStore",
    "NewPartitions",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "PutResult",
    "ReadOnlyStoreError",
    "RecordMetadata",
    "StoreClosedError",
    "StoreConfig",
    "StoreError",
    "StoreLockedError",
    "TopicConfig",
    "TopicDeletionDisabledError",
    "TopicPartition",
    "UnknownTopicError",
]
