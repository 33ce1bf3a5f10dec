"""FaultProxy: each fault, first against the fake cluster over TCP (fast, checks what the
broker applied), then against the embedded tansu broker (marked integration)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import list_offsets as lo
from pipeline.protocol.messages import metadata as md
from pipeline.testing.broker import EmbeddedBroker, free_port
from pipeline.testing.fake_cluster import FakeCluster
from pipeline.testing.proxy import FaultProxy

from . import RawClient, batch, partition_response, produce_request


async def open_client(proxy: FaultProxy) -> RawClient:
    return RawClient(await trio.open_tcp_stream("127.0.0.1", proxy.port))


@pytest.fixture
async def fake_behind_proxy(nursery: trio.Nursery) -> tuple[FakeCluster, FaultProxy]:
    fake = FakeCluster(brokers=1, tcp=True, seed=2)
    fake.create_topic("t", 1)
    await nursery.start(fake.run)
    port = int(fake.bootstrap.rsplit(":", 1)[1])
    proxy = FaultProxy("127.0.0.1", port, seed=9)
    await nursery.start(proxy.run)
    return fake, proxy


async def test_forwards_whole_frames(fake_behind_proxy: tuple[FakeCluster, FaultProxy]) -> None:
    _fake, proxy = fake_behind_proxy
    c = await open_client(proxy)
    for i in range(3):
        r = partition_response(await c.request(produce_request("t", 0, batch(b"v%d" % i)), 9))
        assert (r.error_code, r.base_offset) == (0, i)
    assert (proxy.stats.requests, proxy.stats.responses, proxy.stats.accepted) == (3, 3, 1)


async def test_lose_responses_write_applied_ack_lost(
    fake_behind_proxy: tuple[FakeCluster, FaultProxy],
) -> None:
    fake, proxy = fake_behind_proxy
    proxy.lose_responses(1, api_key=ApiKey.PRODUCE)
    c = await open_client(proxy)
    assert (await c.request(md.MetadataRequest(topics=None), 9)).brokers  # not a Produce: forwarded
    await c.send(produce_request("t", 0, batch(b"applied")), 9)
    assert await c.closed()
    assert [e.record.value for e in fake.log("t", 0)] == [b"applied"]
    assert proxy.stats.responses_lost == 1
    assert [e.kind for e in proxy.events if e.kind in ("lose_response", "kill")] == [
        "lose_response",
        "kill",
    ]


async def test_stop_losing_responses_disarms_what_has_not_fired(
    fake_behind_proxy: tuple[FakeCluster, FaultProxy],
) -> None:
    fake, proxy = fake_behind_proxy
    proxy.lose_responses(2, api_key=ApiKey.PRODUCE)
    c = await open_client(proxy)
    await c.send(produce_request("t", 0, batch(b"lost ack")), 9)
    assert await c.closed()
    assert proxy.stats.responses_lost == 1
    assert proxy.stop_losing_responses() == 1  # the second one had not fired
    assert proxy.stop_losing_responses() == 0
    c = await open_client(proxy)
    r = partition_response(await c.request(produce_request("t", 0, batch(b"answered")), 9))
    assert (r.error_code, r.base_offset) == (0, 1)
    assert proxy.stats.responses_lost == 1
    assert [e.record.value for e in fake.log("t", 0)] == [b"lost ack", b"answered"]


async def test_cut_mid_frame_response(fake_behind_proxy: tuple[FakeCluster, FaultProxy]) -> None:
    _, proxy = fake_behind_proxy
    proxy.cut_mid_frame("response")
    c = await open_client(proxy)
    await c.send(md.MetadataRequest(topics=None), 9)
    assert await c.closed()  # a partial frame, then EOF
    assert 0 < c.buffered
    assert proxy.stats.cuts == 1


async def test_cut_mid_frame_request_is_not_applied(
    fake_behind_proxy: tuple[FakeCluster, FaultProxy],
) -> None:
    fake, proxy = fake_behind_proxy
    proxy.cut_mid_frame("request")
    c = await open_client(proxy)
    await c.send(produce_request("t", 0, batch(b"half")), 9)
    assert await c.closed()
    await trio.sleep(0.1)
    assert fake.requests == []  # the fake never saw a whole request
    assert fake.high_watermark("t", 0) == 0


async def test_kill_on_command_and_random_lifetimes(
    fake_behind_proxy: tuple[FakeCluster, FaultProxy],
) -> None:
    _, proxy = fake_behind_proxy
    a, b = await open_client(proxy), await open_client(proxy)
    for c in (a, b):
        await c.request(md.MetadataRequest(topics=None), 9)
    killed = proxy.kill_one()
    assert killed in (1, 2)
    assert proxy.kill_all() == 1
    assert await a.closed()
    assert await b.closed()

    proxy.kill_randomly(0.05, 0.1)
    c = await open_client(proxy)
    t0 = trio.current_time()
    with trio.fail_after(5):
        assert await c.closed()
    assert 0.04 <= trio.current_time() - t0 < 2
    assert proxy.events[-2].detail == "random lifetime"


async def test_blackhole_and_delay(fake_behind_proxy: tuple[FakeCluster, FaultProxy]) -> None:
    _, proxy = fake_behind_proxy
    c = await open_client(proxy)
    await c.request(md.MetadataRequest(topics=None), 9)
    proxy.blackhole(0.3)
    t0 = trio.current_time()
    await c.request(md.MetadataRequest(topics=None), 9)
    assert trio.current_time() - t0 >= 0.29
    proxy.set_delay(0.1)
    t1 = trio.current_time()
    await c.request(md.MetadataRequest(topics=None), 9)
    assert trio.current_time() - t1 >= 0.19  # once each way


async def test_clear_faults_ends_a_blackhole_at_once(
    fake_behind_proxy: tuple[FakeCluster, FaultProxy], nursery: trio.Nursery
) -> None:
    _, proxy = fake_behind_proxy
    c = await open_client(proxy)
    proxy.blackhole(60.0)
    nursery.start_soon(_clear_after, proxy, 0.2)
    t0 = trio.current_time()
    with trio.fail_after(10):
        assert (await c.request(md.MetadataRequest(topics=None), 9)).brokers
    assert 0.19 <= trio.current_time() - t0 < 5


async def _clear_after(proxy: FaultProxy, seconds: float) -> None:
    await trio.sleep(seconds)
    proxy.clear_faults()


async def test_max_connections_bound(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1, tcp=True)
    await nursery.start(fake.run)
    proxy = FaultProxy("127.0.0.1", int(fake.bootstrap.rsplit(":", 1)[1]), max_connections=1)
    await nursery.start(proxy.run)
    first = await open_client(proxy)
    await first.request(md.MetadataRequest(topics=None), 9)
    second = await open_client(proxy)
    assert await second.closed()
    assert proxy.stats.rejected == 1


# ---------------------------------------------------------------- against tansu


@pytest.fixture
def tansu_ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
async def tansu_behind_proxy(
    nursery: trio.Nursery, tansu_ports: tuple[int, int]
) -> AsyncIterator[tuple[EmbeddedBroker, FaultProxy]]:
    broker_port, proxy_port = tansu_ports
    proxy = FaultProxy("127.0.0.1", broker_port, listen_port=proxy_port, seed=4)
    await nursery.start(proxy.run)
    # the broker advertises the proxy, so clients stay behind it after bootstrap
    broker = EmbeddedBroker(port=broker_port, advertised_port=proxy.port)
    await trio.to_thread.run_sync(broker.start)
    try:
        c = await open_client(proxy)
        req = ct.CreateTopicsRequest(
            topics=(ct.CreatableTopic(name="t", num_partitions=1, replication_factor=1),),
            timeout_ms=5000,
        )
        assert (await c.request(req, 5)).topics[0].error_code == 0
        await c.aclose()
        yield broker, proxy
    finally:
        await trio.to_thread.run_sync(broker.stop)


async def latest_offset(proxy: FaultProxy) -> int:
    c = await open_client(proxy)
    req = lo.ListOffsetsRequest(
        replica_id=-1,
        topics=(
            lo.ListOffsetsTopic(
                name="t", partitions=(lo.ListOffsetsPartition(partition_index=0, timestamp=-1),)
            ),
        ),
    )
    offset: int = (await c.request(req, 7)).topics[0].partitions[0].offset
    await c.aclose()
    return offset


@pytest.mark.integration
async def test_tansu_metadata_points_at_the_proxy(
    tansu_behind_proxy: tuple[EmbeddedBroker, FaultProxy],
) -> None:
    _, proxy = tansu_behind_proxy
    c = await open_client(proxy)
    resp = await c.request(md.MetadataRequest(topics=None), 12)
    assert [(b.host, b.port) for b in resp.brokers] == [("127.0.0.1", proxy.port)]


@pytest.mark.integration
async def test_tansu_lose_response_after_write(
    tansu_behind_proxy: tuple[EmbeddedBroker, FaultProxy],
) -> None:
    _, proxy = tansu_behind_proxy
    proxy.lose_responses(1, api_key=ApiKey.PRODUCE)
    c = await open_client(proxy)
    await c.send(produce_request("t", 0, batch(b"x", producer_id=-1)), 9)
    with trio.fail_after(10):
        assert await c.closed()
    assert proxy.stats.responses_lost == 1
    assert await latest_offset(proxy) == 1  # tansu applied it; only the ack was lost


@pytest.mark.integration
async def test_tansu_cut_and_kill(tansu_behind_proxy: tuple[EmbeddedBroker, FaultProxy]) -> None:
    _, proxy = tansu_behind_proxy
    proxy.cut_mid_frame("response")
    c = await open_client(proxy)
    await c.send(md.MetadataRequest(topics=None), 12)
    with trio.fail_after(10):
        assert await c.closed()
    c = await open_client(proxy)
    assert (await c.request(md.MetadataRequest(topics=None), 12)).brokers
    proxy.kill_all()
    with trio.fail_after(10):
        assert await c.closed()
    assert proxy.stats.cuts == 1
    assert proxy.stats.killed == 2


@pytest.mark.integration
async def test_tansu_blackhole(tansu_behind_proxy: tuple[EmbeddedBroker, FaultProxy]) -> None:
    _, proxy = tansu_behind_proxy
    proxy.blackhole(0.3)
    t0 = trio.current_time()
    c = await open_client(proxy)  # accepted, but nothing is forwarded for 0.3 s
    assert (await c.request(md.MetadataRequest(topics=None), 12)).brokers
    assert trio.current_time() - t0 >= 0.29
