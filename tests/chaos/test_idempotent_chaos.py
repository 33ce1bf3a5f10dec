"""Idempotence under chaos (issue 5, acceptance 3).

The embedded tansu broker sits behind a ``FaultProxy`` (tansu advertises the proxy's
port, so every connection after bootstrap goes through it). During each run the proxy
kills every connection after a seeded random lifetime (0.05-0.3 s) and, at seeded
random moments, loses the response to a Produce request after the broker applied it.
Each run sends ``PIPELINE_CHAOS_MESSAGES`` (default 20 000) messages to a fresh
6-partition topic, in paced bursts so that several batches per partition are in flight;
the value encodes ``(run, seq)`` and the partition is ``seq % 6``. Afterwards the faults
are cleared, an ``END`` sentinel is appended to every partition, and the topic is read
back with confluent-kafka (``assign()``, CRC checks on) up to the sentinels. (tansu's
high watermark from ListOffsets lags the log end by a few batches, so "read up to the
high watermark" would miss the tail.)

Idempotent runs (the default config), one per seed, must show:

* 0 duplicates: every ``(run, seq)`` is in the log at most once;
* 0 acknowledged losses: every message whose delivery succeeded is in the log, at
  the partition it was sent to, and at the reported offset when the offset is known
  (tansu answers a duplicate with DUPLICATE_SEQUENCE_NUMBER: success, offset unknown);
* exact per-partition order: each partition's log is strictly increasing in ``seq``.
  This covers failed (fate unknown) messages too: they may be present or absent, but
  never duplicated or out of order;
* no stall and no loss of service: every message is delivered (kills and lost
  responses are all recoverable by identical retries), none waited out its
  ``delivery_timeout``.

The control runs send the same way with ``idempotent=False, acks="all"`` under the
same fault schedules; their duplicates, summed over the seeds, must be > 0, which
proves the faults bite (a lost ack makes a non-idempotent retry write the batch twice).

These runs found a producer bug, now fixed and pinned by
``tests/scenarios/test_idempotence.py::test_failed_write_behind_pending_requests_keeps_sequence_order``:
a write that failed at once on a dying connection was bounced ahead of the earlier
requests still pending on it, so retries went out of sequence order and 3-10% of the
messages failed with OUT_OF_ORDER_SEQUENCE_NUMBER under a new producer id.

Every loop is bounded in count and time: each run is under ``trio.fail_after``.
Run with ``-s`` to see the per-run table.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from pipeline import ProducerError, open_producer
from pipeline.protocol.api import ApiKey
from pipeline.testing.broker import EmbeddedBroker, create_topics, free_port
from pipeline.testing.proxy import FaultProxy

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.chaos

MESSAGES = int(os.environ.get("PIPELINE_CHAOS_MESSAGES", "20000"))
SEEDS = [1, 2, 3, 4, 5]
PARTITIONS = 6
# Sending is paced (a pause every PACE_EVERY messages) so that each run lasts a few
# seconds and many faults hit it (unpaced, 20k messages take ~0.5 s and see one or two),
# while each burst still pipelines several batches per partition.
PACE_EVERY = 1000
PACE_SLEEP = 0.1
RUN_TIMEOUT = 60.0  # seconds per run: produce, flush, close and read back
PAD = b"." * 64  # values of ~80 bytes
END = b"END"  # the sentinel closing each partition

# Faults: each connection lives 0.05-0.3 s; a Produce response is lost every 0.1-0.3 s.
# A retry round (backoff <= 50 ms, then a few ms of I/O) must fit between two faults
# most of the time, or no round ever completes and the run is a delivery-timeout livelock.
KILL_LIFETIME = (0.05, 0.3)
LOSE_EVERY = (0.1, 0.3)

PRODUCER_OPTIONS: dict[str, Any] = dict(
    acks="all",
    linger=0.002,
    batch_bytes=4096,  # ~45 records per batch: bursts keep up to 5 per partition in flight
    request_timeout=3.0,  # a lost response recovers fast (the proxy also closes the socket)
    delivery_timeout=30.0,  # generous: acknowledged loss is what is measured, not timeouts
    retry_backoff=0.01,
    retry_backoff_max=0.05,
    close_timeout=30.0,
    client_id="chaos",
)


@dataclass
class RunResult:
    label: str
    seed: int
    sent: int = 0
    acked: int = 0
    failed: int = 0
    in_log: int = 0
    duplicates: int = 0
    order_violations: int = 0
    acked_lost: int = 0
    wrong_partition: int = 0
    wrong_offset: int = 0
    offset_unknown: int = 0
    foreign: int = 0
    bumps: int = 0
    new_ids: int = 0
    kills: int = 0
    responses_lost: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    HEADER = (
        f"{'run':<14}{'sent':>6}{'acked':>7}{'failed':>7}{'in log':>8}{'dups':>6}"
        f"{'order':>6}{'lost':>5}{'bumps':>6}{'newids':>7}{'kills':>6}{'resp':>6}{'secs':>6}"
    )

    def row(self) -> str:
        return (
            f"{self.label + ' s' + str(self.seed):<14}{self.sent:>6}{self.acked:>7}"
            f"{self.failed:>7}{self.in_log:>8}{self.duplicates:>6}{self.order_violations:>6}"
            f"{self.acked_lost:>5}{self.bumps:>6}{self.new_ids:>7}{self.kills:>6}"
            f"{self.responses_lost:>6}{self.seconds:>6.1f}"
        )


# ---------------------------------------------------------------- broker, proxy, read back


@pytest.fixture(scope="module")
def chaos_broker() -> Iterator[tuple[EmbeddedBroker, int]]:
    """One tansu for the module, advertising ``proxy_port``: each test puts its own
    seeded FaultProxy on that port."""
    proxy_port = free_port()
    broker = EmbeddedBroker(port=free_port(), advertised_port=proxy_port)
    broker.start()
    try:
        yield broker, proxy_port
    finally:
        broker.stop()


def read_topic(bootstrap: str, topic: str, timeout: float = 20.0) -> dict[int, list[Any]]:
    """Every record of ``topic`` up to and excluding each partition's ``END`` sentinel
    (written by ``write_sentinels`` after the run), per partition in offset order
    (confluent-kafka, ``assign()``, CRC checks on; blocking, bounded by ``timeout``).

    tansu's high watermark (ListOffsets latest) lags the log end by up to a few
    batches, so it cannot tell when the whole log has been read: the sentinel can."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "check.crcs": True,
            "socket.timeout.ms": 5000,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: dict[int, list[Any]] = {p: [] for p in range(PARTITIONS)}
        open_partitions = set(range(PARTITIONS))
        deadline = time.monotonic() + timeout
        while open_partitions and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                if msg.error() is not None:
                    raise AssertionError(f"consumer error: {msg.error()}")
                p = msg.partition()
                if p not in open_partitions:
                    continue
                if msg.value() == END:
                    open_partitions.discard(p)
                else:
                    out[p].append(msg)
        assert not open_partitions, (
            f"no END sentinel read from {topic} partitions {sorted(open_partitions)} "
            f"within {timeout}s"
        )
        for records in out.values():
            records.sort(key=lambda m: m.offset())
        return out
    finally:
        consumer.close()


