"""mqstore's broker: Kafka's wire protocol over a store (``mqstore serve``).

A real server that Kafka clients (librdkafka, kafka-python, ...) produce to and
consume from, over the engine interface (mqstore.engine), so it serves both
engines. See docs/BROKER.md for how to run it and what works.

Layout, downward: ``server`` (event loop, connections, frames) -> ``handlers`` and
``groups`` (the APIs) -> ``log`` (the storage adapter) -> ``batch`` (record
batches) -> the engine. ``protocol`` holds the served versions and the codec.
"""

from mqstore.broker.config import BrokerConfig
from mqstore.broker.log import PartitionLog, RecordLog
from mqstore.broker.serve import serve
from mqstore.broker.server import Broker

__all__ = ["Broker", "BrokerConfig", "PartitionLog", "RecordLog", "serve"]
