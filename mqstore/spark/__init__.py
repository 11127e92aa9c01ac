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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["MQStoreDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``mqstore`` format with ``spark``."""
    from mqstore.spark.source import MQStoreDataSource

    spark.dataSource.register(MQStoreDataSource)


def __getattr__(name: str) -> Any:
    if name == "MQStoreDataSource":  # lazy: importing offsets must not need pyspark
        from mqstore.spark.source import MQStoreDataSource

        return MQStoreDataSource
    raise AttributeError(name)
