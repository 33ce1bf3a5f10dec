"""TLS and SASL against Apache Kafka itself: every mechanism and protocol end to end
(judged by confluent-kafka with the same credentials), each failure's own error in bounded
time, KIP-368 re-authentication during a long paced send, and the not-retried policy.

Three session clusters (tests/conftest.py): ``kafka_sasl_ssl`` (all four mechanisms,
short re-authentication for SCRAM-SHA-512 and OAUTHBEARER), ``kafka_sasl_plaintext``
(all four) and ``kafka_mtls`` (SSL, client certificates required); module clusters:
one-way SSL, and SASL_PLAINTEXT without OAUTHBEARER for the mechanism-not-enabled error.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from pipeline import open_producer
from pipeline.cluster.admin import Admin
from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import (
    AuthenticationError,
    SaslAuthenticationError,
    SaslMechanismError,
    TlsCertificateError,
    TlsClientCertificateError,
    TlsError,
    TlsHostnameError,
)
from pipeline.consumer import read_topic, topic_offsets
from pipeline.producer._errors import ProducerError
from pipeline.testing.fake_cluster import FakeCluster, FakeSasl
from pipeline.testing.kafka import KafkaCluster, unsecured_token_provider

from .conftest import confluent_kafka, read_partitions

Topic = Callable[..., str]


def users(cluster: KafkaCluster) -> dict[str, str]:
    return dict(cluster.security.users)


def reauth_seconds(cluster: KafkaCluster, mechanism: str) -> float:
    key = f"listener.name.client.{mechanism.lower()}.connections.max.reauth.ms"
    return int(cluster.broker_config[key]) / 1000

CASES = [
    ("kafka_sasl_ssl", "PLAIN"),
    ("kafka_sasl_ssl", "SCRAM-SHA-256"),
    ("kafka_sasl_ssl", "SCRAM-SHA-512"),
    ("kafka_sasl_ssl", "OAUTHBEARER"),
    ("kafka_sasl_plaintext", "PLAIN"),
    ("kafka_sasl_plaintext", "SCRAM-SHA-256"),
    ("kafka_sasl_plaintext", "SCRAM-SHA-512"),
    ("kafka_sasl_plaintext", "OAUTHBEARER"),
    ("kafka_mtls", None),
    ("kafka_ssl", None),
]


@pytest.fixture(scope="module")
def kafka_ssl(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """1 node, SSL without client certificates (one-way TLS, the common case);
    module-scoped: it stops when this module is done."""
    if kafka_unavailable is not None:
        pytest.skip(kafka_unavailable)
    with KafkaCluster(nodes=1, security_protocol="SSL") as cluster:
        yield cluster


async def produce(cluster: KafkaCluster, topic: str, n: int, **options: Any) -> list[Any]:
    async with open_producer(cluster.bootstrap, request_timeout=10.0, **options) as producer:
        deliveries = [await producer.send(topic, b"v%05d" % i, key=b"k%d" % (i % 3))
                      for i in range(n)]
        return [await d for d in deliveries]


@pytest.mark.parametrize(("fixture", "mechanism"), CASES, ids=lambda x: str(x))
async def test_produce_and_read_back_with_the_same_credentials(
    request: pytest.FixtureRequest, kafka_topic: Callable[[str], str], fixture: str,
    mechanism: str | None,
) -> None:
    cluster: KafkaCluster = request.getfixturevalue(fixture)
    topic = kafka_topic("sec")
    await cluster.call(cluster.create_topic, topic, 2)
    with trio.fail_after(60):
        metas = await produce(cluster, topic, 200, **cluster.client_options(mechanism))
    got = await trio.to_thread.run_sync(
        lambda: read_partitions(cluster.bootstrap, topic, [0, 1], 200,
                                config=cluster.librdkafka_config(mechanism)))
    assert sorted((m.partition(), m.offset(), m.value()) for m in got) == sorted(
        (meta.partition, meta.offset, b"v%05d" % i) for i, meta in enumerate(metas))
    # Our own reader and admin client reach it the same way.
    config = ClusterConfig(**cluster.client_options(mechanism))
    with trio.fail_after(60):
        records = [r async for r in read_topic(cluster.bootstrap, topic, stop_at_end=True,
                                               config=config)]
        async with Admin.open(cluster.bootstrap, config) as admin:
            described = await admin.describe_topics([topic])
    assert len(records) == 200
    assert len(described[topic].partitions) == 2


async def check_refused(cluster: KafkaCluster, error: type[AuthenticationError], match: str,
                        bootstrap: str | None = None, **options: Any) -> str:
    """open_producer fails with ``error`` within 5 s (request_timeout is 30 s: it is not
    retried until then); returns the message."""
    started = time.monotonic()
    with trio.fail_after(30), pytest.raises(error, match=match) as info:
        async with open_producer(bootstrap or cluster.bootstrap, request_timeout=30.0,
                                 **options):
            pass  # pragma: no cover
    assert time.monotonic() - started < 5.0
    return str(info.value)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_wrong_password(kafka_sasl_ssl: KafkaCluster, mechanism: str) -> None:
    text = await check_refused(
        kafka_sasl_ssl, SaslAuthenticationError, f"refused user 'alice' with SASL {mechanism}",
        **kafka_sasl_ssl.client_options(mechanism, password="not-alices-password"))
    assert "not-alices-password" not in text
    assert users(kafka_sasl_ssl)["alice"] not in text


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_unknown_user(kafka_sasl_plaintext: KafkaCluster, mechanism: str) -> None:
    text = await check_refused(
        kafka_sasl_plaintext, SaslAuthenticationError, "refused user 'mallory'",
        **kafka_sasl_plaintext.client_options(mechanism, user="mallory", password="guess-123"))
    assert "guess-123" not in text


@pytest.fixture(scope="module")
def kafka_scram_only(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """1 node, SASL_PLAINTEXT without OAUTHBEARER (the mechanism-not-enabled case);
    module-scoped: it stops when this module is done."""
    if kafka_unavailable is not None:
        pytest.skip(kafka_unavailable)
    with KafkaCluster(nodes=1, security_protocol="SASL_PLAINTEXT",
                      scram_users={"alice": "alice-pw"},
                      sasl_mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")) as cluster:
        yield cluster


async def test_mechanism_not_enabled(kafka_scram_only: KafkaCluster,
                                     nursery: trio.Nursery) -> None:
    options: dict[str, Any] = dict(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=unsecured_token_provider("alice"))
    text = await check_refused(
        kafka_scram_only, SaslMechanismError,
        "does not enable SASL mechanism OAUTHBEARER; it offers ", **options)
    offered = text.split("it offers ")[1].split(" (")[0]
    assert sorted(offered.split(", ")) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    # the fake, with the same mechanisms, refuses the same way
    fake = FakeCluster(brokers=1, auto_create_topics=False, sasl=FakeSasl(
        mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), users={"alice": "x"}))
    await nursery.start(fake.run)
    with trio.fail_after(30), pytest.raises(SaslMechanismError) as info:
        async with open_producer(fake.bootstrap, connector=fake.connector, **options):
            pass  # pragma: no cover
    fake_offered = str(info.value).split("it offers ")[1].split(" (")[0]
    assert sorted(fake_offered.split(", ")) == sorted(offered.split(", "))
    assert text.replace(kafka_scram_only.bootstrap, "B").replace(offered, "L") == \
        str(info.value).replace("fake-0:9092", "B").replace(fake_offered, "L")


async def test_expired_token(kafka_sasl_ssl: KafkaCluster) -> None:
    from pipeline.testing.kafka import unsecured_token

    def stale() -> tuple[str, float]:
        token, _ = unsecured_token("alice", lifetime=-10.0)
        return token, time.time() + 60  # the provider claims a valid one
    options = kafka_sasl_ssl.client_options("OAUTHBEARER")
    options["sasl_oauth_token_provider"] = stale
    text = await check_refused(kafka_sasl_ssl, SaslAuthenticationError, "invalid_token",
                               **options)
    assert "refused an OAUTHBEARER token" in text


async def test_a_token_issued_in_the_future_is_refused(kafka_sasl_ssl: KafkaCluster) -> None:
    """Kafka checks ``iat`` against its clock with no skew allowed: the rule the test
    kit's tokens meet by rounding ``iat`` down (tests/testing/test_kafka_pki.py)."""
    from pipeline.testing.kafka import unsecured_token

    def ahead() -> tuple[str, float]:
        return unsecured_token("alice", lifetime=60.0, now=time.time() + 5.0)
    options = kafka_sasl_ssl.client_options("OAUTHBEARER")
    options["sasl_oauth_token_provider"] = ahead
    await check_refused(kafka_sasl_ssl, SaslAuthenticationError, "invalid_token", **options)


