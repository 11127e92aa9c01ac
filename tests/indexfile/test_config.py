"""IndexConfig: defaults and bounded validators."""

from __future__ import annotations

import attrs
import pytest

from mqstore.commitlog.config import FILE_SIZE_DEFAULT_BYTES
from mqstore.commitlog.errors import ConfigError
from mqstore.indexfile import IndexConfig
from mqstore.indexfile.config import ENTRY_COUNT_BROKER, SLOT_COUNT_BROKER


def test_defaults_cover_a_default_commitlog_file_of_small_records() -> None:
    config = IndexConfig()
    assert (config.slot_count, config.entry_count) == (262_144, 1_048_576)
    assert config.entry_count == FILE_SIZE_DEFAULT_BYTES // 128  # one key per 128 B record
    assert config.entry_count == 4 * config.slot_count  # RocketMQ's entries per slot
    assert config.file_size_bytes == 22_020_144  # 21 MiB


def test_broker_sizes_follow_rocketmq() -> None:
    config = IndexConfig(slot_count=SLOT_COUNT_BROKER, entry_count=ENTRY_COUNT_BROKER)
    assert (config.slot_count, config.entry_count) == (5_000_000, 20_000_000)
    assert config.file_size_bytes == 420_000_048


@pytest.mark.parametrize(
    "kwargs",
    [
        {"slot_count": 0},
        {"slot_count": 2**26 + 1},
        {"slot_count": 4.0},
        {"slot_count": True},
        {"entry_count": 1},
        {"entry_count": 2**27 + 1},
        {"entry_count": "64"},
    ],
)
def test_out_of_bounds_values_raise_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        IndexConfig(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen_and_keyword_only() -> None:
    config = IndexConfig(slot_count=1, entry_count=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.slot_count = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        IndexConfig(4, 64)  # type: ignore[misc]
