"""The columnar read (commitlog/columns.py): read_columns, slices, rows and tuples,
the C versions (commitlog/_columns.c) against their pure-Python twins (same results,
same bytes, same verdicts), and read_columns' verdicts against record.decode_run's.
The C-only cases skip where the C module did not build."""

from __future__ import annotations

import gc
import os
import struct
import weakref
from array import array
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog import columns, record
from mqstore.commitlog.errors import CorruptDataError
from mqstore.commitlog.native import NATIVE
from tests import strategies as s

native = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")

KEY_NAME = b"\x00key"  # mqstore.commitlog_engine.KEY_PROPERTY, as the store passes it
FILE_START = 1 << 20
QUEUE_ID = 3
FIRST_OFFSET = 40

#: A record to write: body (None: a tombstone), index keys, tag, properties (the Kafka
#: key property may be among them, anywhere, even twice), born timestamp.
_records = st.tuples(
    s.bodies | st.none(),
    s.keys,
    s.tags,
    st.lists(
        st.tuples(st.sampled_from(["\x00key", "h", "é"]) | st.text(max_size=8),
                  st.binary(max_size=40)),
        max_size=4,
    ),
    s.timestamps_ms,
)  # fmt: skip


def _write(topic: str, items: list, slack: int = 16) -> tuple[bytearray, np.ndarray, np.ndarray]:
    """The records of one queue one after another in a file starting at FILE_START;
    (buffer, physical offsets, sizes) as ConsumeQueue units would hold them."""
    encoded = []
    for body, keys, tag, props, born in items:
        tag_b, keys_b = record.encode_tag(tag), record.encode_keys(keys)
        props_b = record.encode_properties(props)
        body_b = b"" if body is None else body
        size = record.HEADER_SIZE + len(topic) + len(tag_b) + len(keys_b) + len(props_b)
        flags = record.FLAG_NULL_BODY if body is None else 0
        encoded.append((size + len(body_b), flags, tag_b, keys_b, props_b, body_b, born))
    buffer = bytearray(sum(item[0] for item in encoded) + slack)
    physicals = np.zeros(len(encoded), np.int64)
    written = record.encode_run_py(buffer, 0, len(buffer), FILE_START, FIRST_OFFSET, 7,
                                   QUEUE_ID, record.validate_topic(topic), encoded, 0,
                                   physicals)  # fmt: skip
    assert written == len(encoded)
    return buffer, physicals, np.array([item[0] for item in encoded], np.int64)


def _read(
    run: Any,
    buffer: Any,
    physicals: np.ndarray,
    sizes: np.ndarray,
    topic: bytes,
    queue_id: int = QUEUE_ID,
    first: int = FIRST_OFFSET,
    verify: bool = True,
) -> Any:
    """(result, out) of one read_columns (out only when it succeeded)."""  # fmt: skip
    out = np.full((columns.OUT_ROWS, len(physicals) + 1), -7, np.int64)
    result = run(bytes(buffer), FILE_START, physicals, sizes, topic, queue_id, first,
                 KEY_NAME, verify, out)  # fmt: skip
    return result, (out.tolist() if result[0] < 0 else None)


def _both(*args: Any, **kwargs: Any) -> Any:
    """read_columns in C and in Python; they must agree. The Python result."""
    py = _read(columns.read_columns_py, *args, **kwargs)
    if NATIVE is not None:
        assert _read(NATIVE.read_columns, *args, **kwargs) == py
    return py


def _decode_run_verdict(
    buffer: Any,
    physicals: np.ndarray,
    sizes: np.ndarray,
    topic: str,
    queue_id: int = QUEUE_ID,
    first: int = FIRST_OFFSET,
) -> int:
    """The position decode_run stops at, or -1 when it reads the whole run."""  # fmt: skip
    try:
        record.decode_run(bytes(buffer), "f", FILE_START, physicals, sizes, topic, queue_id,
                          first, record.Record)  # fmt: skip
    except CorruptDataError as error:
        return error.position
    return -1


