"""Replication: a follower copies its leader's one CommitLog by physical offset.

Layout, downward: ``fetcher`` (the follower's thread) and ``leader`` (the leader's
answers and its followers' LEOs) -> ``protocol`` (ReplicaFetch on Kafka's framing)
-> the store (mqstore.store_replica, commitlog/replica.py). docs/REPLICATION.md
says what is built and what is not.
"""
