"""The columnar read of a run of records: ``read_columns`` and ``slices``.

Both are in C (commitlog/_columns.c) when the module is built; the pure-Python twins
here are the fallback and the reference the tests compare the C with (same results,
same bytes, same verdicts).

``read_columns(buffer, file_start, physicals, sizes, topic, queue_id,
first_queue_offset, key_name, verify_checksums, out) -> (bad, reason, bodies, keys,
extras)`` reads the records that ConsumeQueue units point at inside one CommitLog file
(``buffer``, starting at physical ``file_start``; unit i is ``physicals[i]``,
``sizes[i]``, int64 arrays). Each record is verified exactly as
``record.decode_run`` verifies it, in the same order, and the first that fails stops
the read with its reason:

====================  =======================================================
COLUMNS_OUTSIDE       the unit points outside the file
COLUMNS_MISMATCH      a header field is not the unit's: magic, size, physical
                      offset, queue offset (``first_queue_offset + i``), queue
                      id, topic length, flags, or section lengths that do not
                      add up to the size
COLUMNS_CHECKSUM      the record runs past the file, or (``verify_checksums``)
                      its XXH64 checksum does not match
COLUMNS_TOPIC         the topic bytes are not ``topic``
COLUMNS_TAG           the tag is not UTF-8
COLUMNS_PROPERTIES    the properties section does not parse as
                      ``record.decode_properties`` reads it (UTF-8 names
                      included): one check more than decode_run, since the key
                      column comes out of it
COLUMNS_CHANGED       C only: a record changed between the check and the copy
                      (the mapping is shared with the writer's process)
====================  =======================================================

Then it gathers the run into ``out`` (int64, ``OUT_ROWS`` rows of a width > n; the
rows are named by ``OUT_*``) and three new bytes objects, in Arrow's layout (row i of
a variable column is ``data[offsets[i]:offsets[i + 1]]``)::

    OUT_BORN_TS        born_ts_ms
    OUT_STORE_TS       store_ts_ms
    OUT_FLAGS          flags (FLAG_NULL_BODY: a null body)
    OUT_TAG_LEN        tag bytes          } how to cut a row of extras
    OUT_KEYS_LEN       keys bytes         }
    OUT_HAS_KEY        1 when a property is named ``key_name``
    OUT_BODY_OFFSETS   n + 1 offsets into bodies (a null body is empty)
    OUT_KEY_OFFSETS    n + 1 offsets into keys: the value of the first property
                       named ``key_name`` (empty where there is none)
    OUT_EXTRA_OFFSETS  n + 1 offsets into extras: each record's tag | keys |
                       properties sections, as stored

It returns ``(-1, COLUMNS_OK, bodies, keys, extras)``, or ``(i, COLUMNS_*, None, None,
None)`` for the first bad record i (``out`` is then unspecified). A wrong argument
(arrays of different lengths, a short ``out``, offsets that could wrap) is a
ValueError, a wrong type a TypeError.

``slices(data, offsets, valid, views) -> list`` cuts ``data`` (bytes) at ``offsets``
(int64, n + 1, non-decreasing inside data): item i is a bytes copy, or with ``views``
a read-only memoryview of ``data``, or None where ``valid`` (uint8 or None) is 0.

``rows(cls, batch, view, offsets, valid) -> list`` makes the rows of a batch: row i
is a ``cls`` (``Row``, or a subclass of it with ``__slots__ = ()``: what
mqstore.message.Message is) holding ``batch``, ``i``, and its body's place in
``view`` (a 1-D memoryview, cut as ``slices`` cuts); ``row.body`` is then
``view[offsets[i]:offsets[i + 1]]``, made when read, or None where ``valid`` is 0.
Rows are read-only. The C rows are also out of the cyclic GC: nothing can set their
fields again, so no cycle can pass through one (as long as ``batch`` never comes to
hold its rows), and the collector then never walks the rows a consumer holds. The
pure-Python rows are ordinary objects.

``tuples(cls, columns[, shared_empty]) -> list`` makes row i the ``cls`` (tuple, or a
subclass that ``tuple.__new__`` takes: a NamedTuple) of ``(columns[0][i],
columns[1][i], ...)``, as ``tuple.__new__(cls, row)`` would, without the row tuple:
``columns`` is a tuple of lists of one length (their number is not checked against the
NamedTuple's fields, as tuple.__new__ does not check it). In C, a row of a class
without an instance dict whose items can never join a reference cycle leaves the
cyclic GC too (objects of types without GC support such as int, str, bytes, None;
exact tuples CPython untracked; ``shared_empty``, a read-only empty list subclass
instance, while it is empty and untracked: CPython's own rule for untracking exact
tuples, which it never applies to subclasses): a consumer holding a poll's records
then costs the collector nothing (issue 15: collections were half of
``KafkaConsumer.poll``). An item merely untracked now (a dict of atomic values, which
takes a container later) keeps its row tracked, and so does ``shared_empty`` found
changed (``list.append`` called on it directly), which goes back under the collector.

``untracked_empty_list(obj) -> obj`` takes an empty instance of a list subclass
without an instance dict or slots of its own out of the cyclic GC (C; the twin returns
it as it is), for one read-only empty list many rows share (mqstore.engine.NO_HEADERS,
the ``shared_empty`` of the records' rows). Anything else is a TypeError.

``untracked_int_array(obj) -> obj`` takes an instance of an ``array.array`` subclass
without an instance dict, whose slots hold only ints, out of the cyclic GC (C; the
twin returns it as it is): such an object cannot be part of a cycle, and 100,000 of
them (the shared unit log's runs, one per queue) made every full collection walk
them (issue 15). Anything else is a TypeError.
"""

