"""The ConsumeQueue on-disk format, declared once.

A queue lives in ``<consumequeue dir>/<topic>/<queue_id>/``. Its logical byte space
holds one 20-byte unit per queue offset: offset ``n`` lives at byte ``n * 20``. The
space is cut into unit files of ``units_per_file`` units, each named by the 20-digit,
zero-padded byte offset of its first unit (as RocketMQ; the padding makes ``ls`` sort
numerically). Beside every unit file sits a companion time file (suffix ``.time``)
holding the per-unit timestamps and a sparse block-max time index, so a time look-up
never reads the CommitLog::

    unit file "00000000000006000000"  (units_per_file * 20 bytes, no header)
    +--------------------+-----------+--------------------+
    | commitlog_offset 8 | size 4    | tag_hash 8         |  unit 0 (queue offset k*upf)
    +--------------------+-----------+--------------------+
    | ...                                                 |  unit i at byte i * 20
    +-----------------------------------------------------+

    time file "00000000000006000000.time"
    +-------------------------------------------------------------+
    | header (32 bytes, TIME_HEADER)                              |
    |   magic u32 | version u16 | header_size u16                 |
    |   units_per_file u32 | time_index_interval_units u32        |
    |   first_unit_in_file u32 | reserved u32 x 3                 |
    +-------------------------------------------------------------+
    | timestamp_ms i64 x units_per_file   (unit i at 32 + i * 8)  |
    +-------------------------------------------------------------+
    | block_max_ms i64 x blocks_per_file  (block j at ... + j * 8)|
    +-------------------------------------------------------------+

Shared unit log (issue 15): a queue's first units do not get files of their own. They
go, with every other young queue's of the topic, into the topic's shared log, one
40-byte record per unit, in dispatch order (so commitlog offsets strictly increase
along the log); a queue "graduates" to its own files once it holds
``shared_units_max`` units there, its first own file beginning at the next offset::

    <topic dir>/.shared/00000000000041943040   (records_per_file * 40 bytes, sparse)
    +--------------------+--------+-------------+----------+--------------+----------+
    | commitlog_offset 8 | size 4 | tag_hash 8  | queue_id | queue_offset | time_ms 8|
    |                    |        |             | 4        | 8            |          |
    +--------------------+--------+-------------+----------+--------------+----------+
      the 20-byte unit, verbatim                  record i at byte i * 40 of the log

A shared file is named by the log byte position of its first record; it is created at
its full size under a temporary name and renamed into place. A record is written iff
its ``size`` is non-zero; a zero size past the written end is free space, before it a
unit truncated by hand (a tombstone, which keeps its commitlog offset).

Beside the shared files, ``ends`` remembers the next offset of every queue whose
records retention deleted entirely and that has no own file (the log alone would
forget it, and the queue would restart at 0 on reopen). It is rewritten atomically
(temporary name, fsync, rename, directory fsync) before the files are deleted::

    <topic dir>/.shared/ends
    +-------------------------------------------------------------+
    | header (12 bytes, SHARED_ENDS_HEADER)                       |
    |   magic u32 | count u32 | crc32 of the entries u32          |
    +-------------------------------------------------------------+
    | queue_id i32 | next_offset i64     (count entries, SHARED_END) |
    +-------------------------------------------------------------+

All integers are little-endian. A unit is written iff its ``size`` field is non-zero
(sizes are always > 0); an all-zero unit reads as "not written". Block ``j`` of a file
covers its units ``[j * N, min((j + 1) * N, units_per_file))`` with ``N =
time_index_interval_units``; its entry is the largest timestamp among the written
units of that block (0 while none is written; timestamps are >= 0). The entries are
local maxima, not a running maximum: the running maximum is computed in memory, from
the queue's minimum offset on, so retention never leaves stale maxima in it.

``first_unit_in_file`` is non-zero only in the first file of a queue whose first unit
was not at a file boundary (after retention the log may begin at offset N): units
below it are unwritten by design, not lost.

Crash policy: files are built under a temporary name (suffix ``.allocating``) at their
full size and renamed into place, the time file before its unit file, so a unit file
never exists without its time file and never at a short size. Inside a unit the size
field is written last, so a reader that sees a non-zero size sees the whole unit,
its timestamp and its block maximum.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

from mqstore.commitlog.errors import CorruptDataError

__all__ = [
    "UNIT",
    "UNIT_SIZE_BYTES",
    "TIMESTAMP",
    "TIMESTAMP_SIZE_BYTES",
    "SHARED_DIRECTORY",
    "SHARED_END",
    "SHARED_ENDS_FILE",
    "SHARED_ENDS_HEADER",
    "SHARED_ENDS_MAGIC",
    "SHARED_RECORD",
    "SHARED_RECORD_SIZE_BYTES",
    "SHARED_UNIT_VIEW",
    "TIME_HEADER",
    "TIME_HEADER_SIZE_BYTES",
    "TIME_HEADER_STRUCT",
    "TIME_FILE_MAGIC",
    "TIME_FILE_VERSION",
    "TIME_FILE_SUFFIX",
    "TEMP_SUFFIX",
    "FILE_NAME_DIGITS",
    "unit_file_name",
    "time_file_name",
    "parse_unit_file_name",
    "unit_file_size_bytes",
    "blocks_per_file",
    "time_file_size_bytes",
    "times_position_bytes",
    "block_max_position_bytes",
    "encode_time_header",
    "check_time_header",
]

UNIT: Final = np.dtype(
    [
        ("commitlog_offset", "<i8"),  # physical offset of the record in the CommitLog
        ("size", "<i4"),  # record size in bytes; 0 means "unit not written"
        ("tag_hash", "<i8"),  # hash of the record's tag, for server-side filtering
    ]
)
assert UNIT.itemsize == 20  # packed: RocketMQ's 20-byte CQ unit
assert UNIT.fields is not None
assert UNIT.fields["size"][1] == 8
assert UNIT.fields["tag_hash"][1] == 12
UNIT_SIZE_BYTES: Final = UNIT.itemsize

SHARED_RECORD: Final = np.dtype(
    [
        ("commitlog_offset", "<i8"),  # the unit's three fields, as in UNIT
        ("size", "<i4"),  # 0: free (past the written end) or truncated (a tombstone)
        ("tag_hash", "<i8"),
        ("queue_id", "<i4"),  # the queue of the topic this unit belongs to
        ("queue_offset", "<i8"),  # its offset in that queue
        ("timestamp_ms", "<i8"),  # its ConsumeQueue time (as in a time file)
    ]
)
assert SHARED_RECORD.itemsize == 40
SHARED_RECORD_SIZE_BYTES: Final = SHARED_RECORD.itemsize
# The unit inside a record: gathered units convert to UNIT field by field.
SHARED_UNIT_VIEW: Final = np.dtype(
    {
        "names": ["commitlog_offset", "size", "tag_hash"],
        "formats": ["<i8", "<i4", "<i8"],
        "offsets": [0, 8, 12],
        "itemsize": SHARED_RECORD_SIZE_BYTES,
    }
)
assert SHARED_RECORD.fields is not None and UNIT.fields is not None
assert UNIT.names is not None
assert all(SHARED_RECORD.fields[name][1] == UNIT.fields[name][1] for name in UNIT.names)
SHARED_DIRECTORY: Final = ".shared"  # under a topic's directory; never a queue id
SHARED_ENDS_FILE: Final = "ends"  # in SHARED_DIRECTORY; not 20 digits, never a log file
SHARED_ENDS_MAGIC: Final = 0x53444E45  # "ENDS" little-endian
SHARED_ENDS_HEADER: Final = struct.Struct("<III")  # magic, entry count, crc32 of entries
SHARED_END: Final = np.dtype(
    [
        ("queue_id", "<i4"),  # a queue of the topic without records or own files
        ("next_offset", "<i8"),  # its max offset when retention deleted its records
    ]
)
assert SHARED_END.itemsize == 12

TIMESTAMP: Final = np.dtype("<i8")  # milliseconds since the epoch, >= 0
TIMESTAMP_SIZE_BYTES: Final = TIMESTAMP.itemsize
assert TIMESTAMP_SIZE_BYTES == 8

TIME_HEADER: Final = np.dtype(
    [
        ("magic", "<u4"),  # TIME_FILE_MAGIC
        ("version", "<u2"),  # TIME_FILE_VERSION
        ("header_size", "<u2"),  # TIME_HEADER_SIZE_BYTES, so readers can skip a longer header
        ("units_per_file", "<u4"),  # must equal the configured units_per_file
        ("time_index_interval_units", "<u4"),  # N: units per block of the time index
        ("first_unit_in_file", "<u4"),  # first unit ever written here (0 but in a first file)
        ("reserved", "<u4", (3,)),  # zero; pads the header to 32 bytes (8-byte aligned)
    ]
)
TIME_HEADER_SIZE_BYTES: Final = TIME_HEADER.itemsize
assert TIME_HEADER_SIZE_BYTES == 32
# The same header as a struct, to encode one cheaply (a file is created per new queue).
TIME_HEADER_STRUCT: Final = struct.Struct("<IHHIII12x")
assert TIME_HEADER_STRUCT.size == TIME_HEADER_SIZE_BYTES

TIME_FILE_MAGIC: Final = 0x5154_4D43  # "CMTQ" read as little-endian bytes: b"CMTQ"
TIME_FILE_VERSION: Final = 1
TIME_FILE_SUFFIX: Final = ".time"
TEMP_SUFFIX: Final = ".allocating"  # a file being built; never read, removed at load
FILE_NAME_DIGITS: Final = 20  # zero-padded so that ls sorts files numerically
_FILE_NAME_FORMAT: Final = f"%0{FILE_NAME_DIGITS}d"


def unit_file_name(file_index: int, units_per_file: int) -> str:
    """Name of unit file ``file_index``: the byte offset of its first unit, 20 digits."""
    assert file_index >= 0
    assert units_per_file > 0
    return _FILE_NAME_FORMAT % (file_index * units_per_file * UNIT_SIZE_BYTES)


def time_file_name(unit_name: str) -> str:
    """Name of the time file that sits beside unit file ``unit_name``."""
    return unit_name + TIME_FILE_SUFFIX


def parse_unit_file_name(name: str, units_per_file: int, directory: str) -> int | None:
    """The file index a unit file name stands for, or None if ``name`` is not a unit file.

    Raises:
        CorruptDataError: a 20-digit name that is not a multiple of the file size (the
            files were written with another ``units_per_file``).
    """
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        return None
    start_bytes = int(name)
    file_size = unit_file_size_bytes(units_per_file)
    if start_bytes % file_size:
        raise CorruptDataError(
            f"{directory}/{name}",
            0,
            f"file name is not a multiple of {file_size} bytes (units_per_file={units_per_file})",
        )
    return start_bytes // file_size


def unit_file_size_bytes(units_per_file: int) -> int:
    return units_per_file * UNIT_SIZE_BYTES


def blocks_per_file(units_per_file: int, interval_units: int) -> int:
    """Blocks of the time index per file; the last one is short if N does not divide."""
    return -(-units_per_file // interval_units)


def times_position_bytes() -> int:
    """Byte position of the first timestamp in a time file."""
    return TIME_HEADER_SIZE_BYTES


def block_max_position_bytes(units_per_file: int) -> int:
    """Byte position of the first block maximum in a time file."""
    return TIME_HEADER_SIZE_BYTES + units_per_file * TIMESTAMP_SIZE_BYTES


def time_file_size_bytes(units_per_file: int, interval_units: int) -> int:
    blocks = blocks_per_file(units_per_file, interval_units)
    return block_max_position_bytes(units_per_file) + blocks * TIMESTAMP_SIZE_BYTES


def encode_time_header(units_per_file: int, interval_units: int, first_unit_in_file: int) -> bytes:
    """The 32 header bytes of a new time file."""
    assert 0 <= first_unit_in_file < units_per_file
    return TIME_HEADER_STRUCT.pack(
        TIME_FILE_MAGIC,
        TIME_FILE_VERSION,
        TIME_HEADER_SIZE_BYTES,
        units_per_file,
        interval_units,
        first_unit_in_file,
    )


def _field_position(name: str) -> int:
    assert TIME_HEADER.fields is not None
    position: int = TIME_HEADER.fields[name][1]
    return position


def check_time_header(
    path: str, header: np.ndarray, units_per_file: int, interval_units: int
) -> int:
    """Validate a time file's header (read from disk) against the configuration.

    Returns:
        The header's ``first_unit_in_file``.

    Raises:
        CorruptDataError: bad magic or version, or a file written with another
            ``units_per_file`` or ``time_index_interval_units``.
    """
    assert header.dtype == TIME_HEADER
    assert header.shape == (1,)
    expected = (
        ("magic", TIME_FILE_MAGIC),
        ("version", TIME_FILE_VERSION),
        ("header_size", TIME_HEADER_SIZE_BYTES),
        ("units_per_file", units_per_file),
        ("time_index_interval_units", interval_units),
    )
    for name, value in expected:
        found = int(header[name][0])
        if found != value:
            raise CorruptDataError(
                path, _field_position(name), f"time file {name} is {found:#x}, expected {value:#x}"
            )
    first_unit = int(header["first_unit_in_file"][0])
    if first_unit >= units_per_file:
        raise CorruptDataError(
            path,
            _field_position("first_unit_in_file"),
            f"first_unit_in_file {first_unit} >= units_per_file {units_per_file}",
        )
    return first_unit
