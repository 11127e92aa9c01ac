"""PySpark data source ``mqstore``: read topics into DataFrames and write them back,
batch and streaming, with the options of Spark's Kafka source.

    import mqstore.spark
    mqstore.spark.register(spark)
    df = spark.read.format("mqstore").option("path", "./data").option("subscribe", "t").load()

The module ``pyspark_mqstore`` exports ``DefaultSource`` for auto-registration.
Planning (``mqstore.spark.offsets``) imports neither pyspark nor pyarrow; the rest
needs the ``spark`` extra.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from mqstore.commitlog.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["MQStoreDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``mqstore`` format with ``spark``.

    Spark runs a Python data source in worker processes of the interpreter
    ``PYSPARK_PYTHON`` named when the session started (default ``python3`` on PATH;
    ``spark.pyspark.python`` alone does not reach data sources). When that interpreter
    cannot import mqstore: on a local master the source runs on this process's
    interpreter instead (nothing else in the session changes); on a cluster master
    ``ConfigError`` says what to set, before any query fails inside Spark.
    """
    from mqstore.spark.source import MQStoreDataSource

    context = spark.sparkContext
    workers = context.pythonExec
    if _can_import_mqstore(workers):
        spark.dataSource.register(MQStoreDataSource)
        return
    if not (context.master or "").startswith("local"):
        raise ConfigError(
            f"Spark's Python workers run {workers!r}, which cannot import mqstore: set "
            "PYSPARK_PYTHON to a Python with mqstore installed (on every worker) before "
            "the SparkSession starts"
        )
    # The wrapped data source keeps the interpreter it was registered with.
    context.pythonExec = sys.executable
    try:
        spark.dataSource.register(MQStoreDataSource)
    finally:
        context.pythonExec = workers


def _can_import_mqstore(python: str) -> bool:
    """Whether ``python`` (a path or a name on PATH) imports this source as workers do."""
    found = shutil.which(python)
    if found is None:
        return False
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return True
    # What a worker imports beyond pyspark (which Spark puts on the workers' PYTHONPATH
    # itself): mqstore with its dependencies and pyarrow. Run in this directory, as the
    # workers are.
    try:
        probe = subprocess.run(
            [found, "-c", "import mqstore.spark.batches, mqstore.store"],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def __getattr__(name: str) -> Any:
    if name == "MQStoreDataSource":  # lazy: importing offsets must not need pyspark
        from mqstore.spark.source import MQStoreDataSource

        return MQStoreDataSource
    raise AttributeError(name)
