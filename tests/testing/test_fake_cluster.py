"""FakeCluster: the Kafka semantics each API handler promises (in memory, raw requests)."""

from __future__ import annotations

import pytest
import trio

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import api_versions as av
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import delete_topics as dt
from pipeline.protocol.messages import fetch as fm
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import list_offsets as lo
from pipeline.protocol.messages import metadata as md
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.fake_cluster import SUPPORTED_VERSIONS, FakeCluster

from . import RawClient, batch, partition_response, produce_request

MAX_SEQ = 2**31 - 1


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    fake = FakeCluster(brokers=3, seed=1)
    fake.create_topic("t", 3, leaders=[0, 1, 2])
    await nursery.start(fake.run)
    return fake


async def client(fake: FakeCluster, node: int = 0) -> RawClient:
    return RawClient(await fake.connector(f"fake-{node}", 9092))


async def produce(
    c: RawClient,
    records: bytes | None,
    *,
    topic: str = "t",
    partition: int = 0,
    version: int = 9,
    acks: int = -1,
) -> pm.PartitionProduceResponse:
    return partition_response(
        await c.request(produce_request(topic, partition, records, acks=acks), version)
    )


async def init_pid(
    c: RawClient, pid: int = -1, epoch: int = -1, version: int = 4
) -> ipi.InitProducerIdResponse:
    resp: ipi.InitProducerIdResponse = await c.request(
        ipi.InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=60000,
            producer_id=pid,
            producer_epoch=epoch,
        ),
        version,
    )
    return resp


# ---------------------------------------------------------------- ApiVersions / Metadata


async def test_api_versions_lists_served_ranges(fake: FakeCluster) -> None:
    c = await client(fake)
    for version in range(4):
        resp = await c.request(
            av.ApiVersionsRequest(client_software_name="t", client_software_version="1"), version
        )
        assert resp.error_code == 0
        assert {
            k.api_key: (k.min_version, k.max_version) for k in resp.api_keys
        } == SUPPORTED_VERSIONS


async def test_api_versions_above_max_answers_v0_unsupported_version(fake: FakeCluster) -> None:
    # Kafka answers a too-new ApiVersions in v0 format, listing its own ApiVersions range
    c = await client(fake)
    corr = await c.send(av.ApiVersionsRequest(), 4)
    got, resp = await c.recv(18, 0)
    assert got == corr
    assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 3)]
    # the connection stays usable
    assert (await c.request(av.ApiVersionsRequest(), 3)).error_code == 0


async def test_unsupported_version_of_other_api_closes_connection(fake: FakeCluster) -> None:
    c = await client(fake)
    await c.send(pm.ProduceRequest(acks=1), 13)  # the fake serves Produce v3-12
    assert await c.closed()
    assert fake.requests[-1].request is None


@pytest.mark.parametrize("version", [1, 4, 9, 10, 12])
async def test_metadata_brokers_leaders_and_epochs(fake: FakeCluster, version: int) -> None:
    fake.move_leader("t", 2, to=0)
    c = await client(fake, 1)
    resp = await c.request(md.MetadataRequest(topics=None), version)
    assert [(b.node_id, b.host, b.port) for b in resp.brokers] == [
        (0, "fake-0", 9092),
        (1, "fake-1", 9092),
        (2, "fake-2", 9092),
    ]
    assert resp.controller_id == 0
    (topic,) = resp.topics
    assert topic.name == "t"
    assert topic.error_code == 0
    assert [(p.partition_index, p.leader_id) for p in topic.partitions] == [(0, 0), (1, 1), (2, 0)]
    if version >= 7:
        assert [p.leader_epoch for p in topic.partitions] == [0, 0, 1]
    if version >= 10:
        assert topic.topic_id == fake.state.topics["t"].topic_id


async def test_metadata_spreads_leaders_over_brokers(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=3, seed=5)
    fake.create_topic("spread", 6)
    leaders = [fake.leader("spread", p) for p in range(6)]
    assert sorted(leaders) == [0, 0, 1, 1, 2, 2]
    assert leaders[:3] == leaders[3:]  # round robin from a seeded start


