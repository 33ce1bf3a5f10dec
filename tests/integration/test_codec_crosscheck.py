"""Cross-checks of our wire codec against a real broker and librdkafka (confluent-kafka).

a. Batches built by our ``BatchBuilder`` (each compression codec), sent in a ProduceRequest
   over a plain trio socket with our codec/FrameBuffer, read back by confluent-kafka's
   Consumer with identical keys, values, headers and timestamps; tansu logs no ``crc=``
   (tansu only: it stores a bad CRC and just logs it; Kafka refuses it with
   CORRUPT_MESSAGE, tests/testing/test_fake_vs_kafka.py).
b. Batches written by confluent-kafka's Producer (each codec) and fetched with our
   FetchRequest codec decode to exactly what it sent.

Consumers use ``assign()`` (a tansu group join takes ~23 s). The tests that use the
session broker run on ``[tansu]`` and ``[kafka]`` (tests/integration/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from pipeline.protocol import codec
from pipeline.protocol.api import ApiKey
from pipeline.protocol.compression import Compression
from pipeline.protocol.framing import NEED_DATA, FrameBuffer
from pipeline.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from pipeline.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from pipeline.protocol.records import (
    BatchBuilder,
    CorruptRecordError,
    RecordBatch,
    decode_record_batches,
)
from pipeline.testing.broker import EmbeddedBroker, create_topics, parse_bootstrap

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration

Headers = tuple[tuple[str, bytes | None], ...]
NewTopic = Callable[..., str]
Consume = Callable[..., list[Any]]

CODECS = [
    Compression.NONE,
    Compression.GZIP,
    Compression.SNAPPY,
    Compression.LZ4,
    Compression.ZSTD,
]
CONFLUENT_CODEC = {
    Compression.NONE: "none",
    Compression.GZIP: "gzip",
    Compression.SNAPPY: "snappy",
    Compression.LZ4: "lz4",
    Compression.ZSTD: "zstd",
}
# Errors after which nothing was appended and a retry is safe (real Kafka right after
# CreateTopics, before the new partitions have leaders).
RETRIABLE_NOT_APPENDED = {3, 5, 6}
BASE_TS = 1_700_000_000_000


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


class RawClient:
    """One plain trio TCP connection speaking our codec, one request at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.frames = FrameBuffer()
        self.correlation_id = 0

    @classmethod
    async def connect(cls, bootstrap: str) -> RawClient:
        host, port = parse_bootstrap(bootstrap)[0]
        return cls(await trio.open_tcp_stream(host, port))

    async def request(self, request: Any, version: int) -> Any:
        self.correlation_id += 1
        frame = codec.encode_request(
            request,
            version=version,
            correlation_id=self.correlation_id,
            client_id="pipeline-crosscheck",
        )
        with trio.fail_after(15):
            await self.stream.send_all(frame)
            while True:
                payload = self.frames.next_frame()
                if payload is not NEED_DATA:
                    break
                data = await self.stream.receive_some(1 << 16)
                if not data:
                    raise ConnectionError("broker closed the connection")
                self.frames.receive_data(data)
        assert isinstance(payload, bytes | bytearray | memoryview)
        correlation_id, response = codec.decode_response(
            bytes(payload), api_key=ApiKey(request.API_KEY), version=version
        )
        assert correlation_id == self.correlation_id
        return response

    async def aclose(self) -> None:
        await self.stream.aclose()


# --------------------------------------------------------------------------- helpers


def _sample_records(seed: int) -> list[tuple[int, bytes | None, bytes | None, Headers]]:
    """(timestamp, key, value, headers) covering nulls, empties, binary, big values,
    repeated/unicode/null-valued headers and an out-of-order timestamp."""
    text = b"".join(b"order %05d status=PAID amount=%d;" % (i, i * 7) for i in range(400))
    out: list[tuple[int, bytes | None, bytes | None, Headers]] = [
        (BASE_TS + seed, b"k-0", b"v-0", ()),
        (BASE_TS + seed + 1, None, b"value with null key", (("h", b"1"), ("h", b"2"))),
        (BASE_TS + seed + 1, b"tombstone", None, (("nil", None),)),
        (BASE_TS + seed + 5, b"", b"", (("empty", b""),)),
        (
            BASE_TS + seed - 250,
            bytes(range(256)),
            bytes(range(255, -1, -1)),
            (("bin", bytes(range(256))),),
        ),
        (
            BASE_TS + seed + 9,
            "ключ".encode(),
            text,
            (("ключ", "значение".encode()), ("trace", b"x" * 64)),
        ),
    ]
    out += [
        (BASE_TS + seed + 10 + i, b"key-%d" % (i % 3), b"payload %d " % i * 20, (("i", b"%d" % i),))
        for i in range(20)
    ]
    return out


def _build(
    compression: Compression, records: Sequence[tuple[int, bytes | None, bytes | None, Headers]]
) -> bytes:
    builder = BatchBuilder(compression=compression)
    for ts, key, value, headers in records:
        builder.append(ts, key, value, headers)
    return builder.build()


