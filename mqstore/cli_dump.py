"""The decoders behind ``mqstore dump`` and ``mqstore verify``.

They read store files directly, with plain reads and read-only maps: they never open
a store, take its lock or write a byte, so they never "repair" what they show (opening
a store as a writer runs crash recovery, which cuts a corrupt tail).

Kinds of file, told apart by path (``kind_of``)::

    commitlog          <store>/commitlog/<20 digits>          CommitLog records
    consumequeue       <store>/consumequeue/<topic>/<queue>/<20 digits>[.time]
    index              <store>/index/<17 digits>              key index entries
    checkpoint         <store>/checkpoint                     both checkpoint slots
    segment-log        <20 digits>.log        Kafka record batches v2 (segmented engine)
    segment-index      <20 digits>.index      (relative offset i32, position i32)
    segment-timeindex  <20 digits>.timeindex  (timestamp i64, relative offset i32)

Every decoder yields one dict per record, unit or entry, with its byte ``position``;
a dict holding ``corrupt`` names what is wrong there. Payloads are bytes; the caller
renders them (``to_json``, ``to_text``).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

import attrs
import numpy as np
import xxhash

from mqstore.cli_dump_kafka import dump_batches, dump_offset_index, dump_time_index, walk_batches
from mqstore.cli_files import (
    Line,
    is_digits,
    mapped,
    printable,
    read_bytes,
    to_json,
    to_text,
)
from mqstore.commitlog import checkpoint as ckpt
from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    PREFIX,
    Record,
    decode,
    read_prefix,
)
from mqstore.consumequeue.format import (
    FILE_NAME_DIGITS,
    SHARED_DIRECTORY,
    SHARED_END,
    SHARED_ENDS_FILE,
    SHARED_ENDS_HEADER,
    SHARED_ENDS_MAGIC,
    SHARED_RECORD,
    SHARED_RECORD_SIZE_BYTES,
    TIME_FILE_SUFFIX,
    TIME_HEADER,
    TIME_HEADER_SIZE_BYTES,
    TIMESTAMP,
    UNIT,
    UNIT_SIZE_BYTES,
    block_max_position_bytes,
    blocks_per_file,
    check_time_header,
)
from mqstore.indexfile import format as ix

__all__ = [
    "KINDS",
    "dump_path",
    "kind_of",
    "print_dump",
    "printable",
    "to_json",
    "to_text",
    "walk_batches",
    "walk_commitlog",
]

KINDS: Final = (
    "commitlog",
    "consumequeue",
    "consumequeue-time",
    "consumequeue-shared",
    "consumequeue-shared-ends",
    "index",
    "checkpoint",
    "segment-log",
    "segment-index",
    "segment-timeindex",
)


def kind_of(path: str) -> str | None:
    """What a store file is, from its path (see the module docstring), or None."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    for suffix, kind in (
        (".log", "segment-log"),
        (".timeindex", "segment-timeindex"),
        (".index", "segment-index"),
    ):
        if name.endswith(suffix):
            return kind
    if name == ckpt.CHECKPOINT_NAME:
        return "checkpoint"
    if is_digits(name, FILE_NAME_DIGITS) and parent == "commitlog":
        return "commitlog"
    if is_digits(name, ix.FILE_NAME_DIGITS) and parent == "index":
        return "index"
    if parent == SHARED_DIRECTORY:  # consumequeue/<topic>/.shared/
        if is_digits(name, FILE_NAME_DIGITS):
            return "consumequeue-shared"
        if name == SHARED_ENDS_FILE:
            return "consumequeue-shared-ends"
    queue_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    if os.path.basename(queue_root) == "consumequeue":
        if is_digits(name, FILE_NAME_DIGITS):
            return "consumequeue"
        if name.endswith(TIME_FILE_SUFFIX) and is_digits(
            name[: -len(TIME_FILE_SUFFIX)], FILE_NAME_DIGITS
        ):
            return "consumequeue-time"
    return None


def dump_path(path: str, kind: str | None, print_data: bool) -> Iterator[Line]:
    """Lines for one file, or for every file of a known kind under a directory.

    Raises:
        ValueError: the kind of a named file cannot be told from its path.
    """
    if os.path.isdir(path):
        for directory, subdirectories, names in os.walk(path):
            subdirectories.sort()
            for name in sorted(names):
                child = os.path.join(directory, name)
                child_kind = kind or kind_of(child)
                if child_kind is not None:
                    yield from _dump_file(child, child_kind, print_data)
        return
    found = kind or kind_of(path)
    if found is None:
        raise ValueError(
            f"cannot tell what kind of file {path} is from its path; pass --kind "
            f"({', '.join(KINDS)})"
        )
    yield from _dump_file(path, found, print_data)


