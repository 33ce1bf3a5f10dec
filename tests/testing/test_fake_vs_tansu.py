"""The fake (tcp mode) and tansu give structurally the same answers on the happy path.

The same raw requests (ApiVersions, CreateTopics, Metadata, InitProducerId,
Produce, ListOffsets, Fetch) go to both; the answers are normalised (node ids,
ports and producer ids differ by nature) and compared. Where Kafka and tansu
differ, the fake follows Kafka; the last tests pin each difference and say why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from pipeline.protocol.codec import peek_correlation_id
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import api_versions as av
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import fetch as fm
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import list_offsets as lo
from pipeline.protocol.messages import metadata as md
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.broker import EmbeddedBroker
from pipeline.testing.fake_cluster import FakeCluster

from . import RawClient, batch, partition_response, produce_request

pytestmark = pytest.mark.integration

# the versions the project's client speaks for these tests
VERSIONS = {0: 9, 1: 12, 2: 7, 3: 12, 18: 3, 19: 5, 22: 4}


@pytest.fixture(scope="module")
def tansu() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:  # one per module: a tansu stop takes ~2 s
        yield broker


@pytest.fixture
async def targets(nursery: trio.Nursery, tansu: EmbeddedBroker) -> dict[str, tuple[str, int]]:
    fake = FakeCluster(brokers=1, tcp=True)
    await nursery.start(fake.run)
    host, port = fake.bootstrap.split(":")
    return {"fake": (host, int(port)), "tansu": ("127.0.0.1", tansu.port)}


async def connect(address: tuple[str, int]) -> RawClient:
    return RawClient(await trio.open_tcp_stream(*address))


async def happy_path(c: RawClient, port: int) -> dict[str, Any]:
    """Run the scenario; return what must be equal on any Kafka-compatible broker."""
    out: dict[str, Any] = {}
    api = await c.request(
        av.ApiVersionsRequest(client_software_name="pipeline", client_software_version="0"), 3
    )
    ranges = {k.api_key: (k.min_version, k.max_version) for k in api.api_keys}
    out["api_versions"] = (
        api.error_code,
        {k: ranges[k][0] <= v <= ranges[k][1] for k, v in VERSIONS.items()},
    )

    create = ct.CreateTopicsRequest(
        topics=(ct.CreatableTopic(name="cmp", num_partitions=3, replication_factor=1),),
        timeout_ms=5000,
    )
    created = (await c.request(create, 5)).topics[0]
    again = (await c.request(create, 5)).topics[0]
    out["create"] = (created.name, created.error_code, again.error_code)

    meta = await c.request(
        md.MetadataRequest(
            topics=(md.MetadataRequestTopic(name="cmp"),), allow_auto_topic_creation=False
        ),
        12,
    )
    (broker,) = meta.brokers
    (topic,) = meta.topics
    out["metadata"] = (
        (broker.host, broker.port == port),
        meta.controller_id == broker.node_id,
        topic.name,
        topic.error_code,
        topic.topic_id.int != 0,
        sorted(
            (p.partition_index, p.error_code, p.leader_id == broker.node_id)
            for p in topic.partitions
        ),
    )

    pid = await c.request(ipi.InitProducerIdRequest(transaction_timeout_ms=60000), 4)
    out["init_producer_id"] = (pid.error_code, pid.producer_id >= 0, pid.producer_epoch)

    first = partition_response(
        await c.request(
            produce_request(
                "cmp",
                1,
                batch(b"a", b"b", producer_id=pid.producer_id, producer_epoch=0, base_sequence=0),
            ),
            9,
        )
    )
    second = partition_response(
        await c.request(
            produce_request(
                "cmp",
                1,
                batch(b"c", producer_id=pid.producer_id, producer_epoch=0, base_sequence=2),
            ),
            9,
        )
    )
    plain = partition_response(await c.request(produce_request("cmp", 2, batch(b"p")), 9))
    out["produce"] = [(r.error_code, r.base_offset) for r in (first, second, plain)]

    offsets = await c.request(
        lo.ListOffsetsRequest(
            replica_id=-1,
            topics=(
                lo.ListOffsetsTopic(
                    name="cmp",
                    partitions=(
                        lo.ListOffsetsPartition(partition_index=1, timestamp=-2),
                        lo.ListOffsetsPartition(partition_index=1, timestamp=-1),
                        lo.ListOffsetsPartition(partition_index=0, timestamp=-1),
                    ),
                ),
            ),
        ),
        7,
    )
    out["list_offsets"] = [
        (p.partition_index, p.error_code, p.offset) for p in offsets.topics[0].partitions
    ]

    fetch = await c.request(
        fm.FetchRequest(
            max_wait_ms=100,
            min_bytes=1,
            max_bytes=1 << 20,
            topics=(
                fm.FetchTopic(
                    topic="cmp",
                    partitions=(
                        fm.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20),
                    ),
                ),
            ),
        ),
        12,
    )
    pd = fetch.responses[0].partitions[0]
    records = [
        (
            b.base_offset + r.offset_delta,
            r.key,
            r.value,
            b.producer_id == pid.producer_id,
            b.base_sequence,
        )
        for b in decode_record_batches(pd.records or b"")
        for r in b.records
    ]
    out["fetch"] = (pd.error_code, pd.high_watermark, records)
    return out


async def test_same_answers_on_the_happy_path(targets: dict[str, tuple[str, int]]) -> None:
    results = {}
    for name, address in targets.items():
        c = await connect(address)
        results[name] = await happy_path(c, address[1])
        await c.aclose()
    assert results["fake"] == results["tansu"]
    assert results["fake"]["produce"] == [(0, 0), (0, 2), (0, 0)]
    assert results["fake"]["fetch"][1] == 3


async def prepared(address: tuple[str, int], topic: str) -> tuple[RawClient, int]:
    c = await connect(address)
    create = ct.CreateTopicsRequest(
        topics=(ct.CreatableTopic(name=topic, num_partitions=2, replication_factor=1),)
    )
    assert (await c.request(create, 5)).topics[0].error_code == 0
    pid = (await c.request(ipi.InitProducerIdRequest(transaction_timeout_ms=60000), 4)).producer_id
    return c, pid


async def test_duplicate_batch_kafka_vs_tansu(targets: dict[str, tuple[str, int]]) -> None:
    """Kafka caches the last 5 batches per producer and answers a retry with NONE and the
    ORIGINAL offset; tansu keeps only a next-sequence counter: 46 with offset -1."""
    answers = {}
    for name, address in targets.items():
        c, pid = await prepared(address, "dup")
        b = batch(b"once", producer_id=pid, producer_epoch=0, base_sequence=0)
        partition_response(await c.request(produce_request("dup", 0, b), 9))
        dup = partition_response(await c.request(produce_request("dup", 0, b), 9))
        answers[name] = (dup.error_code, dup.base_offset)
    assert answers == {"fake": (0, 0), "tansu": (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, -1)}


async def test_unknown_partition_kafka_vs_tansu(targets: dict[str, tuple[str, int]]) -> None:
    """Kafka refuses a partition that does not exist; tansu appends to an invisible one."""
    answers = {}
    for name, address in targets.items():
        c, _ = await prepared(address, "unknown")
        answers[name] = partition_response(
            await c.request(produce_request("unknown", 7, batch(b"x")), 9)
        ).error_code
    assert answers == {"fake": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "tansu": 0}


async def test_size_limit_kafka_vs_tansu(targets: dict[str, tuple[str, int]]) -> None:
    """Kafka enforces max.message.bytes (default 1048588); tansu has no size limit."""
    answers = {}
    for name, address in targets.items():
        c, _ = await prepared(address, "size")
        big = batch(b"x" * 1_100_000)
        answers[name] = partition_response(
            await c.request(produce_request("size", 0, big), 9)
        ).error_code
    assert answers == {"fake": ErrorCode.MESSAGE_TOO_LARGE, "tansu": 0}


async def test_acks_zero_kafka_vs_tansu(targets: dict[str, tuple[str, int]]) -> None:
    """Kafka never answers acks=0; tansu does (which breaks aiokafka and kafka-python)."""
    answers = {}
    for name, address in targets.items():
        c, _ = await prepared(address, "acks0")
        quiet = await c.send(produce_request("acks0", 0, batch(b"q"), acks=0), 9)
        await c.send(md.MetadataRequest(topics=()), 12)
        frame = await c.read_frame()
        assert frame is not None
        answers[name] = peek_correlation_id(frame) == quiet
    assert answers == {"fake": False, "tansu": True}


async def test_the_fakes_tansu_mode_answers_idempotent_batches_as_tansu(
        nursery: trio.Nursery, tansu: EmbeddedBroker) -> None:
    """``FakeCluster(tansu_sequences=True)`` (the explorer's tansu schedules) gives
    tansu's answers where tansu and Kafka differ: a re-sent batch 46 with offset -1,
    nothing appended; an epoch the producer bumped itself 90; and, as both, a gap 45."""
    fake = FakeCluster(brokers=1, tcp=True, tansu_sequences=True)
    await nursery.start(fake.run)
    host, port = fake.bootstrap.split(":")
    answers = {}
    for name, address in {"fake": (host, int(port)), "tansu": ("127.0.0.1", tansu.port)}.items():
        c, pid = await prepared(address, "tansu-mode")
        seen = []
        for b in (batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0),
                  batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0),
                  batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=5),
                  batch(b"c", producer_id=pid, producer_epoch=1, base_sequence=0),
                  batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=2)):
            r = partition_response(await c.request(produce_request("tansu-mode", 0, b), 9))
            seen.append((r.error_code, r.base_offset if r.error_code in (0, 46) else None))
        answers[name] = seen
    assert answers["fake"] == answers["tansu"] == [
        (0, 0), (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, -1),
        (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None), (ErrorCode.PRODUCER_FENCED, None),
        (0, 2)]
