"""CommitLogConfig: the lean defaults and the bounds of prepare_next_percent."""

from __future__ import annotations

import pytest

from mqstore.commitlog.config import (
    FILE_SIZE_DEFAULT_BYTES,
    MIB,
    PREPARE_NEXT_PERCENT_DEFAULT,
    CommitLogConfig,
)
from mqstore.commitlog.errors import ConfigError


def test_defaults_are_an_embedded_stores():
    config = CommitLogConfig()
    assert config.file_size_bytes == FILE_SIZE_DEFAULT_BYTES == 128 * MIB
    assert config.prepare_next_percent == PREPARE_NEXT_PERCENT_DEFAULT == 50
    assert config.preallocate_next


@pytest.mark.parametrize("percent", [0, 1, 50, 99])
def test_prepare_next_percent_in_bounds(percent):
    assert CommitLogConfig(prepare_next_percent=percent).prepare_next_percent == percent


@pytest.mark.parametrize("percent", [-1, 100, 250, 50.0, "50", None])
def test_prepare_next_percent_out_of_bounds_is_a_config_error(percent):
    with pytest.raises(ConfigError, match="prepare_next_percent"):
        CommitLogConfig(prepare_next_percent=percent)
