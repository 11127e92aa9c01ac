"""Hypothesis strategies of the segmented tests, kept in one place."""

from __future__ import annotations

from hypothesis import strategies as st

from mqstore.engine import ProducerRecord

keys = st.none() | st.binary(max_size=40)
values = st.none() | st.binary(max_size=300)
header_lists = st.lists(st.tuples(st.text(max_size=12), st.binary(max_size=30)), max_size=3)
timestamps_ms = st.integers(min_value=0, max_value=2**63 - 1)
small_timestamps_ms = st.integers(min_value=0, max_value=20)  # equal and out-of-order times

producer_records = st.builds(
    ProducerRecord, key=keys, value=values, headers=header_lists, timestamp_ms=timestamps_ms
)
# A batch of records whose timestamps come from a small range, so look-ups meet
# equal timestamps and CreateTime going backwards.
timed_batches = st.lists(
    st.builds(
        ProducerRecord,
        key=st.none(),
        value=st.binary(min_size=20, max_size=120),
        headers=st.just([]),
        timestamp_ms=small_timestamps_ms,
    ),
    min_size=1,
    max_size=4,
)

topic_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
    min_size=1,
    max_size=40,
).filter(lambda name: name not in (".", ".."))
topics_and_partitions = st.tuples(topic_names, st.integers(0, 2**31 - 1))