@settings(max_examples=150)
@given(s.topics, st.lists(_records, min_size=1, max_size=6))
def test_read_columns_gathers_what_decode_shows(topic: str, items: list) -> None:
    """Intact runs: the columns hold exactly what each decoded record shows, in C and
    in Python alike."""
    buffer, physicals, sizes = _write(topic, items)
    (bad, reason, bodies, keys, extras), out = _both(buffer, physicals, sizes, topic.encode())
    assert (bad, reason) == (-1, columns.COLUMNS_OK)
    assert out is not None
    decoded = record.decode_run(bytes(buffer), "f", FILE_START, physicals, sizes, topic,
                                QUEUE_ID, FIRST_OFFSET, record.Record)  # fmt: skip
    expect_bodies, expect_keys, expect_extras = [], [], []
    for index, rec in enumerate(decoded):
        body = b"" if rec.body is None else bytes(rec.body)
        key = next((v for name, v in rec.properties if name == "\x00key"), None)
        tag = b"" if rec.tag is None else rec.tag.encode()
        fixed = [rec.born_ts_ms, rec.store_ts_ms, rec.flags, len(tag), len(rec.keys_raw),
                 int(key is not None)]  # fmt: skip
        assert [out[row][index] for row in range(6)] == fixed
        expect_bodies.append(body)
        expect_keys.append(key or b"")
        expect_extras.append(tag + bytes(rec.keys_raw) + bytes(rec.properties_raw))
    for data, expected, row in ((bodies, expect_bodies, columns.OUT_BODY_OFFSETS),
                                (keys, expect_keys, columns.OUT_KEY_OFFSETS),
                                (extras, expect_extras, columns.OUT_EXTRA_OFFSETS)):  # fmt: skip
        assert data == b"".join(expected)
        assert out[row] == [0, *np.cumsum([len(e) for e in expected]).tolist()]


