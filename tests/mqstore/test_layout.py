"""The recorded layout: written by the writer, read by config-less openers, and a
mismatching config refused before any file is touched."""

from __future__ import annotations

import json
import os

import pytest

from mqstore import ConfigError, CorruptDataError, MessageStore, StoreConfig
from mqstore.atomic import json_checksum
from mqstore.cli_verify import disk_layout
from mqstore.commitlog.config import GIB
from mqstore.layout import LAYOUT_FILE, load_defaults, load_layout
from mqstore.spark.store_access import layout_config

SMALL = dict(commitlog_file_size_bytes=256 * 1024, consumequeue_units_per_file=64, prewarm=False)


def test_writer_records_the_layout_and_config_less_openers_follow_it(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.create_topic("t", partitions=2)  # topics, but no queue file yet
    assert load_layout(path) == {"commitlog_file_size_bytes": 256 * 1024,
                                 "consumequeue_units_per_file": 64}  # fmt: skip
    assert disk_layout(path)["consumequeue_units_per_file"] == 64
    config = layout_config(path)  # what a Spark task opens with
    assert config.consumequeue_units_per_file == 64
    with MessageStore.open(path, config) as store:
        store.put("t", 0, b"x")
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:  # the files agree
        assert [bytes(m.body) for m in store.get("t", 0, 0, 5)] == [b"x"]


@pytest.mark.parametrize("read_only", [False, True])
def test_a_config_that_disagrees_is_refused_and_changes_nothing(tmp_path, read_only):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.put("t", 0, b"kept")
    before = sorted(os.listdir(path))
    wrong = StoreConfig(**{**SMALL, "consumequeue_units_per_file": 128})
    with pytest.raises(ConfigError, match="consumequeue_units_per_file=64"):
        MessageStore.open(path, wrong, read_only=read_only)
    assert sorted(os.listdir(path)) == before
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        assert [bytes(m.body) for m in store.get("t", 0, 0, 5)] == [b"kept"]


def test_a_damaged_layout_is_corrupt_data(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path, StoreConfig(**SMALL)).close()
    layout_path = os.path.join(path, LAYOUT_FILE)
    with open(layout_path) as handle:
        document = json.load(handle)
    document["layout"]["consumequeue_units_per_file"] = 65
    with open(layout_path, "w") as handle:
        json.dump(document, handle)
    with pytest.raises(CorruptDataError):
        MessageStore.open(path, StoreConfig(**SMALL))


RECORDED = dict(SMALL, flush_mode="sync", retention_hours=5.0, retention_bytes=1 << 30)


def test_any_process_opens_any_store_without_its_config(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(**RECORDED)) as store:
        store.put("t", 0, b"first")
    with MessageStore.open(path, read_only=True) as reader:  # no config at all
        assert [bytes(m.body) for m in reader.get("t", 0, 0, 5)] == [b"first"]
        assert reader.config.commitlog_file_size_bytes == 256 * 1024
        assert (reader.config.flush_mode, reader.config.retention_hours) == ("sync", 5.0)
    with MessageStore.open(path) as writer:  # a writer with no config adopts it too
        assert writer.config.consumequeue_units_per_file == 64
        assert writer.config.retention_bytes == 1 << 30
        writer.put("t", 0, b"second")
    with MessageStore.open(path, StoreConfig(prewarm=False), read_only=True) as reader:
        assert [bytes(m.body) for m in reader.get("t", 0, 0, 5)] == [b"first", b"second"]
        assert reader.config.commitlog_file_size_bytes == 256 * 1024  # the rest adopted


def test_an_explicit_conflicting_layout_names_its_source(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path, StoreConfig(**SMALL)).close()
    with pytest.raises(ConfigError) as caught:
        MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=512 * 1024))
    message = str(caught.value)
    assert "StoreConfig(commitlog_file_size_bytes=524288)" in message
    assert "created with commitlog_file_size_bytes=262144" in message


def test_recorded_defaults_are_overridable_per_open_and_never_rewritten(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path, StoreConfig(**RECORDED)).close()
    with MessageStore.open(path, StoreConfig(flush_mode="async", retention_hours=1.0)) as store:
        assert (store.config.flush_mode, store.config.retention_hours) == ("async", 1.0)
        assert store.config.commitlog_file_size_bytes == 256 * 1024
    with MessageStore.open(path, read_only=True) as reader:  # the record is unchanged
        assert (reader.config.flush_mode, reader.config.retention_hours) == ("sync", 5.0)


def test_a_version_1_layout_is_read_and_upgraded_by_a_writer(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(**SMALL)) as store:
        store.put("t", 0, b"old")
    layout = {"commitlog_file_size_bytes": 256 * 1024, "consumequeue_units_per_file": 64}
    with open(os.path.join(path, LAYOUT_FILE), "w") as handle:  # as older versions wrote it
        json.dump({"layout": layout, "checksum": json_checksum(layout)}, handle)
    with MessageStore.open(path, read_only=True) as reader:
        assert reader.config.commitlog_file_size_bytes == 256 * 1024
        assert [bytes(m.body) for m in reader.get("t", 0, 0, 5)] == [b"old"]
    assert load_defaults(path) == {}
    MessageStore.open(path, StoreConfig(flush_mode="sync")).close()
    with open(os.path.join(path, LAYOUT_FILE)) as handle:
        assert json.load(handle)["version"] == 3
    assert load_layout(path) == layout
    assert load_defaults(path) == {"flush_mode": "sync", "retention_hours": 72.0,
                                   "retention_bytes": -1}  # fmt: skip