async def test_untrusted_certificate(kafka_sasl_ssl: KafkaCluster) -> None:
    options = kafka_sasl_ssl.client_options("PLAIN")
    del options["ssl_cafile"]  # the system CAs do not know the test CA
    await check_refused(kafka_sasl_ssl, TlsCertificateError, "is not trusted", **options)


async def test_wrong_hostname(kafka_sasl_ssl: KafkaCluster) -> None:
    """The brokers' certificate names 127.0.0.1 only; localhost reaches the same port."""
    bootstrap = kafka_sasl_ssl.bootstrap.replace("127.0.0.1", "localhost")
    text = await check_refused(kafka_sasl_ssl, TlsHostnameError, "does not match",
                               bootstrap=bootstrap, **kafka_sasl_ssl.client_options("PLAIN"))
    assert "localhost" in text


async def test_mtls_without_a_client_certificate(kafka_mtls: KafkaCluster) -> None:
    await check_refused(kafka_mtls, TlsClientCertificateError,
                        "refused the client certificate",
                        **kafka_mtls.client_options(client_certificate=False))


async def test_plaintext_client_on_a_tls_listener(kafka_mtls: KafkaCluster) -> None:
    await check_refused(kafka_mtls, TlsError, "answered with TLS.*security_protocol=SSL")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "OAUTHBEARER"])
