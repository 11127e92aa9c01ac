"""SegmentedConfig: Kafka's defaults and bounded, typed fields."""

from __future__ import annotations

import pytest

from mqstore.commitlog.errors import ConfigError
from mqstore.segmented import SegmentedConfig


def test_defaults_are_kafkas():
    config = SegmentedConfig()
    assert config.segment_bytes == 1 << 30
    assert config.segment_ms == 7 * 24 * 3600 * 1000
    assert config.index_interval_bytes == 4096
    assert config.index_max_bytes == 10 << 20
    assert config.retention_ms == 7 * 24 * 3600 * 1000 and config.retention_bytes == -1
    assert config.file_delete_delay_ms == 60_000
    assert config.retention_check_interval_ms == 300_000
    assert config.flush_mode == "async"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("segment_bytes", 1023),
        ("segment_bytes", 2**31),  # positions in .index are int32
        ("segment_bytes", "1 GiB"),
        ("segment_bytes", True),
        ("segment_ms", 0),
        ("index_interval_bytes", -1),
        ("index_max_bytes", 23),
        ("flush_mode", "sometimes"),
        ("flush_interval_ms", 0),
        ("sync_flush_timeout_ms", 0),
        ("retention_ms", -2),
        ("retention_bytes", -5),
        ("retention_bytes", 1.5),
        ("file_delete_delay_ms", -1),
        ("max_message_size_bytes", 64),
        ("inactive_index_maps_max", 1),
    ],
)
def test_out_of_bounds_values_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=field):
        SegmentedConfig(**{field: value})


def test_minus_one_means_unlimited_retention():
    config = SegmentedConfig(retention_ms=-1, retention_bytes=-1)
    assert (config.retention_ms, config.retention_bytes) == (-1, -1)


def test_fields_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        SegmentedConfig(4096)  # type: ignore[misc]
    config = SegmentedConfig()
    with pytest.raises(AttributeError):
        config.segment_bytes = 5  # type: ignore[misc]