def _write_layout(path: str, version: int, defaults: dict) -> None:
    layout = {"commitlog_file_size_bytes": 256 * 1024, "consumequeue_units_per_file": 64}
    summed = {"layout": layout, "defaults": defaults}
    with open(os.path.join(path, LAYOUT_FILE), "w") as handle:
        json.dump({"version": version, **summed, "checksum": json_checksum(summed)}, handle)


def test_a_version_2_layout_is_upgraded_with_its_values_and_a_later_one_refused(tmp_path):
    """A writer rewrites version 2 (stop 23's) as version 3 with the values it
    recorded, so that code from before append groups refuses the store instead of
    reading their flag as corruption and cutting the log there; a version this code
    does not know is refused the same way, before any file is touched."""
    path = str(tmp_path / "s")
    MessageStore.open(path, StoreConfig(**SMALL)).close()
    recorded = {"flush_mode": "sync", "retention_hours": 5.0, "retention_bytes": -1}
    _write_layout(path, 2, recorded)
    MessageStore.open(path, StoreConfig(flush_mode="async")).close()
    with open(os.path.join(path, LAYOUT_FILE)) as handle:
        assert json.load(handle)["version"] == 3
    assert load_defaults(path) == recorded  # not the writer's explicit async
    _write_layout(path, 4, recorded)
    with pytest.raises(CorruptDataError, match="layout version 4"):
        MessageStore.open(path, read_only=True)


BROKER_DISK_BYTES = 3 * GIB  # two 1 GiB CommitLog files and a 420 MB index, allocated


def _free_bytes(path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def test_a_broker_profile_store_reopens_without_config(tmp_path):
    """A store made with the old defaults (RocketMQ's sizes, now the broker profile)
    opens with no config under the new defaults: its recorded sizes are adopted."""
    if _free_bytes(tmp_path) < BROKER_DISK_BYTES:
        pytest.skip(f"needs {BROKER_DISK_BYTES} bytes free in {tmp_path}")
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig.broker(prewarm=False)) as store:
        store.put("t", 0, b"broker", keys=["k1"])
    assert load_layout(path) == {"commitlog_file_size_bytes": GIB,
                                 "consumequeue_units_per_file": 300_000}  # fmt: skip
    for read_only in (True, False):
        with MessageStore.open(path, read_only=read_only) as store:
            assert store.config.commitlog_file_size_bytes == GIB
            assert [bytes(m.body) for m in store.get("t", 0, 0, 5)] == [b"broker"]
            hits = store.query_by_key("t", "k1", 0, 2**62, 5)
            assert [bytes(m.body) for m in hits] == [b"broker"]
    with MessageStore.open(path) as store:  # a writer with no config: writes go on
        store.put("t", 0, b"lean defaults")
    assert os.path.getsize(os.path.join(path, "commitlog", f"{0:020d}")) == GIB
    with MessageStore.open(path, read_only=True) as reader:
        assert [bytes(m.body) for m in reader.get("t", 0, 0, 5)] == [b"broker", b"lean defaults"]


def test_a_store_older_than_the_record_adopts_its_file_size(tmp_path):
    """Stores made before ``layout`` existed (1 GiB files, the default then) show
    their file size in their files: it is adopted and recorded, never the default.
    (Their units per file were the default, which has not changed.)"""
    path = str(tmp_path / "s")
    with MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=256 * 1024,
                                             prewarm=False)) as store:  # fmt: skip
        store.put("t", 0, b"old")
    os.unlink(os.path.join(path, LAYOUT_FILE))  # as stores older than the record are
    with MessageStore.open(path, read_only=True) as reader:
        assert reader.config.commitlog_file_size_bytes == 256 * 1024
        assert [bytes(m.body) for m in reader.get("t", 0, 0, 5)] == [b"old"]
    assert not os.path.exists(os.path.join(path, LAYOUT_FILE))  # a reader records nothing
    with pytest.raises(ConfigError, match="created with commitlog_file_size_bytes=262144"):
        MessageStore.open(path, StoreConfig(commitlog_file_size_bytes=512 * 1024))
    with MessageStore.open(path, StoreConfig(prewarm=False)) as writer:
        assert writer.config.commitlog_file_size_bytes == 256 * 1024
    assert load_layout(path)["commitlog_file_size_bytes"] == 256 * 1024


def test_the_broker_profile_is_refused_by_a_store_of_other_sizes(tmp_path):
    path = str(tmp_path / "s")
    MessageStore.open(path, StoreConfig(**SMALL)).close()
    before = sorted(os.listdir(path))
    with pytest.raises(ConfigError, match=r"StoreConfig\(commitlog_file_size_bytes=1073741824\)"):
        MessageStore.open(path, StoreConfig.broker())
    assert sorted(os.listdir(path)) == before
