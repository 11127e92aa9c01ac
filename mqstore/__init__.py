"""mqstore: an embedded, persistent message store in the design of RocketMQ's engine.

from mqstore import MessageStore, StoreConfig

with MessageStore.open("./data", StoreConfig(flush_mode="sync")) as store:
    result = store.put("orders", 0, b"payload", keys=["order-1"])
    messages = store.get("orders", 0, result.queue_offset, 10)
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqstore.batch import MessageBatch
    from mqstore.commitlog.errors import (
        ConfigError,
        CorruptDataError,
        DiskFullError,
        DispatchFailedError,
        FlushFailedError,
        FlushTimeoutError,
        IllegalStateError,
        InvalidArgumentError,
        InvalidRecordError,
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

# The public names load on first use (PEP 562), so that importing a room of the store
# (mqstore.commitlog, mqstore.segmented, ...) does not load the facade above it.
_EXPORTS = {
    "ConfigError": "mqstore.commitlog.errors",
    "CorruptDataError": "mqstore.commitlog.errors",
    "DiskFullError": "mqstore.commitlog.errors",
    "DispatchFailedError": "mqstore.commitlog.errors",
    "FlushFailedError": "mqstore.commitlog.errors",
    "FlushTimeoutError": "mqstore.commitlog.errors",
    "IllegalStateError": "mqstore.commitlog.errors",
    "InvalidArgumentError": "mqstore.commitlog.errors",
    "InvalidRecordError": "mqstore.commitlog.errors",
    "InvalidTypeError": "mqstore.commitlog.errors",
    "KafkaTimeoutError": "mqstore.commitlog.errors",
    "LimitExceededError": "mqstore.commitlog.errors",
    "OffsetOutOfRangeError": "mqstore.commitlog.errors",
    "ReadOnlyStoreError": "mqstore.commitlog.errors",
    "StoreClosedError": "mqstore.commitlog.errors",
    "StoreError": "mqstore.commitlog.errors",
    "StoreLockedError": "mqstore.commitlog.errors",
    "TopicDeletionDisabledError": "mqstore.commitlog.errors",
    "UnknownTopicError": "mqstore.commitlog.errors",
    "StoreConfig": "mqstore.config",
    "ConsumerRebalanceListener": "mqstore.kafka",
    "ConsumerRecord": "mqstore.kafka",
    "KafkaConsumer": "mqstore.kafka",
    "KafkaProducer": "mqstore.kafka",
    "OffsetAndMetadata": "mqstore.kafka",
    "OffsetAndTimestamp": "mqstore.kafka",
    "RecordMetadata": "mqstore.kafka",
    "TopicPartition": "mqstore.kafka",
    "KafkaAdminClient": "mqstore.kafka_admin",
    "NewPartitions": "mqstore.kafka_admin",
    "NewTopic": "mqstore.kafka_admin",
    "Message": "mqstore.message",
    "MessageBatch": "mqstore.batch",
    "PutResult": "mqstore.message",
    "MessageStore": "mqstore.store",
    "TopicConfig": "mqstore.topics",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mqstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
    "InvalidRecordError",
    "InvalidTypeError",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaProducer",
    "KafkaTimeoutError",
    "LimitExceededError",
    "Message",
    "MessageBatch",
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
