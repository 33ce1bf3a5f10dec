"""Columnar batches on a real broker, judged by an independent reader (confluent-kafka).

Rows built as Arrow arrays (the Spark shape: keys, values, list<struct> headers,
timestamps, nulls) are partitioned with the vectorized murmur2, grouped, cut into
several batches per partition and encoded by ``columnar.encode_batch`` (each
codec, on the C kernel and on the pure-Python one), produced with a raw
ProduceRequest, and read back by confluent-kafka: keys, values, headers,
timestamps, partitions and order must be exact. librdkafka's own ``murmur2``
partitioner, producing the same keys, must pick the same partitions.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.producer._columnar.partitioning import group_by_partition, key_partitions
from pipeline.protocol.columnar import build_columns, cut_batches, encode_batch
from pipeline.protocol.compression import Compression
from pipeline.testing.broker import EmbeddedBroker
from tests.integration.test_codec_crosscheck import (
    BASE_TS,
    CODECS,
    CONFLUENT_CODEC,
    RawClient,
    Rec,
    _from_confluent,
    _produce,
)
from tests.protocol.columnar_support import use_kernel

confluent_kafka = pytest.importorskip("confluent_kafka")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.integration

PARTITIONS = 3
ROWS = 300
HEADER_T = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _rows() -> list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    out = []
    for i in range(ROWS):
        key = None if i % 9 == 4 else f"клиент-{i % 23}".encode()
        value = None if i % 31 == 7 else (b"" if i % 29 == 3 else b"order %04d;" % i * (1 + i % 9))
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 4:
            headers = (("id", b"%d" % i), ("trace", None if i % 5 == 0 else b"t" * (i % 70)))
        ts = BASE_TS + 3 * i - (20_000 if i % 17 == 0 else 0)  # some before the batch base
        out.append((ts, key, value, headers))
    return out


def _arrow_columns(rows: list[Any], null_key_partition: int) -> tuple[Any, Any]:
    ts, keys, values, headers = (list(c) for c in zip(*rows, strict=True))
    cols = build_columns(
        pa.array(values, pa.binary()),
        pa.array([k.decode() if k is not None else None for k in keys], pa.string()),
        pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], HEADER_T),
        pa.array(ts, pa.int64()),
    )
    parts = key_partitions(cols, PARTITIONS)
    for i in range(len(parts)):  # the caller's null-key policy: here, a fixed partition
        if parts[i] < 0:
            parts[i] = null_key_partition
    return cols, parts


@pytest.mark.parametrize("kernel", ["c", "python"])
@pytest.mark.parametrize("compression", CODECS, ids=lambda c: c.name.lower())
async def test_columnar_batches_read_back_by_librdkafka(
    compression: Compression,
    kernel: str,
    kafka_bootstrap: str,
    new_topic: Any,
    consume: Any,
    embedded_broker: EmbeddedBroker | None,
) -> None:
    crc_before = len(embedded_broker.crc_errors_in_log()) if embedded_broker else 0
    topic = new_topic(partitions=PARTITIONS)
    rows = _rows()
    with use_kernel(kernel):
        cols, parts = _arrow_columns(rows, null_key_partition=1)
        # per partition, several batches (cut at 2 KiB), in row order
        queues: dict[int, list[bytes]] = {}
        expected: list[Rec] = []
        for p, picked in group_by_partition(parts, PARTITIONS).by_partition:
            queues[p] = [encode_batch(cols, picked[a:b], compression=compression)
                         for a, b, _ in cut_batches(cols, picked, max_bytes=2048)]
            expected += [Rec(p, offset, *rows[row]) for offset, row in enumerate(picked)]
    assert all(len(q) > 1 for q in queues.values()) and len(queues) == PARTITIONS

    client = await RawClient.connect(kafka_bootstrap)
    try:
        while any(queues.values()):  # one request per round: the next batch of each partition
            await _produce(client, topic, {p: q.pop(0) for p, q in queues.items() if q}, 9)
    finally:
        await client.aclose()

    messages = await trio.to_thread.run_sync(
        lambda: consume(kafka_bootstrap, topic, PARTITIONS, ROWS)
    )
    got = [_from_confluent(m) for m in messages]
    assert got == sorted(expected, key=lambda r: (r.partition, r.offset))
    if embedded_broker is not None:
        assert embedded_broker.crc_errors_in_log()[crc_before:] == []


async def test_librdkafka_murmur2_agrees_with_the_vectorized_partitioner(
    kafka_bootstrap: str, new_topic: Any
) -> None:
    topic = new_topic(partitions=PARTITIONS)
    keys = [*sorted({k for _, k, _, _ in _rows() if k is not None}), b"", b"x" * 1000]
    cols = build_columns([b"v"] * len(keys), keys, default_timestamp=BASE_TS)
    ours = list(key_partitions(cols, PARTITIONS))

    def produce() -> list[int]:
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap,
                                             "partitioner": "murmur2_random",
                                             "compression.type": CONFLUENT_CODEC[CODECS[0]]})
        theirs: dict[bytes, int] = {}
        for key in keys:
            producer.produce(topic, key=key, value=b"v", on_delivery=lambda err, msg, key=key:
                             theirs.__setitem__(key, -1 if err else msg.partition()))
        assert producer.flush(20) == 0
        return [theirs[k] for k in keys]

    assert await trio.to_thread.run_sync(produce) == ours
