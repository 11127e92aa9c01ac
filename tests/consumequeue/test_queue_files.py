"""QueueFiles: listing, creation order, deletion, files vanishing under a reader."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mqstore.commitlog.errors import CorruptDataError, OffsetOutOfRangeError
from mqstore.consumequeue import UNIT, ConsumeQueueConfig
from mqstore.consumequeue.format import time_file_name, unit_file_name
from mqstore.consumequeue.queue_files import QueueContext, QueueFiles

CONFIG = ConsumeQueueConfig(units_per_file=8, max_open_files=4, time_index_interval_units=3)


def files_in(directory: str, read_only: bool = False) -> QueueFiles:
    return QueueFiles(QueueContext(CONFIG, read_only), directory, serial=0)


def create(files: QueueFiles, file_index: int) -> None:
    units = np.zeros(1, dtype=UNIT)
    units["size"] = 1
    files.create(file_index, 0, units, np.array([5]))


def test_create_list_and_delete(tmp_path: object) -> None:
    directory = os.path.join(str(tmp_path), "t", "0")
    files = files_in(directory)
    assert files.indexes() == []
    for file_index in (0, 1, 2):
        create(files, file_index)
    assert files.indexes() == [0, 1, 2]
    assert files.exists(1)
    assert int(files.units(1).sizes[0]) == 1
    assert int(files.times(1).times[0]) == 5
    files.delete(2)
    assert sorted(os.listdir(directory)) == sorted(
        name
        for i in (0, 1)
        for name in (unit_file_name(i, 8), time_file_name(unit_file_name(i, 8)))
    )


def test_gap_between_files_is_corrupt(tmp_path: object) -> None:
    files = files_in(str(tmp_path))
    create(files, 0)
    create(files, 2)
    with pytest.raises(CorruptDataError) as caught:
        files.indexes()
    assert caught.value.path == files.unit_path(1)


def test_missing_file_for_writer_and_reader(tmp_path: object) -> None:
    directory = str(tmp_path)
    create(files_in(directory), 0)
    create(files_in(directory), 1)
    os.unlink(files_in(directory).unit_path(1))
    os.unlink(files_in(directory).time_path(1))
    with pytest.raises(CorruptDataError):
        files_in(directory).units(1)
    reader = files_in(directory, read_only=True)
    with pytest.raises(OffsetOutOfRangeError):
        reader.units(1)
    assert reader.stale  # the owner reloads before its next operation
    assert reader.indexes() == [0]
    assert not reader.stale
