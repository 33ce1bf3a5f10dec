"""Spark's Kafka sink option names (``kafka.<Kafka producer property>``) -> producer
options, for the ``pipeline-kafka`` data source and ``export_dataframe(kafka_options=)``.

Users of Spark's own Kafka sink already write::

    .option("kafka.security.protocol", "SASL_SSL")
    .option("kafka.sasl.mechanism", "SCRAM-SHA-512")
    .option("kafka.sasl.jaas.config",
            'org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="alice" password="...";')
    .option("kafka.ssl.truststore.location", "/etc/kafka/ca.pem")
    .option("kafka.ssl.truststore.type", "PEM")

The security names are mapped by :func:`pipeline.cluster.properties.kafka_properties`
(JAAS lines: PlainLoginModule / ScramLoginModule); the producer tuning names by
:data:`KAFKA_OPTIONS`. Errors name the option, never a secret's value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.cluster.errors import ConfigError
from pipeline.cluster.properties import PROPERTY_NAMES, kafka_properties

__all__ = ["KAFKA_OPTIONS", "SECURITY_OPTIONS", "producer_options_from_kafka"]

#: ``kafka.<property>`` -> (ProducerConfig field, converter from the option's text)
KAFKA_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "kafka.acks": ("acks", lambda v: v if v == "all" else int(v)),
    "kafka.compression.type": ("compression", str),
    "kafka.linger.ms": ("linger", lambda v: float(v) / 1000),
    "kafka.batch.size": ("batch_bytes", int),
    "kafka.request.timeout.ms": ("request_timeout", lambda v: float(v) / 1000),
    "kafka.delivery.timeout.ms": ("delivery_timeout", lambda v: float(v) / 1000),
    "kafka.client.id": ("client_id", str),
    "kafka.enable.idempotence": ("idempotent", lambda v: v.lower() == "true"),
    "kafka.max.request.size": ("max_request_bytes", int),
    "kafka.buffer.memory": ("buffer_memory", int),
    "kafka.transaction.timeout.ms": ("transaction_timeout", lambda v: float(v) / 1000),
}
#: The ``kafka.``-prefixed security names understood (see pipeline.cluster.properties).
SECURITY_OPTIONS = frozenset(f"kafka.{name}" for name in PROPERTY_NAMES) - set(KAFKA_OPTIONS)


def producer_options_from_kafka(options: Mapping[str, str]) -> dict[str, Any]:
    """``kafka.*`` options (names case-insensitive) -> ``open_producer`` options.

    Raises :class:`ConfigError` for a name that is neither in :data:`KAFKA_OPTIONS`
    nor a security name, or a value that cannot be used (a JKS truststore, a JAAS
    line that does not parse, a JAAS module that does not match the mechanism...).
    """
    out: dict[str, Any] = {}
    security: dict[str, str] = {}
    for name, value in options.items():
        key = name.strip().lower()
        if key in KAFKA_OPTIONS:
            field, convert = KAFKA_OPTIONS[key]
            try:
                out[field] = convert(str(value).strip())
            except ValueError:
                raise ConfigError(f"{key}={value!r}: not a valid value") from None
        elif key in SECURITY_OPTIONS:
            security[key[len("kafka."):]] = str(value)
        else:
            raise ConfigError(
                f"unknown option {name!r}; known kafka.* options: "
                f"{', '.join(sorted({*KAFKA_OPTIONS, *SECURITY_OPTIONS}))}"
            )
    found, rest = kafka_properties(security, prefix="kafka.")
    assert not rest  # every name was one kafka_properties knows
    out.update(found)
    return out
