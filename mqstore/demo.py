"""``make demo``: the main job on an embedded store in a local folder.

1. A service produces order events into a topic through the Kafka-style producer
   (per message and in batches), with keys, across several partitions.
2. The store is closed and reopened (recovery from the checkpoint).
3. A consumer group reads everything back, commits, and the demo checks the count.
4. Look-ups: by partition offset, by key (the IndexFile), and by time.

Every step prints what happened with its timing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

from mqstore import KafkaConsumer, KafkaProducer, MessageStore, StoreConfig, TopicPartition

TOPIC = "orders"
PARTITIONS = 8
AUDIT_TOPIC = "audit"  # a second topic, RocketMQ-style: queues, tags and keys via put()
AUDIT_QUEUES = 4  # created with its queues: every entry point then sees the same topic


@contextmanager
def step(label: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    print(f"  {label}: {(time.perf_counter() - started) * 1000:,.1f} ms")


def produce(store: MessageStore, count: int) -> int:
    producer = KafkaProducer(store, key_serializer=str.encode)
    half = count // 2
    with step(f"send {half:,} events one by one (key -> partition by murmur2)"):
        for i in range(half):
            producer.send(TOPIC, b'{"order": %d, "amount": 42}' % i, key=f"order-{i}")
    rest = count - half
    with step(f"send {rest:,} events in batches of 1,000 (put_batch)"):
        for start in range(0, rest, 1000):
            size = min(1000, rest - start)
            partition = (start // 1000) % PARTITIONS
            producer.send_batch(TOPIC, partition, [b'{"bulk": true}'] * size)
    producer.close()
    with step(f"put {count // 10:,} audit events into topic '{AUDIT_TOPIC}' with tags and keys"):
        for i in range(count // 10):
            store.put(AUDIT_TOPIC, i % AUDIT_QUEUES, b"audit %d" % i, tag="Checked",
                      keys=[f"audit-{i}"])  # fmt: skip
    return count


def consume(store: MessageStore, expected: int) -> None:
    consumer = KafkaConsumer(
        TOPIC, store=store, group_id="billing", auto_offset_reset="earliest",
        enable_auto_commit=False, max_poll_records=5000,
    )  # fmt: skip
    seen = 0
    with step(f"consume {expected:,} events with a consumer group, then commit"):
        while seen < expected:
            batch = consumer.poll(timeout_ms=1000)
            if not batch:
                break
            seen += sum(len(records) for records in batch.values())
        consumer.commit()
    lag = sum(
        end - (consumer.committed(tp) or 0)
        for tp, end in consumer.end_offsets(consumer.assignment()).items()
    )
    print(f"  consumed {seen:,} events; lag after commit: {lag}")
    assert seen == expected, f"expected {expected} events, consumed {seen}"
    consumer.close()


def look_up(store: MessageStore) -> None:
    tp = TopicPartition(TOPIC, 3)
    with step("read 100 events of partition 3 from offset 10"):
        records = store.read_records(tp.topic, tp.partition, 10, 100)
    print(f"  first: offset {records[0].offset}, value {records[0].value!r}")
    with step("query key 'order-777' (IndexFile, checked against the record)"):
        hits = store.query_by_key(TOPIC, "order-777", 0, 2**62, 10)
    hit = hits[0]
    print(f"  found {len(hits)} message(s): partition {hit.queue_id}, offset {hit.queue_offset}")
    target = hits[0].store_timestamp_ms
    with step("offsets_for_times on every partition"):
        consumer = KafkaConsumer(store=store)
        found = consumer.offsets_for_times(
            {TopicPartition(TOPIC, p): target for p in range(PARTITIONS)}
        )
    print(f"  partition 0 -> {found[TopicPartition(TOPIC, 0)]}")
    with step(f"get 32 messages of '{AUDIT_TOPIC}' queue 2 from offset 100"):
        messages = store.get(AUDIT_TOPIC, 2, 100, 32)
    first = messages[0]
    print(f"  first: {first.value!r} tag={first.tag} keys={first.keys}")
    with step(f"query key 'audit-4242' in '{AUDIT_TOPIC}'"):
        audit_hits = store.query_by_key(AUDIT_TOPIC, "audit-4242", 0, 2**62, 4)
    print(f"  found queue {audit_hits[0].queue_id} offset {audit_hits[0].queue_offset}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--path", default="./demo-data", help="store directory (recreated)")
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args(argv)
    if os.path.exists(args.path):
        shutil.rmtree(args.path)
    config = StoreConfig(commitlog_file_size_bytes=64 << 20, index_slot_count=500_000,
                         index_entry_count=2_000_000)  # fmt: skip

    print(f"store: {os.path.abspath(args.path)}")
    with step("open a new store"):
        store = MessageStore.open(args.path, config)
    store.create_topic(TOPIC, PARTITIONS)
    store.create_topic(AUDIT_TOPIC, AUDIT_QUEUES)  # put() alone would auto-create it too
    produce(store, args.messages)
    with step("close (flush, dispatch the tail, checkpoint)"):
        store.close()

    with step("reopen (recovery bounded by the checkpoint)"):
        store = MessageStore.open(args.path, config)
    print(f"  {store.stats()['commitlog_files']} CommitLog file(s), "
          f"write position {store.commitlog.write_position:,} bytes")  # fmt: skip
    topics = {name: topic.partitions for name, topic in sorted(store.list_topics().items())}
    print(f"  topics (name: partitions): {topics}")
    consume(store, args.messages)
    look_up(store)
    store.close()
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