@settings(max_examples=200)
@given(s.topics, st.lists(_records, min_size=1, max_size=5), st.data())
def test_read_columns_stops_where_decode_run_stops(topic: str, items: list, data: Any) -> None:
    """A flipped bit anywhere, or a unit that is not its record's (size, place, queue
    offset, queue id, topic): C and Python give the same verdict, at the record where
    decode_run stops (checksums on), and never read past a bad record."""
    buffer, physicals, sizes = _write(topic, items)
    topic_b, queue_id, first = topic.encode(), QUEUE_ID, FIRST_OFFSET
    damage = data.draw(st.sampled_from(["flip", "size", "place", "offset", "queue", "topic"]))
    victim = data.draw(st.integers(0, len(items) - 1))
    if damage == "flip":
        bit = data.draw(st.integers(0, int(sizes.sum()) * 8 - 1))
        buffer[bit // 8] ^= 1 << (bit % 8)
    elif damage == "size":
        sizes[victim] += data.draw(st.sampled_from([-1, 1, 1 << 20, -(1 << 20)]))
    elif damage == "place":
        physicals[victim] += data.draw(st.sampled_from([-1, 1, 68, -FILE_START - 1, 1 << 30]))
    elif damage == "offset":
        first += data.draw(st.sampled_from([-1, 1]))
    elif damage == "queue":
        queue_id += 1
    else:
        topic_b = topic_b[:-1] + (b"_" if topic_b[-1:] != b"_" else b"-")
    (bad, reason, *rest), out = _both(buffer, physicals, sizes, topic_b, queue_id, first)
    where = _decode_run_verdict(buffer, physicals, sizes, topic_b.decode(), queue_id, first)
    if bad < 0:
        assert where == -1 and damage == "flip"  # a bit in the slack after the records
        return
    assert rest == [None, None, None] and out is None
    if reason != columns.COLUMNS_PROPERTIES:  # decode_run does not parse properties
        assert where == int(physicals[bad]) - FILE_START
    assert reason in {
        "size": (columns.COLUMNS_OUTSIDE, columns.COLUMNS_MISMATCH),
        "place": (columns.COLUMNS_OUTSIDE, columns.COLUMNS_MISMATCH),
        "offset": (columns.COLUMNS_MISMATCH,),
        "queue": (columns.COLUMNS_MISMATCH,),
        "topic": (columns.COLUMNS_TOPIC,),
    }.get(damage, tuple(range(1, 7)))


def test_checksums_can_be_left_unverified() -> None:
    """verify_checksums False (Spark's verifyChecksums=false): a flipped body bit
    reads, the same bit with checksums on is a checksum mismatch."""
    buffer, physicals, sizes = _write("t", [(b"body", [], None, [], 1)])
    buffer[int(sizes[0]) - 1] ^= 1
    assert _both(buffer, physicals, sizes, b"t")[0][:2] == (0, columns.COLUMNS_CHECKSUM)
    result, _ = _both(buffer, physicals, sizes, b"t", verify=False)
    assert result[:3] == (-1, columns.COLUMNS_OK, b"bodx")  # "y" ^ 1


@pytest.mark.parametrize(
    "properties, why",
    [
        (b"\x01", "cut in the key length"),
        (b"\x05\x00ab", "key cut off"),
        (b"\x01\x00a\x01\x00", "value length cut off"),
        (b"\x01\x00a\x09\x00\x00\x00xy", "value cut off"),
        (b"\x01\x00\xff\x00\x00\x00\x00", "key not UTF-8"),
    ],
)
def test_malformed_properties_are_refused(properties: bytes, why: str) -> None:
    """A record whose checksum verifies but whose properties do not parse (the key
    column comes out of them) is COLUMNS_PROPERTIES, in C and in Python."""
    size = record.HEADER_SIZE + 1 + len(properties) + 2
    buffer = bytearray(size + 8)
    record.encode_into_py(buffer, 0, FILE_START, size, FIRST_OFFSET, 1, 1, QUEUE_ID, 0, b"t",
                          b"", b"", properties, b"ok")  # fmt: skip
    physicals, sizes = np.array([FILE_START], np.int64), np.array([size], np.int64)
    assert _both(buffer, physicals, sizes, b"t")[0][:2] == (0, columns.COLUMNS_PROPERTIES), why


def test_wrong_arguments_are_refused_alike() -> None:
    buffer, physicals, sizes = _write("t", [(b"x", [], None, [], 1)] * 2)
    bad_calls = [
        (physicals, sizes[:1], 3, 40, np.zeros((columns.OUT_ROWS, 3), np.int64)),
        (physicals, sizes, 3, 40, np.zeros((columns.OUT_ROWS, 2), np.int64)),  # too narrow
        (physicals, sizes, 3, 40, np.zeros(columns.OUT_ROWS * 3 + 1, np.int64)),
        (physicals, sizes, 2**31, 40, np.zeros((columns.OUT_ROWS, 3), np.int64)),
        (physicals, sizes, 3, -1, np.zeros((columns.OUT_ROWS, 3), np.int64)),
        (physicals, sizes, 3, (1 << 63) - 1, np.zeros((columns.OUT_ROWS, 3), np.int64)),
    ]
    runs = [columns.read_columns_py] + ([NATIVE.read_columns] if NATIVE is not None else [])
    for run in runs:
        for p, z, queue_id, first, out in bad_calls:
            with pytest.raises(ValueError):
                run(bytes(buffer), FILE_START, p, z, b"t", queue_id, first, KEY_NAME, True, out)
        with pytest.raises(ValueError):  # a negative file start
            run(bytes(buffer), -1, physicals, sizes, b"t", 3, 40, KEY_NAME, True,
                np.zeros((columns.OUT_ROWS, 3), np.int64))  # fmt: skip


def test_an_empty_run_reads_nothing() -> None:
    out = np.full((columns.OUT_ROWS, 1), -1, np.int64)
    empty = np.zeros(0, np.int64)
    for run in [columns.read_columns_py] + ([NATIVE.read_columns] if NATIVE else []):
        result = run(b"", 0, empty, empty, b"t", 0, 0, KEY_NAME, True, out)
        assert result == (-1, columns.COLUMNS_OK, b"", b"", b"")
        assert out[columns.OUT_BODY_OFFSETS :, 0].tolist() == [0, 0, 0]


# ------------------------------------------------------------------ slices, rows, tuples


@settings(max_examples=150)
@given(st.binary(max_size=300), st.data())
def test_slices_and_rows_cut_alike(data_bytes: bytes, data: Any) -> None:
    """slices (bytes and views) and rows' bodies: the same cuts, None where not valid,
    in C and in Python."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(data_bytes)), min_size=1, max_size=8)))
    offsets = np.array(cuts, np.int64)
    valid = data.draw(st.none() | st.just(np.array(
        data.draw(st.lists(st.integers(0, 1), min_size=len(cuts) - 1,
                           max_size=len(cuts) - 1)), np.uint8)))  # fmt: skip
    keep = [1] * (len(cuts) - 1) if valid is None else valid.tolist()
    expected = [
        data_bytes[a:b] if k else None for a, b, k in zip(cuts, cuts[1:], keep, strict=False)
    ]
    implementations = [(columns.slices_py, columns.rows_py, columns.RowPy)]
    if NATIVE is not None:
        implementations.append((NATIVE.slices, NATIVE.rows, NATIVE.Row))
    for slices, rows, row_class in implementations:
        assert slices(data_bytes, offsets, valid, False) == expected
        views = slices(data_bytes, offsets, valid, True)
        assert [None if v is None else bytes(v) for v in views] == expected
        assert all(v is None or (isinstance(v, memoryview) and v.readonly) for v in views)
        batch = object()
        made = rows(row_class, batch, memoryview(data_bytes), offsets, valid)
        assert [None if r.body is None else bytes(r.body) for r in made] == expected
        assert [(r._batch, r._row) for r in made] == [(batch, i) for i in range(len(made))]


def test_slices_and_rows_refuse_offsets_outside_the_data() -> None:
    data = b"abcdef"
    for offsets, valid in (([0, 7], None), ([3, 2], None), ([-1, 2], None), ([], None),
                           ([0, 2, 4], np.array([1], np.uint8))):  # fmt: skip
        cut = np.array(offsets, np.int64)
        implementations = [(columns.slices_py, columns.rows_py, columns.RowPy)]
        if NATIVE is not None:
            implementations.append((NATIVE.slices, NATIVE.rows, NATIVE.Row))
        for slices, rows, row_class in implementations:
            with pytest.raises(ValueError):
                slices(data, cut, valid, False)
            with pytest.raises(ValueError):
                rows(row_class, None, memoryview(data), cut, valid)


class _Pair(NamedTuple):
    left: Any
    right: Any


def test_tuples_makes_named_tuples_as_tuple_new_does() -> None:
    implementations = [columns.tuples_py] + ([NATIVE.tuples] if NATIVE is not None else [])
    for tuples in implementations:
        made = tuples(_Pair, ([1, 2, 3], ["a", None, [5]]))
        assert made == [_Pair(1, "a"), _Pair(2, None), _Pair(3, [5])]
        assert all(type(pair) is _Pair for pair in made)
        assert tuples(_Pair, ([], [])) == [] and tuples(tuple, ()) == []
        with pytest.raises(ValueError):
            tuples(_Pair, ([1], []))
        # os.stat_result: a C subclass that frees fields past its length (unsafe to make
        # as a tuple; tuple.__new__ refuses it too)
        for cls, cols in ((list, ([1],)), (_Pair, [[1], [2]]), (_Pair, ([1], (2,))),
                          (os.stat_result, ([1],)), (5, ([1],))):  # fmt: skip
            with pytest.raises(TypeError):
                tuples(cls, cols)


@native
def test_c_tuples_leave_the_gc_when_nothing_in_them_can_join_a_cycle() -> None:
    """A row of a class without an instance dict whose items can never join a cycle
    (ints, str, bytes, None, an exact untracked tuple, the call's shared empty list) is
    untracked, as CPython untracks such exact tuples; a row holding a tracked item, an
    item untracked only for now (a dict of atomic values), another untracked empty
    list, or of a class with a dict, is not."""
    assert NATIVE is not None

    class WithDict(tuple):  # type: ignore[type-arg]
        pass

    empty = NATIVE.untracked_empty_list(_EmptyList())
    made = NATIVE.tuples(_Pair, ([1, 2, 3, 4], ["a", b"b", (1, "x"), empty]), empty)
    assert not any(gc.is_tracked(pair) for pair in made)
    held = NATIVE.tuples(_Pair, ([1, 2], [[5], [object()]]), empty)  # tracked items
    assert all(gc.is_tracked(pair) for pair in held)
    atomic_dict = {"a": 1}
    assert not gc.is_tracked(atomic_dict)  # untracked until it takes a container
    assert gc.is_tracked(NATIVE.tuples(_Pair, ([1], [atomic_dict]), empty)[0])
    other = NATIVE.untracked_empty_list(_EmptyList())
    assert gc.is_tracked(NATIVE.tuples(_Pair, ([1], [empty]), other)[0])
    assert gc.is_tracked(NATIVE.tuples(_Pair, ([1], [empty]))[0])  # no shared list
    assert not gc.is_tracked(NATIVE.tuples(_Pair, ([1], [other]), other)[0])
    assert all(gc.is_tracked(row) for row in NATIVE.tuples(WithDict, ([1],), empty))
    for refused in ([], (), "x"):
        with pytest.raises(TypeError):
            NATIVE.tuples(_Pair, ([1], [2]), refused)
        with pytest.raises(TypeError):
            columns.tuples_py(_Pair, ([1], [2]), refused)
    del made, held
    gc.collect()


@native
def test_a_cycle_through_a_row_and_a_dict_it_holds_is_collected() -> None:
    """A row holding a dict of atomic values (a JSON-decoded value) stays tracked: a
    cycle user code makes through the dict later is collected."""
    assert NATIVE is not None

    class Marker:
        pass

    (row,) = NATIVE.tuples(_Pair, ([1], [{"a": 1}]))
    marker = Marker()
    probe = weakref.ref(marker)
    row.right["context"] = {"row": row, "marker": marker}
    del row, marker
    gc.collect()
    assert probe() is None


@native
def test_the_shared_list_changed_behind_its_back_goes_back_under_the_gc() -> None:
    """list.append called on the shared empty list directly (its subclass refuses
    append): rows holding it stay tracked, and the list is tracked again, so a cycle
    through it is collected."""
    assert NATIVE is not None

    class Marker:
        pass

    empty = NATIVE.untracked_empty_list(_EmptyList())
    marker = Marker()
    probe = weakref.ref(marker)
    (row,) = NATIVE.tuples(_Pair, ([1], [empty]), empty)
    assert not gc.is_tracked(row)
    list.append(empty, [marker, empty])
    (again,) = NATIVE.tuples(_Pair, ([1], [empty]), empty)
    assert gc.is_tracked(again) and gc.is_tracked(empty)
    del row, again, empty, marker
    gc.collect()
    assert probe() is None


class _EmptyList(list):  # type: ignore[type-arg]
    __slots__ = ()


def test_untracked_empty_list_takes_only_an_empty_list_subclass_instance() -> None:
    """C and twin refuse alike: a plain list, a non-empty one, one with an instance
    dict, anything else. C then leaves the cyclic GC for the one it takes."""

    class WithDict(list):  # type: ignore[type-arg]
        pass

    class WithSlots(list):  # type: ignore[type-arg]
        __slots__ = ("held",)  # could hold a tracked object: never out of the GC

    implementations = [columns.untracked_empty_list_py]
    if NATIVE is not None:
        implementations.append(NATIVE.untracked_empty_list)
    for untracked in implementations:
        empty = _EmptyList()
        assert untracked(empty) is empty
        full = _EmptyList()
        full.append(1)
        for refused in ([], full, WithDict(), WithSlots(), (), "x", None):
            with pytest.raises(TypeError):
                untracked(refused)
    if NATIVE is not None:
        assert not gc.is_tracked(NATIVE.untracked_empty_list(_EmptyList()))


class _IntArray(array):  # type: ignore[type-arg]
    __slots__ = ("first", "second")


def test_untracked_int_array_takes_only_an_array_subclass_holding_ints() -> None:
    """C and twin refuse alike: a plain array, a subclass with a dict, one whose slots
    hold anything but ints, anything else. C then leaves the cyclic GC for the one it
    takes (issue 15: the shared log's runs)."""

    class WithDict(array):  # type: ignore[type-arg]
        pass

    implementations = [columns.untracked_int_array_py]
    if NATIVE is not None:
        implementations.append(NATIVE.untracked_int_array)
    for untracked in implementations:
        taken = _IntArray("q", [1, 2])
        assert untracked(taken) is taken  # unset slots
        taken.first, taken.second = 3, 2**70
        assert untracked(taken) is taken
        refused = []
        for value in (None, [], "x", 1.0, True):
            holding = _IntArray("q")
            holding.second = value
            refused.append(holding)
        for subject in (*refused, array("q"), WithDict("q"), [], (), 5, None):
            with pytest.raises(TypeError):
                untracked(subject)
    if NATIVE is not None:
        made = _IntArray("q", [1])
        made.first = 1
        assert gc.is_tracked(made)
        assert NATIVE.untracked_int_array(made) is made and not gc.is_tracked(made)
        del made
        gc.collect()


# ------------------------------------------------------------------ the C Row


@native
def test_c_rows_are_read_only_and_out_of_the_gc() -> None:
    """Rows cannot be changed (so no cycle can pass through one) and are not tracked
    by the cyclic GC; a subclass that could hold more is refused."""
    assert NATIVE is not None

    class Plain(NATIVE.Row):  # type: ignore[misc, name-defined]
        __slots__ = ()

    class WithDict(NATIVE.Row):  # type: ignore[misc, name-defined]
        pass

    class WithSlot(NATIVE.Row):  # type: ignore[misc, name-defined]
        __slots__ = ("extra",)

    offsets = np.array([0, 2, 4], np.int64)
    made = NATIVE.rows(Plain, "batch", memoryview(b"abcd"), offsets, None)
    assert [bytes(r.body) for r in made] == [b"ab", b"cd"]
    assert not any(gc.is_tracked(r) for r in made)
    for name in ("body", "_batch", "_row", "anything"):
        with pytest.raises(AttributeError):
            setattr(made[0], name, made[0])
    for cls in (WithDict, WithSlot, int, "Row"):
        with pytest.raises(TypeError):
            NATIVE.rows(cls, None, memoryview(b"abcd"), offsets, None)
    with pytest.raises(TypeError):
        NATIVE.Row()
    with pytest.raises(TypeError):  # a view of more than one dimension
        NATIVE.rows(Plain, None, memoryview(b"abcd").cast("B", (2, 2)), offsets, None)
    del made
    gc.collect()  # dealloc of untracked subclass instances


def test_python_rows_are_read_only() -> None:
    class Plain(columns.RowPy):
        __slots__ = ()

    (made,) = columns.rows_py(Plain, "b", memoryview(b"ab"), np.array([0, 2], np.int64), None)
    with pytest.raises(AttributeError):
        made.body = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        made._row = 5


def test_row_layout_is_python_layout() -> None:
    """The C Row's surface is RowPy's, and the C copy of the constants matches."""
    if NATIVE is None:
        pytest.skip("mqstore.commitlog._native is not built")
    assert {name: NATIVE.LAYOUT[name] for name in columns.LAYOUT} == columns.LAYOUT
    public = {"body", "_batch", "_row"}
    assert public <= set(dir(NATIVE.Row)) and public <= set(dir(columns.RowPy))
    assert struct.calcsize("P") == 8  # the C Row's fields are 64-bit Py_ssize_t
