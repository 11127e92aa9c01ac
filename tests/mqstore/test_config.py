"""StoreConfig: the lean defaults, the broker profile, and the prepare-next setting."""

from __future__ import annotations

import pytest

from mqstore import ConfigError, StoreConfig
from mqstore.commitlog.config import GIB, MIB
from mqstore.config import BROKER_PROFILE, PROFILES
from mqstore.indexfile import IndexConfig


def _index_file_bytes(config: StoreConfig) -> int:
    return IndexConfig(
        slot_count=config.index_slot_count, entry_count=config.index_entry_count
    ).file_size_bytes


def test_defaults_are_an_embedded_stores():
    config = StoreConfig()
    assert config.commitlog_file_size_bytes == 128 * MIB
    assert config.commitlog_prepare_next_percent == 50
    assert (config.index_slot_count, config.index_entry_count) == (262_144, 1_048_576)
    assert _index_file_bytes(config) == 22_020_144  # 21 MiB
    # An index file covers as many 128-byte records as a CommitLog file holds.
    assert config.index_entry_count * 128 == config.commitlog_file_size_bytes
    assert config.explicit_settings == frozenset()
    commitlog = config.commitlog_config()
    assert commitlog.file_size_bytes == 128 * MIB
    assert commitlog.prepare_next_percent == 50


def test_the_broker_profile_has_rocketmqs_sizes():
    config = StoreConfig.broker()
    assert config.commitlog_file_size_bytes == GIB
    assert config.commitlog_prepare_next_percent == 0  # the next file at once
    assert (config.index_slot_count, config.index_entry_count) == (5_000_000, 20_000_000)
    assert _index_file_bytes(config) == 420_000_048
    assert config.commitlog_config().prepare_next_percent == 0
    assert config.explicit_settings == frozenset(BROKER_PROFILE)  # a stated layout
    assert PROFILES["broker"] is BROKER_PROFILE
    # Everything else is the default.
    assert config.flush_mode == StoreConfig().flush_mode
    assert config.prewarm == StoreConfig().prewarm


def test_broker_overrides_win_and_count_as_explicit():
    config = StoreConfig.broker(prewarm=False, commitlog_file_size_bytes=256 * MIB)
    assert (config.prewarm, config.commitlog_file_size_bytes) == (False, 256 * MIB)
    assert config.index_entry_count == 20_000_000
    assert "prewarm" in config.explicit_settings
    with pytest.raises(ConfigError, match="unknown StoreConfig settings: colour"):
        StoreConfig.broker(colour="red")


def test_the_broker_profile_cannot_be_changed():
    with pytest.raises(TypeError):
        BROKER_PROFILE["commitlog_file_size_bytes"] = 1  # type: ignore[index]


@pytest.mark.parametrize("percent", [0, 1, 50, 99])
def test_prepare_next_percent_in_bounds(percent):
    config = StoreConfig(commitlog_prepare_next_percent=percent)
    assert config.commitlog_config().prepare_next_percent == percent


@pytest.mark.parametrize("percent", [-1, 100, 50.0, "50", None])
def test_prepare_next_percent_out_of_bounds_names_the_field(percent):
    with pytest.raises(ConfigError, match=r"StoreConfig\.commitlog_prepare_next_percent"):
        StoreConfig(commitlog_prepare_next_percent=percent)
