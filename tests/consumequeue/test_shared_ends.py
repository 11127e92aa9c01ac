"""The shared log's ``ends`` file: round trips, and every kind of damage refused."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.errors import CorruptDataError
from mqstore.consumequeue.format import SHARED_ENDS_FILE, SHARED_ENDS_HEADER, SHARED_ENDS_MAGIC
from mqstore.consumequeue.shared_ends import read_ends, write_ends


# No deadline: each example fsyncs twice, which took 776 ms once on a loaded machine
# (hypothesis' 200 ms deadline failed `make unit`; the rerun took 3 ms).
@settings(deadline=None)
@given(ends=st.dictionaries(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), max_size=20))
def test_round_trip(tmp_path_factory, ends) -> None:
    directory = str(tmp_path_factory.mktemp("ends"))
    assert read_ends(directory) == {}  # absent: empty
    write_ends(directory, ends)
    assert read_ends(directory) == ends
    write_ends(directory, {})
    assert read_ends(directory) == {}
    assert os.listdir(directory) == [SHARED_ENDS_FILE]  # no temporary left


def _damage(directory: str, change) -> None:
    path = os.path.join(directory, SHARED_ENDS_FILE)
    with open(path, "rb") as file:
        data = bytearray(file.read())
    with open(path, "wb") as file:
        file.write(change(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda data: data[:5], "has no header"),
        (lambda data: b"\0\0\0\0" + data[4:], "bad ends magic"),
        (lambda data: data[:-1], "do not fit"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "checksum"),
    ],
)
def test_damage_is_refused(tmp_path, change, message) -> None:
    write_ends(str(tmp_path), {3: 7, 9: 1})
    _damage(str(tmp_path), change)
    with pytest.raises(CorruptDataError, match=message):
        read_ends(str(tmp_path))


def test_a_negative_entry_is_refused(tmp_path) -> None:
    write_ends(str(tmp_path), {3: 7})

    def negative(data: bytearray) -> bytes:
        body = bytes(data[SHARED_ENDS_HEADER.size : -8]) + (-1).to_bytes(8, "little", signed=True)
        header = SHARED_ENDS_HEADER.pack(SHARED_ENDS_MAGIC, 1, zlib.crc32(body))
        return header + body

    _damage(str(tmp_path), negative)
    with pytest.raises(CorruptDataError, match="negative"):
        read_ends(str(tmp_path))
