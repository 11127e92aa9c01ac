"""Fixtures shared by the ConsumeQueue tests: stores over a temporary directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from mqstore.consumequeue import ConsumeQueueConfig, ConsumeQueueStore

StoreFactory = Callable[..., ConsumeQueueStore]


@pytest.fixture
def cq_dir(tmp_path: object) -> str:
    return os.path.join(str(tmp_path), "consumequeue")


@pytest.fixture
def open_store(cq_dir: str) -> Iterator[StoreFactory]:
    """Open stores on ``cq_dir`` (small files by default); all are closed at teardown."""
    opened: list[ConsumeQueueStore] = []

    def factory(read_only: bool = False, **config: int) -> ConsumeQueueStore:
        settings = {"units_per_file": 8, "max_open_files": 16, "time_index_interval_units": 3}
        settings.update(config)
        store = ConsumeQueueStore.open(cq_dir, ConsumeQueueConfig(**settings), read_only=read_only)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