async def write_sentinels(bootstrap: str, topic: str) -> None:
    """One ``END`` record at the end of every partition (after the run's producer closed)."""
    async with open_producer(
        bootstrap, idempotent=False, acks="all", request_timeout=5.0, delivery_timeout=10.0,
        close_timeout=10.0,
    ) as producer:
        for p in range(PARTITIONS):
            await producer.send(topic, END, partition=p)
        await producer.flush()


# ---------------------------------------------------------------- one run


async def inject_lost_responses(proxy: FaultProxy, stop: trio.Event, seed: int) -> None:
    """Until ``stop``: wait a seeded random interval, then arm "lose the next Produce
    response", but only once the previous one fired. Armed rules must not pile up: a
    pile would lose every response, and a producer that retries more slowly than the
    rules are armed would never see an answer."""
    rng = random.Random(seed * 7919)
    armed = 0
    for _ in range(100_000):  # bounded; the run's fail_after bounds the time
        with trio.move_on_after(rng.uniform(*LOSE_EVERY)):
            await stop.wait()
        if stop.is_set():
            return
        if proxy.stats.responses_lost >= armed:
            armed += 1
            proxy.lose_responses(1, api_key=ApiKey.PRODUCE)


async def chaos_run(
    broker: EmbeddedBroker, proxy_port: int, seed: int, *, idempotent: bool
) -> RunResult:
    label = "idempotent" if idempotent else "control"
    result = RunResult(label, seed)
    run_id = seed if idempotent else 1000 + seed
    topic = f"chaos-{label}-{seed}-{time.monotonic_ns() % 10**9}"
    create_topics(broker.bootstrap, {topic: PARTITIONS})
    t0 = time.monotonic()
    with trio.fail_after(RUN_TIMEOUT):
        async with trio.open_nursery() as nursery:
            proxy = FaultProxy("127.0.0.1", broker.port, listen_port=proxy_port, seed=seed)
            await nursery.start(proxy.run)
            deliveries = []
            stop = trio.Event()
            async with open_producer(
                proxy.address, idempotent=idempotent, **PRODUCER_OPTIONS
            ) as producer:
                proxy.kill_randomly(*KILL_LIFETIME)
                nursery.start_soon(inject_lost_responses, proxy, stop, seed)
                for seq in range(MESSAGES):
                    if seq % PACE_EVERY == PACE_EVERY - 1:
                        await trio.sleep(PACE_SLEEP)
                    deliveries.append(
                        await producer.send(
                            topic,
                            b"%d:%d:" % (run_id, seq) + PAD,
                            key=b"k%d" % (seq % 97),
                            partition=seq % PARTITIONS,
                        )
                    )
                await producer.flush()
                stats = producer.statistics()
                idem = producer._core.idempotence
                if idem is not None:
                    result.bumps, result.new_ids = idem.bumps, idem.new_ids
                assert stats.double_settles == 0
                assert stats.outstanding == 0
            # Read back through a quiet proxy (the broker advertises its port).
            stop.set()
            proxy.clear_faults()
            proxy.stop_random_kills()
            # killed counts the connections closed to lose a response too
            result.kills = proxy.stats.killed - proxy.stats.responses_lost
            result.responses_lost = proxy.stats.responses_lost
            await write_sentinels(proxy.address, topic)
            log = await trio.to_thread.run_sync(read_topic, proxy.address, topic)
            nursery.cancel_scope.cancel()
    result.seconds = time.monotonic() - t0
    result.sent = len(deliveries)

    # Outcomes.
    acked: dict[int, Any] = {}  # seq -> RecordMetadata
    for seq, delivery in enumerate(deliveries):
        assert delivery.done(), f"message {seq} has no outcome after flush"
        try:
            acked[seq] = delivery.result()
        except ProducerError as exc:
            result.failed += 1
            name = type(exc.cause).__name__
            result.errors[name] = result.errors.get(name, 0) + 1
    result.acked = len(acked)

    # The log.
    where: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset) of its first copy
    at: dict[tuple[int, int], int] = {}  # (partition, offset) -> seq
    for partition, records in log.items():
        last = -1
        for msg in records:
            result.in_log += 1
            r, s, _ = msg.value().split(b":", 2)
            if int(r) != run_id:
                result.foreign += 1
                continue
            seq = int(s)
            at[partition, msg.offset()] = seq
            if seq % PARTITIONS != partition:
                result.wrong_partition += 1
            if seq in where:
                result.duplicates += 1  # (a duplicate is never also an order violation)
            else:
                where[seq] = (partition, msg.offset())
                if seq < last:
                    result.order_violations += 1
            last = max(last, seq)
    # Duplicates == 0 and order violations == 0 <=> each partition's log is strictly
    # increasing in seq.
    for seq, meta in acked.items():
        if seq not in where:
            result.acked_lost += 1
            continue
        if meta.partition != where[seq][0]:
            result.wrong_partition += 1
        if not meta.offset_known:
            result.offset_unknown += 1
        elif at.get((meta.partition, meta.offset)) != seq:
            result.wrong_offset += 1
    return result


