"""mqstore.spark.register: the source runs where mqstore imports, or fails saying what to set.

The interpreter that cannot import mqstore is a real one: a fresh venv without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import mqstore.spark
from mqstore import ConfigError, MessageStore
from mqstore.spark import _can_import_mqstore


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python without mqstore (a new venv, no site-packages of ours)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


def test_this_interpreter_imports_mqstore_and_a_bare_one_does_not(bare_python: str) -> None:
    assert _can_import_mqstore(sys.executable)
    assert not _can_import_mqstore(bare_python)
    assert not _can_import_mqstore("no-such-python-on-path")


def test_a_local_session_whose_workers_lack_mqstore_still_reads(
    spark, bare_python: str, tmp_path: Path
) -> None:
    """As a newcomer's session: workers would run a Python without mqstore (the README's
    snippet then failed with ModuleNotFoundError inside PYTHON_DATA_SOURCE_ERROR)."""
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic("orders", 1)
        store.put("orders", 0, b"one")
        store.put("orders", 0, b"two")
    context = spark.sparkContext
    previous = context.pythonExec
    context.pythonExec = bare_python
    try:
        mqstore.spark.register(spark)
        assert context.pythonExec == bare_python  # the rest of the session is untouched
        rows = (
            spark.read.format("mqstore")
            .option("path", str(tmp_path / "s"))
            .option("subscribe", "orders")
            .load()
            .orderBy("offset")
            .collect()
        )
    finally:
        context.pythonExec = previous
        mqstore.spark.register(spark)
    assert [row.value for row in rows] == [b"one", b"two"]


def test_a_cluster_session_whose_workers_lack_mqstore_is_refused_at_once(
    bare_python: str,
) -> None:
    """A cluster's executors may not have this interpreter: say what to set, register nothing."""
    registered: list[object] = []
    session = SimpleNamespace(
        sparkContext=SimpleNamespace(master="spark://head:7077", pythonExec=bare_python),
        dataSource=SimpleNamespace(register=registered.append),
    )
    with pytest.raises(ConfigError, match="set PYSPARK_PYTHON to a Python with mqstore"):
        mqstore.spark.register(session)  # type: ignore[arg-type]
    assert registered == []
