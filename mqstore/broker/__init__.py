"""mqstore's broker: Kafka's wire protocol over a store (``mqstore serve``).

A real server that Kafka clients (librdkafka, kafka-python, ...) produce to and
consume from, over the engine interface (mqstore.engine), so it serves both
engines. See docs/BROKER.md for how to run it and what works.

Layout, downward: ``server`` (event loop, connections, frames) -> ``handlers`` and
``groups`` (the APIs) -> ``log`` (the storage adapter; ``column_log`` on the
CommitLog engine, ``zero_copy`` on the segmented one) -> ``batch``, ``fetch_batch``,
``produce_columns`` (record batches; the last two in C, _kafka_codec.c) -> the engine.
``protocol`` holds the served versions and the codec.
"""

from mqstore.broker.config import BrokerConfig
from mqstore.broker.log import PartitionLog, RecordLog
from mqstore.broker.serve import serve
from mqstore.broker.server import Broker

__all__ = ["Broker", "BrokerConfig", "PartitionLog", "RecordLog", "serve"]
