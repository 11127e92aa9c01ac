"""Auto-registration hook: PySpark looks for ``pyspark_<name>`` modules exporting
``DefaultSource``; this one is the ``mqstore`` format (see ``mqstore.spark``)."""

from mqstore.spark.source import MQStoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