from __future__ import annotations

import struct
from array import array
from types import MemberDescriptorType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from mqstore.commitlog.native import NATIVE, check_layout
from mqstore.commitlog.record import (
    FLAG_NULL_BODY,
    FLAGS_KNOWN,
    HASHED_FROM,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    checksum,
)

__all__ = [
    "COLUMNS_OK",
    "COLUMNS_OUTSIDE",
    "COLUMNS_MISMATCH",
    "COLUMNS_CHECKSUM",
    "COLUMNS_TOPIC",
    "COLUMNS_TAG",
    "COLUMNS_PROPERTIES",
    "COLUMNS_CHANGED",
    "OUT_BORN_TS",
    "OUT_STORE_TS",
    "OUT_FLAGS",
    "OUT_TAG_LEN",
    "OUT_KEYS_LEN",
    "OUT_HAS_KEY",
    "OUT_BODY_OFFSETS",
    "OUT_KEY_OFFSETS",
    "OUT_EXTRA_OFFSETS",
    "OUT_ROWS",
    "Row",
    "RowPy",
    "read_columns",
    "read_columns_py",
    "rows",
    "rows_py",
    "slices",
    "slices_py",
    "tuples",
    "tuples_py",
    "untracked_empty_list",
    "untracked_empty_list_py",
    "untracked_int_array",
    "untracked_int_array_py",
]

#: Why read_columns stopped (the C enum COLUMNS_* in commitlog/_native.h).
COLUMNS_OK: Final = 0
COLUMNS_OUTSIDE: Final = 1
COLUMNS_MISMATCH: Final = 2
COLUMNS_CHECKSUM: Final = 3
COLUMNS_TOPIC: Final = 4
COLUMNS_TAG: Final = 5
COLUMNS_PROPERTIES: Final = 6
COLUMNS_CHANGED: Final = 7

#: The rows of read_columns' ``out`` (the C enum OUT_*).
OUT_BORN_TS: Final = 0
OUT_STORE_TS: Final = 1
OUT_FLAGS: Final = 2
OUT_TAG_LEN: Final = 3
OUT_KEYS_LEN: Final = 4
OUT_HAS_KEY: Final = 5
OUT_BODY_OFFSETS: Final = 6
OUT_KEY_OFFSETS: Final = 7
OUT_EXTRA_OFFSETS: Final = 8
OUT_ROWS: Final = 9
#: The rows of one value per record, in the order _check_record returns them.
_FIXED_ROWS: Final = (OUT_BORN_TS, OUT_STORE_TS, OUT_FLAGS, OUT_TAG_LEN, OUT_KEYS_LEN, OUT_HAS_KEY)

