"""QueueTable: the dict and the per-topic seeds stay disjoint, and together they say
what a plain dict of next offsets says (hypothesis against that model)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mqstore.commitlog.queue_table import QueueTable

TOPICS = ("a", "b", "c")
QUEUES = 6
SEED_LENGTHS = {"a": 4, "b": 0, "c": 6}  # b's loader returns an empty seed: loaded alone


def _stored(topic: str, queue_id: int) -> int:
    """What the ConsumeQueue says a queue's next offset is (the loaders' answer)."""
    return 100 * TOPICS.index(topic) + 10 * queue_id


def _table() -> tuple[QueueTable, list[Any]]:
    asked: list[Any] = []
    table = QueueTable()

    def topic_loader(topic: str) -> np.ndarray:
        asked.append(topic)
        seed = [_stored(topic, q) for q in range(SEED_LENGTHS[topic])]
        if topic == "c":
            seed[5] = -1  # a queue the seed leaves to the queue loader
        return np.array(seed, dtype=np.int64)

    def queue_loader(topic: str, queue_id: int) -> int:
        asked.append((topic, queue_id))
        return _stored(topic, queue_id)

    table.topic_loader, table.queue_loader = topic_loader, queue_loader
    return table, asked


def _append(table: QueueTable, topic: str, queue_id: int) -> int | None:
    """What the Appender does: the seed's slot when it holds an offset, else the dict's
    entry; None when neither (the general path)."""
    seed = table.seeds.get(topic)
    if seed is not None and queue_id < len(seed) and seed[queue_id] >= 0:
        offset = int(seed[queue_id])
        seed[queue_id] = offset + 1
        return offset
    offset = table.table.get((topic, queue_id))
    if offset is not None:
        table.table[(topic, queue_id)] = offset + 1
    return offset


_keys = st.tuples(st.sampled_from(TOPICS), st.integers(0, QUEUES - 1))
# A scan or a replica's plan takes a record's int32 queue id as it is: negative ones
# too, which must never index a seed from its end.
_any_keys = st.tuples(st.sampled_from(TOPICS), st.integers(-2, QUEUES - 1))
_ops = st.one_of(
    st.tuples(st.just("append"), _keys),  # the C path, else the general path's get + set
    st.tuples(st.just("get"), _keys),
    st.tuples(st.just("set"), _any_keys, st.integers(0, 1_000)),  # a batch, a replica's plan
    st.tuples(st.just("scan"), st.lists(st.tuples(_any_keys, st.integers(0, 1_000)), max_size=4)),
    st.tuples(st.just("raise"), st.dictionaries(_any_keys, st.integers(0, 1_000), max_size=4)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ops, max_size=60))
# A negative id set after the last queue of a seed advanced in place must leave it be.
@example([("get", ("a", 0)), ("append", ("a", 3)), ("set", ("a", -1), 7), ("append", ("a", 3))])
# A replica's chunk below a seeded queue's offset leaves the queue where it is.
@example([("get", ("a", 0)), ("raise", {("a", 1): 5, ("a", 2): 25})])
def test_the_table_and_the_seeds_are_one_dict_of_next_offsets(ops: list[Any]) -> None:
    """After every step: no queue in both places, each place agrees with the model, and
    the snapshot is the model (every queue appended to, asked for, set or scanned)."""
    table, _ = _table()
    model: dict[tuple[str, int], int] = {}  # next offsets; a queue not in it: _stored
    for op in ops:
        if op[0] == "append":
            key = op[1]
            offset = _append(table, *key)
            if offset is None:  # the general path: get, then set
                offset = table.get(*key)
                table.set(key, offset + 1)
            assert offset == model.get(key, _stored(*key))
            model[key] = offset + 1
        elif op[0] == "get":
            key = op[1]
            model[key] = model.get(key, _stored(*key))
            assert table.get(*key) == model[key]
        elif op[0] == "set":
            table.set(op[1], op[2])
            model[op[1]] = op[2]
        elif op[0] == "raise":  # a replica's chunk: each queue to at least its end
            before = {key: table.known(*key) or 0 for key in op[1]}
            table.raise_to(op[1])
            for key, offset in op[1].items():
                if offset > before[key]:
                    model[key] = offset
        elif op[0] == "scan":  # scan_log writes the dict directly, then after_scan
            for key, offset in op[1]:
                table.table[key] = offset
                model[key] = offset
            table.after_scan()
        else:
            table.clear()
            model.clear()
        for topic, queue_id in table.table:  # disjoint
            seed = table.seeds.get(topic)
            assert seed is None or not 0 <= queue_id < len(seed) or seed[queue_id] < 0
        for key in [(t, q) for t in TOPICS for q in range(QUEUES)]:
            known = table.known(*key)
            assert known == model.get(key) if key in model else known in (None, _stored(*key))
        assert table.snapshot() == model


def test_a_seed_loads_once_per_topic_and_skips_the_queues_the_dict_holds() -> None:
    """The first queue of a topic the dict lacks loads the topic's seed (one call);
    queues a scan put in the dict before keep the dict's offset (their slots are
    cleared), queues past the seed or at -1 are loaded one by one; a snapshot lists
    what was appended or asked, not the seed's untouched queues."""
    table, asked = _table()
    table.table[("c", 1)] = 77  # counted by the scan at open
    table.after_scan()
    assert table.get("c", 0) == 200
    assert table.seeds["c"].tolist() == [-1, -1, 220, 230, 240, -1]  # 0 asked, 1 scanned
    assert table.get("c", 1) == 77
    assert _append(table, "c", 2) == 220
    assert table.get("c", 5) == 250  # -1 in the seed: loaded alone
    assert table.get("b", 3) == 130  # an empty seed: loaded alone
    assert asked == ["c", ("c", 5), "b", ("b", 3)]
    assert table.snapshot() == {("c", 0): 200, ("c", 1): 77, ("c", 2): 221, ("c", 5): 250,
                                ("b", 3): 130}  # fmt: skip
    table.set(("c", 3), 5)  # written from Python: the dict's from now on
    assert table.seeds["c"][3] == -1 and _append(table, "c", 3) == 5
