"""Fixtures shared across test packages."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for every Spark test (startup costs ~5 s), configured as in
    notes/spark.md: loopback only, no UI, 2 shuffle partitions, UTC."""
    pytest.importorskip("pyspark")  # here, so tests without Spark run without it
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need this venv (mqstore, xxhash)
    from pyspark.sql import SparkSession

    import mqstore.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    mqstore.spark.register(session)
    yield session
    session.stop()
