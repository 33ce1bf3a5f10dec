"""Spark's ``kafka.*`` security options (data source and ``export_dataframe``) and the
secrets on their way to the executors: masked in the ExportConfig's repr and pickle."""

from __future__ import annotations

import functools
import pickle

import pytest

from pipeline.cluster.errors import ConfigError
from pipeline.spark.options import producer_options_from_kafka
from pipeline.spark.status import ExportConfig, Masked

SECRET = "Sp4rk-s3cret-pw"
SCRAM_JAAS = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
              f'username="alice" password="{SECRET}";')


def test_kafka_options_as_for_sparks_own_sink() -> None:
    opts = producer_options_from_kafka({
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": SCRAM_JAAS, "kafka.ssl.truststore.location": "/ca.pem",
        "kafka.ssl.truststore.type": "PEM", "kafka.linger.ms": "20", "kafka.acks": "1",
    })
    assert opts == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_username": "alice", "sasl_password": SECRET,
                    "ssl_cafile": "/ca.pem", "linger": 0.02, "acks": 1}


@pytest.mark.parametrize(("options", "match"), [
    ({"kafka.sasl.jaas.config": SCRAM_JAAS[:-1]}, "kafka.sasl.jaas.config: could not parse"),
    ({"kafka.sasl.jaas.config": SCRAM_JAAS}, "set kafka.sasl.mechanism to SCRAM"),
    ({"kafka.ssl.truststore.location": "/t.jks"}, "kafka.ssl.truststore.location: a JKS"),
    ({"kafka.sasl.kerberos.service.name": "kafka"}, "unknown option"),
])
def test_bad_kafka_options(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        producer_options_from_kafka(options)
    assert SECRET not in str(info.value)


def test_data_source_options_map_security_names() -> None:
    pytest.importorskip("pyspark.sql.datasource")
    from pipeline.spark.datasource import config_from_options

    cfg = config_from_options({
        "kafka.bootstrap.servers": "h:9093", "topic": "t",
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": SCRAM_JAAS,
    })
    assert cfg.open_options() == {"security_protocol": "SASL_PLAINTEXT",
                                  "sasl_mechanism": "SCRAM-SHA-256",
                                  "sasl_username": "alice", "sasl_password": SECRET}
    assert SECRET not in repr(cfg)
    with pytest.raises(ValueError, match=r"pipeline-kafka: kafka\.sasl\.jaas\.config") as info:
        config_from_options({"kafka.bootstrap.servers": "h:1",
                             "kafka.sasl.jaas.config": SCRAM_JAAS})
    assert SECRET not in str(info.value)


def test_export_config_masks_secrets_in_repr_and_pickle() -> None:
    from pyspark import cloudpickle  # what pyspark ships the task closure with

    from pipeline.spark.partition import spark_task

    cfg = ExportConfig(bootstrap="h:1", producer_options={
        "sasl_password": SECRET, "ssl_password": SECRET + "2", "sasl_username": "alice"})
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.producer_options)
    for blob in (pickle.dumps(cfg), cloudpickle.dumps(functools.partial(spark_task, cfg=cfg))):
        assert SECRET.encode() not in blob and b"alice" in blob
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg
    assert back.open_options() == {"sasl_password": SECRET, "ssl_password": SECRET + "2",
                                   "sasl_username": "alice"}
    assert isinstance(back.producer_options["sasl_password"], Masked)
