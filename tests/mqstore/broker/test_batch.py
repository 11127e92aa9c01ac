"""Produced batches: the checks a broker makes, every codec, and bad bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from mqstore.broker import batch as batch_module
from mqstore.broker.batch import InvalidBatchError, check_produced, decode_produced
from mqstore.engine import EngineBatch

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def built(codec: str = "none", count: int = 5, value: bytes = b"value") -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=CODECS[codec], is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24,
    )  # fmt: skip
    for i in range(count):
        key = None if i == 0 else b"k%d" % i
        builder.append(i, timestamp=1_000 + i, key=key, value=value + b"%d" % i, headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_every_codec_decodes(codec: str) -> None:
    records = decode_produced(check_produced(built(codec, 50)))
    assert len(records) == 50
    assert records[0].key is None
    assert records[9] == (b"k9", b"value9", [], 1_009)


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (lambda b: b[:-1], 2),  # cut short
        (lambda b: b + b, 87),  # two batches for one partition
        (lambda b: b[:16] + b"\x01" + b[17:], 2),  # magic 1
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), 2),  # a flipped bit under the CRC
        (lambda b: b[:40], 2),  # shorter than a header
    ],
)
def test_bad_batches_are_refused_with_kafka_codes(damage, code) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidBatchError) as raised:
        check_produced(damage(built()))
    assert raised.value.error_code == code


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_decompression_bomb_is_refused(monkeypatch: pytest.MonkeyPatch, codec: str) -> None:
    monkeypatch.setattr(batch_module, "INFLATED_BYTES_MAX", 10_000)
    bomb = check_produced(built(codec, 3, value=b"\0" * 50_000))
    with pytest.raises(InvalidBatchError, match="inflates past"):
        decode_produced(bomb)
    assert len(decode_produced(check_produced(built(codec, 3)))) == 3


def test_records_that_do_not_fill_the_batch_are_refused() -> None:
    from crc32c import crc32c

    data = bytearray(built(count=2))
    data[-1] ^= 0x7F  # inside the last record
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")  # a valid CRC over it
    batch = check_produced(bytes(data))
    with pytest.raises(InvalidBatchError):
        decode_produced(batch)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 4))
def test_random_bytes_never_escape_as_other_errors(tail: bytes, codec: int) -> None:
    """A valid header and CRC over random records: decode or InvalidBatchError."""
    from crc32c import crc32c

    head = bytearray(built()[:61])
    head += tail
    head[8:12] = (len(head) - 12).to_bytes(4, "big", signed=True)
    head[21:23] = codec.to_bytes(2, "big")
    head[17:21] = crc32c(bytes(head[21:])).to_bytes(4, "big")
    try:
        decode_produced(check_produced(bytes(head)))
    except InvalidBatchError:
        pass


def test_fetch_batch_round_trips() -> None:
    from mqstore.broker.batch import build_fetch_batch
    from mqstore.segmented.record_batch import decode_records

    batch = EngineBatch(
        [7, 8], [100, 90], [0, 0], [b"a", None], [b"x", None], [[("h", b"1")], []],
        [None, None], [1, -1], [1, -1], [2, 0],
    )  # fmt: skip
    data = bytes(build_fetch_batch(batch, 0, 2))
    header = check_produced(data).header
    assert (header.base_offset, header.records_count, header.max_timestamp) == (7, 2, 100)
    records = decode_records(data, 0, header, 7, 2)
    assert [(r.offset, r.timestamp_ms, r.key, r.value) for r in records] == [
        (7, 100, b"a", b"x"),
        (8, 90, None, None),
    ]
    assert records[0].headers == [("h", b"1")]
