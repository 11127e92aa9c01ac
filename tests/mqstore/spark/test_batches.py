"""Arrow batches of a queue (mqstore/spark/batches.py), without a Spark session: the
columns hold what get() returns, the value and key columns are the columnar read's
buffers, and a corrupt record is CorruptDataError."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from mqstore import CorruptDataError, MessageStore, StoreConfig  # noqa: E402
from mqstore.commitlog_engine import KEY_PROPERTY  # noqa: E402
from mqstore.spark.batches import arrow_schema, read_range  # noqa: E402
from mqstore.spark.offsets import OffsetRange  # noqa: E402
from tests.mqstore.conftest import SMALL  # noqa: E402

CONFIG = StoreConfig(**{**SMALL, "commitlog_file_size_bytes": 64 * 1024})


def _fill(store: MessageStore, count: int) -> None:
    store.create_topic("t", 1)
    for i in range(count):
        properties = [("h", b"%d" % i)] + ([(KEY_PROPERTY, b"k%d" % i)] if i % 2 else [])
        store.put("t", 0, None if i % 7 == 0 else bytes([i % 256]) * (i * 37 % 900),
                  keys=[f"a{i}", "b"] if i % 3 else (), tag=f"tag{i}" if i % 4 else None,
                  properties=properties, born_timestamp_ms=1_000 + i)  # fmt: skip


def _read(store: MessageStore, end: int, max_bytes: int = 1 << 20, **flags: bool) -> list:
    schema = arrow_schema(include_headers=True, include_rocketmq_columns=True)
    options = {"log_append_time": False, "verify_checksums": True, "fail_on_data_loss": True,
               **flags}  # fmt: skip
    return list(read_range(store, OffsetRange("t", 0, 0, end), schema,
                           max_bytes_per_batch=max_bytes, **options))  # fmt: skip


def test_columns_hold_what_get_returns(tmp_path) -> None:
    with MessageStore.open(tmp_path / "s", CONFIG) as store:
        _fill(store, 200)
        messages = store.get("t", 0, 0, 200)  # also dispatches what read_range reads
        batches = _read(store, 200, max_bytes=20_000)  # several batches, several files
        assert len(batches) > 3 and store.commitlog.file_count > 1
        table = pa.Table.from_batches(batches)
        assert table.column("offset").to_pylist() == list(range(200))
        assert table.column("value").to_pylist() == [m.value for m in messages]
        assert table.column("key").to_pylist() == [
            dict(m.properties).get(KEY_PROPERTY) for m in messages
        ]
        assert table.column("tags").to_pylist() == [m.tag for m in messages]
        assert table.column("keys").to_pylist() == [list(m.keys) for m in messages]
        assert table.column("headers").to_pylist() == [
            [{"key": "h", "value": b"%d" % i}] for i in range(200)
        ]
        stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
        assert stamps == [(1_000 + i) * 1000 for i in range(200)]


def test_a_corrupt_record_is_corrupt_data_unless_checksums_are_off(tmp_path) -> None:
    with MessageStore.open(tmp_path / "s", CONFIG) as store:
        _fill(store, 20)
        victim = store.get("t", 0, 5, 1)[0]  # also dispatches what read_range reads
        mapped = store.commitlog.file_for(victim.physical_offset)
        mapped.mapping[victim.physical_offset - mapped.start_offset + victim.size - 1] ^= 1
        with pytest.raises(CorruptDataError, match="checksum"):
            _read(store, 20)
        table = pa.Table.from_batches(_read(store, 20, verify_checksums=False))
        assert table.num_rows == 20
