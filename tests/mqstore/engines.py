"""The engines the adapter's conformance tests run against."""

from __future__ import annotations

from typing import Any

from mqstore import MessageStore, StoreConfig
from mqstore.segmented import SegmentedConfig, SegmentedStore
from tests.mqstore.conftest import SMALL

ENGINES = ["commitlog", "segmented"]


def open_engine(kind: str, path: Any, **overrides: Any) -> Any:
    if kind == "commitlog":
        return MessageStore.open(path, StoreConfig(**{**SMALL, **overrides}))
    if kind == "segmented":
        return SegmentedStore.open(path, SegmentedConfig(segment_bytes=256 * 1024, **overrides))
    raise AssertionError(f"unknown engine {kind}")