def _dump_file(path: str, kind: str, print_data: bool) -> Iterator[Line]:
    size_bytes = os.path.getsize(path)
    yield {"file": path, "kind": kind, "size_bytes": size_bytes}
    decoders: dict[str, Callable[[str, bool], Iterator[Line]]] = {
        "commitlog": _dump_commitlog,
        "consumequeue": _dump_units,
        "consumequeue-time": _dump_times,
        "consumequeue-shared": _dump_shared,
        "consumequeue-shared-ends": _dump_shared_ends,
        "index": dump_index,
        "checkpoint": _dump_checkpoint,
        "segment-log": dump_batches,
        "segment-index": dump_offset_index,
        "segment-timeindex": dump_time_index,
    }
    yield from decoders[kind](path, print_data)


def print_dump(paths: list[str], kind: str | None, print_data: bool, as_json: bool) -> int:
    """Print the lines of every path (JSON Lines with ``as_json``); return how many
    corrupt spots they show.

    Raises:
        ValueError: the kind of a named file cannot be told from its path.
    """
    corrupt = 0
    for path in paths:
        for line in dump_path(path, kind, print_data):
            corrupt += "corrupt" in line
            if as_json:
                print(json.dumps(to_json(line), ensure_ascii=False))
            elif "file" in line:
                print(f"Dumping {line['file']} ({line['kind']}, {line['size_bytes']} bytes)")
            else:
                print(to_text(line))
    return corrupt


# ---------------------------------------------------------------- CommitLog


class Step(NamedTuple):
    """One stop of a walk through a CommitLog file."""

    kind: str  # "record", "blank", "corrupt" or "end" (zeros, or the end of the file)
    position: int  # in the file
    size: int  # bytes of the record; 0 for "end" and an unskippable "corrupt"
    record: Record | None
    reason: str


def walk_commitlog(buffer: Any, path: str, file_start: int) -> Iterator[Step]:
    """Every record of one CommitLog file, verified, up to zeros or a blank record.

    A corrupt record whose prefix (size, magic) is sane is stepped over, so every
    corrupt position is reported; after an insane prefix the file cannot be walked on.
    """
    limit = len(buffer)
    position = 0
    while position + BLANK_SIZE <= limit:
        total_size, magic, _ = PREFIX.unpack_from(buffer, position)
        if total_size == 0 and magic == 0:
            break
        try:
            record = decode(buffer, position, limit, path, file_start)
        except CorruptDataError as error:
            try:
                skip, _ = read_prefix(buffer, position, limit, path)
            except CorruptDataError:
                skip = 0
            yield Step("corrupt", position, skip, None, error.reason)
            if not skip:
                return
            position += skip
            continue
        if record is None:
            yield Step("blank", position, total_size, None, "")
            return
        assert record.size >= HEADER_SIZE  # decode checked it: the walk always advances
        yield Step("record", position, record.size, record, "")
        position += record.size
    yield Step("end", position, 0, None, "")


def _dump_commitlog(path: str, print_data: bool) -> Iterator[Line]:
    file_start = int(os.path.basename(path))
    records = 0
    with mapped(path) as buffer:
        for step in walk_commitlog(buffer, path, file_start):
            line: Line = {"position": step.position, "physical_offset": file_start + step.position}
            if step.kind == "record":
                assert step.record is not None
                records += 1
                line.update(_record_fields(step.record, print_data))
            elif step.kind == "blank":
                line.update(magic="blank", size=step.size)
            elif step.kind == "corrupt":
                line.update(_claimed_fields(buffer, step.position))
                line["corrupt"] = step.reason
            else:
                line.update(end="zeros" if step.position < len(buffer) else "end of file")
                line["records"] = records
            yield line


def _record_fields(record: Record, print_data: bool) -> Line:
    body_len = -1 if record.body is None else len(record.body)
    line: Line = {
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "born_ts_ms": record.born_ts_ms,
        "store_ts_ms": record.store_ts_ms,
        "flags": record.flags,
        "tag": record.tag,
        "keys": list(record.keys),
        "properties": len(record.properties),
        "body_len": body_len,
        "checksum": "valid",
    }
    if print_data:
        line["properties"] = [{"key": k, "value": v} for k, v in record.properties]
        line["body"] = None if record.body is None else bytes(record.body)
    return line


def _claimed_fields(buffer: Any, position: int) -> Line:
    """What the header of a corrupt record claims, when there is a whole header."""
    if position + HEADER_SIZE > len(buffer):
        return {}
    fields = HEADER.unpack_from(buffer, position)
    total_size, magic, _, queue_offset, physical_offset, _, store_ts_ms, queue_id = fields[:8]
    if magic not in (MESSAGE_MAGIC, BLANK_MAGIC):
        return {"magic": f"0x{magic:08x}"}
    return {
        "size": total_size,
        "queue_id": queue_id,
        "queue_offset": queue_offset,
        "claimed_physical_offset": physical_offset,
        "store_ts_ms": store_ts_ms,
    }


