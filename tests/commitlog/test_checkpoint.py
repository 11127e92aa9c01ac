from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.commitlog.checkpoint import SLOT_SIZE, Checkpoint, CheckpointFile


def test_missing_file_means_no_checkpoint(tmp_path):
    assert CheckpointFile(str(tmp_path), read_only=True).load() is None


def test_round_trip_and_alternating_slots(tmp_path):
    file = CheckpointFile(str(tmp_path))
    first = file.store(Checkpoint(flushed_position=10, dispatched_position=7))
    second = file.store(attrs_evolve(first, flushed_position=20))
    assert second.sequence == first.sequence + 1
    loaded = file.load()
    assert loaded == second
    file.close()


def attrs_evolve(checkpoint, **changes):
    import attrs

    return attrs.evolve(checkpoint, **changes)


def test_torn_newest_slot_falls_back_to_the_previous(tmp_path):
    file = CheckpointFile(str(tmp_path))
    first = file.store(Checkpoint(flushed_position=100, dispatched_position=90))
    second = file.store(attrs_evolve(first, flushed_position=200, dispatched_position=190))
    file.close()
    path = os.path.join(str(tmp_path), "checkpoint")
    with open(path, "r+b") as handle:  # damage the slot holding `second`
        handle.seek((second.sequence % 2) * SLOT_SIZE + 20)
        handle.write(b"\xff")
    loaded = CheckpointFile(str(tmp_path), read_only=True).load()
    assert loaded is not None
    assert (loaded.flushed_position, loaded.dispatched_position) == (100, 90)


@settings(max_examples=100)
@given(st.binary(min_size=0, max_size=4096))
def test_garbage_file_never_yields_a_bogus_checkpoint(tmp_path_factory, garbage):
    root = tmp_path_factory.mktemp("cp")
    with open(os.path.join(str(root), "checkpoint"), "wb") as handle:
        handle.write(garbage)
    assert CheckpointFile(str(root), read_only=True).load() is None


def test_a_new_checkpoint_file_is_durable_before_it_is_used(tmp_path, syscalls):
    """Regression: the checkpoint file was created without an fsync of its directory,
    so after a power cut a checkpoint could vanish, or outlive CommitLog files."""
    root = str(tmp_path)
    path = os.path.join(root, "checkpoint")
    file = CheckpointFile(root)
    try:
        events = syscalls.events
        assert ("fdatasync", path) in events
        assert events.index(("fdatasync", path)) < events.index(("fsync", root))
        file.store(Checkpoint(flushed_position=1, dispatched_position=1))
        assert events[-1] == ("fdatasync", path)
    finally:
        file.close()
