"""mqstore.spark.register: the source runs where mqstore imports, or fails saying what to set.

The interpreter that cannot import mqstore is a real one: a fresh venv without it.
"""

from __future__ import annotations

import os
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


AUTO_REGISTERED = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.read.format("mqstore").option("path", sys.argv[1]).option("subscribe", "t").load()
print("rows", df.count())
spark.stop()
"""


def test_the_format_is_found_without_register_in_the_editable_install(tmp_path: Path) -> None:
    """PySpark's own look-up (pkgutil.iter_modules over the workers' sys.path) finds
    pyspark_mqstore in the editable install (`make demo`, `make test`), with no
    register call, when the workers run this venv's Python (PYSPARK_PYTHON)."""
    with MessageStore.open(tmp_path / "s") as store:
        store.put("t", 0, b"x")
    script = tmp_path / "auto.py"
    script.write_text(AUTO_REGISTERED)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")},
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s")],
        cwd=tmp_path,  # not the checkout: found through the install, not the cwd
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows 1" in result.stdout.splitlines()