async def test_reauthentication_during_a_long_paced_send(
    kafka_sasl_ssl: KafkaCluster, kafka_topic: Callable[[str], str], mechanism: str
) -> None:
    """KIP-368: the broker ends each session after 3-4 s. A 12 s paced send (one message
    every 40 ms) re-authenticates on the same connections, and every message is written
    exactly once, in order (read back by confluent-kafka). Without re-authentication
    the broker closes each connection at its session's end (the client reconnects:
    ``connects`` would grow)."""
    cluster = kafka_sasl_ssl
    topic = kafka_topic("reauth")
    await cluster.call(cluster.create_topic, topic, 1)
    options = cluster.client_options(mechanism, user="bob")
    if mechanism == "OAUTHBEARER":
        # Tokens live 6 s: the session ends at min(4 s, the token's expiry), and the
        # re-authentication after 85-95% of it needs a fresh token from time to time.
        options["sasl_oauth_token_provider"] = provider = unsecured_token_provider("bob", 6.0)
    n = 300
    with trio.fail_after(90):
        async with open_producer(cluster.bootstrap, request_timeout=10.0,
                                 **options) as producer:
            await producer.send_and_wait(topic, b"first")
            cluster_client = producer._core.cluster
            connects_before = cluster_client.connects
            deliveries = []
            for i in range(n):
                deliveries.append(await producer.send(topic, b"m%04d" % i))
                await trio.sleep(0.04)
            metas = [await d for d in deliveries]
            conns = cluster_client.open_connections()
            reauths = sum(c.reauthentications for c in conns)
            assert cluster_client.connects == connects_before  # no reconnect at all
    lifetime = reauth_seconds(cluster, mechanism)
    assert reauths >= int(12 / lifetime) - 1, reauths
    assert [m.offset for m in metas] == list(range(1, n + 1))
    got = await trio.to_thread.run_sync(
        lambda: read_partitions(cluster.bootstrap, topic, [0], n + 1,
                                config=cluster.librdkafka_config(mechanism, user="bob")))
    assert [m.value() for m in got] == [b"first"] + [b"m%04d" % i for i in range(n)]
    # ...and nothing after them: no duplicate at the end either
    with trio.fail_after(30):
        ends = await topic_offsets(cluster.bootstrap, topic, **cluster.client_options("PLAIN"))
    assert ends == {0: (0, n + 1)}
    if mechanism == "OAUTHBEARER":
        assert provider.calls >= 2  # type: ignore[attr-defined]