async def test_metadata_auto_create_kafka_style(fake: FakeCluster) -> None:
    c = await client(fake)
    req = md.MetadataRequest(
        topics=(md.MetadataRequestTopic(name="new"),), allow_auto_topic_creation=True
    )
    first = (await c.request(req, 9)).topics[0]
    # Kafka: the response that creates the topic says LEADER_NOT_AVAILABLE
    assert first.error_code == ErrorCode.LEADER_NOT_AVAILABLE
    assert first.partitions == ()
    second = (await c.request(req, 9)).topics[0]
    assert second.error_code == 0
    assert len(second.partitions) == 1

    no_auto = md.MetadataRequest(
        topics=(md.MetadataRequestTopic(name="other"),), allow_auto_topic_creation=False
    )
    assert (await c.request(no_auto, 9)).topics[
        0
    ].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "other" not in fake.state.topics


async def test_metadata_auto_create_partition_count_and_switch(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=2, auto_create_partitions=5)
    await nursery.start(fake.run)
    c = await client(fake)
    req = md.MetadataRequest(
        topics=(md.MetadataRequestTopic(name="auto"),), allow_auto_topic_creation=True
    )
    await c.request(req, 12)
    assert len(fake.state.topics["auto"].partitions) == 5

    off = FakeCluster(brokers=1, auto_create_topics=False)
    await nursery.start(off.run)
    c2 = await client(off)
    assert (await c2.request(req, 12)).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------- CreateTopics / DeleteTopics