# ---------------------------------------------------------------- ConsumeQueue


def _dump_units(path: str, print_data: bool) -> Iterator[Line]:
    data = read_bytes(path, 0, os.path.getsize(path))
    if len(data) % UNIT_SIZE_BYTES:
        yield {"position": 0, "corrupt": f"size {len(data)} is not a multiple of 20"}
        return
    units = np.frombuffer(data, dtype=UNIT)
    first_offset = int(os.path.basename(path)) // UNIT_SIZE_BYTES
    times = companion_times(path + TIME_FILE_SUFFIX, len(units))
    for index in np.flatnonzero(units["size"] != 0).tolist():
        unit = units[index]
        line: Line = {
            "queue_offset": first_offset + index,
            "position": index * UNIT_SIZE_BYTES,
            "commitlog_offset": int(unit["commitlog_offset"]),
            "size": int(unit["size"]),
            "tag_hash": int(unit["tag_hash"]),
        }
        if times is not None:
            line["timestamp_ms"] = int(times[index])
        yield line
    yield {"units_per_file": len(units), "written_units": int(np.count_nonzero(units["size"]))}


def _dump_shared(path: str, print_data: bool) -> Iterator[Line]:
    """A topic's shared unit log (consumequeue/format.py): 40-byte records, each a
    unit of one queue with its queue id, queue offset and time."""
    data = read_bytes(path, 0, os.path.getsize(path))
    if len(data) % SHARED_RECORD_SIZE_BYTES:
        yield {"position": 0, "corrupt": f"size {len(data)} is not a multiple of 40"}
        return
    records = np.frombuffer(data, dtype=SHARED_RECORD)
    for index in np.flatnonzero(records["size"] != 0).tolist():
        record = records[index]
        yield {
            "position": index * SHARED_RECORD_SIZE_BYTES,
            "queue_id": int(record["queue_id"]),
            "queue_offset": int(record["queue_offset"]),
            "commitlog_offset": int(record["commitlog_offset"]),
            "size": int(record["size"]),
            "tag_hash": int(record["tag_hash"]),
            "timestamp_ms": int(record["timestamp_ms"]),
        }
    yield {"records_per_file": len(records), "written": int(np.count_nonzero(records["size"]))}


def _dump_shared_ends(path: str, print_data: bool) -> Iterator[Line]:
    """The next offsets a topic's shared log remembers for queues without records."""
    data = read_bytes(path, 0, os.path.getsize(path))
    if len(data) < SHARED_ENDS_HEADER.size:
        yield {"position": 0, "corrupt": f"{len(data)} bytes: shorter than the header"}
        return
    magic, count, crc = SHARED_ENDS_HEADER.unpack_from(data)
    entries = data[SHARED_ENDS_HEADER.size :]
    if magic != SHARED_ENDS_MAGIC or len(entries) != count * SHARED_END.itemsize:
        yield {"position": 0, "corrupt": f"bad header (magic {magic:#x}, count {count})"}
        return
    if zlib.crc32(entries) != crc:
        yield {"position": SHARED_ENDS_HEADER.size, "corrupt": "crc32 of the entries mismatch"}
        return
    for entry in np.frombuffer(entries, dtype=SHARED_END):
        yield {"queue_id": int(entry["queue_id"]), "next_offset": int(entry["next_offset"])}


def companion_times(time_path: str, units_per_file: int) -> np.ndarray | None:
    if not os.path.exists(time_path):
        return None
    raw = read_bytes(time_path, TIME_HEADER_SIZE_BYTES, units_per_file * TIMESTAMP.itemsize)
    if len(raw) != units_per_file * TIMESTAMP.itemsize:
        return None
    return np.frombuffer(raw, dtype=TIMESTAMP)


def time_header(path: str) -> tuple[np.ndarray, Line]:
    header = np.frombuffer(read_bytes(path, 0, TIME_HEADER_SIZE_BYTES), dtype=TIME_HEADER)
    if len(header) != 1:
        raise CorruptDataError(path, 0, "time file header cut off")
    names = TIME_HEADER.names or ()
    fields: Line = {name: int(header[name][0]) for name in names if name != "reserved"}
    fields["magic"] = f"0x{fields['magic']:08x}"
    return header, fields