_PROPERTY_KEY_LEN: Final = struct.Struct("<H")  # as record.encode_properties writes them
_PROPERTY_VALUE_LEN: Final = struct.Struct("<I")
_INT64_MAX: Final = (1 << 63) - 1
_RUN_ROWS_MAX: Final = (1 << 31) - 1  # bounds every offset sum: 2**31 lengths < 2**32 each


def _find_property(props: memoryview, name: bytes) -> tuple[int, int] | None:
    """(value position, value length) of the first property named ``name``, or None.

    Raises:
        ValueError: the section does not parse (UnicodeDecodeError is one).
    """
    at, end, found = 0, len(props), None
    while at < end:
        if end - at < _PROPERTY_KEY_LEN.size:
            raise ValueError("property key length cut off")
        (key_len,) = _PROPERTY_KEY_LEN.unpack_from(props, at)
        at += _PROPERTY_KEY_LEN.size
        if end - at < key_len:
            raise ValueError("property key cut off")
        key = bytes(props[at : at + key_len])
        key.decode("utf-8")
        at += key_len
        if end - at < _PROPERTY_VALUE_LEN.size:
            raise ValueError("property value length cut off")
        (value_len,) = _PROPERTY_VALUE_LEN.unpack_from(props, at)
        at += _PROPERTY_VALUE_LEN.size
        if end - at < value_len:
            raise ValueError("property value cut off")
        if found is None and key == name:
            found = (at, value_len)
        at += value_len
    return found


def _check_record(
    view: memoryview,
    file_start: int,
    physical: int,
    size: int,
    queue_offset: int,
    topic: bytes,
    queue_id: int,
    key_name: bytes,
    verify: bool,
) -> tuple[int, tuple[Any, ...]]:
    """``check_record`` of the C file: (COLUMNS_OK, the row's fields) or (why, ())."""
    position = physical - file_start
    if physical < file_start or size < HEADER_SIZE or position > len(view) - HEADER_SIZE:
        return COLUMNS_OUTSIDE, ()
    (total, magic, stored, record_queue_offset, record_physical, born, store_ts,
     record_queue_id, flags, body_len, props_len, keys_len, topic_len,
     tag_len) = HEADER.unpack_from(view, position)  # fmt: skip
    if (
        magic != MESSAGE_MAGIC
        or total != size
        or record_physical != physical
        or record_queue_offset != queue_offset
        or record_queue_id != queue_id
        or topic_len != len(topic)
        or flags & ~FLAGS_KNOWN
        or HEADER_SIZE + topic_len + tag_len + keys_len + props_len + body_len != total
    ):
        return COLUMNS_MISMATCH, ()
    end = position + total
    if end > len(view):
        return COLUMNS_CHECKSUM, ()
    if verify and checksum(view[position + HASHED_FROM : end], total, magic) != stored:
        return COLUMNS_CHECKSUM, ()
    extra_at = position + HEADER_SIZE + topic_len
    if view[position + HEADER_SIZE : extra_at] != topic:
        return COLUMNS_TOPIC, ()
    try:
        str(view[extra_at : extra_at + tag_len], "utf-8")
    except UnicodeDecodeError:
        return COLUMNS_TAG, ()
    props_at = extra_at + tag_len + keys_len
    try:
        key = _find_property(view[props_at : props_at + props_len], key_name)
    except ValueError:
        return COLUMNS_PROPERTIES, ()
    body_at = props_at + props_len
    body = b"" if flags & FLAG_NULL_BODY else bytes(view[body_at:end])
    key_bytes = b"" if key is None else bytes(view[props_at + key[0] : props_at + sum(key)])
    fields = (born, store_ts, flags, tag_len, keys_len, int(key is not None))  # _FIXED_ROWS
    return COLUMNS_OK, (fields, body, key_bytes, bytes(view[extra_at:body_at]))


