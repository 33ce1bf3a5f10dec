"""SASL against the FakeCluster's SASL_PLAINTEXT listeners (Kafka's rules, fake/sasl.py),
on autojump_clock: every "at once" and "within a bound" is an exact virtual-time check.

Apache Kafka itself runs the same paths in tests/apache_kafka/test_kafka_security.py.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from pipeline.cluster.errors import SaslAuthenticationError, SaslMechanismError
from pipeline.consumer import read_topic
from pipeline.producer._errors import ProducerError
from pipeline.testing.fake_cluster import FakeCluster, FakeSasl

from .conftest import open_fake_producer, values_in_log

USERS = {"alice": "alice-secret-1", "bob": "bob-secret-2"}


async def _fake(nursery: trio.Nursery, sasl: FakeSasl, brokers: int = 1) -> FakeCluster:
    fake = FakeCluster(brokers=brokers, seed=3, auto_create_topics=False, sasl=sasl)
    await nursery.start(fake.run)
    fake.create_topic("t", 1)
    return fake


def credentials(mechanism: str, user: str = "alice", password: str | None = None
                ) -> dict[str, Any]:
    return dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                sasl_username=user, sasl_password=USERS[user] if password is None else password)


def token_provider(fake: FakeCluster, principal: str, lifetime: float
                   ) -> tuple[Callable[[], Awaitable[tuple[str, float]]], list[float]]:
    """An async provider issuing fake tokens valid for ``lifetime`` seconds; records when
    it was called (virtual time)."""
    calls: list[float] = []
    assert fake.sasl is not None

    async def provide() -> tuple[str, float]:
        await trio.lowlevel.checkpoint()
        calls.append(trio.current_time())
        token = fake.sasl.issue_token(principal, expires_at=trio.current_time() + lifetime)
        return token, time.time() + lifetime

    return provide, calls


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"])
async def test_each_mechanism_round_trip(nursery: trio.Nursery, autojump_clock: Any,
                                         mechanism: str) -> None:
    fake = await _fake(nursery, FakeSasl(users=dict(USERS)))
    if mechanism == "OAUTHBEARER":
        provider, _ = token_provider(fake, "alice", 3600.0)
        options: dict[str, Any] = dict(security_protocol="SASL_PLAINTEXT",
                                       sasl_mechanism="OAUTHBEARER",
                                       sasl_oauth_token_provider=provider)
    else:
        options = credentials(mechanism)
    async with open_fake_producer(fake, idempotent=True, **options) as producer:
        for i in range(5):
            await producer.send_and_wait("t", b"v%d" % i)
    assert values_in_log(fake, "t", 0) == [b"v%d" % i for i in range(5)]
    assert fake.sasl is not None
    assert {(a.principal, a.mechanism) for a in fake.sasl.authentications} == {
        ("alice", mechanism)
    }
    # The consumer reaches the same cluster the same way.
    records = [r async for r in read_topic(fake.bootstrap, "t", stop_at_end=True,
                                           config=_cluster_config(fake, options))]
    assert [r.value for r in records] == [b"v%d" % i for i in range(5)]


def _cluster_config(fake: FakeCluster, options: dict[str, Any]) -> Any:
    from pipeline.cluster.config import ClusterConfig

    return ClusterConfig(connector=fake.connector, **options)


@pytest.mark.parametrize(
    ("user", "password"),
    [("alice", "wrong-password"), ("mallory", "whatever-pw")],
    ids=["wrong-password", "unknown-user"],
)
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_refused_credentials_fail_open_at_once(
    nursery: trio.Nursery, autojump_clock: Any, mechanism: str, user: str, password: str
) -> None:
    fake = await _fake(nursery, FakeSasl(users=dict(USERS)))
    options = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                   sasl_username=user, sasl_password=password)
    started = trio.current_time()
    with pytest.raises(SaslAuthenticationError) as info:
        async with open_fake_producer(fake, request_timeout=30.0, **options):
            pass  # pragma: no cover
    text = str(info.value)
    assert f"user {user!r}" in text and mechanism in text, text
    assert "SASL_AUTHENTICATION_FAILED" in text
    assert password not in text
    # Not retried until request_timeout (30 s): one attempt, no virtual time passed.
    assert trio.current_time() - started == 0
    assert len(fake.requests_of(36)) == (1 if mechanism == "PLAIN" else 1 + (user == "alice"))


async def test_mechanism_not_enabled_lists_what_the_broker_offers(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    fake = await _fake(nursery, FakeSasl(mechanisms=("PLAIN", "SCRAM-SHA-512"), users=USERS))
    with pytest.raises(SaslMechanismError, match="offers PLAIN, SCRAM-SHA-512") as info:
        async with open_fake_producer(fake, **credentials("SCRAM-SHA-256")):
            pass  # pragma: no cover
    assert "does not enable SASL mechanism SCRAM-SHA-256" in str(info.value)
    assert info.value.mechanisms == ("PLAIN", "SCRAM-SHA-512")


async def test_sasl_client_against_a_listener_without_sasl(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    fake = FakeCluster(brokers=1, auto_create_topics=False)  # PLAINTEXT listener
    await nursery.start(fake.run)
    with pytest.raises(SaslMechanismError, match="does not expect SASL"):
        async with open_fake_producer(fake, **credentials("PLAIN")):
            pass  # pragma: no cover


async def test_plaintext_client_against_a_sasl_listener_is_closed(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """Kafka closes a connection whose first request after ApiVersions is not SASL: the
    client cannot tell why (Kafka says nothing), and reports no answer in bounded time."""
    fake = await _fake(nursery, FakeSasl(users=dict(USERS)))
    from pipeline.cluster.errors import BrokerConnectionError

    with pytest.raises(BrokerConnectionError, match="no bootstrap broker"):
        async with open_fake_producer(fake, request_timeout=2.0):
            pass  # pragma: no cover
    assert trio.current_time() <= 2.0


async def test_reauthentication_keeps_the_connection_and_loses_nothing(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """KIP-368: with a 2 s session lifetime, a 30 s paced send re-authenticates on the
    same connections, never sends a request on an expired session (the fake would close
    the connection, as Kafka does), and every message is written once, in order."""
    fake = await _fake(nursery, FakeSasl(users=dict(USERS), session_lifetime=2.0), brokers=1)
    assert fake.sasl is not None
    async with open_fake_producer(fake, idempotent=True, **credentials("SCRAM-SHA-512")
                                  ) as producer:
        deliveries = []
        for i in range(150):
            deliveries.append(await producer.send("t", b"m%03d" % i))
            await trio.sleep(0.2)
        for d in deliveries:
            await d
    assert values_in_log(fake, "t", 0) == [b"m%03d" % i for i in range(150)]
    assert fake.sasl.expired_requests == 0
    first = [a for a in fake.sasl.authentications if not a.reauthentication]
    again = [a for a in fake.sasl.authentications if a.reauthentication]
    # one bootstrap connection (closed after the first metadata) + one to broker 0
    assert len(first) == 2
    assert len(again) >= 30 / 2.0 * 0.9 - 1  # every 1.7-1.9 s over 30 s
    gaps = [b.time - a.time for a, b in itertools.pairwise(again)
            if a.node_id == b.node_id]
    assert all(1.7 <= g <= 1.9 for g in gaps), gaps


async def test_oauthbearer_token_is_refreshed_before_it_expires(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The broker bounds the session by the token's life (10 s here, under a 60 s
    max); re-authentication at 85-95% of it finds the cached token past 80% of its
    life and fetches a fresh one, so the broker never sees an expired token."""
    fake = await _fake(nursery, FakeSasl(session_lifetime=60.0))
    assert fake.sasl is not None
    provider, calls = token_provider(fake, "svc", 10.0)
    async with open_fake_producer(
        fake, idempotent=True, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=provider,
    ) as producer:
        for i in range(60):
            await producer.send_and_wait("t", b"%d" % i)
            await trio.sleep(1.0)
    assert len(values_in_log(fake, "t", 0)) == 60
    assert fake.sasl.expired_requests == 0
    assert all(a.principal == "svc" for a in fake.sasl.authentications)
    assert len(calls) >= 6  # one per ~8.5-9.5 s session
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(g >= 8.0 for g in gaps), gaps  # never before 80% of a token's life


