"""Every entry point reaches a secured Apache Kafka: SyncProducer and the CLI
(``produce`` / ``consume`` with ``--config FILE`` and ``-X`` properties as kcat takes
them), judged by confluent-kafka with the same credentials; the CLI's failures are one
line, bounded, and never show a secret (neither does ``-v``'s echo of the options).

The Spark entry points are in tests/spark/test_spark_kafka_security.py. The session
clusters are the ones of test_kafka_security.py (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import SyncProducer
from pipeline.cluster.errors import SaslAuthenticationError
from pipeline.consumer import consume
from pipeline.producer._config import ProducerConfig
from pipeline.testing.kafka import KafkaCluster

from .conftest import read_partitions

ROOT = Path(__file__).resolve().parents[2]
Topic = Callable[..., str]


def test_sync_producer_and_reader(kafka_sasl_ssl: KafkaCluster, kafka_topic: Topic) -> None:
    cluster = kafka_sasl_ssl
    topic = kafka_topic("sync")
    cluster.create_topic(topic, 1)
    config = ProducerConfig(request_timeout=10.0, **cluster.client_options("SCRAM-SHA-256"))
    with SyncProducer(cluster.bootstrap, config) as producer:
        metas = [d.get() for d in [producer.send(topic, b"s%d" % i) for i in range(20)]]
    got = read_partitions(cluster.bootstrap, topic, [0], 20,
                          config=cluster.librdkafka_config("SCRAM-SHA-256"))
    assert [(m.offset(), m.value()) for m in got] == [
        (meta.offset, b"s%d" % i) for i, meta in enumerate(metas)]
    # the blocking reader, with the security options as keywords
    records = consume(cluster.bootstrap, topic, timeout=60, **cluster.client_options("PLAIN"))
    assert [r.value for r in records] == [b"s%d" % i for i in range(20)]


def test_sync_producer_wrong_password_fails_fast(kafka_sasl_ssl: KafkaCluster) -> None:
    started = time.monotonic()
    with pytest.raises(SaslAuthenticationError, match="refused user 'alice'") as info:
        SyncProducer(kafka_sasl_ssl.bootstrap, request_timeout=30.0,
                     **kafka_sasl_ssl.client_options("PLAIN", password="Nope-9988"))
    assert time.monotonic() - started < 10.0
    assert "Nope-9988" not in str(info.value)


def _cli(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_BOOTSTRAP"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", *argv], input=stdin,
                          capture_output=True, timeout=120, cwd=ROOT, env=env)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                       proc.stderr.decode())


def _properties(cluster: KafkaCluster, path: Path, mechanism: str, password: str) -> Path:
    module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
              if mechanism.startswith("SCRAM") else
              "org.apache.kafka.common.security.plain.PlainLoginModule")
    path.write_text(
        "# as for kafka-console-producer --producer.config\n"
        f"bootstrap.servers={cluster.bootstrap}\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={mechanism}\n"
        f'sasl.jaas.config={module} required username="alice" password="{password}";\n'
        f"ssl.truststore.location={cluster.ssl_cafile}\n"
        "ssl.truststore.type=PEM\n"
    )
    return path


def test_cli_produce_and_consume_on_sasl_ssl(
        kafka_sasl_ssl: KafkaCluster, kafka_topic: Topic, tmp_path: Path) -> None:
    cluster = kafka_sasl_ssl
    password = cluster.security.users["alice"]
    topic = kafka_topic("cli")
    cluster.create_topic(topic, 1)
    props = _properties(cluster, tmp_path / "client.properties", "SCRAM-SHA-512", password)
    lines = b"".join(b"k%d:line %d\n" % (i, i) for i in range(50))
    # produce: everything from --config (bootstrap.servers included), -v echoes options
    produced = _cli("produce", "--config", str(props), "-t", topic, "-K", ":", "-v",
                    stdin=lines)
    assert produced.returncode == 0, produced.stderr
    assert "produced 50 message(s)" in produced.stderr
    assert "sasl_password='***'" in produced.stderr  # the echo shows it is set...
    assert password not in produced.stderr + produced.stdout  # ...never its value
    got = read_partitions(cluster.bootstrap, topic, [0], 50,
                          config=cluster.librdkafka_config("SCRAM-SHA-512"))
    assert [(m.key(), m.value()) for m in got] == [
        (b"k%d" % i, b"line %d" % i) for i in range(50)]
    # consume: kcat-style -X properties (librdkafka names), -b given
    consumed = _cli(
        "consume", "-b", cluster.bootstrap, "-t", topic, "-e", "-f", "%k=%s\\n",
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-256",
        "-X", "sasl.username=alice", "-X", f"sasl.password={password}",
        "-X", f"ssl.ca.location={cluster.ssl_cafile}", "-v",
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [f"k{i}=line {i}" for i in range(50)]
    assert password not in consumed.stderr


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_cli_wrong_password_is_one_bounded_line_without_the_secret(
        kafka_sasl_ssl: KafkaCluster, tmp_path: Path, command: str) -> None:
    props = _properties(kafka_sasl_ssl, tmp_path / "bad.properties", "PLAIN", "Wr0ng-CLI-pw")
    started = time.monotonic()
    proc = _cli(command, "--config", str(props), "-t", "any-topic", "--timeout", "30", "-v")
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "refused user 'alice' with SASL PLAIN" in errors[0]
    assert "Traceback" not in proc.stderr and "Wr0ng-CLI-pw" not in proc.stderr
    assert elapsed < 25.0  # not retried until --timeout (interpreter start included)


def test_cli_untrusted_certificate(kafka_sasl_ssl: KafkaCluster, tmp_path: Path) -> None:
    """Without the cluster's CA (the system's trust store is used): the TLS error."""
    proc = _cli("produce", "-b", kafka_sasl_ssl.bootstrap, "-t", "x",
                "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=PLAIN",
                "-X", "sasl.username=alice", "-X", "sasl.password=whatever-pw")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "is not trusted" in errors[0] and "pass ssl.ca.location" in errors[0], errors[0]
    assert "cannot reach" not in errors[0] and "whatever-pw" not in proc.stderr
