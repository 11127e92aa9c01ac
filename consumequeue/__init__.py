"""ConsumeQueue: per-(topic, queue) indexes of 20-byte units into the CommitLog.

Public surface: ``ConsumeQueueStore`` (all queues of a store), ``ConsumeQueue`` (one
queue), ``ConsumeQueueConfig``, and the on-disk dtypes ``UNIT`` and ``TIMESTAMP``.
See mqstore.consumequeue.format for the layout and mqstore.consumequeue.consume_queue for the rules.
"""

from mqstore.consumequeue.config import ConsumeQueueConfig
from mqstore.consumequeue.consume_queue import ConsumeQueue
from mqstore.consumequeue.format import TIMESTAMP, UNIT
from mqstore.consumequeue.queue_store import QUEUE_ID_MAX, ConsumeQueueStore

__all__ = [
    "QUEUE_ID_MAX",
    "TIMESTAMP",
    "UNIT",
    "ConsumeQueue",
    "ConsumeQueueConfig",
    "ConsumeQueueStore",
]