def report(results: list[RunResult]) -> None:
    print()
    print(RunResult.HEADER)
    for r in results:
        print(r.row())
        details = {
            k: v
            for k, v in (
                ("wrong_partition", r.wrong_partition),
                ("wrong_offset", r.wrong_offset),
                ("offset_unknown", r.offset_unknown),
                ("foreign", r.foreign),
            )
            if v
        }
        if details or r.errors:
            print(f"{'':14}{details} failures: {r.errors}")


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", SEEDS)
async def test_idempotent_exactly_once_in_order_under_chaos(
    chaos_broker: tuple[EmbeddedBroker, int], seed: int
) -> None:
    broker, proxy_port = chaos_broker
    r = await chaos_run(broker, proxy_port, seed, idempotent=True)
    report([r])
    assert r.sent == MESSAGES
    assert r.acked + r.failed == r.sent
    # At the default size each run sees several of both; tiny runs may miss one kind.
    assert r.kills + r.responses_lost > 0, "the faults never fired"
    assert r.foreign == 0
    assert r.duplicates == 0
    assert r.acked_lost == 0
    assert r.order_violations == 0
    assert r.wrong_partition == 0
    assert r.wrong_offset == 0
    # Never stuck: no message waited out its delivery_timeout. Connection kills and
    # lost responses are all recoverable by identical retries, so every message is
    # delivered, with no sequence error taken for unexplained (that was a bug: a
    # failed write was bounced ahead of earlier pending requests).
    assert "DeliveryTimeoutError" not in r.errors, r.errors
    assert "OUT_OF_ORDER_SEQUENCE_NUMBER" not in r.errors, r.errors
    assert r.acked == r.sent, r.errors


async def test_control_non_idempotent_shows_duplicates(
    chaos_broker: tuple[EmbeddedBroker, int],
) -> None:
    """Same sends, same fault schedules, ``idempotent=False``: the faults make duplicates
    (summed over the seeds), so the idempotent runs above prove something."""
    broker, proxy_port = chaos_broker
    results = []
    for seed in SEEDS:
        results.append(await chaos_run(broker, proxy_port, seed, idempotent=False))
    report(results)
    for r in results:
        assert r.sent == MESSAGES
        assert r.acked + r.failed == r.sent
        assert r.foreign == 0
        assert r.acked_lost == 0  # acks=all with retries: duplicates, never losses
    assert sum(r.duplicates for r in results) > 0