async def test_revoked_credentials_fail_later_messages_and_keep_delivered_ones(
    kafka_sasl_ssl: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    """The policy (as the Java client's SaslAuthenticationException, KIP-152): not
    retried. carol's SCRAM-SHA-512 credential is deleted while she produces; her session
    (3 s) ends, the re-authentication is refused and closes the connection, and the
    messages sent from then on fail with SaslAuthenticationError within seconds (not
    after delivery_timeout, 120 s). What was delivered stays; close returns at once."""
    cluster = kafka_sasl_ssl
    topic = kafka_topic("revoked")
    await cluster.call(cluster.create_topic, topic, 1)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.internal_bootstrap})
    scram = confluent_kafka.admin.ScramMechanism.SCRAM_SHA_512
    try:
        with trio.fail_after(90):
            async with open_producer(cluster.bootstrap, request_timeout=10.0,
                                     delivery_timeout=120.0,
                                     **cluster.client_options("SCRAM-SHA-512", user="carol")
                                     ) as producer:
                early = [await producer.send_and_wait(topic, b"ok%d" % i) for i in range(5)]
                deleting = admin.alter_user_scram_credentials(
                    [confluent_kafka.admin.UserScramCredentialDeletion("carol", scram)])
                await trio.to_thread.run_sync(lambda: [f.result(15) for f in deleting.values()])
                revoked_at = time.monotonic()
                failed: list[ProducerError] = []
                for i in range(100):  # 10 s paced: the session ends within 3 s
                    try:
                        await producer.send_and_wait(topic, b"late%d" % i)
                    except ProducerError as exc:
                        failed.append(exc)
                        break
                    await trio.sleep(0.1)
                failed_after = time.monotonic() - revoked_at
                after = await producer.send(topic, b"after")
                with pytest.raises(ProducerError) as info:
                    await after
                close_started = time.monotonic()
            closed_in = time.monotonic() - close_started
    finally:
        futures = admin.alter_user_scram_credentials([
            confluent_kafka.admin.UserScramCredentialUpsertion(
                "carol", confluent_kafka.admin.ScramCredentialInfo(scram, 4096),
                users(cluster)["carol"].encode())])
        for f in futures.values():
            f.result(15)
        del admin  # a librdkafka client reconnects until collected
    assert [m.offset for m in early] == [0, 1, 2, 3, 4]
    assert len(failed) == 1 and isinstance(failed[0].cause, SaslAuthenticationError)
    assert "refused user 'carol'" in str(failed[0].cause)
    assert failed_after < 3.0 + 5.0, failed_after
    assert isinstance(info.value.cause, SaslAuthenticationError)
    assert closed_in < 5.0
    got = await trio.to_thread.run_sync(
        lambda: read_partitions(cluster.bootstrap, topic, [0], 5,
                                config=cluster.librdkafka_config("SCRAM-SHA-512")))
    assert [m.value() for m in got[:5]] == [b"ok%d" % i for i in range(5)]


async def test_no_secret_in_debug_logs(
    kafka_sasl_ssl: KafkaCluster, kafka_topic: Callable[[str], str],
    caplog: pytest.LogCaptureFixture
) -> None:
    """Every mechanism, a refusal and a success, everything logged at DEBUG: no password
    and no token in any record (message, arguments, exception text)."""
    cluster = kafka_sasl_ssl
    topic = kafka_topic("logs")
    await cluster.call(cluster.create_topic, topic, 1)
    tokens: list[str] = []
    base = unsecured_token_provider("alice", 3600)

    def provider() -> tuple[str, float]:
        token, expiry = base()
        tokens.append(token)
        return token, expiry

    caplog.set_level(logging.DEBUG)
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"):
        options = cluster.client_options(mechanism)
        if mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = provider
        await produce(cluster, topic, 3, **options)
        with pytest.raises(AuthenticationError):
            await produce(cluster, topic, 1, **cluster.client_options(
                mechanism if mechanism != "OAUTHBEARER" else "PLAIN", password="Wr0ng-Pa55"))
    assert tokens
    secrets = [*users(cluster).values(), "Wr0ng-Pa55", *tokens]
    text = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.exc_info[1] if r.exc_info else ''}"
        for r in caplog.records)
    assert "authentication failed" in text  # the refusals were logged...
    leaked = [s for s in secrets if s in text]
    assert not leaked  # ...without a secret


def _broker_says(text: str) -> str:
    """The broker's own part of a refusal: ``(<ERROR_CODE>: <its message>)``."""
    found = re.search(r"\(([A-Z_]+: [^()]*)\)", text)
    assert found is not None, text
    return found.group(1)


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("PLAIN", "alice", "wrong-pw-1"), ("PLAIN", "mallory", "any-pw-2"),
    ("SCRAM-SHA-256", "alice", "wrong-pw-3"), ("SCRAM-SHA-512", "mallory", "any-pw-4"),
])
async def test_the_fake_refuses_as_kafka_does(
    kafka_sasl_plaintext: KafkaCluster, nursery: trio.Nursery, mechanism: str, user: str,
    password: str,
) -> None:
    """The FakeCluster's SASL refusals (tests/scenarios/test_sasl.py rely on them) are
    Kafka's: the same error class, error code and broker message."""
    fake = FakeCluster(brokers=1, auto_create_topics=False,
                       sasl=FakeSasl(users=dict(users(kafka_sasl_plaintext))))
    await nursery.start(fake.run)
    options = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                   sasl_username=user, sasl_password=password)
    errors = []
    for bootstrap, extra in ((kafka_sasl_plaintext.bootstrap, {}),
                             (fake.bootstrap, {"connector": fake.connector})):
        with trio.fail_after(30), pytest.raises(AuthenticationError) as info:
            async with open_producer(bootstrap, request_timeout=10.0, **options, **extra):
                pass  # pragma: no cover
        errors.append(info.value)
    on_kafka, on_fake = errors
    assert type(on_fake) is type(on_kafka)
    assert _broker_says(str(on_fake)) == _broker_says(str(on_kafka)), (on_kafka, on_fake)