def _dump_times(path: str, print_data: bool) -> Iterator[Line]:
    try:
        header, fields = time_header(path)
        units_per_file = int(header["units_per_file"][0])
        interval = int(header["time_index_interval_units"][0])
        check_time_header(path, header, units_per_file, interval)
    except CorruptDataError as error:
        yield {"position": error.position, "corrupt": error.reason}
        return
    yield {"position": 0, **fields}
    blocks = blocks_per_file(units_per_file, interval)
    block_position = block_max_position_bytes(units_per_file)
    maxima = np.frombuffer(read_bytes(path, block_position, blocks * 8), dtype=TIMESTAMP)
    for block, maximum in enumerate(maxima.tolist()):
        if maximum:
            yield {
                "block": block,
                "position": block_position + block * 8,
                "units": f"[{block * interval}, {min((block + 1) * interval, units_per_file)})",
                "max_timestamp_ms": maximum,
            }
    if print_data:
        times = companion_times(path, units_per_file)
        assert times is not None
        for unit, stamp in enumerate(times.tolist()):
            if stamp:
                position = TIME_HEADER_SIZE_BYTES + unit * TIMESTAMP.itemsize
                yield {"unit": unit, "position": position, "timestamp_ms": stamp}


# ---------------------------------------------------------------- IndexFile and checkpoint


def dump_index(path: str, print_data: bool) -> Iterator[Line]:
    head = read_bytes(path, 0, ix.FILE_HEADER_SIZE)
    if len(head) < ix.FILE_HEADER_SIZE:
        yield {"position": 0, "corrupt": "header cut off"}
        return
    magic, version = ix.PREFIX.unpack_from(head, 0)
    if magic != ix.INDEX_MAGIC or version != ix.FORMAT_VERSION:
        yield {"position": 0, "corrupt": f"bad magic 0x{magic:08x} or version {version}"}
        return
    header = ix.IndexHeader.unpack_from(head)
    yield {"position": ix.HEADER_POSITION, **attrs.asdict(header)}
    entry_count = ix.entry_count_for_size(max(header.slot_count, 1), os.path.getsize(path))
    if header.slot_count < 1 or entry_count is None:
        yield {"position": ix.HEADER_POSITION, "corrupt": "slot count does not fit the file size"}
        return
    if not 0 <= header.index_count <= ix.entry_capacity(entry_count):
        yield {"position": ix.INDEX_COUNT_POSITION, "corrupt": "index count past the capacity"}
        return
    base = ix.entries_position(header.slot_count)
    raw = read_bytes(path, base + ix.ENTRY_SIZE, header.index_count * ix.ENTRY_SIZE)
    entries = np.frombuffer(raw, dtype=ix.ENTRY_DTYPE)
    for number, entry in enumerate(entries.tolist(), start=1):
        key_hash, physical_offset, time_delta_s, prev = entry
        yield {
            "entry": number,
            "position": base + number * ix.ENTRY_SIZE,
            "key_hash": key_hash,
            "slot": key_hash % header.slot_count,
            "physical_offset": physical_offset,
            "time_delta_s": time_delta_s,
            "timestamp_ms": header.begin_ts_ms + time_delta_s * ix.TIME_GRANULARITY_MS,
            "prev": prev,
        }
    if print_data:
        slots = np.frombuffer(
            read_bytes(path, ix.SLOTS_POSITION, header.slot_count * ix.SLOT_SIZE), ix.SLOT_DTYPE
        )
        for slot in np.flatnonzero(slots).tolist():
            position = ix.SLOTS_POSITION + slot * ix.SLOT_SIZE
            yield {"slot": slot, "position": position, "newest_entry": int(slots[slot])}


def _dump_checkpoint(path: str, print_data: bool) -> Iterator[Line]:
    raw = read_bytes(path, 0, 2 * ckpt.SLOT_SIZE)
    for slot in range(2):
        position = slot * ckpt.SLOT_SIZE
        data = raw[position : position + ckpt.SLOT_SIZE]
        if len(data) < ckpt.SLOT_SIZE or not any(data):
            yield {"slot": slot, "position": position, "state": "empty"}
            continue
        fields = ckpt.SLOT.unpack(data)
        magic, version, _, sequence, flushed, dispatched, flushed_ts, dispatched_ts = fields[:8]
        written_at_ms, check = fields[8:]
        valid = (
            magic == ckpt.CHECKPOINT_MAGIC
            and version == ckpt.CHECKPOINT_VERSION
            and xxhash.xxh3_64_intdigest(data[: ckpt.CHECKSUMMED]) == check
        )
        yield {
            "slot": slot,
            "position": position,
            # An invalid slot is a torn write the loader skips, not lost data.
            "state": "valid" if valid else "invalid (ignored on load)",
            "sequence": sequence,
            "flushed_position": flushed,
            "dispatched_position": dispatched,
            "flushed_ts_ms": flushed_ts,
            "dispatched_ts_ms": dispatched_ts,
            "written_at_ms": written_at_ms,
        }
