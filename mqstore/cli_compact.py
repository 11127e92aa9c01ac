"""``mqstore compact`` and the ``--topic-config KEY=VALUE`` items of ``topics
create|alter`` (Kafka-named topic settings: ``cleanup.policy=compact``,
``max.compaction.lag.ms=2000``...; ``--config`` already means the store's config).

``compact TOPIC`` runs a cleaning pass now over every cleanable partition of a
compacted topic (either engine), whatever its dirty ratio, and prints each
partition's figures; the active segment and the head younger than
min.compaction.lag.ms are left alone, as by the scheduled cleaner.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, Final

from mqstore.cli_store import CliError, emit, open_store

__all__ = ["add_compact", "cmd_compact", "describe_compaction", "topic_configs"]

EXIT_OK: Final = 0


def topic_configs(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict of Kafka topic settings (values stay strings:
    the store parses them, as Kafka's broker does)."""
    configs: dict[str, str] = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise CliError(
                f"bad --topic-config {item!r}: use KEY=VALUE (e.g. cleanup.policy=compact)"
            )
        configs[key.strip()] = value.strip()
    return configs


def add_compact(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``compact`` command's parser."""
    text = "run a compaction pass now over a compacted topic"
    compact = commands.add_parser("compact", help=text, description=text, parents=[common])
    compact.set_defaults(handler=cmd_compact)
    compact.add_argument("topic", help="a topic with cleanup.policy compact or compact,delete")


def cmd_compact(args: argparse.Namespace) -> int:
    with open_store(args, write=True) as store:
        results = store.compact(args.topic)
        for result in results:
            partition = result.partition
            data = {"topic": args.topic, "partition": partition, **_figures(result)}
            mb_per_s = result.bytes_read / max(result.duration_ms, 1e-3) / 1000
            text = (
                f"{args.topic}-{partition}: cleaned [{result.first_dirty_offset}, "
                f"{result.end_offset}), {result.keys} keys, {result.bytes_read} B read, "
                f"{result.bytes_written} B written, {result.segments_in} -> "
                f"{result.segments_out} segments, {result.duration_ms:.1f} ms "
                f"({mb_per_s:.1f} MB/s){' (key map full)' if result.map_full else ''}"
            )
            emit(args, data, text)
        if not results:
            emit(args, {"topic": args.topic, "cleaned": 0}, f"{args.topic}: nothing to clean")
    return EXIT_OK


def _figures(result: Any) -> dict[str, Any]:
    return {
        "first_dirty_offset": result.first_dirty_offset,
        "end_offset": result.end_offset,
        "keys": result.keys,
        "bytes_read": result.bytes_read,
        "bytes_written": result.bytes_written,
        "segments_in": result.segments_in,
        "segments_out": result.segments_out,
        "map_full": result.map_full,
        "duration_ms": round(result.duration_ms, 1),
    }


def describe_compaction(topic: Any) -> str:
    """The cleanup policy and, if compacted, its settings (``topics describe``)."""
    text = f"\tCleanupPolicy: {topic.cleanup_policy}"
    if topic.compacted:
        configs = topic.kafka_configs()
        for name in (
            "min.cleanable.dirty.ratio",
            "min.compaction.lag.ms",
            "max.compaction.lag.ms",
            "delete.retention.ms",
        ):
            text += f"\t{name}: {configs[name]}"
    return text
