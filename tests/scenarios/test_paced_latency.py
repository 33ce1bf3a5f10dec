"""Design latency at a paced rate, on virtual time: what the pipeline adds to linger when
CPU costs nothing (issue 15, goal 6; the real-time figures are bench/latency_bench.py's).

20k msg/s, linger 5 ms, acks=all, idempotent, one broker answering at once: every
message must be acknowledged within linger of its send() (the pipeline's hops, the
flusher's wake-ups and the responder add no virtual time), and linger must batch
(about one request per linger period, not one per pacing step).
"""

from __future__ import annotations

import pytest
import trio

from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer

RATE = 20_000
LINGER = 0.005


@pytest.mark.parametrize("burst", [1, 20], ids=["every-50us", "20-per-ms"])
async def test_paced_sends_are_acknowledged_within_linger(autojump_clock: trio.abc.Clock,
                                                          burst: int) -> None:
    n = 2_000  # 0.1 s of virtual time
    fake = FakeCluster(brokers=1, seed=7, auto_create_topics=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.run)
        fake.create_topic("t", partitions=6)
        sent = [0.0] * n
        acked = [0.0] * n
        async with open_fake_producer(fake, idempotent=True, linger=LINGER) as producer:
            await producer.send_and_wait("t", b"warm-up")
            requests0 = producer.statistics().requests_sent

            async def watch(burst_items: list[tuple[int, object]]) -> None:
                for k, delivery in burst_items:
                    await delivery  # type: ignore[misc]
                    acked[k] = trio.current_time()

            async with trio.open_nursery() as watchers:
                start = trio.current_time()
                for i in range(0, n, burst):
                    await trio.sleep_until(start + i / RATE)
                    items = []
                    for k in range(i, min(n, i + burst)):
                        sent[k] = trio.current_time()
                        items.append((k, await producer.send("t", b"v" * 100)))
                    watchers.start_soon(watch, items)
            requests = producer.statistics().requests_sent - requests0
        nursery.cancel_scope.cancel()
    latency = sorted(a - s for s, a in zip(sent, acked, strict=True))
    assert latency[0] >= 0
    assert latency[-1] <= LINGER + 1e-9, f"max {latency[-1] * 1000:.3f} ms"
    assert latency[n // 2] == pytest.approx(LINGER / 2, abs=0.0011)  # uniform over linger
    assert requests <= n / RATE / LINGER + 2  # one request per linger period
