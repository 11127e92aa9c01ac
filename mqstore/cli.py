"""``mqstore``: the command line of a store, for Kafka and RocketMQ hands.

One command does what kafka-topics, kafka-console-producer/-consumer,
kafka-get-offsets and kafka-dump-log do, and what mqadmin queryMsgByKey and the
store-checking tools do. ``python -m mqstore`` runs it too.

How it opens the store:
- commands that write (``topics create|alter``, ``produce``, ``consume --group``,
  ``serve``) open it as the writer: they take its lock, so they fail while a service
  has it open;
- commands that only read (``topics list|describe``, ``consume``, ``offsets``,
  ``query-key``, ``stats``) open it read-only: they run beside a live writer and
  never change a byte;
- ``dump`` and ``verify`` read the files directly (``mqstore.cli_dump``,
  ``mqstore.cli_verify``), so verify never "repairs" what it checks (a writer's open
  cuts a corrupt tail).

Config: ``--config KEY=VALUE`` sets StoreConfig fields (SegmentedConfig fields with
``--engine segmented``) for this run, after those in ``$MQSTORE_CONFIG``; an unknown
or malformed item is refused from either; ``profile=broker`` sets the fields of
StoreConfig's broker profile (RocketMQ's sizes) at its place in that order. A new
store records its layout and defaults (``mqstore.layout``); an existing one is
opened with them: its layout (CommitLog file size, ConsumeQueue units per file,
index slots and entries) wins over ``$MQSTORE_CONFIG`` (a shell-wide setting for
the stores it creates), a ``--config`` value that contradicts it is refused, and
other settings given override the recorded defaults for this run only.

Exit codes: 0 success, 1 a user error (bad arguments, unknown topic, a store error
that is not corruption), 2 corrupt data (CorruptDataError, or verify/dump findings).
Errors print one line, ``mqstore: error: ...``; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from mqstore import cli_compact, cli_consume, cli_dump, cli_produce, cli_verify
from mqstore.cli_credentials import add_credentials_options, add_security_options
from mqstore.cli_store import (
    CONFIG_ENV,
    STORE_ENV,
    CliError,
    dumps,
    emit,
    note,
    open_store,
    progress,
    table,
)
from mqstore.commitlog.errors import CorruptDataError, StoreError, UnknownTopicError
from mqstore.commitlog_engine import KEY_PROPERTY
from mqstore.store import MessageStore

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_USER_ERROR: Final = 1
EXIT_CORRUPT: Final = 2
EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT, as shells report it
DEFAULT_STORE: Final = "./mqstore-data"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 1 (argparse uses 2, which
    here means corrupt data)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------- parser


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the command. After it, defaults are
    suppressed so that they do not overwrite what was given before it."""
    parent = argparse.ArgumentParser(add_help=False)

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parent.add_argument_group("common options")
    group.add_argument(
        "--store",
        metavar="PATH",
        default=default(os.environ.get(STORE_ENV, DEFAULT_STORE)),
        help=f"the store directory (default: ${STORE_ENV}, else {DEFAULT_STORE})",
    )
    group.add_argument(
        "--engine",
        choices=("commitlog", "segmented"),
        default=default("commitlog"),
        help="commitlog (mqstore's design, default) or segmented (the Kafka-design baseline)",
    )
    group.add_argument(
        "--config",
        dest="config_after" if suppress else "config",
        metavar="KEY=VALUE",
        action="append",
        default=default([]),
        help="set a StoreConfig field for this run, e.g. commitlog_file_size_bytes=1048576, "
        "or profile=broker for RocketMQ's sizes (repeatable; after those in "
        f"${CONFIG_ENV}; an existing store's layout and defaults are read back from it)",
    )
    group.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON Lines"
    )
    group.add_argument(
        "--quiet", action="store_true", default=default(False), help="no progress bars or notes"
    )
    group.add_argument(
        "--debug", action="store_true", default=default(False), help="tracebacks and debug logs"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(suppress=True)
    parser = _Parser(
        prog="mqstore",
        description="Inspect and use an mqstore message store from the shell.",
        parents=[_common_options(suppress=False)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    commands: Any = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, handler: Callable[[argparse.Namespace], int]) -> Any:
        sub = commands.add_parser(name, help=help_text, description=help_text, parents=[common])
        sub.set_defaults(handler=handler)
        return sub

    _add_topics(commands, common)
    produce = command(
        "produce", "append lines of stdin or a file to a topic", cli_produce.cmd_produce
    )
    produce.add_argument("topic", help="the topic")
    produce.add_argument("--file", metavar="PATH", help="read this file instead of stdin")
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", help="the key of every record")
    keys.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    produce.add_argument(
        "--header", metavar="K=V", action="append", default=[], help="add a header (repeatable)"
    )
    produce.add_argument(
        "--partition", type=int, help="the partition (default: by key hash, else round robin)"
    )

    consume = command("consume", "print the records of a topic", _cmd_consume)
    consume.add_argument("topic", help="the topic")
    start = consume.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        type=_start,
        metavar="WHERE",
        help="earliest, latest or an offset (default: the group's committed offset, else earliest)",
    )
    start.add_argument("--from-time", type=_time_ms, metavar="TIME", help="ms or ISO-8601")
    consume.add_argument("--partition", type=int, help="only this partition")
    consume.add_argument("--max-messages", type=_positive, metavar="N", help="stop after N")
    consume.add_argument(
        "--follow", action="store_true", help="keep polling for new records (stop: Ctrl-C)"
    )
    consume.add_argument(
        "--timeout-ms", type=_positive, metavar="MS", help="with --follow: stop after MS idle"
    )
    consume.add_argument("--group", help="commit the positions reached for this group")
    consume.add_argument("--print-key", action="store_true", help="print KEY<SEP>VALUE")
    consume.add_argument("--key-separator", default="\t", metavar="SEP", help="default: tab")
    consume.add_argument(
        "--print-metadata", action="store_true", help="prefix partition, offset and timestamp"
    )

    offsets = command("offsets", "earliest, latest and lag per partition", _cmd_offsets)
    offsets.add_argument("topic", help="the topic")
    offsets.add_argument("--time", type=_time_ms, help="also the offset for this time")
    offsets.add_argument(
        "--group", action="append", default=[], help="show this group's lag (repeatable)"
    )
    offsets.add_argument("--all-groups", action="store_true", help="show every group's lag")

    query = command("query-key", "find the messages of a topic with a key", _cmd_query_key)
    query.add_argument("topic", help="the topic")
    query.add_argument("key", help="a message key (a Kafka key that is UTF-8 text is one)")
    query.add_argument("--begin", type=_time_ms, default=0, help="ms or ISO-8601 (default: 0)")
    query.add_argument("--end", type=_time_ms, default=2**63 - 1, help="(default: no end)")
    query.add_argument("--max", type=_positive, default=64, help="at most N (default: 64)")

    dump = command("dump", "decode store files the way kafka-dump-log does", _cmd_dump)
    dump.add_argument("paths", nargs="+", metavar="PATH", help="files, or directories of them")
    dump.add_argument("--print-data", action="store_true", help="show keys, bodies, payloads")
    dump.add_argument("--kind", choices=cli_dump.KINDS, help="do not guess the kind from the path")

    serve = command("serve", "serve the store over Kafka's wire protocol", _cmd_serve)
    serve.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT")
    serve.add_argument("--no-auto-create", action="store_true", help="Metadata creates no topic")
    serve.add_argument(
        "--follow", metavar="HOST:PORT",
        help="be a follower: copy this leader's CommitLog, refuse writes (docs/REPLICATION.md)",
    )  # fmt: skip
    serve.add_argument(
        "--replica-id", type=int, metavar="N",
        help="this node's id in Metadata and as a follower (default: 1 with --follow, else 0)",
    )  # fmt: skip
    serve.add_argument(
        "--replica-ids", default="", metavar="N,N",
        help="a leader's followers that count for the high watermark and acks=all",
    )  # fmt: skip
    serve.add_argument("--min-insync-replicas", type=int, default=1, metavar="N")
    serve.add_argument("--replica-lag-time-max-ms", type=int, default=30_000, metavar="MS")
    serve.add_argument("--max-connections", type=int, metavar="N", help="default 2048")
    serve.add_argument("--max-connections-per-ip", type=int, metavar="N", help="default 1024")
    add_security_options(serve)

    promote = command(
        "promote", "make a follower broker the leader, with a new leader epoch", _cmd_promote
    )
    promote.add_argument("--broker", required=True, metavar="HOST:PORT", help="the follower")
    promote.add_argument(
        "--unclean", action="store_true",
        help="promote a follower outside the in-sync set: records only the old leader has "
        "are lost (the answer says how many bytes, as last heard)",
    )  # fmt: skip
    promote.add_argument("--timeout-ms", type=_positive, default=10_000, metavar="MS")

    credentials = command("credentials", "manage the broker's SASL users", _cmd_credentials)
    add_credentials_options(credentials)

    cli_compact.add_compact(commands, common)
    command("verify", "check every record checksum and ConsumeQueue unit", _cmd_verify)
    stats = command("stats", "sizes, files, queues, dispatch lag and open files", _cmd_stats)
    stats.add_argument(
        "--broker", metavar="HOST:PORT", help="read a broker's metrics endpoint instead"
    )
    bench = command("bench", "run the quick CommitLog append benchmark", _cmd_bench)
    bench.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="more benchmark arguments, after --"
    )
    return parser


