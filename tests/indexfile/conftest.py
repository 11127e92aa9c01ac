"""Fixtures and the dict model shared by the indexfile tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import attrs
import pytest

from mqstore.indexfile import IndexConfig, IndexService

TINY = IndexConfig(slot_count=4, entry_count=64)
BASE_TS_MS = 1_700_000_000_000  # a realistic store time (2023-11)


@attrs.frozen
class Message:
    topic: str
    keys: tuple[str, ...]
    store_ts_ms: int


@attrs.define
class Model:
    """What the index should answer: physical offset -> message, in put order."""

    messages: dict[int, Message] = attrs.field(factory=dict)
    verify_calls: list[int] = attrs.field(factory=list)

    def put(self, topic: str, keys: Sequence[str], offset: int, store_ts_ms: int) -> None:
        if keys and (not self.messages or offset > max(self.messages)):
            self.messages[offset] = Message(topic, tuple(keys), store_ts_ms)

    def truncate(self, physical_end: int) -> None:
        self.messages = {o: m for o, m in self.messages.items() if o < physical_end}

    def verify(
        self, topic: str, key: str, begin_ts_ms: int, end_ts_ms: int
    ) -> Callable[[int], bool]:
        """The caller's check of the real record (topic, key and store time)."""

        def check(offset: int) -> bool:
            self.verify_calls.append(offset)
            message = self.messages.get(offset)
            return (
                message is not None
                and message.topic == topic
                and key in message.keys
                and begin_ts_ms <= message.store_ts_ms <= end_ts_ms
            )

        return check

    def expected(
        self, topic: str, key: str, begin_ts_ms: int, end_ts_ms: int, max_results: int
    ) -> list[int]:
        check = self.verify(topic, key, begin_ts_ms, end_ts_ms)
        hits = [offset for offset in sorted(self.messages, reverse=True) if check(offset)]
        self.verify_calls.clear()
        return hits[:max_results]

    def query(
        self,
        index: IndexService,
        topic: str,
        key: str,
        begin_ts_ms: int = 0,
        end_ts_ms: int = 2**62,
        max_results: int = 1000,
    ) -> list[int]:
        """Query the index with this model's verify callback."""
        return index.query(
            topic,
            key,
            begin_ts_ms,
            end_ts_ms,
            max_results,
            self.verify(topic, key, begin_ts_ms, end_ts_ms),
        )


@pytest.fixture
def model() -> Model:
    return Model()


@pytest.fixture
def index_dir(tmp_path) -> str:
    return str(tmp_path / "index")


@pytest.fixture
def open_index(index_dir) -> Iterator[Callable[..., IndexService]]:
    """Open services on index_dir (TINY config unless given); close them all at the end."""
    opened: list[IndexService] = []

    def factory(config: IndexConfig = TINY, *, read_only: bool = False) -> IndexService:
        service = IndexService.open(index_dir, config, read_only=read_only)
        opened.append(service)
        return service

    yield factory
    for service in opened:
        service.close()