async def test_create_and_delete_topics(fake: FakeCluster) -> None:
    c = await client(fake, 2)
    req = ct.CreateTopicsRequest(
        topics=(
            ct.CreatableTopic(name="a", num_partitions=4, replication_factor=2),
            ct.CreatableTopic(name="t", num_partitions=1, replication_factor=1),
            ct.CreatableTopic(name="bad/name", num_partitions=1, replication_factor=1),
            ct.CreatableTopic(name="z", num_partitions=0, replication_factor=1),
            ct.CreatableTopic(name="rf", num_partitions=1, replication_factor=4),
            ct.CreatableTopic(name="d", num_partitions=-1, replication_factor=-1),
        ),
        timeout_ms=1000,
    )
    resp = await c.request(req, 7)
    codes = {r.name: r.error_code for r in resp.topics}
    assert codes == {
        "a": 0,
        "t": ErrorCode.TOPIC_ALREADY_EXISTS,
        "bad/name": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "z": ErrorCode.INVALID_PARTITIONS,
        "rf": ErrorCode.INVALID_REPLICATION_FACTOR,
        "d": 0,
    }
    a = resp.topics[0]
    assert (a.num_partitions, a.replication_factor) == (4, 2)
    assert len(fake.state.topics["a"].partitions) == 4
    assert all(len(p.replicas) == 2 for p in fake.state.topics["a"].partitions)

    dresp = await c.request(dt.DeleteTopicsRequest(topic_names=("a", "nope"), timeout_ms=1000), 5)
    assert [(r.name, r.error_code) for r in dresp.responses] == [
        ("a", 0),
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert "a" not in fake.state.topics
    # v6: by topic id
    tid = fake.state.topics["d"].topic_id
    d6 = await c.request(
        dt.DeleteTopicsRequest(topics=(dt.DeleteTopicState(name=None, topic_id=tid),)), 6
    )
    assert [(r.name, r.error_code) for r in d6.responses] == [("d", 0)]


async def test_create_topics_max_message_bytes_config(fake: FakeCluster) -> None:
    c = await client(fake)
    req = ct.CreateTopicsRequest(
        topics=(
            ct.CreatableTopic(
                name="small",
                num_partitions=1,
                replication_factor=1,
                configs=(ct.CreatableTopicConfig(name="max.message.bytes", value="200"),),
            ),
        )
    )
    assert (await c.request(req, 5)).topics[0].error_code == 0
    fake.move_leader("small", 0, to=0)
    assert (
        await produce(c, batch(b"x" * 300), topic="small")
    ).error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert (await produce(c, batch(b"x" * 10), topic="small")).error_code == 0


# ---------------------------------------------------------------- Produce / ListOffsets / Fetch


async def test_produce_list_offsets_fetch_roundtrip(fake: FakeCluster) -> None:
    c = await client(fake)
    first = await produce(c, batch(b"a", b"b", b"c"))
    second = await produce(c, batch(b"d"), version=11)
    assert (first.error_code, first.base_offset, first.log_start_offset) == (0, 0, 0)
    assert (second.error_code, second.base_offset) == (0, 3)
    assert [(e.offset, e.record.value) for e in fake.log("t", 0)] == [
        (0, b"a"),
        (1, b"b"),
        (2, b"c"),
        (3, b"d"),
    ]
    assert fake.high_watermark("t", 0) == 4

    lreq = lo.ListOffsetsRequest(
        replica_id=-1,
        topics=(
            lo.ListOffsetsTopic(
                name="t",
                partitions=(
                    lo.ListOffsetsPartition(partition_index=0, timestamp=-2),
                    lo.ListOffsetsPartition(partition_index=0, timestamp=-1),
                    lo.ListOffsetsPartition(partition_index=0, timestamp=1_700_000_000_001),
                    lo.ListOffsetsPartition(partition_index=1, timestamp=-1),
                ),
            ),
        ),
    )
    parts = (await c.request(lreq, 7)).topics[0].partitions
    assert [(p.error_code, p.offset) for p in parts] == [
        (0, 0),
        (0, 4),
        (0, 1),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1),
    ]
    assert parts[2].timestamp == 1_700_000_000_001

    freq = fm.FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        topics=(
            fm.FetchTopic(
                topic="t",
                partitions=(
                    fm.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20),
                ),
            ),
        ),
    )
    pd = (await c.request(freq, 11)).responses[0].partitions[0]
    assert (pd.error_code, pd.high_watermark) == (0, 4)
    batches = decode_record_batches(pd.records or b"")
    # Fetch returns whole stored batches: the one holding offset 1 starts at 0
    assert [b.base_offset for b in batches] == [0, 3]
    assert pd.records == b"".join(s.data for s in fake.partition("t", 0).batches)

    # v13+: by topic id
    tid = fake.state.topics["t"].topic_id
    f13 = fm.FetchRequest(
        max_wait_ms=0,
        topics=(
            fm.FetchTopic(
                topic_id=tid,
                partitions=(
                    fm.FetchPartition(partition=0, fetch_offset=3, partition_max_bytes=1 << 20),
                ),
            ),
        ),
    )
    pd13 = (await c.request(f13, 13)).responses[0].partitions[0]
    assert [b.base_offset for b in decode_record_batches(pd13.records or b"")] == [3]

    out_of_range = fm.FetchRequest(
        topics=(
            fm.FetchTopic(
                topic="t",
                partitions=(
                    fm.FetchPartition(partition=0, fetch_offset=5, partition_max_bytes=100),
                ),
            ),
        )
    )
    assert (await c.request(out_of_range, 4)).responses[0].partitions[
        0
    ].error_code == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_fetch_long_poll_wakes_on_produce(
    fake: FakeCluster, autojump_clock: trio.abc.Clock
) -> None:
    c = await client(fake)
    producer = await client(fake)
    start = trio.current_time()

    async def later() -> None:
        await trio.sleep(0.3)
        await produce(producer, batch(b"late"))

    freq = fm.FetchRequest(
        max_wait_ms=1000,
        min_bytes=1,
        topics=(
            fm.FetchTopic(
                topic="t",
                partitions=(
                    fm.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
                ),
            ),
        ),
    )
    async with trio.open_nursery() as n:
        n.start_soon(later)
        resp = await c.request(freq, 12)
    assert trio.current_time() - start == pytest.approx(0.3)
    assert resp.responses[0].partitions[0].high_watermark == 1
    # nothing arrives: the full max_wait
    t0 = trio.current_time()
    freq2 = fm.FetchRequest(
        max_wait_ms=1000,
        min_bytes=1,
        topics=(
            fm.FetchTopic(
                topic="t",
                partitions=(
                    fm.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20),
                ),
            ),
        ),
    )
    assert (await c.request(freq2, 12)).responses[0].partitions[0].records == b""
    assert trio.current_time() - t0 == pytest.approx(1.0)