def read_columns_py(
    buffer: Any,
    file_start: int,
    physicals: Any,
    sizes: Any,
    topic: bytes,
    queue_id: int,
    first_queue_offset: int,
    key_name: bytes,
    verify_checksums: bool,
    out: Any,
) -> tuple[int, int, bytes | None, bytes | None, bytes | None]:
    """The pure-Python ``read_columns`` (see the module docstring)."""
    view = memoryview(buffer)
    count = len(physicals)
    flat = out.reshape(-1)  # C takes any contiguous int64 buffer of OUT_ROWS rows
    width = flat.size // OUT_ROWS
    if len(sizes) != count:
        raise ValueError("physicals and sizes differ in length")
    if count > _RUN_ROWS_MAX:
        raise ValueError("a run holds at most 2**31 - 1 records")
    if flat.size % OUT_ROWS or width <= count:
        raise ValueError("out must be int64 of OUT_ROWS rows, each longer than the run")
    table = flat.reshape(OUT_ROWS, width)
    if file_start < 0:
        raise ValueError("file_start must be >= 0")
    if not 0 <= first_queue_offset <= _INT64_MAX - count:
        raise ValueError("first_queue_offset out of range")
    if not -(1 << 31) <= queue_id < 1 << 31:
        raise ValueError("queue_id out of range")
    parts: tuple[list[bytes], list[bytes], list[bytes]] = ([], [], [])
    offsets = [table[OUT_BODY_OFFSETS], table[OUT_KEY_OFFSETS], table[OUT_EXTRA_OFFSETS]]
    for column in offsets:
        column[0] = 0
    units = zip(physicals.tolist(), sizes.tolist(), strict=True)
    for index, (physical, size) in enumerate(units):
        why, row = _check_record(view, file_start, physical, size, first_queue_offset + index,
                                 topic, queue_id, key_name, bool(verify_checksums))  # fmt: skip
        if why != COLUMNS_OK:
            return index, why, None, None, None
        fields, *data = row
        for column, value in zip(_FIXED_ROWS, fields, strict=True):
            table[column, index] = value
        for column, piece in enumerate(data):
            parts[column].append(piece)
            offsets[column][index + 1] = offsets[column][index] + len(piece)
    bodies, keys, extras = (b"".join(part) for part in parts)
    return -1, COLUMNS_OK, bodies, keys, extras


def slices_py(data: bytes, offsets: Any, valid: Any, views: bool) -> list[Any]:
    """The pure-Python ``slices`` (see the module docstring)."""
    if type(data) is not bytes:
        raise TypeError("slices: data must be bytes")
    bounds = offsets.tolist()
    count = len(bounds) - 1
    if count < 0 or (valid is not None and len(valid) < count):
        raise ValueError("slices: offsets must hold n + 1 values, valid n")
    if any(not 0 <= bounds[i] <= bounds[i + 1] <= len(data) for i in range(count)):
        raise ValueError("slices: offsets must be non-decreasing and inside data")
    source = memoryview(data) if views else data
    keep = [1] * count if valid is None else valid.tolist()
    return [source[bounds[i] : bounds[i + 1]] if keep[i] else None for i in range(count)]


class RowPy:
    """The pure-Python ``Row``: a row of a batch (see the module docstring)."""

    __slots__ = ("_batch", "_end", "_row", "_start", "_view")
    _batch: Any
    _row: int
    _view: memoryview | None
    _start: int
    _end: int

    @property
    def body(self) -> memoryview | None:
        """The body: a read-only view into the batch's bodies, or None."""
        return None if self._view is None else self._view[self._start : self._end]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} objects are read-only")


