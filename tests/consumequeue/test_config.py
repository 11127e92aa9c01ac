"""ConsumeQueueConfig: defaults, bounds, immutability."""

from __future__ import annotations

import attrs
import pytest

from mqstore.commitlog.errors import ConfigError
from mqstore.consumequeue import ConsumeQueueConfig


def test_defaults_follow_rocketmq() -> None:
    config = ConsumeQueueConfig()
    assert config.units_per_file == 300_000
    assert config.max_open_files == 4096
    assert config.time_index_interval_units == 1024


@pytest.mark.parametrize(
    "settings",
    [
        {"units_per_file": 0},
        {"units_per_file": 50_000_001},
        {"units_per_file": 8.0},
        {"max_open_files": 1},
        {"max_open_files": (1 << 20) + 1},
        {"time_index_interval_units": 0},
        {"time_index_interval_units": "8"},
    ],
)
def test_out_of_bounds_is_a_config_error(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ConsumeQueueConfig(**settings)  # type: ignore[arg-type]


def test_frozen_and_keyword_only() -> None:
    config = ConsumeQueueConfig(units_per_file=8)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.units_per_file = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        ConsumeQueueConfig(8)  # type: ignore[call-arg]
