"""``df.write.format("pipeline-kafka")``: the export as a Spark Python Data Source.

    from pipeline.spark.datasource import register
    register(spark)
    (df.write.format("pipeline-kafka")
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .mode("append")            # Python data sources only support append/overwrite
       .save())

The same per-partition code as :func:`pipeline.spark.export_dataframe` runs in each
task, with the same columns and semantics (at-least-once, or exactly-once with
``exactlyOnce=true``). Differences: ``save()`` returns nothing, so there is no report
(use ``export_dataframe`` for one); a failed row beyond ``maxFailedRows`` fails the job.

Exactly-once: ``exactlyOnce`` (``true``), ``exportId`` (default: a fresh one per
write; a rerun with the same id writes only the partitions not yet committed),
``ledgerTopic``, ``commitInterval`` (seconds), ``commitRows``,
``transactionalIdPrefix``, ``verifySkipped`` (``true`` / ``false``, the default), and the producer's
``kafka.transaction.timeout.ms``: as the ``export_dataframe`` arguments of the same
names. The writer is made on the driver, which creates the ledger and reads it there; a
failed write's ``abort`` fences the attempts' open transactions.

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

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from pipeline.cluster.errors import ConfigError
from pipeline.spark.exactly_once_job import check_options, prepare
from pipeline.spark.ledger import DEFAULT_LEDGER_TOPIC
from pipeline.spark.options import producer_options_from_kafka
from pipeline.spark.partition import export_partition
from pipeline.spark.status import (
    DEFAULT_MESSAGE_ID_HEADER,
    ExactlyOnce,
    ExportConfig,
    ExportTaskError,
    PartitionStatus,
)

__all__ = ["NAME", "PipelineKafkaDataSource", "register"]

NAME = "pipeline-kafka"

log = logging.getLogger("pipeline.spark")

_OWN_OPTIONS = {
    "kafka.bootstrap.servers", "topic", "maxfailedrows", "chunkrows", "messageidheader",
    "messageidprefix", "path", "exactlyonce", "exportid", "ledgertopic", "commitinterval",
    "commitrows", "transactionalidprefix", "verifyskipped",
}


def _flag(opts: dict[str, str], name: str, default: bool) -> bool:
    value = opts.get(name.lower())
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"{NAME}: option {name}={value!r}: use true or false")
    return value.lower() == "true"


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
                "maxFailedRows, chunkRows, messageIdHeader, messageIdPrefix, exactlyOnce, "
                "exportId, ledgerTopic, commitInterval, commitRows, transactionalIdPrefix, "
                "verifySkipped, pipeline.<producer option> or a kafka.<producer property>"
            )
    try:
        producer.update(producer_options_from_kafka(kafka))
    except ConfigError as exc:
        raise ConfigError(f"{NAME}: {exc}") from None
    make_config(None, dict(producer))  # ConfigError for a bad value, on the driver
    header = opts.get("messageidheader")
    if header is not None and header.lower() in ("true", "false"):
        header = DEFAULT_MESSAGE_ID_HEADER if header.lower() == "true" else None
    max_failed = int(opts.get("maxfailedrows", "0"))
    exactly: ExactlyOnce | None = None
    if _flag(opts, "exactlyOnce", False):
        topic = opts.get("topic")
        prefix = opts.get("transactionalidprefix", "pipeline-export-")
        export_id = check_options(opts.get("exportid"), max_failed, producer, prefix)
        rows = opts.get("commitrows")
        interval = opts.get("commitinterval")
        exactly, _ = prepare(
            bootstrap=bootstrap, topic=topic, export_id=export_id,
            ledger_topic=opts.get("ledgertopic", DEFAULT_LEDGER_TOPIC),
            producer_options=producer, commit_rows=int(rows) if rows else None,
            commit_interval=float(interval) if interval else None,
            transactional_id_prefix=prefix,
            verify_done=_flag(opts, "verifySkipped", False))
    elif "exportid" in opts:
        raise ValueError(f"{NAME}: exportId needs exactlyOnce=true")
    return ExportConfig(
        bootstrap=bootstrap,
        topic=opts.get("topic"),
        producer_options=producer,
        chunk_rows=int(opts.get("chunkrows", "10000")),
        max_failed_rows=max_failed,
        message_id_header=header,
        message_id_prefix=opts.get("messageidprefix", ""),
        exactly_once=exactly,
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
        eo = self.cfg.exactly_once
        if eo is not None and not eo.done:  # every task succeeded: the export is done
            from pipeline.spark.exactly_once_job import finish

            try:
                finish(bootstrap=self.cfg.bootstrap, eo=eo, partitions=len(messages),
                       rows=sum(m.status.committed_rows for m in messages if m is not None),
                       producer_options=self.cfg.open_options())
            except Exception as exc:
                log.warning("%s: export %r is committed, but recording that it finished "
                            "failed (%s)", NAME, eo.export_id, exc)

    def abort(self, messages: list[Any]) -> None:
        """At-least-once: nothing to roll back (delivered rows stay delivered).
        Exactly-once: fence what the failed job's attempts left open (committed
        partitions stay visible; a rerun with the same exportId writes the rest)."""
        eo = self.cfg.exactly_once
        if eo is None:
            return
        from pipeline.spark.exactly_once_job import after_failure

        statuses = after_failure(
            bootstrap=self.cfg.bootstrap, eo=eo, partitions=len(messages),
            succeeded={i for i, m in enumerate(messages) if m is not None},
            producer_options=self.cfg.open_options())
        failed = [s.partition for s in statuses if s.outcome == "failed"]
        log.warning("%s: exactly-once export %r failed; partitions not committed: %s "
                    "(the others are, and stay visible); write again with exportId=%s to "
                    "finish it", NAME, eo.export_id, failed or "none", eo.export_id)


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
    """Make ``format("pipeline-kafka")`` available in this session, and make the session
    the calling thread's active one: Spark (4.2) looks a Python data source up in the
    active session of the JVM thread that serves the call, which can be unset (then
    ``save()`` fails with DATA_SOURCE_NOT_FOUND although the source is registered)."""
    spark.dataSource.register(PipelineKafkaDataSource)
    jvm_session = getattr(spark, "_jsparkSession", None)
    if jvm_session is not None:  # (Spark Connect has no JVM here)
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jvm_session)