async def test_produce_errors(fake: FakeCluster) -> None:
    c = await client(fake)
    assert (
        await produce(c, batch(b"x"), topic="missing")
    ).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (
        await produce(c, batch(b"x"), partition=3)
    ).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (
        await produce(c, batch(b"x"), partition=1)
    ).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    bad = bytearray(batch(b"x"))
    bad[-1] ^= 0xFF
    assert (await produce(c, bytes(bad))).error_code == ErrorCode.CORRUPT_MESSAGE
    assert (await produce(c, batch(b"x") + batch(b"y"))).error_code == ErrorCode.INVALID_RECORD
    assert (await produce(c, batch(b"x")[:30])).error_code == ErrorCode.CORRUPT_MESSAGE
    assert (await produce(c, None)).error_code == ErrorCode.INVALID_RECORD
    assert (await produce(c, batch(b"x"), acks=2)).error_code == ErrorCode.INVALID_REQUIRED_ACKS
    assert fake.high_watermark("t", 0) == 0


async def test_produce_not_leader_v10_carries_new_leader(fake: FakeCluster) -> None:
    c = await client(fake)
    fake.move_leader("t", 0, to=2)
    resp = await c.request(produce_request("t", 0, batch(b"x")), 10)
    part = partition_response(resp)
    assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (2, 1)
    assert [(e.node_id, e.host, e.port) for e in resp.node_endpoints] == [(2, "fake-2", 9092)]


async def test_message_too_large(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1, max_message_bytes=1000)
    fake.create_topic("t", 1)
    await nursery.start(fake.run)
    c = await client(fake)
    small = batch(b"x" * 100)
    assert (await produce(c, small)).error_code == 0
    assert (await produce(c, batch(b"x" * 1000))).error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert [e.offset for e in fake.log("t", 0)] == [0]


async def test_acks_zero_gets_no_response(fake: FakeCluster) -> None:
    c = await client(fake)
    await c.send(produce_request("t", 0, batch(b"quiet"), acks=0), 9)
    # the next response on the wire belongs to the next request
    corr = await c.send(md.MetadataRequest(topics=()), 9)
    got, _ = await c.recv(3, 9)
    assert got == corr
    assert [e.record.value for e in fake.log("t", 0)] == [b"quiet"]


async def test_acks_zero_error_closes_connection(fake: FakeCluster) -> None:
    # Kafka closes the connection on an acks=0 error so the client refreshes metadata
    c = await client(fake)
    await c.send(produce_request("t", 1, batch(b"x"), acks=0), 9)
    assert await c.closed()


# ---------------------------------------------------------------- idempotence


async def test_duplicate_gets_original_offset_within_five_batches(fake: FakeCluster) -> None:
    c = await client(fake)
    pid = (await init_pid(c)).producer_id
    offsets = []
    for seq in range(6):
        r = await produce(
            c, batch(b"v%d" % seq, b"w", producer_id=pid, producer_epoch=0, base_sequence=2 * seq)
        )
        assert r.error_code == 0
        offsets.append(r.base_offset)
    assert offsets == [0, 2, 4, 6, 8, 10]
    # batches 1..5 are cached: a retry answers NONE with the ORIGINAL offset, nothing appended
    for seq in range(1, 6):
        r = await produce(
            c, batch(b"v%d" % seq, b"w", producer_id=pid, producer_epoch=0, base_sequence=2 * seq)
        )
        assert (r.error_code, r.base_offset) == (0, offsets[seq])
    # batch 0 fell out of the cache: Kafka says OUT_OF_ORDER_SEQUENCE_NUMBER
    r = await produce(c, batch(b"v0", b"w", producer_id=pid, producer_epoch=0, base_sequence=0))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert fake.high_watermark("t", 0) == 12
    # an overlapping (not identical) range is out of order, not a duplicate (tansu says 46)
    r = await produce(c, batch(b"x", producer_id=pid, producer_epoch=0, base_sequence=11))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


