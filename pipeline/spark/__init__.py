"""Spark export stage: write a DataFrame to Kafka through the pipeline producer.

    from pipeline.spark import export_dataframe
    report = export_dataframe(df, bootstrap="broker:9092", topic="orders")
    print(report.format())

``pipeline.spark.partition`` is the part that runs inside each Spark task (testable
without Spark); ``pipeline.spark.export`` is the driver side; ``pipeline.spark.datasource``
registers ``df.write.format("pipeline-kafka")``; :func:`kafka_sink_jars` fetches the jars of
Spark's own ``format("kafka")`` sink, to run it beside ours. Importing this package does not
import pyspark.
"""

from __future__ import annotations

from pipeline.spark.export import (
    ExportError,
    ExportProgress,
    ExportReport,
    ExportSchemaError,
    SpeculationWarning,
    build_report,
    export_dataframe,
    validate_schema,
)
from pipeline.spark.partition import export_partition
from pipeline.spark.sink_jars import KafkaSinkJarsError, kafka_sink_jars
from pipeline.spark.status import (
    DEFAULT_MESSAGE_ID_HEADER,
    ExportConfig,
    ExportTaskError,
    PartitionStatus,
)

__all__ = [
    "DEFAULT_MESSAGE_ID_HEADER",
    "ExportConfig",
    "ExportError",
    "ExportProgress",
    "ExportReport",
    "ExportSchemaError",
    "ExportTaskError",
    "KafkaSinkJarsError",
    "PartitionStatus",
    "SpeculationWarning",
    "build_report",
    "export_dataframe",
    "export_partition",
    "kafka_sink_jars",
    "validate_schema",
]
