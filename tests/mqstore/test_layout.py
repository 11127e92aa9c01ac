"""The recorded layout: written by the writer, read by config-less openers, and a
mismatching config refused before any file is touched."""

from __future__ import annotations

import json
import os

import pytest

from mqstore import ConfigError, CorruptDataError, MessageStore, StoreConfig
from mqstore.cli_verify import disk_layout
from mqstore.layout import LAYOUT_FILE, load_layout
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
