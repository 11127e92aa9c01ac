"""segmented: Kafka's segmented log, the baseline mqstore's CommitLog is measured
against, behind the same engine interface (``mqstore.engine.Engine``).

    from mqstore.segmented import SegmentedConfig, SegmentedStore
    from mqstore.engine import ProducerRecord

    with SegmentedStore.open("./kafka-data", SegmentedConfig(flush_mode="sync")) as store:
        store.create_topic("orders", partitions=3)
        [appended] = store.append_records("orders", 0, [ProducerRecord(b"k", b"v", [], None)])
        records = store.read_records("orders", 0, appended.offset, 10)
"""

from mqstore.segmented.config import SegmentedConfig
from mqstore.segmented.store import SegmentedStore

__all__ = ["SegmentedConfig", "SegmentedStore"]
