"""The CommitLog engine's record mapping (mqstore.commitlog_engine): Kafka keys and
headers as properties of one message."""

from __future__ import annotations

from typing import Any

import pytest

from mqstore.commitlog.errors import InvalidRecordError
from mqstore.engine import ProducerRecord
from tests.mqstore.engines import open_engine


def test_a_header_in_the_stores_reserved_namespace_is_refused(tmp_path: Any) -> None:
    """A header named like the store's key property ("\\x00key") read back as the
    record's key (found by hypothesis in test_fetch_batch): NUL-prefixed header names
    are refused (Kafka's INVALID_RECORD through the broker), and nothing of the batch
    is appended; other names, NUL inside included, round-trip."""
    store = open_engine("commitlog", tmp_path / "store")
    try:
        store.create_topic("t", 1)
        for name in ("\x00key", "\x00other"):
            with pytest.raises(InvalidRecordError, match="reserved"):
                store.append_records(
                    "t", 0,
                    [ProducerRecord(None, b"fine", [], None),
                     ProducerRecord(None, b"v", [(name, b"")], None)],
                )  # fmt: skip
        assert store.latest_offset("t", 0) == 0
        store.append_records("t", 0, [ProducerRecord(None, b"v", [("a\x00key", b"x")], None)])
        read = store.read_records("t", 0, 0, 10)
        assert [(r.key, r.headers) for r in read] == [(None, [("a\x00key", b"x")])]
    finally:
        store.close()
