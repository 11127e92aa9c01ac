"""IndexFile and MappedIndexCache: lazy maps of inactive indexes, and their bound."""

from __future__ import annotations

import os

from mqstore.segmented.index_file import MappedIndexCache
from mqstore.segmented.offset_index import OffsetIndex


def _inactive_index(tmp_path, name: str, cache: MappedIndexCache) -> OffsetIndex:
    index = OffsetIndex.create(str(tmp_path / name), 0, 4096)
    for i in range(1, 20):
        index.append(i, i * 100)
    index.trim()
    loaded = OffsetIndex.load(index.path, 0, 4096)
    loaded.attach_cache(cache)
    return loaded


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_inactive_index_is_mapped_only_when_looked_up(tmp_path):
    cache = MappedIndexCache(capacity=8)
    index = _inactive_index(tmp_path, "a.index", cache)
    assert not index.is_mapped and len(cache) == 0
    before = _fds()
    assert index.lookup(5) == (5, 500)
    assert index.is_mapped and len(cache) == 1
    assert _fds() == before + 1  # Python's mmap holds a duplicate of the fd
    index.close()
    assert len(cache) == 0 and _fds() == before


def test_cache_unmaps_the_least_recently_used_beyond_its_capacity(tmp_path):
    cache = MappedIndexCache(capacity=2)
    indexes = [_inactive_index(tmp_path, f"{i}.index", cache) for i in range(3)]
    before = _fds()
    indexes[0].lookup(5)
    indexes[1].lookup(5)
    indexes[0].lookup(5)  # 0 is now the most recently used
    indexes[2].lookup(5)  # evicts 1
    assert [index.is_mapped for index in indexes] == [True, False, True]
    assert cache.evictions == 1 and len(cache) == 2
    assert _fds() == before + 2
    assert indexes[1].lookup(7) == (7, 700)  # remapped on demand, evicting 0
    assert [index.is_mapped for index in indexes] == [False, True, True]
    for index in indexes:
        index.close()


def test_active_indexes_stay_out_of_the_cache(tmp_path):
    cache = MappedIndexCache(capacity=2)
    index = OffsetIndex.create(str(tmp_path / "active.index"), 0, 4096)
    index.attach_cache(cache)
    index.append(3, 100)
    assert index.lookup(4) == (3, 100)
    assert len(cache) == 0 and index.is_mapped
    index.close()