async def test_sequence_gap_is_out_of_order(fake: FakeCluster) -> None:
    c = await client(fake)
    pid = (await init_pid(c)).producer_id
    assert (
        await produce(c, batch(b"a", producer_id=pid, producer_epoch=0, base_sequence=0))
    ).error_code == 0
    r = await produce(c, batch(b"b", producer_id=pid, producer_epoch=0, base_sequence=2))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (
        await produce(c, batch(b"b", producer_id=pid, producer_epoch=0, base_sequence=1))
    ).error_code == 0
    # sequences are per partition
    c1 = await client(fake, 1)
    assert (
        await produce(
            c1, batch(b"p1", producer_id=pid, producer_epoch=0, base_sequence=0), partition=1
        )
    ).error_code == 0
    assert fake.producer_state("t", 0) == {pid: (0, 1)}


async def test_unknown_producer_kafka3_accepts_any_sequence(fake: FakeCluster) -> None:
    c = await client(fake)
    r = await produce(c, batch(b"late", producer_id=4242, producer_epoch=3, base_sequence=77))
    assert (r.error_code, r.base_offset) == (0, 0)
    assert fake.producer_state("t", 0) == {4242: (3, 77)}


async def test_unknown_producer_strict_mode(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1, strict_unknown_producer=True)
    fake.create_topic("t", 1)
    await nursery.start(fake.run)
    c = await client(fake)
    r = await produce(c, batch(b"x", producer_id=9, producer_epoch=0, base_sequence=5))
    assert r.error_code == ErrorCode.UNKNOWN_PRODUCER_ID
    assert (
        await produce(c, batch(b"x", producer_id=9, producer_epoch=0, base_sequence=0))
    ).error_code == 0


async def test_epoch_rules_on_produce(fake: FakeCluster) -> None:
    c = await client(fake)
    pid = (await init_pid(c)).producer_id
    assert (
        await produce(c, batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0))
    ).error_code == 0
    # a new epoch must start at 0
    r = await produce(c, batch(b"c", producer_id=pid, producer_epoch=1, base_sequence=2))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    r = await produce(c, batch(b"c", producer_id=pid, producer_epoch=1, base_sequence=0))
    assert (r.error_code, r.base_offset) == (0, 2)
    # the older epoch is now rejected, even its cached duplicate
    r = await produce(c, batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0))
    assert r.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert fake.producer_state("t", 0) == {pid: (1, 0)}


async def test_sequence_wraps_at_int32_max(fake: FakeCluster) -> None:
    c = await client(fake)
    pid = 77
    r = await produce(
        c, batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=MAX_SEQ - 1)
    )
    assert r.error_code == 0
    assert fake.producer_state("t", 0) == {pid: (0, MAX_SEQ)}
    assert (
        await produce(c, batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=0))
    ).error_code == 0
    # a batch spanning the wrap: MAX then 0
    pid2 = 78
    assert (
        await produce(c, batch(b"x", producer_id=pid2, producer_epoch=0, base_sequence=MAX_SEQ - 1))
    ).error_code == 0
    r = await produce(
        c, batch(b"y", b"z", producer_id=pid2, producer_epoch=0, base_sequence=MAX_SEQ)
    )
    assert r.error_code == 0
    assert fake.producer_state("t", 0)[pid2] == (0, 0)
    dup = await produce(
        c, batch(b"y", b"z", producer_id=pid2, producer_epoch=0, base_sequence=MAX_SEQ)
    )
    assert (dup.error_code, dup.base_offset) == (0, r.base_offset)
    assert (
        await produce(c, batch(b"w", producer_id=pid2, producer_epoch=0, base_sequence=1))
    ).error_code == 0


