"""The store's internal topics: state a client can observe, kept in the log.

Everything a client can observe must reach a follower through the one stream it
copies (the CommitLog), so state that used to live in side files is written as
records of internal topics instead, and folded back into memory at open, after a
promotion and after a truncation:

- ``__consumer_offsets``: committed consumer offsets (mqstore.offsets_log), Kafka's
  own topic name and record formats;
- ``__mqstore_producer_state``: the idempotent producer's last batches per
  (producer id, topic, partition) (mqstore.broker.producers).

Both are compacted (one record per key survives cleaning, so a rebuild reads a
bounded number of records), hidden from topic listings as Kafka hides its internal
topics, and refused to clients' writes. ``InternalLog`` is the narrow view of the
store the folding code gets: it never imports the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from mqstore.commitlog.batch import Trailer
    from mqstore.engine import EngineBatch

__all__ = ["INTERNAL_TOPICS", "OFFSETS_TOPIC", "PRODUCERS_TOPIC", "InternalLog"]

OFFSETS_TOPIC: Final = "__consumer_offsets"  # Kafka's name
PRODUCERS_TOPIC: Final = "__mqstore_producer_state"  # Kafka derives it from batch headers
INTERNAL_TOPICS: Final = frozenset({OFFSETS_TOPIC, PRODUCERS_TOPIC})


@attrs.frozen(kw_only=True)
class InternalLog:
    """One internal topic (one partition) as the code that folds it sees it.

    Attributes:
        append: appends (key, value) records (value None: a tombstone); raises
            NotLeaderError on a follower. Durable on return when the topic's user
            asked for it (committed offsets), else as the store's flush mode says.
        read: records from a queue offset (empty past the end, or before the topic
            exists).
        bounds: (earliest, latest) offsets ((0, 0) before the topic exists).
        is_follower: whether the store copies a leader's log now.
        trailer: ``trailer(key, value_for)`` makes the record (key, ``value_for(the
            batch's first offset)``) the trailer of a batch (the topic is created
            first when missing): given to the batch's append, it is written right
            after the batch as one append group, so a crash keeps both or neither
            (mqstore.commitlog.batch.Trailer).
        read_unexposed: ``read_unexposed(offset)``: the topic's (key, value) records
            from ``offset`` on that readers do not see yet (a leader restarted held:
            mqstore.store_replica), in log order: state folded at leadership covers
            the whole log, as Kafka rebuilds producer state up to the log end, not
            the high watermark. ``offset``: the next one ``read`` did not return (a
            compacted topic's reads can return records past what readers see).
    """

    append: Callable[[Sequence[tuple[bytes, bytes | None]]], None]
    read: Callable[[int], EngineBatch]
    bounds: Callable[[], tuple[int, int]]
    is_follower: Callable[[], bool]
    trailer: Callable[[bytes, Callable[[int], bytes]], Trailer]
    read_unexposed: Callable[[int], list[tuple[bytes | None, bytes | None]]]