async def test_oauthbearer_rejected_token(nursery: trio.Nursery, autojump_clock: Any) -> None:
    fake = await _fake(nursery, FakeSasl())

    async def stale() -> tuple[str, float]:
        await trio.lowlevel.checkpoint()
        return "not-a-token-the-broker-knows", time.time() + 60

    with pytest.raises(SaslAuthenticationError, match="token status: invalid_token") as info:
        async with open_fake_producer(fake, security_protocol="SASL_PLAINTEXT",
                                      sasl_mechanism="OAUTHBEARER",
                                      sasl_oauth_token_provider=stale):
            pass  # pragma: no cover
    assert "not-a-token-the-broker-knows" not in str(info.value)


async def test_failing_token_provider(nursery: trio.Nursery, autojump_clock: Any) -> None:
    fake = await _fake(nursery, FakeSasl())

    async def broken() -> tuple[str, float]:
        raise RuntimeError("https://idp.example/token?client_secret=hunter2 refused")

    with pytest.raises(SaslAuthenticationError, match="provider raised RuntimeError") as info:
        async with open_fake_producer(fake, security_protocol="SASL_PLAINTEXT",
                                      sasl_mechanism="OAUTHBEARER",
                                      sasl_oauth_token_provider=broken):
            pass  # pragma: no cover
    assert "hunter2" not in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("result", "match"),
    [("just-a-token", "must return"), (("tok", "tomorrow"), "must return"),
     (("tok", 1.0), "expired")],
)
async def test_token_provider_contract(nursery: trio.Nursery, result: object, match: str
                                       ) -> None:
    # Real time: a synchronous provider runs in a worker thread, and autojump_clock
    # would jump virtual time past every timeout while the loop waits for it.
    fake = await _fake(nursery, FakeSasl())

    def provide() -> object:  # sync: runs in a worker thread
        return result

    with pytest.raises(SaslAuthenticationError, match=match):
        async with open_fake_producer(fake, security_protocol="SASL_PLAINTEXT",
                                      sasl_mechanism="OAUTHBEARER",
                                      sasl_oauth_token_provider=provide):
            pass  # pragma: no cover