async def _produce(
    client: RawClient,
    topic: str,
    batches: dict[int, bytes],
    version: int,
) -> dict[int, int]:
    """Produce one batch per partition (acks=-1); returns {partition: base_offset}.

    On Kafka a new topic's partitions become writable one by one, shortly after every
    broker's metadata names their leaders: a partition answered with an error after which
    nothing was appended is produced again on its own (the others are not re-sent)."""
    offsets: dict[int, int] = {}
    pending = dict(batches)
    for attempt in range(50):
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=10_000,
            topic_data=(
                TopicProduceData(
                    name=topic,
                    partition_data=tuple(
                        PartitionProduceData(index=p, records=batch)
                        for p, batch in pending.items()
                    ),
                ),
            ),
        )
        response = await client.request(request, version)
        [topic_response] = response.responses
        assert topic_response.name == topic
        results = {pr.index: pr for pr in topic_response.partition_responses}
        assert set(results) == set(pending)
        for p, pr in results.items():
            if pr.error_code == 0:
                offsets[p] = pr.base_offset
                del pending[p]
            elif pr.error_code not in RETRIABLE_NOT_APPENDED or attempt == 49:
                raise AssertionError(f"produce failed: partition {p}: {pr.error_code}")
        if not pending:
            return offsets
        await trio.sleep(0.2)
    raise AssertionError("unreachable")


def _expected(
    partition: int,
    base_offset: int,
    records: Sequence[tuple[int, bytes | None, bytes | None, Headers]],
) -> list[Rec]:
    return [
        Rec(partition, base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]


def _from_confluent(msg: Any) -> Rec:
    ts_type, ts = msg.timestamp()
    assert ts_type == confluent_kafka.TIMESTAMP_CREATE_TIME
    return Rec(
        msg.partition(),
        msg.offset(),
        ts,
        msg.key(),
        msg.value(),
        tuple(msg.headers() or ()),
    )


def _records_of(batch: RecordBatch) -> list[tuple[int, int, bytes | None, bytes | None, Headers]]:
    """(offset, timestamp, key, value, headers) of a decoded batch."""
    out = []
    for record in batch.records:
        if batch.timestamp_type == 0:
            ts = batch.base_timestamp + record.timestamp_delta
        else:  # LogAppendTime
            ts = batch.max_timestamp
        out.append(
            (
                batch.base_offset + record.offset_delta,
                ts,
                record.key,
                record.value,
                tuple(record.headers),
            )
        )
    return out


async def _fetch_all(
    client: RawClient, topic: str, partition: int, count: int, version: int
) -> tuple[list[Rec], list[RecordBatch]]:
    """Fetch ``count`` records of one partition from offset 0 with our Fetch codec."""
    records: list[Rec] = []
    batches: list[RecordBatch] = []
    offset = 0
    deadline = trio.current_time() + 20
    while len(records) < count:
        assert trio.current_time() < deadline, f"fetched only {len(records)}/{count} records"
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=200,
            min_bytes=1,
            max_bytes=8 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(
                FetchTopic(
                    topic=topic,
                    partitions=(
                        FetchPartition(
                            partition=partition, fetch_offset=offset, partition_max_bytes=4 << 20
                        ),
                    ),
                ),
            ),
        )
        response = await client.request(request, version)
        assert getattr(response, "error_code", 0) == 0
        [topic_response] = response.responses
        [part] = topic_response.partitions
        assert part.partition_index == partition
        assert part.error_code == 0, f"fetch error {part.error_code}"
        for batch in decode_record_batches(part.records or b""):
            if batch.is_control:
                continue
            batches.append(batch)
            for off, ts, key, value, headers in _records_of(batch):
                if off >= offset:
                    records.append(Rec(partition, off, ts, key, value, headers))
        if records:
            offset = records[-1].offset + 1
    return records, batches


# --------------------------------------------------------------------------- 3a


@pytest.mark.parametrize("produce_version", [8, 9])
@pytest.mark.parametrize("compression", CODECS, ids=lambda c: c.name.lower())
async def test_our_batches_read_back_by_librdkafka(
    compression: Compression,
    produce_version: int,
    kafka_bootstrap: str,
    new_topic: NewTopic,
    consume: Consume,
    embedded_broker: EmbeddedBroker | None,
) -> None:
    crc_before = len(embedded_broker.crc_errors_in_log()) if embedded_broker else 0
    topic = new_topic(partitions=2)
    first = _sample_records(0)
    second = _sample_records(1000)[:7]
    third = _sample_records(2000)[5:]

    client = await RawClient.connect(kafka_bootstrap)
    try:
        offsets_1 = await _produce(
            client,
            topic,
            {0: _build(compression, first), 1: _build(compression, second)},
            produce_version,
        )
        offsets_2 = await _produce(client, topic, {0: _build(compression, third)}, produce_version)
    finally:
        await client.aclose()
    assert offsets_1 == {0: 0, 1: 0}
    assert offsets_2 == {0: len(first)}

    expected = _expected(0, 0, first) + _expected(0, len(first), third) + _expected(1, 0, second)
    messages = await trio.to_thread.run_sync(
        lambda: consume(kafka_bootstrap, topic, 2, len(expected))
    )
    got = [_from_confluent(m) for m in messages]
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert have == want

    if embedded_broker is not None:
        assert embedded_broker.crc_errors_in_log()[crc_before:] == []


