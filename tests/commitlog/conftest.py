from __future__ import annotations

import pytest

from mqstore.commitlog.commitlog import CommitLog
from mqstore.commitlog.config import CommitLogConfig

SMALL_FILE_BYTES = 64 * 1024


@pytest.fixture
def small_config() -> CommitLogConfig:
    return CommitLogConfig(file_size_bytes=SMALL_FILE_BYTES, prewarm=False)


@pytest.fixture
def open_log(tmp_path, small_config):
    """Open logs in tmp_path/commitlog and close every one at the end."""
    opened: list[CommitLog] = []

    def factory(config: CommitLogConfig | None = None, **kwargs) -> CommitLog:
        log = CommitLog.open(str(tmp_path / "commitlog"), config or small_config, **kwargs)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()
