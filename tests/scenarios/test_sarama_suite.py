"""sarama's AsyncProducer test suite, as scenarios against the FakeCluster.

Each test names the sarama test it ports (sarama's async_producer_test.go), runs on
autojump_clock, and asserts per-partition order, exactly one outcome per
message, and the virtual time the retry protocol implies (retry_backoff=0.1,
no jitter, every fake request answered in zero virtual time).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline import BrokerResponseError, ProducerClosed, ProducerError, RequestTimedOutError
from pipeline.producer._outcomes.delivery import Delivery
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

from .conftest import open_fake_producer, values_in_log

pytestmark = pytest.mark.usefixtures("both_modes")


async def outcomes(deliveries: list[Delivery]) -> list[Any]:
    """The outcome of each delivery: RecordMetadata or the ProducerError."""
    out: list[Any] = []
    for d in deliveries:
        try:
            out.append(await d)
        except ProducerError as exc:
            out.append(exc)
    return out


def vals(prefix: str, n: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(start, start + n)]


async def send_all(producer: Any, topic: str, values: list[bytes], **kw: Any) -> list[Delivery]:
    return [await producer.send(topic, v, **kw) for v in values]


async def test_failure_retry_after_not_leader(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerFailureRetry: NOT_LEADER on leader 0, success on leader 1."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 10), partition=0))
        fake.move_leader("t", 0, to=1)
        t0 = trio.current_time()
        second = await outcomes(await send_all(producer, "t", vals("b", 10), partition=0))
        assert trio.current_time() == t0 + 0.125
    assert [m.offset for m in first + second] == list(range(20))
    assert values_in_log(fake, "t", 0) == vals("a", 10) + vals("b", 10)
    assert producer.statistics().double_settles == 0
    # The retried request went to the new leader, after one NOT_LEADER answer.
    nodes = [r.node_id for r in fake.requests_of(ApiKey.PRODUCE)]
    assert nodes[-1] == 1 and 0 in nodes


def leader_script(fake: FakeCluster, steps: list[str]) -> list[int]:
    """A sticky Produce hook: each step is 'move:N' (move the leader to N, so this
    broker answers NOT_LEADER), 'stale' (answer NOT_LEADER without moving) or 'ok'."""
    seen: list[int] = []
    script = list(steps)

    def hook(ctx: ControlContext) -> None:
        seen.append(ctx.node_id)
        if not script:
            return None
        step = script.pop(0)
        if step.startswith("move:"):
            fake.move_leader("t", 0, to=int(step[5:]))
        elif step == "stale":
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=ctx.node_id)
        return None

    fake.control(ApiKey.PRODUCE, hook, sticky=True)
    return seen


async def test_multiple_retries_leader_ping_pong(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerMultipleRetries: leader 0 -> 1 -> 0 -> 0 (stale) -> 1, retries=4."""
    fake.create_topic("t", 1, leaders=[0])
    seen = leader_script(fake, ["ok", "move:1", "move:0", "stale", "move:1", "ok"])
    async with open_fake_producer(fake, retries=4, retry_backoff_jitter=0) as producer:
        await producer.send_and_wait("t", b"warm-up", partition=0)
        t0 = trio.current_time()
        results = await outcomes(await send_all(producer, "t", vals("m", 5), partition=0))
        assert trio.current_time() == t0 + 4 * 0.125  # four backoffs
    assert [r.offset for r in results] == list(range(1, 6))
    assert seen == [0, 0, 1, 0, 0, 1]
    assert values_in_log(fake, "t", 0) == [b"warm-up", *vals("m", 5)]


