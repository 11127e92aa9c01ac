"""The crash harness as a test: 20 SIGKILLed writers, every acknowledged message checked.

``make soak`` runs the same harness for 500 iterations.
"""

from __future__ import annotations

from bench.crash_harness import KAFKA_TOPIC, Harness, run

ITERATIONS = 20


def test_twenty_sigkills_lose_and_corrupt_nothing(tmp_path):
    figures = run(ITERATIONS, seed=7, path=str(tmp_path))
    assert figures.child_failures == 0, figures.problems
    assert figures.iterations == ITERATIONS
    assert figures.acked_messages > 1_000  # the workload really ran
    assert figures.acked_checks > 0
    assert figures.commits_reported > 0
    assert figures.losses == 0, figures.problems
    assert figures.corrupt_reads == 0, figures.problems
    assert figures.wrong_content == 0, figures.problems
    assert figures.gaps == 0, figures.problems
    assert figures.duplicates == 0, figures.problems
    assert figures.commit_violations == 0, figures.problems
    assert figures.key_misses == 0, figures.problems
    assert not figures.failed


def test_the_checks_can_fail(tmp_path):
    """Feed the verifier acks the store never had: it must count them."""
    harness = Harness(str(tmp_path / "store"), seed=1)
    harness.run_iteration(0)  # sync flush, killed at a random point
    assert not harness.figures.failed, harness.figures.problems
    acked = harness.acked.setdefault((KAFKA_TOPIC, 0), {})
    end = max(acked, default=-1) + 1
    acked[end + 5] = 1234  # never written: a loss
    live = [offset for offset in acked if offset < end]
    assert live, "seed 1 kills after the child acked some records"
    acked[live[-1]] ^= 1  # wrong checksum: wrong content
    harness.committed[(KAFKA_TOPIC, 1)] = 10**9  # a commit the store never stored
    harness.verify()
    assert harness.figures.losses >= 1
    assert harness.figures.wrong_content == 1
    assert harness.figures.commit_violations == 1
    assert harness.figures.failed