async def test_corrupt_batch_is_only_logged_by_tansu(
    broker_factory: Callable[..., EmbeddedBroker],
) -> None:
    """Negative control for the ``crc=`` check above (and our decoder's CRC check): tansu
    accepts a batch with a flipped payload byte and only logs the mismatch."""
    broker = broker_factory()
    create_topics(broker.bootstrap, {"corrupt": 1})
    batch = bytearray(_build(Compression.NONE, _sample_records(0)[:3]))
    batch[batch.index(b"v-0")] ^= 0x20  # b"v-0" -> b"V-0": framing intact, CRC wrong
    client = await RawClient.connect(broker.bootstrap)
    try:
        await _produce(client, "corrupt", {0: bytes(batch)}, 8)
        with pytest.raises(CorruptRecordError):
            await _fetch_all(client, "corrupt", 0, 3, 4)
    finally:
        await client.aclose()
    for _ in range(100):  # the log is written asynchronously
        if broker.crc_errors_in_log():
            break
        await trio.sleep(0.05)
    assert broker.crc_errors_in_log(), broker.log_tail()
    # the framing is intact: it decodes when CRC checking is off
    assert decode_record_batches(bytes(batch), verify_crc=False)[0].records[0].value == b"V-0"


# --------------------------------------------------------------------------- 3b


def _produce_with_confluent(
    bootstrap: str, topic: str, compression: Compression, count: int
) -> list[Rec]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": CONFLUENT_CODEC[compression],
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.num.messages": 25,  # several batches per partition
        }
    )
    results: list[Rec] = []
    errors: list[str] = []

    for i in range(count):
        partition = i % 2
        key: bytes | None = None if i % 7 == 3 else b"key-%d" % (i % 5)
        value: bytes | None = None if i % 11 == 4 else (b"row %04d;" % i) * (1 + i % 40)
        headers: list[tuple[str, bytes | None]] = []
        if i % 3:
            headers = [("seq", b"%d" % i), ("src", b"confluent"), ("seq", bytes([i % 256]))]
        if i % 13 == 5:
            headers.append(("nil", None))
        ts = BASE_TS + 10 * i - (500 if i % 17 == 0 else 0)
        record = (ts, key, value, tuple(headers))

        def on_delivery(err: Any, msg: Any, record: Any = record) -> None:
            if err is not None:
                errors.append(str(err))
                return
            ts_, key_, value_, headers_ = record
            results.append(Rec(msg.partition(), msg.offset(), ts_, key_, value_, headers_))

        producer.produce(
            topic,
            key=key,
            value=value,
            headers=headers or None,
            timestamp=ts,
            partition=partition,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    remaining = producer.flush(20)
    assert not errors
    assert remaining == 0
    return sorted(results, key=lambda r: (r.partition, r.offset))


@pytest.mark.parametrize("compression", CODECS, ids=lambda c: c.name.lower())
async def test_librdkafka_batches_decode_with_our_fetch(
    compression: Compression,
    kafka_bootstrap: str,
    new_topic: NewTopic,
) -> None:
    topic = new_topic(partitions=2)
    count = 120
    sent = await trio.to_thread.run_sync(
        lambda: _produce_with_confluent(kafka_bootstrap, topic, compression, count)
    )
    assert len(sent) == count

    client = await RawClient.connect(kafka_bootstrap)
    try:
        for fetch_version in (4, 12):
            fetched: list[Rec] = []
            codecs_seen: set[Compression] = set()
            for partition in (0, 1):
                want = [r for r in sent if r.partition == partition]
                records, batches = await _fetch_all(
                    client, topic, partition, len(want), fetch_version
                )
                fetched += records[: len(want)]
                codecs_seen |= {b.compression for b in batches}
                assert all(b.producer_id >= 0 for b in batches)  # idempotent producer
            assert fetched == sent, f"fetch v{fetch_version}"
            # librdkafka falls back to uncompressed batches only when compression does not
            # help; our values compress well, so the codec must really have been exercised
            assert compression in codecs_seen, (fetch_version, codecs_seen)
    finally:
        await client.aclose()


def test_timestamps_are_create_time() -> None:
    """Guard for the helpers above: create-time records get base + delta."""
    batch = decode_record_batches(_build(Compression.NONE, _sample_records(0)))[0]
    assert batch.timestamp_type == 0
    assert [ts for _, ts, *_ in _records_of(batch)] == [ts for ts, *_ in _sample_records(0)]
