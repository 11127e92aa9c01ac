"""``mqstore produce``: lines of a file or stdin as records, through KafkaProducer.

A bad line (or a record the store refuses) stops the input; what was written before
it is reported first (partition and offsets), so a retry knows where to resume."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Final

from mqstore.cli_store import CliError, NoProgress, emit, open_store, progress
from mqstore.commitlog.errors import StoreError
from mqstore.kafka import KafkaProducer

__all__ = ["cmd_produce"]

EXIT_OK: Final = 0
PRODUCE_LINGER_MS: Final = 50  # a line from a slow pipe is appended within this
PRODUCE_BATCH_BYTES: Final = 1 << 20  # records per put_batch, in bytes of key and value
PRODUCE_CHECK_RECORDS: Final = 10_000  # futures checked (and freed) this often


def cmd_produce(args: argparse.Namespace) -> int:
    headers = []
    for item in args.header:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise CliError(f"bad --header {item!r}: use KEY=VALUE")
        headers.append((name, value.encode("utf-8")))
    separator = None if args.key_separator is None else args.key_separator.encode("utf-8")
    if separator == b"":
        raise CliError("--key-separator must not be empty")
    fixed_key = None if args.key is None else args.key.encode("utf-8")
    with contextlib.ExitStack() as stack:
        source = sys.stdin.buffer
        total = 0
        if args.file is not None:
            source = stack.enter_context(open(args.file, "rb"))
            total = os.fstat(source.fileno()).st_size
        store = stack.enter_context(open_store(args, write=True))
        if not store.auto_create_topics:  # else the first send creates the topic
            store.describe_topic(args.topic)  # an unknown topic fails before reading input
        producer = KafkaProducer(store, linger_ms=PRODUCE_LINGER_MS, batch_size=PRODUCE_BATCH_BYTES)
        bar = progress(args, args.file or "stdin", total, "B") if total else NoProgress()
        stack.callback(bar.close)
        summary: dict[int, list[int]] = {}  # partition -> [records, first offset, last offset]
        futures: list[Any] = []
        failure: BaseException | None = None
        try:
            for number, raw in enumerate(source, start=1):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                line = line[:-1] if line.endswith(b"\r") else line
                key = fixed_key
                if separator is not None:
                    key, found, line = line.partition(separator)
                    if not found:
                        raise CliError(f"line {number} has no key separator {args.key_separator!r}")
                futures.append(
                    producer.send(
                        args.topic, line, key=key, headers=headers, partition=args.partition
                    )
                )
                bar.update(len(raw))
                if len(futures) >= PRODUCE_CHECK_RECORDS:
                    producer.flush()
                    failure = _settle(futures, summary)
                    if failure is not None:
                        break
        except (CliError, StoreError) as error:  # a bad line, or a send the store refused
            failure = error
        finally:
            producer.close()  # appends what was sent before a failure
        failure = _settle(futures, summary) or failure
    _report_produced(args, summary, failure)
    if failure is not None:
        raise failure  # after the lines before it were reported
    return EXIT_OK


def _report_produced(
    args: argparse.Namespace, summary: dict[int, list[int]], failure: BaseException | None
) -> None:
    """Print what was written: everything, or (on a failure) what was written before
    it, so a retry knows where to resume."""
    records = sum(item[0] for item in summary.values())
    if failure is not None and not records:
        return  # nothing was written: the error alone says it
    partitions = {
        str(p): {"records": n, "first_offset": first, "last_offset": last}
        for p, (n, first, last) in sorted(summary.items())
    }
    text = f"produced {records} record(s) to {args.topic}"
    if failure is not None:
        spans = ", ".join(
            f"partition {p} offsets {first}-{last}"
            for p, (_, first, last) in sorted(summary.items())
        )
        text += f" before the error ({spans}); the rest of the input was not written"
    data = {"topic": args.topic, "records": records, "partitions": partitions}
    emit(args, {**data, "complete": failure is None}, text)


def _settle(futures: list[Any], summary: dict[int, list[int]]) -> BaseException | None:
    """Count what landed where; return the first send error (records sent after a
    failed one are still counted when they landed)."""
    failure = None
    for future in futures:
        try:
            metadata = future.get()
        except StoreError as error:
            failure = failure or error
            continue
        entry = summary.setdefault(metadata.partition, [0, metadata.offset, metadata.offset])
        entry[0] += 1
        entry[1] = min(entry[1], metadata.offset)
        entry[2] = max(entry[2], metadata.offset)
    futures.clear()
    return failure
