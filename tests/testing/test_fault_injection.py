"""FakeCluster fault injection: one test per fault type, in memory, on autojump_clock."""

from __future__ import annotations

import pytest
import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import metadata as md
from pipeline.protocol.messages import produce as pm
from pipeline.testing.fake_cluster import DROP, NO_RESPONSE, ControlContext, FakeCluster

from . import RawClient, batch, partition_response, produce_request


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    fake = FakeCluster(brokers=3, seed=3)
    fake.create_topic("t", 3, leaders=[0, 1, 2])
    await nursery.start(fake.run)
    return fake


async def client(fake: FakeCluster, node: int = 0) -> RawClient:
    return RawClient(await fake.connector(f"fake-{node}", 9092))


async def produce(
    c: RawClient, records: bytes, *, partition: int = 0
) -> pm.PartitionProduceResponse:
    return partition_response(await c.request(produce_request("t", partition, records), 9))


async def metadata(c: RawClient) -> md.MetadataResponse:
    resp: md.MetadataResponse = await c.request(md.MetadataRequest(topics=None), 12)
    return resp


async def test_move_leader_bumps_epoch_and_fences_old_leader(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    c0, c1 = await client(fake, 0), await client(fake, 1)
    assert (await produce(c0, batch(b"a"))).error_code == 0
    assert fake.move_leader("t", 0, to=1) == 1
    assert (await produce(c0, batch(b"b"))).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    part = (await metadata(c0)).topics[0].partitions[0]
    assert (part.leader_id, part.leader_epoch) == (1, 1)
    assert (await produce(c1, batch(b"b"))).base_offset == 1  # the log moved with the leadership
    # without a target: a seeded random other broker
    assert fake.move_leader("t", 0) in (0, 2)
    assert fake.partition("t", 0).leader_epoch == 2


async def test_stop_and_restart_broker(autojump_clock: trio.abc.Clock, fake: FakeCluster) -> None:
    c2 = await client(fake, 2)
    pid = 5
    assert (
        await produce(
            c2, batch(b"a", producer_id=pid, producer_epoch=0, base_sequence=0), partition=2
        )
    ).error_code == 0
    t0 = trio.current_time()
    fake.stop_broker(2)
    assert await c2.closed()
    assert trio.current_time() == t0
    with pytest.raises(ConnectionRefusedError):
        await fake.connector("fake-2", 9092)
    c0 = await client(fake, 0)
    meta = await metadata(c0)
    assert [b.node_id for b in meta.brokers] == [0, 1]
    new_leader = meta.topics[0].partitions[2].leader_id
    assert new_leader in (0, 1)
    assert meta.topics[0].partitions[2].leader_epoch == 1

    fake.restart_broker(2, lose_producer_state=True)
    assert [b.node_id for b in (await metadata(c0)).brokers] == [0, 1, 2]
    # The partition moved to another leader while 2 was down: that one keeps its state.
    assert set(fake.producer_state("t", 2)) == {pid}
    cl = await client(fake, new_leader)
    r = await produce(
        cl, batch(b"b", producer_id=pid, producer_epoch=0, base_sequence=1), partition=2
    )
    assert (r.error_code, r.base_offset) == (0, 1)
    # A partition that was offline comes back to the restarted broker without it:
    # the next batch is from an unknown producer, accepted at any sequence.
    c1 = await client(fake, 1)
    first = batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=0)
    assert (await produce(c1, first, partition=1)).error_code == 0
    fake.stop_broker(1, elect=False)
    fake.restart_broker(1, lose_producer_state=True)
    assert fake.producer_state("t", 1) == {}
    c1 = await client(fake, 1)
    r = await produce(c1, first, partition=1)  # a retry of a written batch: written again
    assert (r.error_code, r.base_offset) == (0, 1)
    stored = fake.partition("t", 1).batches
    assert [b.state_lost for b in stored] == [False, True]