async def test_retries_exhausted_report_the_last_error(fake: FakeCluster, autojump_clock: Any) -> None:
    """Same ping-pong with retries=3: every message fails once, with NOT_LEADER."""
    fake.create_topic("t", 1, leaders=[0])
    leader_script(fake, ["move:1", "move:0", "stale", "move:1", "ok"])
    async with open_fake_producer(fake, retries=3, retry_backoff_jitter=0) as producer:
        await producer._core.cluster.partitions_for("t")
        results = await outcomes(await send_all(producer, "t", vals("m", 5), partition=0))
    assert all(isinstance(r, ProducerError) for r in results)
    causes = {type(r.cause) for r in results}
    assert causes == {BrokerResponseError}
    assert {r.cause.code for r in results} == {ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert values_in_log(fake, "t", 0) == []
    assert producer.statistics().double_settles == 0


async def test_broker_bounce(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerBrokerBounce: the connection drops; later messages still arrive in order."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 10), partition=0))
        assert fake.drop_connections(0) >= 1
        second = await outcomes(await send_all(producer, "t", vals("b", 10), partition=0))
    assert [m.offset for m in first + second] == list(range(20))
    assert values_in_log(fake, "t", 0) == vals("a", 10) + vals("b", 10)


async def test_broker_bounce_with_stale_metadata(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerBrokerBounceWithStaleMetadata: the leader's broker stops; the
    producer's metadata still names it; it refreshes and reaches the new leader."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 5), partition=0))
        fake.stop_broker(0)
        second = await outcomes(await send_all(producer, "t", vals("b", 5), partition=0))
        fake.restart_broker(0)
    assert [m.offset for m in first + second] == list(range(10))
    assert values_in_log(fake, "t", 0) == vals("a", 5) + vals("b", 5)
    assert fake.leader("t", 0) != 0 or fake.partition("t", 0).leader_epoch > 0


async def test_retry_during_shutdown(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerRetryShutdown: close while a retry is pending; the retried
    messages are still delivered, and sends after close are refused."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0)
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        deliveries = await send_all(producer, "t", vals("m", 10), partition=0)
        await fake.wait_for_requests(ApiKey.PRODUCE, 1)  # the failed attempt happened
        t0 = trio.current_time()
    assert trio.current_time() == t0 + 0.125  # close waited for the retry only
    results = await outcomes(deliveries)
    assert [r.offset for r in results] == list(range(10))
    with pytest.raises(ProducerClosed):
        await producer.send("t", b"late")
    assert values_in_log(fake, "t", 0) == vals("m", 10)


async def test_retries_disabled_still_refreshes_leadership(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """TestAsyncProducerRecoveryWithRetriesDisabled (sarama #294): with retries=0 a
    NOT_LEADER fails the messages, and the next messages reach the new leader."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, retries=0, idempotent=False) as producer:
        await outcomes(await send_all(producer, "t", vals("a", 3), partition=0))
        fake.move_leader("t", 0, to=2)
        failed = await outcomes(await send_all(producer, "t", vals("b", 3), partition=0))
        await trio.sleep(0.5)
        later = await outcomes(await send_all(producer, "t", vals("c", 3), partition=0))
    assert all(isinstance(r, ProducerError) for r in failed)
    assert {r.cause.code for r in failed} == {ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert [r.offset for r in later] == [3, 4, 5]
    assert values_in_log(fake, "t", 0) == vals("a", 3) + vals("c", 3)


async def test_slow_broker_with_concurrent_requests(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerMultipleRetriesWithConcurrentRequests (sarama #2133): responses
    slower than request_timeout, several partitions with requests pipelined; every
    message fails once with a timeout, nothing hangs."""
    fake.create_topic("t", 4, leaders=[0, 0, 0, 0])
    fake.delay_responses(30.0, api_key=ApiKey.PRODUCE, node_id=0)
    async with open_fake_producer(
        fake, retries=1, request_timeout=1.0, retry_backoff_jitter=0, delivery_timeout=60.0
    ) as producer:
        t0 = trio.current_time()
        deliveries = []
        for i in range(20):
            deliveries.append(await producer.send("t", b"x%d" % i, partition=i % 4))
        results = await outcomes(deliveries)
        elapsed = trio.current_time() - t0
    assert all(isinstance(r, ProducerError) for r in results)
    assert {type(r.cause) for r in results} <= {RequestTimedOutError}
    assert elapsed < 10.0
    assert producer.statistics().double_settles == 0


async def test_partitions_sharing_a_broker_producer(fake: FakeCluster, autojump_clock: Any) -> None:
    """TestAsyncProducerRetryWithReferenceOpen / FlusherRetryCondition: two partitions
    on one broker; one fails and retries, the other is not held back."""
    fake.create_topic("t", 2, leaders=[0, 0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0, topic="t", partition=0)
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        p0 = await send_all(producer, "t", vals("p0-", 5), partition=0)
        p1 = await send_all(producer, "t", vals("p1-", 5), partition=1)
        r1 = await outcomes(p1)
        assert trio.current_time() == t0  # partition 1 did not wait for partition 0
        r0 = await outcomes(p0)
        assert trio.current_time() == t0 + 0.125
    assert [r.offset for r in r0] == list(range(5))
    assert [r.offset for r in r1] == list(range(5))
    assert values_in_log(fake, "t", 0) == vals("p0-", 5)
    assert values_in_log(fake, "t", 1) == vals("p1-", 5)
