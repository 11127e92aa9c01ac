from __future__ import annotations

import pytest

from mqstore import MessageStore, StoreConfig

SMALL = dict(
    commitlog_file_size_bytes=256 * 1024,
    consumequeue_units_per_file=64,
    index_slot_count=64,
    index_entry_count=512,
    prewarm=False,
    checkpoint_interval_ms=50,
    # Every queue has files of its own from its first unit: the tests here inspect and
    # damage those files; the shared unit log has its own tests (test_shared_queues.py).
    consumequeue_shared_units_max=0,
)


@pytest.fixture
def small_config() -> StoreConfig:
    return StoreConfig(**SMALL)


@pytest.fixture
def open_store(tmp_path, small_config):
    opened: list[MessageStore] = []

    def factory(config: StoreConfig | None = None, path=None, **kwargs) -> MessageStore:
        store = MessageStore.open(path or tmp_path / "store", config or small_config, **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
