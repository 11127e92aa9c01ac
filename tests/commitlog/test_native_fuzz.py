"""Fuzz every function of mqstore.commitlog._native with hostile arguments.

Offsets and sizes negative, huge, or chosen so that ``at + size`` wraps past 2**63;
buffers too short; arrays of the wrong item size; crafted records (header fields
rewritten after the checksum) and ConsumeQueue units; block intervals of 0. The
property is the same everywhere: the C function returns, or raises ValueError,
TypeError or OverflowError, and never touches memory outside its arguments. Where
the arguments have the types the pure-Python twin in commitlog/record.py takes, the
two must also agree (same result, same bytes written, or both raise).

Memory errors do not always crash; scripts/sanitize.sh runs this module under
AddressSanitizer and UndefinedBehaviorSanitizer, which turn each into a failure.
``MQSTORE_FUZZ_EXAMPLES`` sets the examples per function (default 100), and
``MQSTORE_FUZZ_REPORT`` names a JSON file that gets the inputs tried per function.
"""

from __future__ import annotations

import collections
import gc
import json
import mmap
import os
import struct
import threading
from array import array
from typing import Any, NamedTuple

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.commitlog import columns, header_scan, record, recovery, run_stretches
from mqstore.commitlog.native import NATIVE
from mqstore.consumequeue import reput_check, time_index
from tests.consumequeue.test_reput_check import cases as units_in_place_cases

