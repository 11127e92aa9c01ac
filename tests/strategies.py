"""Hypothesis strategies shared by the test modules (kept in one place)."""

from __future__ import annotations

from hypothesis import strategies as st

TOPIC_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=127).filter(
    lambda name: name not in (".", "..")
)
queue_ids = st.integers(min_value=0, max_value=2**31 - 1)
bodies = st.binary(max_size=2048)
keys = st.lists(st.text(min_size=1, max_size=20).filter(lambda key: "\x00" not in key), max_size=4)
tags = st.none() | st.text(min_size=1, max_size=30)
property_pairs = st.lists(st.tuples(st.text(max_size=16), st.binary(max_size=64)), max_size=4)
timestamps_ms = st.integers(min_value=0, max_value=2**62)
