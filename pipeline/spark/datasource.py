"""``df.write.format("pipeline-kafka")``: the export as a Spark Python Data Source.

    from pipeline.spark.datasource import register
    register(spark)
    (df.write.format("pipeline-kafka")
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .mode("append")            # Python data sources only support append/overwrite
       .save())

The same per-partition code as :func:`pipeline.spark.export_dataframe` runs in each
task, with the same columns and semantics (at-least-once). Differences: ``save()``
returns nothing, so there is no report (use ``export_dataframe`` for one); a failed
row beyond ``maxFailedRows`` fails the job.

Options: ``kafka.bootstrap.servers`` (required), ``topic``, ``maxFailedRows``,
``chunkRows``, ``messageIdHeader`` (a header name, or ``true`` for
``pipeline-message-id``), ``messageIdPrefix``; producer settings either as
``pipeline.<ProducerConfig field>`` (``pipeline.linger=0.02``) or the Kafka names
``kafka.acks``, ``kafka.compression.type``, ``kafka.linger.ms``, ``kafka.batch.size``,
``kafka.request.timeout.ms``, ``kafka.delivery.timeout.ms``, ``kafka.client.id``,
``kafka.enable.idempotence``, ``kafka.max.request.size``, ``kafka.buffer.memory``;
security as for Spark's own Kafka sink: ``kafka.security.protocol``,
``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config`` (a PlainLoginModule or
ScramLoginModule line), ``kafka.ssl.truststore.location`` with
``kafka.ssl.truststore.type=PEM``, ``kafka.ssl.endpoint.identification.algorithm``
(see :mod:`pipeline.spark.options`). Spark redacts option values that mention a
password in its plan; the secrets reach the tasks masked (:class:`~pipeline.spark.status.Masked`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from pipeline.cluster.errors import ConfigError
from pipeline.spark.options import producer_options_from_kafka
from pipeline.spark.partition import export_partition
from pipeline.spark.status import (
    DEFAULT_MESSAGE_ID_HEADER,
    ExportConfig,
    ExportTaskError,
    PartitionStatus,
)

__all__ = ["NAME", "PipelineKafkaDataSource", "register"]

NAME = "pipeline-kafka"

_OWN_OPTIONS = {
    "kafka.bootstrap.servers", "topic", "maxfailedrows", "chunkrows", "messageidheader",
    "messageidprefix", "path",
}


def _parse(value: str) -> Any:
    from pipeline.cluster.config import parse_option_value

    return parse_option_value(value)


def config_from_options(options: Any) -> ExportConfig:
    """Data source options (case-insensitive) -> ExportConfig; ValueError on a bad one."""
    from pipeline.producer._config import make_config

    opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
    bootstrap = opts.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise ValueError(f"{NAME}: option kafka.bootstrap.servers is required")
    producer: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    for key, value in opts.items():
        if key in _OWN_OPTIONS:
            continue
        if key.startswith("pipeline."):
            producer[key[len("pipeline."):]] = _parse(value)
        elif key in ("kafka.key.serializer", "kafka.value.serializer"):
            raise ValueError(f"{NAME}: {key} is not supported: keys and values are bytes/strings")
        elif key.startswith("kafka."):
            kafka[key] = value
        else:
            raise ValueError(
                f"{NAME}: unknown option {key!r}; use kafka.bootstrap.servers, topic, "
                "maxFailedRows, chunkRows, messageIdHeader, messageIdPrefix, "
                "pipeline.<producer option> or a kafka.<producer property>"
            )
    try:
        producer.update(producer_options_from_kafka(kafka))
    except ConfigError as exc:
        raise ConfigError(f"{NAME}: {exc}") from None
    make_config(None, dict(producer))  # ConfigError for a bad value, on the driver
    header = opts.get("messageidheader")
    if header is not None and header.lower() in ("true", "false"):
        header = DEFAULT_MESSAGE_ID_HEADER if header.lower() == "true" else None
    return ExportConfig(
        bootstrap=bootstrap,
        topic=opts.get("topic"),
        producer_options=producer,
        chunk_rows=int(opts.get("chunkrows", "10000")),
        max_failed_rows=int(opts.get("maxfailedrows", "0")),
        message_id_header=header,
        message_id_prefix=opts.get("messageidprefix", ""),
    )


@dataclass
class StatusMessage(WriterCommitMessage):
    status: PartitionStatus


class PipelineKafkaWriter(DataSourceArrowWriter):
    def __init__(self, cfg: ExportConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[Any]) -> StatusMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        return StatusMessage(export_partition(iterator, self.cfg, partition=partition,
                                              attempt=attempt))

    def commit(self, messages: list[Any]) -> None:
        failed = sum(m.status.failed for m in messages if m is not None)
        if failed > 0 and self.cfg.max_failed_rows == 0:  # pragma: no cover - tasks raise first
            raise ExportTaskError(f"{failed} rows were not delivered")

    def abort(self, messages: list[Any]) -> None:
        pass  # nothing to roll back: delivered rows stay delivered (at-least-once)


class PipelineKafkaDataSource(DataSource):
    """Write-only data source; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return (
            "key binary, value binary, headers array<struct<key:string,value:binary>>, "
            "topic string, partition int"
        )

    def writer(self, schema: Any, overwrite: bool) -> PipelineKafkaWriter:
        from pipeline.spark.export import validate_schema

        cfg = config_from_options(self.options)
        validate_schema(schema, topic=cfg.topic)
        return PipelineKafkaWriter(cfg)


def register(spark: Any) -> None:
    """Make ``format("pipeline-kafka")`` available in this session."""
    spark.dataSource.register(PipelineKafkaDataSource)