pytestmark = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
EXAMPLES = int(os.environ.get("MQSTORE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # sanitizer builds run 2-5x slower
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: What a C function may raise for a bad argument (anything else is a bug).
C_ERRORS = (ValueError, TypeError, OverflowError)
#: What the Python twins raise for the same (struct.error for a field out of range; an
#: AssertionError where a twin asserts what its callers guarantee).
PY_ERRORS = (ValueError, TypeError, OverflowError, IndexError, struct.error, AssertionError)
TRIED: collections.Counter[str] = collections.Counter()  # calls of each C function
ACCEPTED: collections.Counter[str] = collections.Counter()  # of which returned (no raise)

#: int64 values that break naive bound checks: the extremes, their neighbours, the
#: int32/uint32 edges, and small values around 0.
EDGES = (
    0, 1, -1, 16, 67, 68, INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, INT64_MAX - 67,
    INT64_MAX - 100, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32, 2**32 + 71,
)  # fmt: skip
i64 = (
    st.sampled_from(EDGES)
    | st.integers(-300, 300)
    | st.integers(INT64_MIN, INT64_MAX)
    | st.integers(INT64_MAX - 512, INT64_MAX)  # + a small size wraps
    | st.integers(INT64_MIN, INT64_MIN + 512)  # - a small offset wraps
)
#: Also past int64 (an OverflowError in C, struct.error in Python).
hostile_int = i64 | st.sampled_from([2**63, -(2**63) - 1, 2**64])
small = st.integers(0, 400)


def mostly(sane: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
    """``sane`` nine times in ten: one hostile argument at a time reaches the code
    behind the first check, where all-hostile calls would stop at the first."""
    return st.integers(0, 9).flatmap(lambda k: hostile if k == 0 else sane)


def _call(function: Any, *args: Any, errors: tuple[type[BaseException], ...] = C_ERRORS) -> Any:
    """("ok", result) or ("raised", the exception type); other exceptions propagate."""
    try:
        return ("ok", function(*args))
    except errors as error:
        return ("raised", type(error))


def _c(name: str, *args: Any) -> Any:
    """Call NATIVE.<name> through _call, counting the input and whether C took it."""
    TRIED[name] += 1
    out = _call(getattr(NATIVE, name), *args)
    ACCEPTED[name] += out[0] == "ok"
    return out


def _agree(c_out: Any, py_out: Any) -> None:
    assert c_out[0] == py_out[0], (c_out, py_out)
    if c_out[0] == "ok":
        assert c_out[1] == py_out[1]


def _int64_array(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _arrays(count: int, dtype: Any) -> st.SearchStrategy[np.ndarray]:
    """An array of ``count`` items, or one short, or of another item size."""
    other = np.int32 if np.dtype(dtype).itemsize == 8 else np.int64
    return st.sampled_from(
        [np.zeros(count, dtype), np.zeros(max(0, count - 1), dtype), np.zeros(count, other)]
    )


@st.composite
def crafted_records(draw: st.DrawFn) -> tuple[bytearray, list[int], list[int]]:
    """Valid records one after another, then one header field of one record rewritten
    (after its checksum, so only the C checks stand between it and a wild read), a
    flipped byte, or a cut. Returns the buffer, record positions and sizes."""
    count = draw(st.integers(1, 4))
    topic = draw(st.sampled_from([b"t", b"topic", b"x" * 127]))
    items = []
    for _ in range(count):
        body = draw(st.binary(max_size=80))
        tag = draw(st.sampled_from([b"", b"tag", "é".encode()]))
        items.append((record.HEADER_SIZE + len(topic) + len(tag) + len(body), tag, body))
    buffer = bytearray(sum(item[0] for item in items) + draw(st.integers(0, 40)))
    positions, sizes, at = [], [], 0
    for index, (size, tag, body) in enumerate(items):
        record.encode_into_py(buffer, at, at, size, index, 1, 1, 0, 0, topic, tag, b"", b"", body)
        positions.append(at)
        sizes.append(size)
        at += size
    damage = draw(st.sampled_from(["none", "field", "flip", "cut"]))
    victim = draw(st.integers(0, count - 1))
    if damage == "field":
        name, code = draw(
            st.sampled_from([
                ("AT_TOTAL_SIZE", "<I"), ("AT_MAGIC", "<I"), ("AT_PHYSICAL_OFFSET", "<q"),
                ("AT_FLAGS", "<I"), ("AT_BODY_LEN", "<I"), ("AT_PROPERTIES_LEN", "<I"),
                ("AT_KEYS_LEN", "<H"), ("AT_TOPIC_LEN", "<B"), ("AT_TAG_LEN", "<B"),
            ])
        )  # fmt: skip
        width = struct.calcsize(code)
        value = draw(st.integers(0, (1 << (8 * width)) - 1))
        if code == "<q":
            value -= 1 << 63
        struct.pack_into(code, buffer, positions[victim] + record.LAYOUT[name], value)
    elif damage == "flip" and buffer:
        buffer[draw(st.integers(0, len(buffer) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif damage == "cut":
        buffer = buffer[: draw(st.integers(0, len(buffer)))]
    return buffer, positions, sizes


# ------------------------------------------------------------------------- xxh64


@FUZZ
@given(st.binary(max_size=200), hostile_int, st.integers(0, 7), st.booleans())
def test_fuzz_xxh64(data: bytes, seed: int, skip: int, as_view: bool) -> None:
    """Misaligned views and seeds past 64 bits (masked, as the xxhash package does)."""
    assert NATIVE is not None
    source = memoryview(bytearray(data))[skip:] if as_view else data[skip:]
    expected = xxhash.xxh64_intdigest(bytes(source), seed % 2**64)
    assert _c("xxh64", source, seed) == ("ok", expected)
    assert _c("xxh64", "not bytes", 0)[0] == "raised"


# ------------------------------------------------------------------- encode_into


@FUZZ
@given(st.integers(0, 200), st.data())
def test_fuzz_encode_into(slack: int, data: st.DataObject) -> None:
    """Positions and sizes that wrap; sections that do not add up or overflow their
    length fields. A refusal leaves the buffer as it was."""
    assert NATIVE is not None
    topic = data.draw(mostly(st.binary(min_size=1, max_size=20), st.binary(max_size=300)))
    tag = data.draw(mostly(st.binary(max_size=20), st.binary(max_size=300)))
    keys, props = data.draw(st.binary(max_size=20)), data.draw(st.binary(max_size=20))
    body = data.draw(st.binary(max_size=100))
    exact = record.HEADER_SIZE + len(topic) + len(tag) + len(keys) + len(props) + len(body)
    total = data.draw(mostly(st.just(exact), st.sampled_from([exact + 1, exact - 1]) | i64))
    length = data.draw(st.integers(0, exact + slack))
    position = data.draw(mostly(st.integers(0, max(0, length - exact)), hostile_int))
    queue_id = data.draw(mostly(st.integers(0, 2**31 - 1), hostile_int))
    flags = data.draw(mostly(st.integers(0, 1), hostile_int))
    fields = data.draw(st.lists(mostly(st.integers(0, 2**40), i64), min_size=3, max_size=3))
    args = (position, fields[0], total, fields[1], fields[2], 5, queue_id, flags,
            topic, tag, keys, props, body)  # fmt: skip
    buffer = bytearray(length)
    outcome = _c("encode_into", buffer, *args)
    if outcome[0] == "raised":
        assert buffer == bytearray(length)
        return
    twin = bytearray(length)
    record.encode_into_py(twin, *args)
    assert buffer == twin


# --------------------------------------------------------------- the batch encoders


@st.composite
def places(draw: st.DrawFn, count: int) -> tuple[int, int, int, int, int, int, int]:
    """(in_file, file_size, physical, first_queue_offset, queue_id, start, buffer
    length): mostly sane, each, else hostile."""
    file_size = draw(mostly(st.integers(100, 900), i64))
    in_file = draw(mostly(st.integers(0, 100), i64))
    physical = draw(mostly(st.integers(0, 10_000), i64))
    queue_offset = draw(mostly(st.integers(0, 10_000), i64))
    queue_id = draw(mostly(st.integers(0, 8), i64))
    start = draw(mostly(st.integers(0, count), i64))
    sane_length = st.integers(max(0, min(file_size, 1000)), 1000)
    length = draw(mostly(sane_length, st.integers(0, 1000)))
    return in_file, file_size, physical, queue_offset, queue_id, start, length


@st.composite
def encoded_items(draw: st.DrawFn) -> list[Any]:
    """record.py's per-record tuples, some of them lying about their size or flags,
    some not tuples at all."""
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        tag = draw(mostly(st.binary(max_size=20), st.binary(max_size=300)))
        keys, props = draw(st.binary(max_size=10)), draw(st.binary(max_size=10))
        body = draw(st.binary(max_size=120))
        exact = record.HEADER_SIZE + 1 + len(tag) + len(keys) + len(props) + len(body)
        size = draw(mostly(st.just(exact), st.just(exact + 1) | hostile_int))
        flags = draw(mostly(st.sampled_from([0, record.FLAG_NULL_BODY]), hostile_int))
        born = draw(mostly(st.none() | st.integers(0, 2**40), hostile_int))
        item: Any = (size, flags, tag, keys, props, body, born)
        items.append(draw(mostly(st.just(item), st.sampled_from([item[:6], list(item), "x"]))))
    return items


def _encode_both(name: str, py_run: Any, length: int, positions: Any, args: tuple,
                 twin_comparable: bool, after: tuple = ()) -> None:  # fmt: skip
    """Run the C encoder and, where comparable, the twin, on fresh buffers
    (``after``: the arguments after the positions)."""
    buffer, c_positions = bytearray(length), positions.copy()
    c_out = _c(name, buffer, *args, c_positions, *after)
    if not twin_comparable:
        return
    twin, py_positions = bytearray(length), positions.copy()
    py_out = _call(py_run, twin, *args, py_positions, *after, errors=PY_ERRORS)
    _agree(c_out, py_out)
    if c_out[0] == "ok":
        assert (buffer, c_positions.tolist()) == (twin, py_positions.tolist())


@FUZZ
@given(encoded_items(), st.data())
def test_fuzz_encode_run(items: list, data: st.DataObject) -> None:
    assert NATIVE is not None
    place = data.draw(places(len(items)))
    length = place[6]
    positions = data.draw(mostly(st.just(np.zeros(len(items), np.int64)),
                                 _arrays(len(items), np.int64)))  # fmt: skip
    args = (*place[:4], 9, place[4], b"t", items, place[5])
    comparable = positions.dtype == np.int64 and all(type(item) is tuple for item in items)
    _encode_both("encode_run", record.encode_run_py, length, positions, args,
                 comparable and all(len(item) == 7 for item in items))  # fmt: skip


bodies_lists = st.lists(
    mostly(
        st.binary(max_size=120)
        | st.none()
        | st.binary(max_size=50).map(bytearray)
        | st.binary(max_size=50).map(memoryview),
        st.sampled_from(["text", 7, object()]),
    ),
    max_size=6,
)


@FUZZ
@given(bodies_lists, mostly(st.integers(68, 400), hostile_int),
       mostly(st.integers(0, 600), hostile_int), st.data())  # fmt: skip
def test_fuzz_check_bodies(bodies: list, fixed: int, limit: int, data: st.DataObject) -> None:
    assert NATIVE is not None
    sizes = data.draw(mostly(st.just(np.zeros(len(bodies), np.int32)),
                             _arrays(len(bodies), np.int32)))  # fmt: skip
    c_sizes, py_sizes = sizes.copy(), sizes.copy()
    c_out = _c("check_bodies", bodies, fixed, limit, c_sizes)
    if sizes.dtype == np.int32 and len(sizes) == len(bodies) and c_out[0] == "ok":
        py_out = _call(record.check_bodies_py, bodies, fixed, limit, py_sizes, errors=PY_ERRORS)
        _agree(c_out, py_out)
        done = len(bodies) if c_out[1] < 0 else c_out[1]
        assert c_sizes[:done].tolist() == py_sizes[:done].tolist()


@FUZZ
@given(bodies_lists, mostly(st.sampled_from([b"", b"tag"]), st.just(b"x" * 256)), st.data())
def test_fuzz_encode_bodies(bodies: list, tag: bytes, data: st.DataObject) -> None:
    assert NATIVE is not None
    place = data.draw(places(len(bodies)))
    length = place[6]
    positions = data.draw(mostly(st.just(np.zeros(len(bodies), np.int64)),
                                 _arrays(len(bodies), np.int64)))  # fmt: skip
    born = data.draw(mostly(st.integers(0, 2**40), i64))
    args = (*place[:4], 9, born, place[4], b"t", tag, bodies, place[5])
    _encode_both("encode_bodies", record.encode_bodies_py, length, positions, args,
                 positions.dtype == np.int64)  # fmt: skip


@FUZZ
@given(st.binary(max_size=200), st.data())
def test_fuzz_encode_slices(payload: bytes, data: st.DataObject) -> None:
    """Offsets that go backwards, below 0 or past the data; nulls and borns short."""
    assert NATIVE is not None
    count = data.draw(st.integers(0, 5))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), min_size=count + 1,
                                     max_size=count + 1)))  # fmt: skip
    valid = data.draw(mostly(st.just(True), st.booleans()))
    offsets = _int64_array(cuts if valid else data.draw(st.lists(i64, max_size=count + 1)))
    count = max(0, len(offsets) - 1)
    nulls = data.draw(
        mostly(st.none() | st.just(np.ones(count, np.uint8)), _arrays(count, np.uint8))
    )
    borns = data.draw(mostly(st.none() | st.just(np.arange(count, dtype=np.int64)),
                             _arrays(count, np.int64)))  # fmt: skip
    place = data.draw(places(count))
    length = place[6]
    positions = data.draw(mostly(st.just(np.zeros(count, np.int64)), _arrays(count, np.int64)))
    args = (*place[:4], 9, 11, place[4], b"t", b"", offsets, payload, nulls, borns, place[5])
    flags = data.draw(mostly(st.sampled_from([0, record.FLAG_GROUP_OPEN]), i64))
    comparable = (
        valid
        and positions.dtype == np.int64
        and (nulls is None or (len(nulls) == count and nulls.dtype == np.uint8))
        and (borns is None or (len(borns) == count and borns.dtype == np.int64))
    )
    _encode_both("encode_slices", record.encode_slices_py, length, positions, args,
                 comparable, (flags,))  # fmt: skip


# --------------------------------------------------------------------- the readers


_SCAN_DTYPES = (np.int64, np.int32, np.int64, np.int32, np.int64, np.uint8, np.uint64)


@FUZZ
@given(crafted_records(), st.data())
def test_fuzz_scan_records(crafted: tuple, data: st.DataObject) -> None:
    """Crafted headers (sizes past the end, lengths that do not add up, wrong physical
    offsets), hostile start/limit/file_start, short or mistyped outputs."""
    assert NATIVE is not None
    buffer, _, _ = crafted
    start = data.draw(mostly(st.sampled_from([0, len(buffer)]), i64))
    limit = data.draw(mostly(st.integers(0, len(buffer)), i64))
    file_start = data.draw(mostly(st.just(0), i64))
    capacity = data.draw(st.integers(0, 6))
    short = data.draw(mostly(st.just(-1), st.integers(0, 6)))  # a column made short
    columns = [np.zeros(capacity, dtype) for dtype in _SCAN_DTYPES]
    if 0 <= short < len(columns) and capacity:
        columns[short] = columns[short][:-1]
    mistyped = data.draw(mostly(st.just(False), st.booleans())) and capacity > 0
    if mistyped:
        columns[1] = np.zeros(capacity, np.int64)
    # The dispatch columns instead of the outputs: none, or rows of a width around the
    # capacity (narrower is refused), or mistyped (int32).
    width = data.draw(mostly(st.none(), st.integers(max(0, capacity - 1), capacity + 2)))
    dispatch_mistyped = width is not None and data.draw(mostly(st.just(False), st.booleans()))
    mistyped |= dispatch_mistyped
    extra = [] if width is None else [
        np.zeros((header_scan.DISPATCH_ROWS, width), np.int32 if dispatch_mistyped else np.int64)
    ]  # fmt: skip
    outputs = []
    for twin in (False, True):
        copies = [column.copy() for column in [*columns, *extra]]
        if twin:
            out = _call(record.scan_records_py, buffer, start, limit, file_start, *copies,
                        errors=PY_ERRORS)  # fmt: skip
        else:
            out = _c("scan_records", buffer, start, limit, file_start, *copies)
        outputs.append((out, [c.tolist() for c in copies]))
    if not mistyped:
        _agree(outputs[0][0], outputs[1][0])
        if outputs[0][0][0] == "ok":
            count = outputs[0][0][1][1]
            assert [c[:count] for c in outputs[0][1]] == [c[:count] for c in outputs[1][1]]
            if extra:  # the dispatch rows, every one
                assert outputs[0][1][-1] == outputs[1][1][-1]


@FUZZ
@given(crafted_records(), st.data())
def test_fuzz_dispatch_columns(crafted: tuple, data: st.DataObject) -> None:
    """The dispatcher's header scan: crafted headers, hostile start/stop/file_size/
    hard_end/file_start, an ``out`` of the wrong shape or item size; with and without
    verify. C and the twin agree on the result and on every column filled."""
    assert NATIVE is not None
    buffer, _, _ = crafted
    file_size = data.draw(mostly(st.integers(0, len(buffer)), i64))
    start = data.draw(mostly(st.just(0), i64))
    stop = data.draw(mostly(st.integers(0, max(0, min(len(buffer), file_size))), i64))
    hard_end = data.draw(mostly(st.sampled_from([file_size, len(buffer), 10**6]), i64))
    file_start = data.draw(mostly(st.just(0), i64))
    verify = data.draw(st.booleans())
    capacity = data.draw(st.integers(1, 6))
    shape = data.draw(mostly(st.just("good"), st.sampled_from(["ragged", "int32", "flat"])))
    rows = header_scan.DISPATCH_ROWS
    out = {
        "good": np.zeros((rows, capacity), np.int64),
        "ragged": np.zeros(rows * capacity + 1, np.int64),
        "int32": np.zeros((rows, capacity), np.int32),
        "flat": np.zeros(rows * capacity, np.int64),
    }[shape]
    args = (buffer, start, stop, file_size, hard_end, file_start, verify)
    c_out, py_out = out.copy(), out.copy()
    got = _c("dispatch_columns", *args, c_out)
    if shape in ("good", "flat"):
        want = _call(header_scan.dispatch_columns_py, *args, py_out, errors=PY_ERRORS)
        _agree(got, want)
        if got[0] == "ok":
            count = got[1][1]
            c_rows, py_rows = c_out.reshape(rows, -1), py_out.reshape(rows, -1)
            assert c_rows[:, :count].tolist() == py_rows[:, :count].tolist()
    else:
        assert got[0] == "raised"


@FUZZ
@given(crafted_records(), st.data())
def test_fuzz_verify_records(crafted: tuple, data: st.DataObject) -> None:
    """Positions and sizes as ConsumeQueue units on disk could hold them: pointing
    past the buffer, negative, or wrapping when added."""
    assert NATIVE is not None
    buffer, positions, sizes = crafted
    extra = data.draw(st.lists(st.tuples(i64, i64), max_size=3))
    where = data.draw(st.integers(0, len(positions)))
    positions = positions[:where] + [p for p, _ in extra] + positions[where:]
    sizes = sizes[:where] + [s for _, s in extra] + sizes[where:]
    p, z = _int64_array(positions), _int64_array(sizes)
    c_out = _c("verify_records", buffer, p, z)
    _agree(c_out, _call(record.verify_records_py, buffer, p, z, errors=PY_ERRORS))
    assert _call(NATIVE.verify_records, buffer, p, _int64_array([*sizes, 1]))[0] == "raised"


@FUZZ
@given(st.binary(max_size=200),
       st.lists(st.tuples(small | i64, mostly(st.integers(0, 100), i64)), max_size=5),
       st.integers(0, 300))  # fmt: skip
def test_fuzz_gather(source: bytes, slices: list, out_length: int) -> None:
    """Slices that wrap, lengths whose sum wraps, an ``out`` too short."""
    assert NATIVE is not None
    starts, lengths = _int64_array([a for a, _ in slices]), _int64_array([n for _, n in slices])
    c_target, py_target = bytearray(out_length), bytearray(out_length)
    c_out = _c("gather", source, starts, lengths, c_target)
    py_out = _call(record.gather_py, source, starts, lengths, py_target, errors=PY_ERRORS)
    _agree(c_out, py_out)
    if c_out[0] == "ok":
        assert c_target == py_target
    else:
        assert c_target == bytearray(out_length)  # checked before any copy


@FUZZ
@given(st.data())
def test_fuzz_units_in_place(data: st.DataObject) -> None:
    """Runs, orders and files from tests/consumequeue/test_reput_check.py's ``cases``
    (rows out of range, short files, bad ranges), then one scalar or array hostile."""
    run, (units, times, maxima), args = data.draw(units_in_place_cases())
    scalars = [args["interval"], args["unit_in_file"], args["first_offset"], args["lo"],
               args["count"]]  # fmt: skip
    arrays = [times, maxima, run["queue_offsets"], run["physical"], run["sizes"],
              run.get("tags"), run["timestamps"], args["order"]]  # fmt: skip
    target = data.draw(st.integers(0, 2 * (len(scalars) + len(arrays))))
    if target < len(scalars):
        scalars[target] = data.draw(hostile_int)
    elif target < len(scalars) + len(arrays):
        count = len(run["physical"])
        arrays[target - len(scalars)] = data.draw(_arrays(count, np.int64))
    interval, unit_in_file, first_offset, lo, count = scalars
    times, maxima, queue_offsets, physical, sizes, tags, timestamps, order = arrays
    both = (units, times, maxima, interval, unit_in_file, first_offset, queue_offsets, physical,
            sizes, tags, timestamps, order, lo, count)  # fmt: skip
    c_out = _c("units_in_place", *both)
    _agree(c_out, _call(reput_check.units_in_place_py, *both, errors=PY_ERRORS))


@FUZZ
@given(st.data())
def test_fuzz_run_stretches(data: st.DataObject) -> None:
    """A run's dispatch columns of hostile values (any int64), a hostile count, rows
    that are not whole rows or of another item size, starts short or mistyped: C and
    the twin agree on the answer and on every start written."""
    width = data.draw(st.integers(0, 6))
    values = data.draw(st.lists(i64, min_size=width * header_scan.DISPATCH_ROWS,
                                max_size=width * header_scan.DISPATCH_ROWS))  # fmt: skip
    rows = np.array(values, np.int64).reshape(header_scan.DISPATCH_ROWS, width)
    if data.draw(mostly(st.just(False), st.booleans())):
        rows = data.draw(_arrays(rows.size, np.int64))  # flat: short, long or int32
    count = data.draw(mostly(st.integers(0, width + 1), hostile_int))
    starts = data.draw(mostly(st.just(np.zeros(width, np.int64)), _arrays(width, np.int64)))
    outputs = []
    for twin in (False, True):
        copy = starts.copy()
        if twin:
            out = _call(run_stretches.run_stretches_py, rows, count, copy, errors=PY_ERRORS)
        else:
            out = _c("run_stretches", rows, count, copy)
        outputs.append((out, copy.tolist()))
    _agree(outputs[0][0], outputs[1][0])
    if outputs[0][0][0] == "ok":
        stretches = outputs[0][0][1][0]
        assert outputs[0][1][:stretches] == outputs[1][1][:stretches]


@FUZZ
@given(st.data())
def test_fuzz_populate_read(data: st.DataObject) -> None:
    """The scan's look-ahead: hostile start and length over an anonymous mapping or a
    bytes object; C and the twin agree on refusing a range outside the buffer."""
    size = data.draw(st.integers(1, 3)) * mmap.PAGESIZE
    mapped = data.draw(st.booleans())
    buffer: Any = mmap.mmap(-1, size) if mapped else bytes(size)
    try:
        start = data.draw(mostly(st.integers(0, size), hostile_int))
        length = data.draw(mostly(st.integers(0, size), hostile_int))
        c_out = _c("populate_read", buffer, start, length)
        py_out = _call(recovery.populate_read_py, buffer, start, length, errors=PY_ERRORS)
        assert c_out[0] == py_out[0], (c_out, py_out)
        if c_out[0] == "ok" and not mapped:
            # A hint: the twin maps only an mmap; C tries any page-aligned buffer, and a
            # bytes object's data is page-aligned now and then (the CI saw True once).
            assert py_out[1] is False
    finally:
        if mapped:
            buffer.close()


# ------------------------------------------------------------------ the columnar read


@st.composite
def queue_records(draw: st.DrawFn) -> tuple[bytearray, list[int], list[int], int]:
    """Records of one queue (queue id 0, queue offsets from 0) in a file starting at
    physical ``file_start``, with properties well-formed or not (so a checksum that
    verifies does not vouch for them), then crafted_records' damage: a header field
    rewritten after the checksum, a flipped byte, a cut. Returns the buffer, physical
    offsets and sizes as units would hold them, and file_start."""
    count = draw(st.integers(1, 4))
    topic = draw(st.sampled_from([b"t", b"topic"]))
    file_start = draw(st.sampled_from([0, 4096, INT64_MAX - 4096]))
    key = len(b"\x00key").to_bytes(2, "little") + b"\x00key"
    pair = key + (3).to_bytes(4, "little") + b"abc"
    items = []
    for _ in range(count):
        props = draw(st.sampled_from([b"", pair, pair + pair]) | st.binary(max_size=12))
        body = draw(st.binary(max_size=40))
        tag = draw(st.sampled_from([b"", b"tag", b"\xff"]))
        items.append((record.HEADER_SIZE + len(topic) + len(tag) + len(props) + len(body),
                      tag, props, body))  # fmt: skip
    buffer = bytearray(sum(item[0] for item in items) + draw(st.integers(0, 40)))
    physicals, sizes, at = [], [], 0
    for index, (size, tag, props, body) in enumerate(items):
        flags = draw(st.sampled_from([0, record.FLAG_NULL_BODY]))
        record.encode_into_py(buffer, at, file_start + at, size, index, 1, 1, 0, flags, topic,
                              tag, b"", props, body)  # fmt: skip
        physicals.append(file_start + at)
        sizes.append(size)
        at += size
    damage = draw(st.sampled_from(["none", "field", "flip", "cut"]))
    victim = physicals[draw(st.integers(0, count - 1))] - file_start
    if damage == "field":
        fields = [
            ("AT_TOTAL_SIZE", "<I"), ("AT_QUEUE_OFFSET", "<q"), ("AT_BODY_LEN", "<I"),
            ("AT_PHYSICAL_OFFSET", "<q"), ("AT_PROPERTIES_LEN", "<I"), ("AT_TAG_LEN", "<B"),
        ]  # fmt: skip
        name, code = draw(st.sampled_from(fields))
        width = struct.calcsize(code)
        value = draw(st.integers(0, (1 << (8 * width)) - 1)) - (1 << 63 if code == "<q" else 0)
        struct.pack_into(code, buffer, victim + record.LAYOUT[name], value)
    elif damage == "flip" and buffer:
        buffer[draw(st.integers(0, len(buffer) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif damage == "cut":
        buffer = buffer[: draw(st.integers(0, len(buffer)))]
    return buffer, physicals, sizes, file_start


@FUZZ
@given(queue_records(), st.data())
def test_fuzz_read_columns(crafted: tuple, data: st.DataObject) -> None:
    """Units past the file, negative, or wrapping when the file start is subtracted;
    headers that lie; properties that do not parse; hostile file_start, queue id,
    first queue offset and output shapes: C returns or raises as its twin does, and
    fills the same columns and bytes."""
    assert NATIVE is not None
    buffer, physicals, sizes, file_start = crafted
    extra = data.draw(st.lists(st.tuples(i64, i64), max_size=2))
    where = data.draw(st.integers(0, len(physicals)))
    physicals = physicals[:where] + [p for p, _ in extra] + physicals[where:]
    sizes = sizes[:where] + [z for _, z in extra] + sizes[where:]
    file_start = data.draw(mostly(st.just(file_start), i64))
    queue_id = data.draw(mostly(st.just(0), i64))
    first = data.draw(mostly(st.just(0), i64))
    width = data.draw(mostly(st.just(len(physicals) + 1), st.integers(0, len(physicals) + 2)))
    rows = data.draw(mostly(st.just(columns.OUT_ROWS), st.integers(1, columns.OUT_ROWS + 1)))
    verify = data.draw(st.booleans())
    p, z = _int64_array(physicals), _int64_array(sizes)
    outputs = []
    for twin in (False, True):
        out = np.full((rows, width), -7, np.int64)
        args = (bytes(buffer), file_start, p, z, b"topic", queue_id, first, b"\x00key", verify)
        if twin:
            result = _call(columns.read_columns_py, *args, out, errors=PY_ERRORS)
        else:
            result = _c("read_columns", *args, out)
        ok = result[0] == "ok" and result[1][0] < 0
        outputs.append((result, out.tolist() if ok else None))
    assert outputs[0] == outputs[1]
    mistyped = (np.zeros(3, np.int32), z, b"t", b"k", np.zeros((columns.OUT_ROWS, 4), np.int64))
    assert _call(NATIVE.read_columns, bytes(buffer), 0, *mistyped[:2], *mistyped[2:3], 0, 0,
                 mistyped[3], True, mistyped[4])[0] == "raised"  # fmt: skip


@FUZZ
@given(st.binary(max_size=100), st.data())
def test_fuzz_slices_and_rows(payload: bytes, data: st.DataObject) -> None:
    """Offsets that go backwards, below 0 or past the data; valid arrays short or of
    another item size; data or view of the wrong type; cls not a plain Row."""
    assert NATIVE is not None
    count = data.draw(st.integers(0, 5))
    sane = st.lists(st.integers(0, len(payload)), min_size=count + 1, max_size=count + 1).map(
        sorted
    )
    offsets = _int64_array(data.draw(mostly(sane, st.lists(i64, max_size=count + 1))))
    valid = data.draw(mostly(st.none() | st.just(np.ones(count, np.uint8)),
                             _arrays(count, np.uint8)))  # fmt: skip
    views = data.draw(st.booleans())
    source: Any = data.draw(mostly(st.just(payload), st.sampled_from([bytearray(payload), "x"])))
    comparable = valid is None or valid.dtype == np.uint8
    c_out = _c("slices", source, offsets, valid, views)
    if comparable:
        py_out = _call(columns.slices_py, source, offsets, valid, views, errors=PY_ERRORS)
        assert c_out[0] == py_out[0]
        if not views:
            _agree(c_out, py_out)
        if views and c_out[0] == "ok":
            assert [None if v is None else bytes(v) for v in c_out[1]] == [
                None if v is None else bytes(v) for v in py_out[1]]  # fmt: skip

    class Plain(NATIVE.Row):  # type: ignore[misc, name-defined]
        __slots__ = ()

    class PlainPy(columns.RowPy):
        __slots__ = ()

    cls = data.draw(mostly(st.just(Plain), st.sampled_from([NATIVE.Row, int, "Row", None])))
    view: Any = data.draw(mostly(st.just(memoryview(payload)), st.sampled_from([payload, 5])))
    c_out = _c("rows", cls, "batch", view, offsets, valid)
    if comparable and cls is Plain:
        py_out = _call(columns.rows_py, PlainPy, "batch", view, offsets, valid, errors=PY_ERRORS)
        assert c_out[0] == py_out[0]
        if c_out[0] == "ok":
            bodies = [[None if r.body is None else bytes(r.body) for r in out[1]]
                      for out in (c_out, py_out)]  # fmt: skip
            assert bodies[0] == bodies[1]


class _Triple(NamedTuple):
    a: Any
    b: Any
    c: Any


@FUZZ
@given(st.lists(st.lists(st.integers(), max_size=4), max_size=4), st.data())
def test_fuzz_tuples(lists: list, data: st.DataObject) -> None:
    """Columns of different lengths, columns that are not lists, a cls that is not a
    tuple subclass, more or fewer columns than the NamedTuple has fields, a shared
    empty list that is not a list subclass instance."""
    assert NATIVE is not None
    hostile = st.sampled_from([list, 3, None, os.stat_result, os.terminal_size])
    cls = data.draw(mostly(st.sampled_from([_Triple, tuple]), hostile))
    shaped = data.draw(
        mostly(st.just(tuple(lists)), st.sampled_from([lists, tuple(map(tuple, lists))]))
    )
    shared = data.draw(
        st.sampled_from([(), (None,), (_EmptyHeaders(),), ([],), ((),), ("x",), (None, 1)])
    )  # the optional shared empty list, or a hostile one, or one argument too many
    c_out = _c("tuples", cls, shaped, *shared)
    py_out = _call(columns.tuples_py, cls, shaped, *shared, errors=PY_ERRORS)
    _agree(c_out, py_out)


class _EmptyHeaders(list):  # type: ignore[type-arg]
    __slots__ = ()


class _ListWithDict(list):  # type: ignore[type-arg]
    pass


@FUZZ
@given(st.data())
def test_fuzz_untracked_empty_list(data: st.DataObject) -> None:
    """Everything but an empty instance of a list subclass without a dict is refused,
    by C as by the twin: lists plain or full, subclasses with a dict, other objects."""
    assert NATIVE is not None
    makers = [
        _EmptyHeaders, list, lambda: _EmptyHeaders([1]), _ListWithDict, tuple, dict,
        lambda: data.draw(st.integers() | st.binary() | st.none() | st.text()),
    ]  # fmt: skip
    subject = data.draw(st.sampled_from(makers))()
    c_out = _c("untracked_empty_list", subject)
    py_out = _call(columns.untracked_empty_list_py, subject, errors=PY_ERRORS)
    assert c_out[0] == py_out[0], (c_out, py_out)
    if c_out[0] == "ok":
        assert c_out[1] is subject and not gc.is_tracked(subject)


class _IntArray(array):  # type: ignore[type-arg]
    __slots__ = ("value",)


class _ArrayWithDict(array):  # type: ignore[type-arg]
    pass


@FUZZ
@given(st.data())
def test_fuzz_untracked_int_array(data: st.DataObject) -> None:
    """Everything but an array.array subclass instance without a dict whose slots hold
    only ints is refused, by C as by the twin."""
    assert NATIVE is not None
    value = data.draw(
        st.integers() | st.none() | st.text() | st.floats() | st.booleans() | st.just([])
    )

    def holding() -> _IntArray:
        subject = _IntArray("q", [1, 2])
        subject.value = value
        return subject

    makers = [
        holding, lambda: _IntArray("q"), lambda: array("q"), lambda: _ArrayWithDict("q"),
        list, lambda: value,
    ]  # fmt: skip
    subject = data.draw(st.sampled_from(makers))()
    c_out = _c("untracked_int_array", subject)
    py_out = _call(columns.untracked_int_array_py, subject, errors=PY_ERRORS)
    assert c_out[0] == py_out[0], (c_out, py_out)
    if c_out[0] == "ok":
        assert c_out[1] is subject and not gc.is_tracked(subject)


# -------------------------------------------------------------------- write_units

_CAPACITY = 6  # units each fuzzed row's arrays hold


def _write_units_model(table: np.ndarray, files: list, columns: list, start: int) -> int:
    """write_units in Python, on ``files`` (units, times, blocks per row) instead of
    raw addresses: the rule the C loop follows."""
    from mqstore.consumequeue import tail_writer as tw

    slots, qoffs, clogs, sizes, tags, times = (c.tolist() for c in columns)
    for i in range(start, len(slots)):
        if not 0 <= slots[i] < len(table):
            return i
        row = table[slots[i]]
        offset = qoffs[i]
        if (row[tw._UNITS_ADDR] == 0 or row[tw._INTERVAL] <= 0 or offset != row[tw._NEXT]
                or not row[tw._FILE_FIRST] <= offset < row[tw._LIMIT]):  # fmt: skip
            return i
        index = offset - int(row[tw._FILE_FIRST])
        if index > 0xFFFF_FFFF or clogs[i] <= row[tw._LAST_CLOG] or sizes[i] <= 0:
            return i
        units, stamps, blocks = files[slots[i]]
        stamps[index] = times[i]
        block = index // int(row[tw._INTERVAL])
        blocks[block] = max(int(blocks[block]), times[i])
        units[index * 20 : index * 20 + 20] = np.frombuffer(
            struct.pack("<qiq", clogs[i], sizes[i], tags[i]), np.uint8
        )
        row[tw._NEXT] = offset + 1
        row[tw._LAST_CLOG] = clogs[i]
    return len(slots)


@st.composite
def tail_rows(draw: st.DrawFn) -> dict[str, int]:
    """A row's columns: hostile interval, first offset, next and last offset, with
    LIMIT - FILE_FIRST <= _CAPACITY (the one thing the tail writer vouches for with
    the mapping it holds), or LIMIT below FILE_FIRST."""
    file_first = draw(i64)
    span = draw(st.integers(-3, _CAPACITY))
    limit = min(INT64_MAX, max(INT64_MIN, file_first + span))
    near = draw(st.integers(-2, _CAPACITY + 1))
    next_offset = draw(st.just(min(INT64_MAX, max(INT64_MIN, file_first + near))) | i64)
    return {
        "interval": draw(st.integers(1, 3) | i64),
        "file_first": file_first,
        "next": next_offset,
        "limit": limit,
        "last_clog": draw(st.just(-1) | i64),
        "attached": draw(st.booleans() | st.just(True)),
    }


@FUZZ
@given(st.lists(tail_rows(), min_size=1, max_size=3), st.data())
def test_fuzz_write_units(rows: list, data: st.DataObject) -> None:
    """Intervals of 0 and below, units below FILE_FIRST or past LIMIT, offsets whose
    differences wrap, slots outside the table, sizes <= 0, a bad start: C writes
    exactly what the model writes, and nothing outside the rows' arrays."""
    from mqstore.consumequeue import tail_writer as tw

    assert NATIVE is not None
    count = data.draw(st.integers(0, 8))
    slots = np.array(data.draw(st.lists(st.integers(-1, len(rows)), min_size=count,
                                        max_size=count)), np.int32)  # fmt: skip
    guesses = [row["next"] for row in rows] + [0]
    qoffs = _int64_array(data.draw(st.lists(st.sampled_from(guesses) | i64, min_size=count,
                                            max_size=count)))  # fmt: skip
    clogs = _int64_array(data.draw(st.lists(i64, min_size=count, max_size=count)))
    sizes = np.array(data.draw(st.lists(st.integers(-2, 2**31 - 1), min_size=count,
                                        max_size=count)), np.int32)  # fmt: skip
    tags = _int64_array(data.draw(st.lists(i64, min_size=count, max_size=count)))
    times = _int64_array(data.draw(st.lists(i64, min_size=count, max_size=count)))
    start = data.draw(st.integers(0, count) | i64)
    results = []
    for runner in ("c", "model"):
        files = [(np.zeros(_CAPACITY * 20, np.uint8), np.zeros(_CAPACITY, np.int64),
                  np.zeros(_CAPACITY, np.int64)) for _ in rows]  # fmt: skip
        table = np.zeros((len(rows), tw._COLUMNS), np.int64)
        for slot, (row, (units, stamps, blocks)) in enumerate(zip(rows, files, strict=True)):
            table[slot, tw._UNITS_ADDR] = units.ctypes.data if row["attached"] else 0
            table[slot, tw._TIMES_ADDR] = stamps.ctypes.data
            table[slot, tw._BLOCKS_ADDR] = blocks.ctypes.data
            for name, column in (("interval", tw._INTERVAL), ("file_first", tw._FILE_FIRST),
                                 ("next", tw._NEXT), ("limit", tw._LIMIT),
                                 ("last_clog", tw._LAST_CLOG)):  # fmt: skip
                table[slot, column] = row[name]
        columns = [slots, qoffs, clogs, sizes, tags, times]
        if runner == "c":
            out = _c("write_units", table, *columns, start)
        elif 0 <= start <= count:
            out = ("ok", _write_units_model(table, files, columns, start))
        else:
            out = ("raised", ValueError)
        kept = np.delete(table, [tw._UNITS_ADDR, tw._TIMES_ADDR, tw._BLOCKS_ADDR], axis=1)
        results.append((out, kept.tolist(), [[a.tolist() for a in f] for f in files]))
    assert results[0] == results[1]
    bad_table = np.zeros((1, tw._COLUMNS + 1), np.int64)  # not a whole number of rows
    assert _call(NATIVE.write_units, bad_table, *columns, 0)[0] == "raised"


# ---------------------------------------------------------------- Appender, feed


@st.composite
def appender_states(draw: st.DrawFn) -> dict[str, Any]:
    """Members an Appender takes from Python, mostly sane, each else hostile: file
    bounds that wrap or lie outside the mapping, a write position outside the file,
    thresholds, limits and offsets at the int64 edges, a feed that is not a list."""
    length = draw(mostly(st.integers(300, 600), st.integers(0, 300)))
    file_size = draw(mostly(st.just(length), st.integers(0, length) | i64))
    file_start = draw(mostly(st.integers(0, 10_000), i64))
    in_file = draw(mostly(st.integers(0, 20), st.integers(0, max(0, min(file_size, length))) | i64))
    write_position = file_start + in_file if -(2**63) <= file_start + in_file < 2**63 else 0
    return {
        "length": length,
        "file_start": file_start,
        "file_size": file_size,
        "write_position": draw(mostly(st.just(write_position), i64)),
        "prepare_next_at": draw(mostly(st.just(INT64_MAX), i64)),
        "record_size_limit": draw(mostly(st.just(1000), st.integers(68, 300) | i64)),
        "last_store_ts_ms": draw(mostly(st.integers(0, 2**40), i64)),
        "queue_offset": draw(mostly(st.integers(0, 2**40), st.sampled_from(EDGES) | st.just("x"))),
        "topic": draw(mostly(st.just(b"t"), st.sampled_from([b"", b"x" * 300, "t"]))),
        "feed": draw(mostly(st.just([]) | st.none(), st.just(("not", "a", "list")))),
        "mapping": draw(mostly(st.just("bytearray"), st.sampled_from(["bytes", "none"]))),
    }


def _fuzz_appender(factory: Any, lock: Any, state: dict[str, Any], args: tuple) -> Any:
    from mqstore.commitlog.appender import AppendResult

    mapping: Any = bytearray(state["length"])
    if state["mapping"] == "bytes":
        mapping = bytes(state["length"])  # read-only: refused, never written
    elif state["mapping"] == "none":
        mapping = None
    appender = factory(lock, {("t", 0): state["queue_offset"]}, {"t": state["topic"]},
                       AppendResult, 2)  # fmt: skip
    for name in ("file_start", "file_size", "write_position", "prepare_next_at",
                 "record_size_limit", "last_store_ts_ms"):  # fmt: skip
        setattr(appender, name, state[name])
    appender.mapping, appender.feed, appender.accepting = mapping, state["feed"], True
    appender.clock = lambda: 7
    return appender, mapping


@FUZZ
@given(appender_states(), st.data())
def test_fuzz_appender(state: dict[str, Any], data: st.DataObject) -> None:
    """Hostile members and arguments: C appends inside the mapping or refuses (None,
    ValueError, TypeError), and agrees with the Python twin whenever both run."""
    from mqstore.commitlog.appender import PyAppender

    assert NATIVE is not None
    body = data.draw(mostly(st.binary(max_size=150), st.none() | st.just(memoryview(b"m"))))
    keys = data.draw(mostly(st.just(b""), st.binary(max_size=20) | st.just("k")))
    born = data.draw(mostly(st.none(), hostile_int | st.just(True)))
    queue_id = data.draw(mostly(st.just(0), hostile_int))
    args = ("t", queue_id, body, None, born, keys, b"")
    TRIED["AppendLock"] += 1
    lock = NATIVE.AppendLock()
    ACCEPTED["AppendLock"] += 1
    try:
        appender, mapping = _fuzz_appender(NATIVE.Appender, lock, state, args)
    except C_ERRORS:
        TRIED["Appender"] += 1
        return
    before = None if mapping is None else bytes(mapping)
    TRIED["Appender"] += 1
    outcome = _call(appender.append, *args)
    ACCEPTED["Appender"] += outcome[0] == "ok"
    assert not lock.locked()
    if outcome[0] == "raised" or outcome[1] is None:
        assert mapping is None or bytes(mapping) == before
    try:
        twin, twin_mapping = _fuzz_appender(PyAppender, threading.Lock(), state, args)
    except PY_ERRORS:
        return
    twin_out = _call(twin.append, *args, errors=PY_ERRORS)
    _agree(outcome, twin_out)
    if outcome[0] == "ok" and mapping is not None:
        assert bytes(mapping) == bytes(twin_mapping)
        assert appender.write_position == twin.write_position


class _Holder:
    """The Putter's failure holder (the store's dispatcher)."""

    def __init__(self, failure: Any) -> None:
        self.failure = failure


@FUZZ
@given(appender_states(), st.data())
def test_fuzz_putter(state: dict[str, Any], data: st.DataObject) -> None:
    """MessageStore.put's C path (mqstore/_put.c) over a hostile Appender, with
    hostile limits, failure holder, threshold and calls: it appends inside the mapping
    (then calls help only past help_past), or hands the call to ``slow`` having
    changed nothing, or raises; the append lock is never left held."""
    assert NATIVE is not None
    lock = NATIVE.AppendLock()
    try:
        appender, mapping = _fuzz_appender(NATIVE.Appender, lock, state, ())
    except C_ERRORS:
        return
    limit = mostly(st.just(1), st.sampled_from(["1", -1, 0, 2**70, True, None]))
    limits = data.draw(mostly(st.builds(lambda n: {"t": n}, limit), st.just({})))
    failure = data.draw(mostly(st.none(), st.just(RuntimeError("failed"))))
    slow_calls: list[Any] = []
    helped: list[int] = []

    def slow(*args: Any, **kwargs: Any) -> str:
        slow_calls.append((args, kwargs))
        return "slow"

    putter = NATIVE.Putter(appender, limits, _Holder(failure), slow, helped.append)
    putter.enabled = data.draw(mostly(st.just(True), st.just(False)))
    putter.help_past = past = data.draw(mostly(st.just(INT64_MAX), i64))
    args = data.draw(
        mostly(
            st.tuples(st.just("t"), st.just(0), st.binary(max_size=60) | st.none()),
            st.tuples(st.sampled_from(["t", b"t", "u"]), hostile_int | st.just(True),
                      st.just("text") | st.just(memoryview(b"m")))
            | st.just(("t", 0)) | st.just(("t", 0, b"x", "extra")),
        )
    )  # fmt: skip
    value = st.none() | st.sampled_from(["", (), [], {}, ["k"], {"p": "v"}, "tag"]) | hostile_int
    kwargs = data.draw(
        mostly(
            st.just({}),
            st.dictionaries(st.sampled_from(["tag", "keys", "properties",
                                             "born_timestamp_ms", "colour"]), value,
                            max_size=3),
        )
    )  # fmt: skip
    before = None if mapping is None else bytes(mapping)
    TRIED["Putter"] += 1
    try:
        result = putter.put(*args, **kwargs)
    except (*C_ERRORS, RuntimeError):
        result = None  # a refusal: the Appender wrote nothing (test_fuzz_appender)
    else:
        ACCEPTED["Putter"] += 1
    assert not lock.locked()
    if result == "slow" or result is None:
        assert mapping is None or bytes(mapping) == before
        assert helped == []
    else:
        assert slow_calls == []
        assert type(result).__name__ == "AppendResult"
        assert helped == ([result[0]] if result[0] > past else [])


class _OddRun(list):  # a run whose first_offset is not an int
    first_offset = "x"


@FUZZ
@given(st.data())
def test_fuzz_runs_append(data: st.DataObject) -> None:
    """The shared log's pass (consumequeue/_runs.c) with hostile runs (not sized, no
    first_offset, a first_offset that is not an int or sits at the int64 edge), a
    new_run that raises, arrays of the wrong item size or too short, first and total
    at the edges: it returns or raises, and when it returns it agrees with the twin."""
    from mqstore.consumequeue.shared_runs import SharedRun, runs_append_py

    assert NATIVE is not None

    def slot_set(first_offset: Any) -> SharedRun:  # the C pass reads the slot directly
        run = SharedRun(0, 1)
        if first_offset is None:
            del run.first_offset
        else:
            run.first_offset = first_offset
        return run

    def hostile_run() -> Any:
        return (
            st.sampled_from([7, "ab", _OddRun([1]), None])
            | st.builds(lambda first: SharedRun(first, 1), i64.filter(lambda v: v >= 0))
            | st.builds(slot_set, st.sampled_from([None, "x", 2**70, -1, 2**63 - 1]))
        )

    def runs_of(draw_seed: list[Any]) -> dict[int, Any]:
        return {queue_id: (SharedRun(*shape) if isinstance(shape, tuple) else shape)
                for queue_id, shape in draw_seed}  # fmt: skip

    shapes = data.draw(
        st.lists(
            st.tuples(st.integers(0, 4),
                      mostly(st.tuples(st.integers(0, 20), st.integers(0, 50)), hostile_run())),
            max_size=5,
        )
    )  # fmt: skip
    length = data.draw(st.integers(0, 8))
    ids = np.array(data.draw(st.lists(st.integers(0, 5), min_size=length, max_size=length)),
                   dtype=data.draw(mostly(st.just(np.int32), st.just(np.int64))))  # fmt: skip
    offsets = np.array(data.draw(st.lists(st.integers(0, 25), min_size=length, max_size=length)),
                       dtype=data.draw(mostly(st.just(np.int64), st.just(np.int32))))  # fmt: skip
    first = data.draw(mostly(st.integers(0, 1000), hostile_int))
    total = data.draw(mostly(st.integers(0, length), hostile_int))
    failing = data.draw(mostly(st.just(False), st.just(True)))

    def calling(offset: int, position: int) -> Any:
        if failing:
            raise ValueError("injected")
        return SharedRun.of_unit(offset, position)

    # The class itself: the C pass makes its runs without a call (runs_register).
    new_run: Any = data.draw(st.sampled_from([calling, SharedRun]))

    def shape(run: Any) -> Any:  # a run as the pass left it
        if type(run) is not SharedRun:
            return repr(run)
        return (getattr(run, "first_offset", None), getattr(run, "min_offset", None), list(run))

    TRIED["runs_append"] += 1
    runs = runs_of(shapes)
    try:
        out = ("ok", NATIVE.runs_append(runs, new_run, ids, offsets, first, total))
    except (*C_ERRORS, AttributeError) as error:
        out = ("raised", type(error))
    ACCEPTED["runs_append"] += out[0] == "ok"
    if out[0] == "ok":
        twin_runs = runs_of(shapes)
        twin = runs_append_py(twin_runs, new_run, ids, offsets, first, total)
        assert out[1][0] == twin[0]
        assert sorted(out[1][1]) == sorted(twin[1])
        assert {k: shape(v) for k, v in runs.items()} == {k: shape(v) for k, v in twin_runs.items()}


@FUZZ
@given(st.data())
def test_fuzz_runs_register(data: st.DataObject) -> None:
    """Classes of every shape offered to runs_register (bases, slots, a dict, an
    __init__, a metaclass with its own mro, non-classes): it accepts or raises
    TypeError, and a class it accepts makes sound runs in the C pass."""
    from array import array

    from mqstore.consumequeue.shared_runs import SharedRun

    assert NATIVE is not None

    class Hiding(type):
        def mro(cls) -> list[type]:
            return [cls, object]

    # Each trait is mostly the registrable one: about half of the classes pass.
    base = data.draw(mostly(st.just(array), st.sampled_from([list, SharedRun, object])))
    slots = data.draw(
        mostly(
            st.permutations(["first_offset", "min_offset"]),
            st.none() | st.lists(st.sampled_from(["first_offset", "min_offset", "x"]), unique=True),
        )
    )
    namespace: dict[str, Any] = {} if slots is None else {"__slots__": tuple(slots)}
    if data.draw(mostly(st.just(False), st.just(True))):
        namespace["__init__"] = lambda self, *args: None
    hiding = data.draw(mostly(st.just(False), st.just(True)))
    try:
        made: Any = (Hiding if hiding else type)("Candidate", (base,), namespace)
    except TypeError:  # a layout Python itself refuses
        made = None
    candidate = data.draw(mostly(st.just(made), st.sampled_from([7, None, "q", array])))
    TRIED["runs_register"] += 1
    try:
        NATIVE.runs_register(candidate)
        ACCEPTED["runs_register"] += 1
        offset = data.draw(st.integers(0, 2**62))
        runs: dict[int, Any] = {}
        ids, offsets = np.array([1], np.int32), np.array([offset], np.int64)
        assert NATIVE.runs_append(runs, candidate, ids, offsets, 5, 1)[0] == 1
        run = runs[1]
        assert type(run) is candidate and list(run) == [5]
        assert run.first_offset == run.min_offset == offset
    except TypeError:
        pass
    finally:
        NATIVE.runs_register(SharedRun)  # as at import


@FUZZ
@given(st.data())
def test_fuzz_feed_columns(data: st.DataObject) -> None:
    """Entries of the wrong shape or types, positions and sizes that wrap, a start
    outside the list, columns short or of the wrong item size."""
    from mqstore.commitlog.appender import feed_columns_py

    assert NATIVE is not None
    entry = st.tuples(
        mostly(st.integers(0, 10_000), hostile_int), mostly(st.integers(68, 500), hostile_int),
        mostly(st.just("t"), st.just(b"t")), mostly(st.integers(0, 3), st.just("q")),
        mostly(st.integers(0, 2**40), hostile_int), mostly(st.integers(0, 2**40), hostile_int),
        mostly(st.integers(0, 2**40), hostile_int), mostly(st.just(b""), st.just("tag")),
        st.just(b""),
    )  # fmt: skip
    entries = data.draw(st.lists(mostly(entry, st.just((1, 2))), max_size=6))
    capacity = data.draw(st.integers(0, 6))
    short = data.draw(mostly(st.just(-1), st.integers(0, 5)))
    dtypes = [np.int32, np.int64, np.int32, np.int64, np.int64, np.int64]
    columns = [np.zeros(capacity, dtype) for dtype in dtypes]
    if 0 <= short < 6 and capacity:
        columns[short] = columns[short][:-1]
    start = data.draw(mostly(st.integers(0, len(entries)), i64))
    end = data.draw(mostly(st.integers(0, 20_000), i64))
    slot_map: dict[Any, Any] = {("t", 0): 1, ("t", 1): 2**40, ("t", 3): 6}
    # The topic's slot array (ids 0-1 or 0-2; -1 there is no slot), or a hostile one.
    slot_map["t"] = data.draw(
        st.sampled_from([None, 7, np.array([5, -1], np.int32), np.array([2, 8, -1], np.int32)])
        | st.sampled_from([b"1234567", "text", True, [1]])
    )
    if slot_map["t"] is None:
        del slot_map["t"]
    c_columns = [column.copy() for column in columns]
    c_out = _c("feed_columns", entries, start, end, slot_map, *c_columns)
    py_columns = [column.copy() for column in columns]
    py_out = _call(feed_columns_py, entries, start, end, slot_map, *py_columns,
                   errors=PY_ERRORS)  # fmt: skip
    _agree(c_out, py_out)
    if c_out[0] == "ok":
        count = c_out[1][0]
        assert [c[:count].tolist() for c in c_columns] == [c[:count].tolist() for c in py_columns]


# ------------------------------------------------------------- the time look-up


def _search_array(draw: st.DrawFn) -> np.ndarray:
    """Sorted (as running maxima are) or not, empty or not, or of another item size."""
    values = draw(st.lists(mostly(st.integers(-5, 40), i64), max_size=12))
    if draw(st.booleans()):
        values.sort()
    dtype = draw(st.sampled_from([np.int64, np.int64, np.int64, np.int32, np.uint8]))
    return np.array(values, dtype=dtype) if dtype is np.int64 else np.zeros(len(values), dtype)


@FUZZ
@given(st.data())
def test_fuzz_time_search(data: st.DataObject) -> None:
    """Counts negative, past the array or past int64; arrays of the wrong item size,
    unsorted, sliced with a stride; hostile targets. C and the twin agree."""
    assert NATIVE is not None
    head, blocks = _search_array(data.draw), _search_array(data.draw)
    if data.draw(st.integers(0, 9)) == 0:
        blocks = np.zeros(2 * len(blocks) + 2, dtype=np.int64)[::2]  # not contiguous
    head_count = data.draw(mostly(st.integers(0, len(head)), hostile_int))
    block_count = data.draw(mostly(st.integers(0, len(blocks)), hostile_int))
    target = data.draw(mostly(st.integers(-6, 41), hostile_int))
    c_out = _c("time_search", head, head_count, blocks, block_count, target)
    typed = head.dtype == np.int64 and blocks.dtype == np.int64 and blocks.flags.c_contiguous
    if typed and INT64_MIN <= target <= INT64_MAX:
        _agree(c_out, _call(time_index.time_search_py, head, head_count, blocks, block_count,
                            target, errors=PY_ERRORS))  # fmt: skip
    if c_out[0] == "ok":
        assert -1 <= c_out[1] < len(head) + len(blocks)


@FUZZ
@given(st.data())
def test_fuzz_first_reaching(data: st.DataObject) -> None:
    """A window [start, end) inverted, negative, past the array or past int64; arrays
    of the wrong item size or read-only. C and the twin agree."""
    assert NATIVE is not None
    times = _search_array(data.draw)
    if data.draw(st.booleans()):
        times.flags.writeable = False  # a read-only mapping's view
    start = data.draw(mostly(st.integers(0, len(times)), hostile_int))
    end = data.draw(mostly(st.integers(0, len(times)), hostile_int))
    target = data.draw(mostly(st.integers(-6, 41), hostile_int))
    c_out = _c("first_reaching", times, start, end, target)
    in_range = all(INT64_MIN <= value <= INT64_MAX for value in (start, end, target))
    if times.dtype == np.int64 and in_range:
        py_out = _call(time_index.first_reaching_py, times, start, end, target, errors=PY_ERRORS)
        _agree(c_out, py_out)
    if c_out[0] == "ok":
        assert c_out[1] == -1 or start <= c_out[1] < end


# ------------------------------------------------------- Kafka record batch spans


@FUZZ
@given(st.data())
def test_fuzz_record_spans(data: st.DataObject) -> None:
    """Random bytes, or a real batch's records with a byte rewritten, walked with a
    window, count and last delta that may be negative, past the buffer or past int64.
    C and the twin (segmented.record_batch.record_spans_py) agree, error positions
    included, and every span C returns lies inside the window."""
    from mqstore.segmented import batch_builder
    from mqstore.segmented import record_batch as rb

    assert NATIVE is not None
    if data.draw(st.booleans()):
        buffer = data.draw(st.binary(max_size=120))
    else:
        keys = data.draw(st.lists(st.none() | st.binary(max_size=9), min_size=1, max_size=4))
        records = [rb_record(key, data.draw(st.none() | st.binary(max_size=9))) for key in keys]
        batch = bytearray(batch_builder.build(records, 7, False, 1 << 20).batch)
        if data.draw(st.booleans()):
            at = data.draw(st.integers(rb.HEADER_SIZE, len(batch) - 1))
            batch[at] = data.draw(st.integers(0, 255))
        buffer = bytes(batch)
    length = len(buffer)
    start = data.draw(mostly(st.integers(0, length), hostile_int))
    end = data.draw(mostly(st.integers(0, length), hostile_int))
    count = data.draw(mostly(st.integers(0, 6), hostile_int))
    last_delta = data.draw(mostly(st.integers(-1, 6), hostile_int))
    c_out = _c("record_spans", buffer, start, end, count, last_delta)
    if all(INT64_MIN <= v <= INT64_MAX for v in (start, end, count, last_delta)):
        py_out = _call(rb.record_spans_py, buffer, start, end, count, last_delta)
        assert c_out[0] == py_out[0], (c_out, py_out)
        if c_out[0] == "ok":
            assert c_out[1] == py_out[1]
    if c_out[0] == "ok":
        rows = np.frombuffer(c_out[1], dtype=np.int64).reshape(-1, 7).tolist()
        assert len(rows) == count
        for _, key_start, key_size, value_start, value_size, record_start, _ in rows:
            assert start <= record_start < end
            assert start <= key_start and key_start + max(key_size, 0) <= end
            assert start <= value_start and value_start + max(value_size, 0) <= end


@FUZZ
@given(st.data())
def test_fuzz_kafka_values(data: st.DataObject) -> None:
    """record_spans' inputs (random bytes, or a real batch with a byte rewritten, and
    hostile windows and counts) into kafka_values: C and its twin
    (mqstore.broker.produce_columns.kafka_values_py) agree, and what C gathers fits."""
    from mqstore.broker.produce_columns import kafka_values_py
    from mqstore.segmented import batch_builder
    from mqstore.segmented import record_batch as rb

    if data.draw(st.booleans()):
        buffer = data.draw(st.binary(max_size=120))
    else:
        keys = data.draw(st.lists(st.none() | st.binary(max_size=9), min_size=1, max_size=4))
        records = [rb_record(key, data.draw(st.none() | st.binary(max_size=9))) for key in keys]
        batch = bytearray(batch_builder.build(records, 7, False, 1 << 20).batch)
        if data.draw(st.booleans()):
            batch[data.draw(st.integers(rb.HEADER_SIZE, len(batch) - 1))] = data.draw(
                st.integers(0, 255)
            )
        buffer = bytes(batch)
    length = len(buffer)
    start = data.draw(mostly(st.integers(0, length), hostile_int))
    end = data.draw(mostly(st.integers(0, length), hostile_int))
    count = data.draw(mostly(st.integers(0, 6), hostile_int))
    last_delta = data.draw(mostly(st.integers(-1, 6), hostile_int))
    c_out = _c("kafka_values", buffer, start, end, count, last_delta)
    if all(INT64_MIN <= v <= INT64_MAX for v in (start, end, count, last_delta)):
        _agree(c_out, _call(kafka_values_py, buffer, start, end, count, last_delta))
    if c_out[0] == "ok":
        _, values, offsets = c_out[1]
        assert len(values) <= max(end - start, 0)
        assert np.frombuffer(offsets, dtype=np.int64).tolist()[-1] == len(values)


@FUZZ
@given(
    columns=st.deferred(lambda: _hostile_columns()),
    first=mostly(st.integers(0, 3), hostile_int),
    count=mostly(st.integers(1, 3), hostile_int),
    budget=mostly(st.integers(0, 400), hostile_int),
)
def test_fuzz_kafka_batch(columns: tuple[Any, ...], first: int, count: int, budget: int) -> None:
    """Hostile columns (offsets outside their data or out of order, mangled properties,
    properties starts anywhere) and hostile first/count/budget into kafka_batch: C
    returns or raises, and agrees with its twin (fetch_batch.kafka_batch_py)."""
    from mqstore.broker.fetch_batch import kafka_batch_py

    args = (first, count, budget, True, False, *columns)
    c_out = _c("kafka_batch", *args)
    if all(INT64_MIN <= v <= INT64_MAX for v in (first, count, budget)):
        py_out = _call(kafka_batch_py, *args)
        assert c_out[0] == py_out[0], (c_out, py_out)
        if c_out[0] == "ok":
            assert bytes(c_out[1][0] or b"") == bytes(py_out[1][0] or b"")


def _hostile_columns() -> Any:
    from tests.mqstore.broker.test_fetch_batch import hostile_columns

    return hostile_columns()


def rb_record(key: bytes | None, value: bytes | None) -> Any:
    from mqstore.engine import ProducerRecord

    return ProducerRecord(key, value, [("h", b"x")] if key == b"h" else [], None)


# --------------------------------------------------------------------- the tally


def test_zz_every_native_function_was_fuzzed() -> None:
    """Print (and with MQSTORE_FUZZ_REPORT, save) the inputs tried per function; when
    the whole module ran, every function the C module exports must be among them."""
    assert NATIVE is not None
    # Types: Row is fuzzed through the function that makes its objects (rows);
    # AppendLock, Appender and Putter, which callers construct, directly.
    exported = sorted(
        name
        for name in dir(NATIVE)
        if not name.startswith("_")
        and callable(getattr(NATIVE, name))
        and not isinstance(getattr(NATIVE, name), type)
    )
    tally = {name: {"tried": TRIED[name], "accepted": ACCEPTED[name]} for name in sorted(TRIED)}
    print("\nfuzz inputs per native function (accepted: C returned, not raised):", tally)
    report = os.environ.get("MQSTORE_FUZZ_REPORT")
    if report:
        with open(report, "w") as out:
            json.dump({"examples_setting": EXAMPLES, "functions": tally}, out, indent=1)
    if len(TRIED) < 2:
        pytest.skip("run the whole module to check coverage")
    # Every function, and the types a caller constructs (AppendLock, Appender, Putter).
    assert sorted(set(exported) - set(TRIED)) == []
    assert [name for name in TRIED if not hasattr(NATIVE, name)] == []
