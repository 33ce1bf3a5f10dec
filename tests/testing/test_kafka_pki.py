"""The test kit's certificates for a secured KafkaCluster follow its work dir; its
OAUTHBEARER tokens pass Kafka's issued-at check at the instant they are made."""

from __future__ import annotations

import base64
import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.testing.kafka import KafkaCluster, unsecured_token


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


@pytest.mark.parametrize("now", [1_700_000_000.0, 1_700_000_000.0004, 1_700_000_000.9999])
def test_a_fresh_token_is_not_issued_after_kafkas_clock(now: float) -> None:
    """Kafka's unsecured validator refuses ``iat * 1000 > now_ms`` (its clock in whole
    milliseconds, no skew allowed): a token checked within the millisecond it was made
    must still pass, so ``iat`` is whole seconds rounded down. Regression: CI refused
    ``{"status":"invalid_token"}`` when ``iat`` was ``time.time()`` itself."""
    token, expires = unsecured_token("alice", 60.0, now=now)
    header, claims, signature = token.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    assert (json.loads(base64.urlsafe_b64decode(header + "==")), signature) == ({"alg": "none"}, "")
    assert decoded["sub"] == "alice"
    assert isinstance(decoded["iat"], int)
    assert decoded["iat"] * 1000 <= math.floor(now * 1000)  # the broker's check, at `now`
    assert decoded["exp"] == expires == now + 60.0