# ---------------------------------------------------------------- InitProducerId


async def test_init_producer_id_always_a_new_id(fake: FakeCluster) -> None:
    """As Kafka's coordinator without a transactional id: every request gets a new
    producer id with epoch 0, whatever id and epoch it carries (so an epoch is only
    ever bumped by the producer itself; tests/testing/test_fake_vs_kafka.py checks the
    same sequence against Kafka)."""
    c = await client(fake)
    first = await init_pid(c)
    assert (first.error_code, first.producer_epoch) == (0, 0)
    pid = first.producer_id
    assert (await init_pid(c)).producer_id == pid + 1
    current = await init_pid(c, pid, 0)  # what a KIP-360 bump by InitProducerId would send
    assert (current.error_code, current.producer_id, current.producer_epoch) == (0, pid + 2, 0)
    bogus = await init_pid(c, 999_999, 32766)
    assert (bogus.error_code, bogus.producer_id, bogus.producer_epoch) == (0, pid + 3, 0)
    assert (await init_pid(c, version=2)).producer_id == pid + 4  # v0-v2 carry no id
    for half in ((-1, 0), (pid, -1)):  # an id without an epoch, or the reverse
        assert (await init_pid(c, *half)).error_code == ErrorCode.INVALID_REQUEST


# ---------------------------------------------------------------- modes


async def test_tcp_mode_advertises_real_ports(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=2, tcp=True)
    fake.create_topic("t", 2, leaders=[0, 1])
    await nursery.start(fake.run)
    hosts = [a.split(":") for a in fake.bootstrap.split(",")]
    assert all(h == "127.0.0.1" and int(p) > 0 for h, p in hosts)
    c = RawClient(await fake.connector(hosts[1][0], int(hosts[1][1])))
    resp = await c.request(md.MetadataRequest(topics=None), 12)
    assert [f"{b.host}:{b.port}" for b in resp.brokers] == fake.bootstrap.split(",")
    assert (await produce(c, batch(b"over tcp"), partition=1)).error_code == 0
    fake.stop_broker(1)
    assert await c.closed()
    with pytest.raises(OSError, match="connect"):
        await fake.connector(hosts[1][0], int(hosts[1][1]))
    fake.restart_broker(1)
    c2 = RawClient(await fake.connector(hosts[1][0], int(hosts[1][1])))
    assert (await c2.request(md.MetadataRequest(topics=None), 12)).brokers


async def test_connector_errors(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1)
    with pytest.raises(RuntimeError):
        await fake.connector("fake-0", 9092)
    await nursery.start(fake.run)
    with pytest.raises(OSError, match="no broker at fake-7:9092"):
        await fake.connector("fake-7", 9092)
    async with FakeCluster.serve(brokers=2) as other:
        assert other.bootstrap == "fake-0:9092,fake-1:9092"


@pytest.mark.parametrize(("requested", "code"), [
    (-1, ErrorCode.NONE),  # no epoch: no check
    (-2, ErrorCode.FENCED_LEADER_EPOCH),  # any other epoch below the leader's is fenced
    (4, ErrorCode.FENCED_LEADER_EPOCH),
    (5, ErrorCode.NONE),
    (6, ErrorCode.UNKNOWN_LEADER_EPOCH),
])
def test_a_read_checks_the_current_leader_epoch_as_kafka_does(requested: int, code: ErrorCode) -> None:
    """Fetch and ListOffsets answer a request's current leader epoch as Kafka's
    Partition.checkCurrentLeaderEpoch does: only -1 skips the check."""
    from pipeline.testing.fake.reads import _leader_epoch_error
    from pipeline.testing.fake.state import PartitionState

    part = PartitionState("t", 0, leader=0, leader_epoch=5, replicas=(0,))
    assert _leader_epoch_error(part, requested) == int(code)