async def test_failed_reauthentication_fails_later_messages_fast_and_keeps_delivered_ones(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """The policy (as the Java client's, KIP-152): an authentication failure is not
    retried. alice's password changes on the broker at t=5; her session ends within
    the 3 s lifetime, the re-authentication is refused and closes the connection; the
    messages sent after that fail with SaslAuthenticationError (not after
    delivery_timeout), those delivered before stay delivered, and close returns."""
    sasl = FakeSasl(users=dict(USERS), session_lifetime=3.0)
    fake = await _fake(nursery, sasl)
    delivered: list[Any] = []
    failed: list[ProducerError] = []
    async with open_fake_producer(fake, idempotent=True, delivery_timeout=60.0,
                                  **credentials("SCRAM-SHA-256")) as producer:
        for i in range(5):
            delivered.append(await producer.send_and_wait("t", b"ok%d" % i))
            await trio.sleep(1.0)
        sasl.users["alice"] = "changed-by-the-admin"
        changed_at = trio.current_time()
        later = [await producer.send("t", b"late%d" % i) for i in range(3)]
        await trio.sleep(4.0)  # past the session's end: the re-authentication is refused
        after = [await producer.send("t", b"after%d" % i) for i in range(3)]
        for d in later + after:
            try:
                await d
            except ProducerError as exc:
                failed.append(exc)
        settled_at = trio.current_time()
        close_started = trio.current_time()
    assert trio.current_time() - close_started < 1.0  # close stays bounded
    assert [m.offset for m in delivered] == [0, 1, 2, 3, 4]
    in_log = values_in_log(fake, "t", 0)
    assert in_log[:5] == [b"ok%d" % i for i in range(5)]
    # "late" ones went out on the still-valid session; "after" ones met the refusal.
    assert len(failed) == 3
    assert all(isinstance(e.cause, SaslAuthenticationError) for e in failed)
    assert all("user 'alice'" in str(e.cause) and "SCRAM-SHA-256" in str(e.cause)
               for e in failed)
    assert b"after0" not in in_log
    assert settled_at - changed_at < 4.0 + 1.0  # a refusal, not a delivery timeout


async def test_a_partition_is_served_again_once_authentication_works_again(
    nursery: trio.Nursery, autojump_clock: Any
) -> None:
    """An authentication failure fails what waits for the broker at once (not
    retried, KIP-152) without giving the partition up for good: everything the
    broker producer held failed and nothing went back, so it tells the
    partition producer (``leader_changed``), which leaves with a chaser. Once
    the credentials work again, the next message is written. Without that,
    the broker producer kept the partition retrying with the authentication
    error and failed every later message with it, forever, without even
    trying to connect.

    Schedule (PLAIN, 3 s sessions): ok is written; alice's password changes,
    the re-authentication is refused and the connection closed; m, sent 4 s
    later, fails with SaslAuthenticationError. The password is set back; n,
    sent 5 s later, is written."""
    sasl = FakeSasl(users=dict(USERS), session_lifetime=3.0)
    fake = await _fake(nursery, sasl)
    async with open_fake_producer(fake, idempotent=False, delivery_timeout=60.0,
                                  **credentials("PLAIN")) as producer:
        ok = await producer.send_and_wait("t", b"ok")
        sasl.users["alice"] = "changed-by-the-admin"
        await trio.sleep(4.0)
        m = await producer.send("t", b"m")
        with pytest.raises(ProducerError) as refused:
            await m
        assert isinstance(refused.value.cause, SaslAuthenticationError)
        sasl.users["alice"] = USERS["alice"]
        await trio.sleep(5.0)
        n = await producer.send_and_wait("t", b"n")
    assert (ok.offset, n.offset) == (0, 1)
    assert values_in_log(fake, "t", 0) == [b"ok", b"n"]
