from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mqstore.engine import ProducerRecord
from mqstore.segmented import SegmentedConfig, SegmentedStore

SMALL = dict(
    segment_bytes=4096,
    index_interval_bytes=256,
    index_max_bytes=4096,
    file_delete_delay_ms=0,
    flush_interval_ms=60_000,  # the tests flush when they mean to
    retention_check_interval_ms=3_600_000,  # ...and run retention when they mean to
)


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python 3.0 (the external reader the tests check our files with) loads its
    # protocol schemas through deprecated importlib.resources calls at import time.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:kafka")
    config.addinivalue_line("filterwarnings", "ignore:open_text is deprecated:DeprecationWarning")


class FakeClock:
    """A wall clock the test moves by hand (ms)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, delta_ms: int) -> None:
        self.now_ms += delta_ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def small_config() -> SegmentedConfig:
    return SegmentedConfig(**SMALL)  # type: ignore[arg-type]


@pytest.fixture
def open_store(tmp_path, small_config, clock) -> Iterator:
    """Open stores (default: tmp_path/store, small config, the fake clock); every one
    still open is closed at the end."""
    opened: list[SegmentedStore] = []

    def factory(config: SegmentedConfig | None = None, path=None, **kwargs) -> SegmentedStore:
        kwargs.setdefault("clock_ms", clock)
        store = SegmentedStore.open(path or tmp_path / "store", config or small_config, **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        if not store._closed:
            store.close()


def record(value: bytes | None = b"v", key: bytes | None = None, headers=(), timestamp_ms=None):
    return ProducerRecord(key, value, list(headers), timestamp_ms)


def segment_files(directory: str, suffix: str = ".log") -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix))


def tree(root: str) -> dict[str, int]:
    """{relative path: size} of every file under ``root``: to show nothing changed."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = os.path.getsize(path)
    return found