async def test_stop_broker_without_election_takes_partitions_offline(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    fake.stop_broker(1, elect=False)
    c0 = await client(fake, 0)
    p1 = (await metadata(c0)).topics[0].partitions[1]
    assert (p1.error_code, p1.leader_id) == (ErrorCode.LEADER_NOT_AVAILABLE, -1)
    fake.restart_broker(1)
    p1 = (await metadata(c0)).topics[0].partitions[1]
    assert (p1.error_code, p1.leader_id, p1.leader_epoch) == (0, 1, 2)


async def test_drop_connections_now(autojump_clock: trio.abc.Clock, fake: FakeCluster) -> None:
    a, b, other = await client(fake, 0), await client(fake, 0), await client(fake, 1)
    assert fake.drop_connections(0) == 2
    assert await a.closed()
    assert await b.closed()
    assert (await metadata(other)).brokers  # other brokers unaffected


async def test_drop_response_after_apply_then_retry_is_a_duplicate(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    fake.drop_response_after_apply(ApiKey.PRODUCE, topic="t", partition=0)
    c = await client(fake)
    b = batch(b"once", producer_id=11, producer_epoch=0, base_sequence=0)
    await c.send(produce_request("t", 0, b), 9)
    assert await c.closed()  # ack lost...
    assert [e.record.value for e in fake.log("t", 0)] == [b"once"]  # ...but the write happened
    c2 = await client(fake)
    r = await produce(c2, b)  # the producer's retry
    assert (r.error_code, r.base_offset) == (0, 0)
    assert fake.high_watermark("t", 0) == 1


async def test_drop_next_request_does_not_apply(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    fake.drop_next_request(ApiKey.PRODUCE)
    c = await client(fake)
    await c.send(produce_request("t", 0, batch(b"lost")), 9)
    assert await c.closed()
    assert fake.high_watermark("t", 0) == 0


async def test_delay_responses_exact_virtual_time(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    handle = fake.delay_responses(2.5, api_key=ApiKey.PRODUCE, count=1)
    c = await client(fake)
    t0 = trio.current_time()
    assert (await produce(c, batch(b"slow"))).error_code == 0
    assert trio.current_time() - t0 == 2.5
    assert not handle.active
    t1 = trio.current_time()
    await produce(c, batch(b"fast"))
    assert trio.current_time() == t1


async def test_delay_before_apply(
    autojump_clock: trio.abc.Clock, fake: FakeCluster, nursery: trio.Nursery
) -> None:
    fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1, before_apply=True)
    c = await client(fake)
    t0 = trio.current_time()
    done = trio.Event()

    async def send() -> None:
        await produce(c, batch(b"x"))
        done.set()

    nursery.start_soon(send)
    await trio.sleep(0.5)
    assert fake.high_watermark("t", 0) == 0  # not applied yet
    await done.wait()
    assert trio.current_time() - t0 == 1.0
    assert fake.high_watermark("t", 0) == 1


async def test_delayed_response_is_lost_when_broker_stops(
    autojump_clock: trio.abc.Clock, fake: FakeCluster, nursery: trio.Nursery
) -> None:
    fake.delay_responses(5.0, api_key=ApiKey.PRODUCE)
    c = await client(fake)
    t0 = trio.current_time()
    await c.send(produce_request("t", 0, batch(b"x")), 9)
    await trio.sleep(1.0)
    fake.stop_broker(0)
    assert await c.closed()
    assert trio.current_time() - t0 == 1.0
    assert fake.high_watermark("t", 0) == 1  # applied, never acknowledged


async def test_fail_next_n_for_one_partition(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    handle = fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, count=2, topic="t", partition=0)
    c0, c1 = await client(fake, 0), await client(fake, 1)
    # partition 1 does not match and does not use up the count
    assert (await produce(c1, batch(b"p1"), partition=1)).error_code == 0
    for _ in range(2):
        r = await produce(c0, batch(b"p0"))
        assert (r.error_code, r.base_offset) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
    assert (handle.fired, handle.active) == (2, False)
    assert (await produce(c0, batch(b"p0"))).base_offset == 0


async def test_fail_next_partitionless_api(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    from pipeline.protocol.messages import init_producer_id as ipi

    fake.fail_next(22, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    c = await client(fake)
    req = ipi.InitProducerIdRequest(transaction_timeout_ms=1000)
    assert (await c.request(req, 4)).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert (await c.request(req, 4)).error_code == 0


async def test_control_hooks_one_shot_sticky_and_markers(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    seen: list[int] = []

    def canned(ctx: ControlContext) -> pm.ProduceResponse | None:
        seen.append(ctx.correlation_id)
        if ctx.node_id != 0:
            return None  # fall through: not consumed
        return pm.ProduceResponse(
            responses=(
                pm.TopicProduceResponse(
                    name="t",
                    partition_responses=(
                        pm.PartitionProduceResponse(
                            index=0, error_code=ErrorCode.REQUEST_TIMED_OUT, base_offset=-1
                        ),
                    ),
                ),
            )
        )

    fake.control(ApiKey.PRODUCE, canned)
    c1, c0 = await client(fake, 1), await client(fake, 0)
    assert (await produce(c1, batch(b"x"), partition=1)).error_code == 0
    assert (await produce(c0, batch(b"x"))).error_code == ErrorCode.REQUEST_TIMED_OUT
    assert (await produce(c0, batch(b"x"))).error_code == 0  # one-shot: gone
    assert len(seen) == 2
    assert fake.high_watermark("t", 0) == 1

    # sticky DROP until removed
    handle = fake.control(ApiKey.METADATA, lambda ctx: DROP, sticky=True)
    for _ in range(2):
        c = await client(fake)
        await c.send(md.MetadataRequest(topics=None), 12)
        assert await c.closed()
    handle.remove()
    assert (await metadata(await client(fake))).brokers

    # NO_RESPONSE: the connection hangs; the client has to time out
    fake.control(ApiKey.PRODUCE, lambda ctx: NO_RESPONSE)
    c = await client(fake)
    await c.send(produce_request("t", 0, batch(b"y")), 9)
    with trio.move_on_after(30) as scope:
        await c.read_frame()
    assert scope.cancelled_caught
    assert fake.high_watermark("t", 0) == 1


async def test_async_control_hook(autojump_clock: trio.abc.Clock, fake: FakeCluster) -> None:
    async def slow_then_normal(ctx: ControlContext) -> None:
        await trio.sleep(0.75)

    fake.control(ApiKey.PRODUCE, slow_then_normal)
    c = await client(fake)
    t0 = trio.current_time()
    assert (await produce(c, batch(b"x"))).error_code == 0
    assert trio.current_time() - t0 == 0.75


async def test_recorded_requests(autojump_clock: trio.abc.Clock, fake: FakeCluster) -> None:
    c = await client(fake)
    t0 = trio.current_time()
    await trio.sleep(1)
    for seq in range(3):
        await produce(c, batch(b"v", producer_id=3, producer_epoch=2, base_sequence=seq))
    recs = fake.requests_of(ApiKey.PRODUCE)
    assert [(r.time - t0, r.node_id, r.api_version, r.client_id) for r in recs] == [
        (1, 0, 9, "tests")
    ] * 3
    assert [r.correlation_id for r in recs] == [1, 2, 3]
    from pipeline.protocol.records import decode_record_batches

    seqs = [
        decode_record_batches(r.request.topic_data[0].partition_data[0].records)[0].base_sequence
        for r in recs
    ]
    assert seqs == [0, 1, 2]
    await fake.wait_for_requests(ApiKey.PRODUCE, 3)


async def test_seeded_leader_moves_are_reproducible() -> None:
    def moves(seed: int) -> list[int]:
        fake = FakeCluster(brokers=5, seed=seed)
        fake.create_topic("t", 1)
        return [fake.move_leader("t", 0) for _ in range(10)]

    assert moves(42) == moves(42)
    assert moves(42) != moves(43)


async def test_fail_after_apply_writes_then_answers_the_error(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    """Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: the batch is in the leader's log,
    the answer is an error; a retry without idempotence writes it again, an
    idempotent retry is recognised as a duplicate (its original offset)."""
    handle = fake.fail_after_apply(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, topic="t",
                                   partition=0, count=2)
    c = await client(fake)
    plain = batch(b"plain")
    r = await produce(c, plain)
    assert (r.error_code, r.base_offset) == (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, -1)
    other = await produce(await client(fake, 1), batch(b"elsewhere"), partition=1)  # unmatched
    assert (other.error_code, other.base_offset) == (0, 0)
    idem = batch(b"idem", producer_id=21, producer_epoch=0, base_sequence=0)
    assert (await produce(c, idem)).error_code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert not handle.active  # count used up
    assert (await produce(c, plain)).base_offset == 2  # the retry: a second copy
    r = await produce(c, idem)  # the idempotent retry: answered as the original
    assert (r.error_code, r.base_offset) == (0, 1)
    assert [e.record.value for e in fake.log("t", 0)] == [b"plain", b"idem", b"plain"]


async def test_stale_metadata_answers_the_old_view_until_removed(
    autojump_clock: trio.abc.Clock, fake: FakeCluster
) -> None:
    """A broker whose metadata cache lags: it keeps answering with the leaders,
    leader epochs and live brokers of the moment the fault was installed."""
    handle = fake.stale_metadata(1)
    fake.move_leader("t", 0, to=2)
    fake.stop_broker(0)
    c1, c2 = await client(fake, 1), await client(fake, 2)
    stale = await metadata(c1)
    assert [b.node_id for b in stale.brokers] == [0, 1, 2]  # still lists the stopped one
    part = stale.topics[0].partitions[0]
    assert (part.leader_id, part.leader_epoch) == (0, 0)
    fresh = (await metadata(c2)).topics[0].partitions[0]  # other brokers are current
    assert (fresh.leader_id, fresh.leader_epoch) == (2, 1)
    assert handle.active  # sticky until removed
    handle.remove()
    part = (await metadata(c1)).topics[0].partitions[0]
    assert (part.leader_id, part.leader_epoch) == (2, 1)
    # count=1: one stale answer, then current again
    fake.stale_metadata(None, count=1)
    fake.move_leader("t", 0, to=1)
    assert (await metadata(c2)).topics[0].partitions[0].leader_id == 2
    assert (await metadata(c2)).topics[0].partitions[0].leader_id == 1
