"""The test kit's certificates for a secured KafkaCluster follow its work dir."""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.testing.kafka import KafkaCluster


def test_a_retried_launch_gets_certificates_in_its_new_work_dir(tmp_path: Path) -> None:
    """Regression: a launch retried after a port conflict makes a new work dir and
    removes the old one; the brokers' keystore must not point into the removed one
    (Kafka then exits: "Unable to read file .../pki/broker-keystore.pem")."""
    cluster = KafkaCluster(nodes=1, security_protocol="SASL_SSL", scram_users={"a": "b"})
    first, second = tmp_path / "attempt-1" / "pki", tmp_path / "attempt-2" / "pki"
    cluster._ensure_pki(first)
    assert Path(cluster.ssl_cafile).parent == first
    shutil.rmtree(first.parent)  # what close() does to a failed attempt's work dir
    cluster._ensure_pki(second)
    assert Path(cluster.ssl_cafile).parent == second
    assert cluster.pki is not None
    assert cluster.pki.broker_keystore.exists() and cluster.pki.ca_file.exists()
    before = cluster.pki
    cluster._ensure_pki(second)  # the same launch: the same certificates
    assert cluster.pki == before


def test_a_plaintext_cluster_has_no_certificates(tmp_path: Path) -> None:
    cluster = KafkaCluster(nodes=1, security_protocol="SASL_PLAINTEXT", scram_users={"a": "b"})
    cluster._ensure_pki(tmp_path / "pki")
    assert cluster.pki is None