def _add_topics(commands: Any, common: argparse.ArgumentParser) -> None:
    topics = commands.add_parser(
        "topics", help="create, list, describe or alter topics", parents=[common]
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a topic", parents=[common])
    create.set_defaults(handler=_cmd_topics_create)
    create.add_argument("topic")
    create.add_argument("--partitions", type=_positive, default=1, help="default: 1")
    create.add_argument(
        "--timestamp-type", choices=cli_consume.TIMESTAMP_NAMES, default="CreateTime"
    )
    create.add_argument(
        "--retention-ms",
        type=int,
        help="-1: keep forever (default: the store's retention_hours, 72 h unless set)",
    )
    create.add_argument("--retention-bytes", type=int, help="per partition; -1: no limit")
    create.add_argument("--if-not-exists", action="store_true", help="no error if it exists")

    listing = actions.add_parser("list", help="list topic names", parents=[common])
    listing.set_defaults(handler=_cmd_topics_list)
    describe = actions.add_parser("describe", help="settings and offsets", parents=[common])
    describe.set_defaults(handler=_cmd_topics_describe)
    describe.add_argument("topics", nargs="*", metavar="TOPIC", help="default: every topic")
    alter = actions.add_parser("alter", help="add partitions, change settings", parents=[common])
    alter.set_defaults(handler=_cmd_topics_alter)
    alter.add_argument("topic")
    alter.add_argument("--partitions", type=_positive, help="the new count")
    for parser in (create, alter):
        parser.add_argument(
            "--topic-config", action="append", default=[], metavar="KEY=VALUE",
            help="a Kafka topic setting, e.g. cleanup.policy=compact (repeatable)",
        )  # fmt: skip


_EPILOG = """\
examples:
  mqstore --config commitlog_file_size_bytes=67108864 topics create orders --partitions 3
  seq 1000 | mqstore produce orders
  mqstore produce orders --file events.txt --key-separator :
  mqstore consume orders --from earliest --max-messages 10 --json
  mqstore consume orders --follow --group billing
  mqstore offsets orders --group billing
  mqstore query-key orders order-42 --begin 2024-05-01T00:00:00Z
  mqstore dump mqstore-data/commitlog/00000000000000000000 --print-data
  mqstore verify
  mqstore serve --listen 127.0.0.1:9092   # Kafka clients connect here (docs/BROKER.md)
  mqstore credentials add alice            # then: serve --sasl-mechanism SCRAM-SHA-256

exit codes: 0 success, 1 user error, 2 corrupt data found.
A new store takes the default StoreConfig (128 MiB pre-warmed CommitLog files, 21 MiB
index files); --config profile=broker takes RocketMQ's (1 GiB and 420 MB). For a
smaller one, export MQSTORE_CONFIG="commitlog_file_size_bytes=1048576 prewarm=false"
(or pass --config): the store records its layout, and later runs adopt it."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _start(text: str) -> str | int:
    """--from: earliest, latest or an offset."""
    if text in ("earliest", "latest"):
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"use earliest, latest or an offset, not {text!r}")
    return int(text)


def _time_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it names its zone)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not epoch ms or an ISO-8601 time: {text!r} (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    value = (moment - epoch) // datetime.timedelta(milliseconds=1)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970")
    return value


def _cmd_credentials(args: argparse.Namespace) -> int:
    from mqstore.cli_credentials import cmd_credentials

    return cmd_credentials(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from mqstore.broker.serve import cmd_serve  # the broker's imports load only here

    return cmd_serve(args)


def _cmd_promote(args: argparse.Namespace) -> int:
    from mqstore.cli_promote import cmd_promote

    return cmd_promote(args)


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        args.config = [*args.config, *getattr(args, "config_after", [])]
        logging.basicConfig(
            level=logging.DEBUG if debug else logging.ERROR if args.quiet else logging.WARNING,
            format="mqstore: %(levelname)s: %(message)s",
            stream=sys.stderr,
        )
        return int(args.handler(args))
    except CorruptDataError as error:
        return _fail(error, EXIT_CORRUPT, debug)
    except (CliError, StoreError) as error:
        return _fail(error, EXIT_USER_ERROR, debug)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED, debug)
    except BrokenPipeError:  # the reader went away (| head): stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as error:
        return _fail(f"{error.strerror or error}: {error.filename or ''}", EXIT_USER_ERROR, debug)
    except Exception as error:
        return _fail(f"internal error: {type(error).__name__}: {error}", EXIT_USER_ERROR, debug)


def _fail(error: BaseException | str, code: int, debug: bool) -> int:
    """Print the one-line error (and with --debug the traceback); return ``code``."""
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else type(error).__name__
    print(f"mqstore: error: {message}", file=sys.stderr)
    return code


# ---------------------------------------------------------------- topics


def _cmd_topics_create(args: argparse.Namespace) -> int:
    with open_store(args, write=True) as store:
        if args.if_not_exists and args.topic in store.list_topics():
            topic = store.describe_topic(args.topic)
        else:
            topic = store.create_topic(
                args.topic,
                args.partitions,
                timestamp_type=args.timestamp_type,
                retention_ms=args.retention_ms,
                retention_bytes=args.retention_bytes,
                topic_configs=cli_compact.topic_configs(args.topic_config),
            )
        topic = store.describe_topic(topic.name)  # with the retention in force
    text = (
        f"created topic {topic.name} with {topic.partitions} partition(s), retention_ms "
        f"{_retention(topic.effective_retention_ms, topic.effective_retention_ms_source)}"
    )
    emit(args, {"name": topic.name, **topic.to_json()}, text)
    return EXIT_OK


def _cmd_topics_list(args: argparse.Namespace) -> int:
    with open_store(args, write=False) as store:
        for name, topic in sorted(store.list_topics().items()):
            emit(args, {"name": name, **topic.to_json()}, name)
    return EXIT_OK


def _cmd_topics_describe(args: argparse.Namespace) -> int:
    with open_store(args, write=False) as store:
        names = args.topics or sorted(store.list_topics())
        for name in names:
            topic = store.describe_topic(name)
            ranges = [
                (p, store.earliest_offset(name, p), store.latest_offset(name, p))
                for p in range(topic.partitions)
            ]
            offsets = [{"partition": p, "earliest": lo, "latest": hi} for p, lo, hi in ranges]
            effective = {
                "effective_retention_ms": topic.effective_retention_ms,
                "effective_retention_ms_source": topic.effective_retention_ms_source,
                "effective_retention_bytes": topic.effective_retention_bytes,
                "effective_retention_bytes_source": topic.effective_retention_bytes_source,
            }
            retention_ms = _retention(
                topic.effective_retention_ms, topic.effective_retention_ms_source
            )
            retention_bytes = _retention(
                topic.effective_retention_bytes, topic.effective_retention_bytes_source, "no limit"
            )
            text = (
                f"Topic: {name}\tPartitions: {topic.partitions}\tTimestampType: "
                f"{topic.timestamp_type}\tRetentionMs: {retention_ms}\tRetentionBytes: "
                f"{retention_bytes}\tCreated: {_iso(topic.created_ms)}"
            ) + cli_compact.describe_compaction(topic)
            for p, lo, hi in ranges:
                text += f"\n\tPartition: {p}\tEarliestOffset: {lo}\tLatestOffset: {hi}"
            data = {"name": name, **topic.to_json(), **effective, "offsets": offsets}
            data["configs"] = topic.kafka_configs()
            emit(args, data, text)
    return EXIT_OK


def _retention(value: int | None, source: str | None, unlimited: str = "forever") -> str:
    """A retention in force and where it comes from: ``-1 (forever, topic)``."""
    return f"{value} ({unlimited + ', ' if value == -1 else ''}{source})"


def _iso(epoch_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cmd_topics_alter(args: argparse.Namespace) -> int:
    configs = cli_compact.topic_configs(args.topic_config)
    if args.partitions is None and not configs:
        raise CliError("topics alter needs --partitions N or --topic-config KEY=VALUE")
    with open_store(args, write=True) as store:
        if configs:
            topic = store.alter_topic(args.topic, configs)
        if args.partitions is not None:
            topic = store.add_partitions(args.topic, args.partitions)
    text = f"topic {topic.name} now has {topic.partitions} partitions, " + ", ".join(
        f"{key}={value}" for key, value in topic.kafka_configs().items()
    )
    emit(args, {"name": topic.name, **topic.to_json()}, text)
    return EXIT_OK


# ---------------------------------------------------------------- consume


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.timeout_ms is not None and not args.follow:
        raise CliError("--timeout-ms needs --follow")
    with open_store(args, write=args.group is not None) as store:
        topic = store.describe_topic(args.topic)
        partitions = list(range(topic.partitions))
        if args.partition is not None:
            if not 0 <= args.partition < topic.partitions:
                raise UnknownTopicError(f"topic {args.topic!r} has no partition {args.partition}")
            partitions = [args.partition]
        committed = store.offsets.load(args.group) if args.group else {}
        positions = {p: cli_consume.start_offset(store, args, p, committed) for p in partitions}
        count = cli_consume.consume(store, args, positions)
        if args.group:
            entries = {(args.topic, p): (offset, "") for p, offset in positions.items()}
            store.offsets.commit(args.group, entries)
    note(args, f"Processed a total of {count} messages")
    return EXIT_OK


# ---------------------------------------------------------------- offsets and keys


def _cmd_offsets(args: argparse.Namespace) -> int:
    with open_store(args, write=False) as store:
        topic = store.describe_topic(args.topic)
        groups = sorted(
            set(args.group) | (set(store.offsets.groups()) if args.all_groups else set())
        )
        committed = {group: store.offsets.load(group) for group in groups}
        rows = []
        for partition in range(topic.partitions):
            row: dict[str, Any] = {
                "topic": args.topic,
                "partition": partition,
                "earliest": store.earliest_offset(args.topic, partition),
                "latest": store.latest_offset(args.topic, partition),
            }
            if args.time is not None:
                found = store.offset_for_timestamp(args.topic, partition, args.time)
                row["offset_for_time"] = None if found is None else found[0]
                row["timestamp"] = None if found is None else found[1]
            if not groups:
                rows.append(row)
            for group in groups:
                entry = committed[group].get((args.topic, partition))
                offset = None if entry is None else entry[0]
                lag = None if offset is None else max(0, row["latest"] - offset)
                rows.append({**row, "group": group, "committed": offset, "lag": lag})
    columns = ["topic", "partition", "earliest", "latest"]
    columns += ["offset_for_time", "timestamp"] if args.time is not None else []
    columns += ["group", "committed", "lag"] if groups else []
    table(args, rows, columns)
    return EXIT_OK


def _cmd_query_key(args: argparse.Namespace) -> int:
    if args.engine != "commitlog":
        raise CliError("query-key needs the commitlog engine (the segmented log has no key index)")
    with open_store(args, write=False) as store:
        for message in store.query_by_key(args.topic, args.key, args.begin, args.end, args.max):
            properties = dict(message.properties)  # the Kafka key is the first, if any
            data = {
                "partition": message.queue_id,
                "offset": message.queue_offset,
                "physical_offset": message.physical_offset,
                "store_timestamp": message.store_timestamp_ms,
                "born_timestamp": message.born_timestamp_ms,
                "keys": list(message.keys),
                "tag": message.tag,
                "key": properties.get(KEY_PROPERTY),
                "value": message.value,
                "headers": [
                    {"key": k, "value": v} for k, v in message.properties if k != KEY_PROPERTY
                ],
            }
            text = (
                f"Partition:{message.queue_id}\tOffset:{message.queue_offset}\t"
                f"StoreTime:{_iso(message.store_timestamp_ms)}\t"
                f"Keys:{','.join(message.keys)}\t"
                + ("null" if message.value is None else cli_dump.printable(message.value))
            )
            emit(args, data, text)
    return EXIT_OK


# ---------------------------------------------------------------- dump and verify


def _cmd_dump(args: argparse.Namespace) -> int:
    for path in args.paths:
        if not os.path.exists(path):
            raise CliError(f"no such file: {path}")
    try:
        corrupt = cli_dump.print_dump(args.paths, args.kind, args.print_data, args.json)
    except ValueError as error:
        raise CliError(str(error)) from None
    if corrupt:
        note(args, f"{corrupt} corrupt spot(s) found")
    return EXIT_CORRUPT if corrupt else EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    marker = "topics" if args.engine == "segmented" else "commitlog"
    if not os.path.isdir(os.path.join(args.store, marker)) and not os.path.isfile(
        os.path.join(args.store, marker)
    ):  # an empty or foreign directory: "no problems" would be a lie
        raise CliError(f"no store at {args.store} (it has no {marker}): nothing to verify")
    bars: list[Any] = []

    def bar(label: str, total: int) -> Callable[[int], None]:
        bars.append(progress(args, label, total, "file" if label == "ConsumeQueue" else "B"))
        return bars[-1].update

    try:
        if args.engine == "segmented":
            report = cli_verify.verify_segmented_store(args.store, bar)
        else:
            if os.path.exists(os.path.join(args.store, "abort")):
                note(args, "note: a writer has the store open, or it crashed: its tail may show")
            report = cli_verify.verify_commitlog_store(args.store, bar)
    finally:
        for shown in bars:
            shown.close()
    cli_verify.print_report(report, args.json)
    return EXIT_CORRUPT if report.findings else EXIT_OK


# ---------------------------------------------------------------- stats and bench


def _cmd_stats(args: argparse.Namespace) -> int:
    if args.broker:
        from mqstore.cli_credentials import print_broker_metrics

        return print_broker_metrics(args.broker, args.json)
    with open_store(args, write=False) as store:
        stats = dict(store.stats())
        stats["topics"] = len(store.list_topics())
        stats["groups"] = len(store.offsets.groups())
        if isinstance(store, MessageStore):
            # Read-only: the store's dispatcher and flush positions are not running;
            # the checkpoint says how far the writer got.
            for name in (
                "dispatched_position",
                "dispatch_lag_bytes",
                "flushed_position",
                "recovered_from_crash",
            ):
                del stats[name]
            stats.update(cli_verify.file_stats(args.store, store.commitlog.write_position))
            stats["queues"] = len(store.consume_queues.existing_queues())  # shared ones too
    stats["files"], stats["bytes"] = cli_verify.tree_size(args.store)
    stats = {k: round(v, 1) if isinstance(v, float) else v for k, v in stats.items()}
    if args.json:
        print(dumps(stats))
    else:
        for name, value in stats.items():
            print(f"{name}: {'-' if value is None else value}")
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "bench", "commitlog_append.py")):
        raise CliError(
            f"bench/ is not next to the mqstore package ({root}); run from a source checkout"
        )
    extra = [arg for arg in args.bench_args if arg != "--"]
    command = [sys.executable, "-m", "bench.commitlog_append", "--quick", *extra]
    note(args, f"running {' '.join(command[1:])} in {root}")
    return subprocess.call(command, cwd=root)