def rows_py(cls: type[RowPy], batch: Any, view: memoryview, offsets: Any, valid: Any) -> list[Any]:
    """The pure-Python ``rows`` (see the module docstring)."""
    plain = (
        isinstance(cls, type)
        and issubclass(cls, RowPy)
        and cls.__basicsize__ == RowPy.__basicsize__
        and not (cls.__itemsize__ or cls.__dictoffset__ or cls.__weakrefoffset__)
    )
    if not plain:
        raise TypeError("rows: cls must be Row or a subclass with __slots__ = ()")
    if not isinstance(view, memoryview) or view.ndim != 1:
        raise TypeError("rows: view must be a 1-D memoryview")
    bounds = offsets.tolist()
    count = len(bounds) - 1
    ordered = all(0 <= bounds[i] <= bounds[i + 1] for i in range(count))
    if count < 0 or (valid is not None and len(valid) < count) or not ordered:
        raise ValueError("rows: offsets must be n + 1 non-decreasing values inside view, valid n")
    if bounds[count] > len(view):
        raise ValueError("rows: offsets must be n + 1 non-decreasing values inside view, valid n")
    keep = [1] * count if valid is None else valid.tolist()
    made = []
    for index in range(count):
        row = object.__new__(cls)
        for name, value in (
            ("_batch", batch),
            ("_row", index),
            ("_start", bounds[index]),
            ("_end", bounds[index + 1]),
            ("_view", view if keep[index] else None),
        ):
            object.__setattr__(row, name, value)
        made.append(row)
    return made


def tuples_py(
    cls: type[tuple[Any, ...]], columns: tuple[list[Any], ...], shared_empty: Any = None
) -> list[Any]:
    """The pure-Python ``tuples`` (see the module docstring; Python cannot untrack)."""
    if type(columns) is not tuple:
        raise TypeError("tuples: columns must be a tuple of lists")
    if shared_empty is not None and (
        not isinstance(shared_empty, list) or type(shared_empty) is list
    ):
        raise TypeError("tuples: shared_empty must be a list subclass instance")
    tuple.__new__(cls, ())  # CPython's rule for cls (a TypeError when it refuses)
    if any(type(column) is not list for column in columns):
        raise TypeError("tuples: every column must be a list")
    if len({len(column) for column in columns}) > 1:
        raise ValueError("tuples: the columns differ in length")
    return [tuple.__new__(cls, row) for row in zip(*columns, strict=True)]


def untracked_empty_list_py(obj: list[Any]) -> list[Any]:
    """The pure-Python ``untracked_empty_list``: the same checks; Python cannot untrack."""
    kind = type(obj)
    if (
        not isinstance(obj, list)
        or kind is list
        or obj
        or hasattr(obj, "__dict__")
        or kind.__basicsize__ != list.__basicsize__
    ):
        raise TypeError(
            "untracked_empty_list: not an empty instance of a list subclass without an "
            "instance dict or slots"
        )
    return obj


_IntArray = TypeVar("_IntArray", bound="array[int]")


def untracked_int_array_py(obj: _IntArray) -> _IntArray:
    """The pure-Python ``untracked_int_array``: the same checks; Python cannot untrack."""
    kind = type(obj)
    ok = isinstance(obj, array) and kind is not array and not hasattr(obj, "__dict__")
    for cls in kind.__mro__ if ok else ():
        if cls is array:
            break
        for member in cls.__dict__.values():  # the slots, as C walks tp_members
            if isinstance(member, MemberDescriptorType):
                try:
                    value = member.__get__(obj, cls)
                except AttributeError:  # unset
                    continue
                if type(value) is not int:
                    ok = False
    if not ok:
        raise TypeError(
            "untracked_int_array: not an array.array subclass instance without a dict "
            "whose slots hold only ints"
        )
    return obj


#: The constants commitlog/_native.h keeps a copy of, checked at import.
LAYOUT: Final = {
    name: value
    for name, value in globals().items()
    if name.startswith(("COLUMNS_", "OUT_")) and isinstance(value, int)
}
assert len(LAYOUT) == 18

if NATIVE is not None:
    check_layout(NATIVE, LAYOUT, "commitlog/columns.py")

if TYPE_CHECKING:
    Row = RowPy  # what mypy checks subclasses against; the C Row has the same surface
elif NATIVE is None:
    Row = RowPy
else:
    Row = NATIVE.Row

if NATIVE is None:
    read_columns = read_columns_py
    slices = slices_py
    rows = rows_py
    tuples = tuples_py
    untracked_empty_list = untracked_empty_list_py
    untracked_int_array = untracked_int_array_py
else:
    read_columns = NATIVE.read_columns
    slices = NATIVE.slices
    rows = NATIVE.rows
    tuples = NATIVE.tuples
    untracked_empty_list = NATIVE.untracked_empty_list
    untracked_int_array = NATIVE.untracked_int_array
