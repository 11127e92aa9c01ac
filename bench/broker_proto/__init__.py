"""Prototype pieces of the Kafka wire-protocol broker (``mqstore serve``, not built yet),
kept under bench/ because they are measurement code, not the store's.

This package holds only what the mapping study needs (docs/BROKER.md,
bench/broker_mapping.py):

- ``wire_batch``: checking a producer's record batch v2 as a broker must (size, magic,
  CRC-32C, counts, codec), assigning its base offset, stamping LogAppendTime;
- ``batch_log``: mapping option B, the producer's batch stored as one CommitLog record
  with a per-partition index of (base offset, record count);
- ``record_mapping``: mapping option A, every Kafka record a CommitLog record (today's
  model), batches decoded on Produce and built on Fetch.

Nothing here is a public API yet, and nothing in the store imports it.
"""

from __future__ import annotations

__all__: list[str] = []
