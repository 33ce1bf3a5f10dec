"""Topic producer rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing"):
which list takes which partitioning path, and the metadata wait
(``pipeline/producer/_stages/topic_producer.py``).

Deterministic (FakeCluster, autojump_clock, no jitter); each docstring walks
through the schedule it needs, and the virtual times the protocol fixes are
asserted exactly. Every producer's ``double_settles == 0`` is checked by the
autouse fixture of ``conftest.py`` and asserted here where the test reads the
statistics anyway.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from pipeline import DeliveryTimeoutError, ProducerError
from pipeline.producer._message import ProducerMessage
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.producer._stages.partitioner import DefaultPartitioner, java_positive, murmur2
from pipeline.producer._stages.topic_producer import TopicProducer
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_guards import exact
from .test_sarama_suite import outcomes

# A burst this long takes the sticky-run path when every message has a null
# key and no partition (topic_producer._RUN_MIN is 16); the rules below must
# hold for it like for any list.
BURST = 20


def keyed_partition(key: bytes, n: int) -> int:
    """Java's murmur2 choice for a key (the default partitioner's keyed path)."""
    return DefaultPartitioner(random.Random(0)).partition("t", key, None, n)


async def test_a_long_burst_of_keyed_messages_is_partitioned_by_key(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A burst of keyed messages (one list of 20 for the topic producer) goes
    by key, message by message (murmur2, as Java), never by the sticky run
    that serves null keys.

    Schedule: one ``send_many`` of k0..k19 to a 3-partition topic: each
    partition's log holds exactly the keys murmur2 puts there, in send order."""
    fake.create_topic("t", 3)
    keys = [b"k%d" % i for i in range(BURST)]
    async with open_fake_producer(fake, **exact()) as producer:
        await producer._core.cluster.partitions_for("t")
        group = await producer.send_many([ProducerMessage("t", b"v", key=k) for k in keys])
        await group
        assert producer.statistics().double_settles == 0
    expected = {p: [k for k in keys if keyed_partition(k, 3) == p] for p in range(3)}
    assert all(expected.values())  # the keys spread over every partition
    for p in range(3):
        assert [e.record.key for e in fake.log("t", p)] == expected[p]


async def test_a_long_burst_with_explicit_partitions_keeps_them(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Explicit partitions in a burst of null-key messages are kept, message
    by message; only a burst with neither keys nor partitions is spread by
    the sticky run.

    Schedule: one ``send_many`` of m0..m19, m_i to partition i % 3: partition
    p's log holds exactly the m_i with i % 3 == p, in order."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, **exact()) as producer:
        await producer._core.cluster.partitions_for("t")
        group = await producer.send_many(
            [ProducerMessage("t", b"m%d" % i, partition=i % 3) for i in range(BURST)]
        )
        await group
    for p in range(3):
        assert values_in_log(fake, "t", p) == [b"m%d" % i for i in range(BURST) if i % 3 == p]


async def test_a_long_burst_of_null_keys_follows_a_round_robin_partitioner(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The sticky run is the default partitioner's shortcut only: with any
    other partitioner (here round robin) each null-key message of a burst
    gets its own ``partition()`` call, and nothing caches the first answer.

    Schedule: one ``send_many`` of m0..m19 (null keys) to a 3-partition topic
    with ``partitioner="round_robin"``: m_i goes to partition i % 3."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, **exact(partitioner="round_robin")) as producer:
        await producer._core.cluster.partitions_for("t")
        group = await producer.send_many(
            [ProducerMessage("t", b"m%d" % i) for i in range(BURST)]
        )
        await group
    for p in range(3):
        assert values_in_log(fake, "t", p) == [b"m%d" % i for i in range(BURST) if i % 3 == p]


async def test_messages_fail_at_their_deadline_while_metadata_does_not_come(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The first messages for a topic wait for its metadata, bounded by their
    delivery deadline (not by the longer ``metadata_timeout``): then they fail
    with a DeliveryTimeoutError that names the topic and the timeout.

    Schedule (delivery_timeout 2 s, request_timeout 1 s, metadata_timeout
    60 s; the brokers answer Metadata 30 s late): a and b, sent at t0 to the
    uncached topic "t", fail at t0 + 2 exactly."""
    fake.create_topic("t", 1)
    async with open_fake_producer(
        fake, **exact(delivery_timeout=2.0, request_timeout=1.0, metadata_timeout=60.0)
    ) as producer:
        fake.delay_responses(30.0, api_key=ApiKey.METADATA)
        t0 = trio.current_time()
        deliveries = [producer.send_nowait("t", b"a"), producer.send_nowait("t", b"b")]
        with trio.fail_after(10):  # settled, not left waiting
            results = await outcomes(deliveries)
        assert trio.current_time() == t0 + 2.0
        fake.clear_faults()
        stats = producer.statistics()
        assert (stats.failed, stats.double_settles) == (2, 0)
    for r in results:
        assert isinstance(r, ProducerError) and isinstance(r.cause, DeliveryTimeoutError)
        assert "no metadata for topic 't' within delivery_timeout=2.0s" in str(r.cause)


async def test_a_full_partition_inbox_makes_the_topic_producer_wait(
    autojump_clock: Any,
) -> None:
    """A partition producer's inbox is bounded (``channel_capacity``): when
    it is full the topic producer waits for room (``send``), and the group
    arrives once the partition producer took what was ahead of it, neither
    dropped nor failed. (Through the whole pipeline the inbox is full only
    when the scheduler runs the topic producer twice before the partition
    producer, which no virtual-time schedule fixes: so the topic producer is
    driven directly, as ``tests/producer/test_hot_path.py`` does.)

    Schedule: the inbox (capacity 1) holds ``ahead``; ``_route`` of m (to
    partition 0) waits; the partition producer's side takes ``ahead``, then
    m's group arrives, all at the same virtual time."""
    send, receive = trio.open_memory_channel[list[Any]](1)
    ahead: list[Any] = []
    send.send_nowait(ahead)
    asked: list[TopicPartition] = []

    async def partition_inbox(tp: TopicPartition) -> trio.MemorySendChannel[list[Any]]:
        asked.append(tp)
        return send

    ctx: Any = SimpleNamespace(
        cluster=SimpleNamespace(partition_count_nowait=lambda topic: 1),
        ledger=None, config=SimpleNamespace(batch_bytes=16384, channel_capacity=10),
    )
    partitions: Any = SimpleNamespace(partition_inbox=partition_inbox)
    producer = TopicProducer(ctx, "t", DefaultPartitioner(random.Random(0)), partitions)
    m = ProducerMessage("t", b"m", partition=0)
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer._route, [m])
        await trio.testing.wait_all_tasks_blocked()
        assert asked == [TopicPartition("t", 0)]
        assert receive.receive_nowait() is ahead
        with trio.fail_after(1):
            group = await receive.receive()
    assert group == [m] and trio.current_time() == t0


async def test_keyed_rows_follow_a_partitioner_that_is_not_murmur2(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send_batch`` hashes keys itself (vectorized murmur2) only for the
    default and murmur2 partitioners; any other partitioner is asked for
    each keyed row, as ``send()`` would ask it.

    Schedule: one ``send_batch`` of 6 keyed rows to a 3-partition topic with
    ``partitioner="round_robin"``: row i goes to partition i % 3 whatever
    its key."""
    fake.create_topic("t", 3)
    values = [b"v%d" % i for i in range(6)]
    async with open_fake_producer(fake, **exact(partitioner="round_robin")) as producer:
        await producer._core.cluster.partitions_for("t")
        result = await (await producer.send_batch("t", values, keys=[b"same"] * 6))
    assert (result.delivered, result.failed) == (6, 0)
    for p in range(3):
        assert values_in_log(fake, "t", p) == values[p::3]


async def test_rows_pinned_out_of_range_are_told_the_partition_count(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Rows of a ``send_batch`` pinned to partitions the topic does not have
    fail with an error that says how many partitions it has and their range
    (what to pin instead), like a message's explicit partition out of range.

    Schedule: rows v0..v3 pinned to 0, 5, 1, 9 of a 2-partition topic: v1 and
    v3 fail ("it has 2 partitions (0..1)"), v0 and v2 are written."""
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, **exact()) as producer:
        result = await (await producer.send_batch(
            "t", [b"v0", b"v1", b"v2", b"v3"], partitions=[0, 5, 1, 9]
        ))
    assert (result.delivered, result.failed) == (2, 2)
    text = str(result.first_error)
    assert "topic 't' does not have: it has 2 partitions (0..1)" in text, text
    assert values_in_log(fake, "t", 0) == [b"v0"] and values_in_log(fake, "t", 1) == [b"v2"]


def reference_assign(
    specs: list[tuple[bytes | None, int | None, int]], n: int, batch_bytes: int,
    partitioner: DefaultPartitioner, state: list[int],
) -> tuple[list[int], dict[int, list[int]]]:
    """The definition, one message at a time and nothing cached: an explicit
    partition is kept; a key goes to murmur2's partition; a null key goes to
    the sticky partition, which changes (``on_new_batch``) once ``batch_bytes``
    of null-key messages went to it (KIP-480: keyed messages do not count).
    ``state`` is [sticky partition, its bytes], carried between calls."""
    chosen: list[int] = []
    groups: dict[int, list[int]] = {}
    for i, (key, partition, size) in enumerate(specs):
        if partition is not None:
            p = partition
        elif key is not None:
            p = java_positive(murmur2(key)) % n
        else:
            p = partitioner.partition("t", None, None, n)
            if p != state[0]:
                state[:] = [p, 0]
            state[1] += size
            if state[1] >= batch_bytes:
                partitioner.on_new_batch("t", n, p)
                state[1] = 0
        chosen.append(p)
        groups.setdefault(p, []).append(i)
    return chosen, groups


async def test_mixed_keys_go_by_murmur2_and_null_keys_stick_by_bytes(
    autojump_clock: Any,
) -> None:
    """``_assign`` on lists mixing keyed, null-key and pinned messages must
    choose what the plain definition (``reference_assign``) chooses, although
    it caches the sticky choice between ``on_new_batch`` calls and appends to
    the last partition's group without a lookup: a keyed message's partition
    never becomes the sticky one, keyed bytes do not count toward the sticky
    batch, and each partition's group keeps list order when partitions
    alternate (p0, p1, p0). The topic producer is driven directly (three
    lists, the sticky state carried from one to the next), like
    ``tests/producer/test_hot_path.py``.

    Lists (batch_bytes 100, 3 partitions, seeded rng; sizes in brackets).
    First: null [60] -> sticky 2; k1 [60] -> 2 by murmur2 (with keyed bytes
    counted, 120 would switch here); null [30] -> 2 (90); k2 -> 0; null [20]
    -> 2 (110: switch); pinned 2; null [70] -> 1; k1 -> 2; null [40] -> 1
    (110: switch); k3 -> 1; null [45] -> 2; k2 -> 0: partition 2's group
    holds messages 0, 1, 2, 4, 5, 7, 10 in that order. Second (sticky 2, 45
    bytes carried): k4 -> 1; null [99] -> 2 (144: switch); null [1] -> 0;
    pinned 0 [200, not counted]; null [100] -> 0 (101: switch); k5 -> 0;
    null [50] -> 2. Third: null, k1, null on 2; k6 -> 1. Fourth: pinned 0
    first (a message for the partition ``last_p`` must not start at). Then
    the topic has 1 partition: three nulls [60] on 0, a switch after the
    second, which can only pick 0 again, so the count restarts at 0 there
    (no other partition resets it); 3 partitions again: the next nulls
    follow from that count, not a stale one. Last, with 1 partition again, 16
    null-key messages [10] take the sticky run (``_assign_sticky_run``): the
    sticky partition 1 is gone, the new one (0) starts from 0 bytes.
    """
    lists: list[list[tuple[bytes | None, int | None, int]]] = [
        [(None, None, 60), (b"k1", None, 60), (None, None, 30), (b"k2", None, 50),
         (None, None, 20), (None, 2, 10), (None, None, 70), (b"k1", None, 5),
         (None, None, 40), (b"k3", None, 90), (None, None, 45), (b"k2", None, 1)],
        [(b"k4", None, 30), (None, None, 99), (None, None, 1), (None, 0, 200),
         (None, None, 100), (b"k5", None, 100), (None, None, 50)],
        [(None, None, 10), (b"k1", None, 10), (None, None, 10), (b"k6", None, 10)],
        [(None, 0, 10), (None, 0, 10), (b"k1", None, 10)],
        [(None, None, 60), (None, None, 60), (None, None, 60)],  # the topic has 1 partition
        [(None, None, 30), (None, None, 30), (None, None, 30)],  # 3 again
        [(None, None, 10)] * 16,  # 1 partition again: a sticky run (_assign_sticky_run)
    ]
    counts = [3, 3, 3, 3, 1, 3, 1]
    producer = TopicProducer(
        SimpleNamespace(config=SimpleNamespace(batch_bytes=100, channel_capacity=10), ledger=None, cluster=None),  # type: ignore[arg-type]
        "t", DefaultPartitioner(random.Random(5)), None,  # type: ignore[arg-type]
    )
    reference, state = DefaultPartitioner(random.Random(5)), [-1, 0]
    spread: set[int] = set()
    for n, specs in zip(counts, lists, strict=True):
        msgs = []
        for key, partition, size in specs:
            msg = ProducerMessage("t", b"", key=key, partition=partition)
            msg._size = size
            msgs.append(msg)
        bad: list[ProducerMessage] = []
        if len(specs) < 16:
            groups = producer._assign(msgs, n, bad)
        else:  # the sticky partition (1) is not one of the partitions now
            assert state[0] == 1
            groups = producer._assign_sticky_run(msgs, n)
        chosen, expected = reference_assign(specs, n, 100, reference, state)
        assert [m.partition for m in msgs] == chosen
        index = {id(m): i for i, m in enumerate(msgs)}
        assert {p: [index[id(m)] for m in g] for p, g in groups.items()} == expected
        assert [producer._sticky_partition, producer._sticky_bytes] == state
        assert bad == []
        spread.update(chosen)
    assert spread == {0, 1, 2}


async def test_messages_around_a_row_run_in_one_list_are_routed_once_in_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """What piles up in the topic producer's inbox while it waits for
    metadata is routed as one list; with a ``send_batch`` run among plain
    messages, ``_assign_mixed`` routes the messages before the run, the run,
    and the messages after it, each once, in order.

    Schedule (the topic's Metadata answered 0.5 s late): t0: m0 makes the
    topic producer wait for the topic's metadata, asked at t0 + 0.125 (refresh
    rounds are retry_backoff apart, the bootstrap round was at t0); a, the run
    r0 r1 and b are sent meanwhile, as three inbox items. t0 + 0.625: m0 is
    routed, then a, r0, r1, b as one list: the log holds m0 a r0 r1 b, each
    once, all written at t0 + 0.625."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, **exact()) as producer:
        fake.delay_responses(0.5, api_key=ApiKey.METADATA, count=1)
        t0 = trio.current_time()
        first = producer.send_nowait("t", b"m0")
        await trio.testing.wait_all_tasks_blocked()
        a = await producer.send("t", b"a")
        group = await producer.send_batch("t", [b"r0", b"r1"])
        b = await producer.send("t", b"b")
        results = await outcomes([first, a, b])
        rows = await group
        assert trio.current_time() == t0 + 0.625
        assert producer.statistics().double_settles == 0
    assert [r.offset for r in results] == [0, 1, 4] and (rows.delivered, rows.failed) == (2, 0)
    assert values_in_log(fake, "t", 0) == [b"m0", b"a", b"r0", b"r1", b"b"]


async def test_a_failed_run_names_its_partition(fake: FakeCluster, autojump_clock: Any) -> None:
    """Each run of a ``send_batch`` call carries the partition the topic
    producer chose for it, so a failure says where its rows went
    ("... to t[1] not delivered"), as a message's error names its partition.

    Schedule (retries 0): rows v0, v1 pinned to partitions 0 and 1 of "t";
    partition 1's batch is answered NOT_ENOUGH_REPLICAS and fails at once: v0
    is written, v1 fails with a RowsError naming t[1]."""
    fake.create_topic("t", 2)
    async with open_fake_producer(fake, **exact(retries=0)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, topic="t", partition=1)
        result = await (await producer.send_batch("t", [b"v0", b"v1"], partitions=[0, 1]))
    assert (result.delivered, result.failed) == (1, 1)
    text = str(result.first_error)
    assert "1 row(s) of a send_batch call (the first at row 1) to t[1] not delivered" in text, text
    assert values_in_log(fake, "t", 0) == [b"v0"] and values_in_log(fake, "t", 1) == []


async def test_a_partitioner_error_fails_its_message_only(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A user partitioner that raises (or answers out of range: the
    ``CallablePartitioner`` wrapper raises then) fails that message with the
    partitioner's own error, at once; the other messages of the same list are
    routed as usual.

    Schedule: one ``send_many`` of a (key b"ok"), b (key b"boom": the
    partitioner raises) and c (key b"far": it answers 7 of 2): b and c fail
    at t0 with the partitioner's errors, a is written on partition 1."""

    def partitioner(topic: str, key: bytes | None, value: bytes | None, n: int) -> int:
        if key == b"boom":
            raise RuntimeError("partitioner bug")
        return 7 if key == b"far" else 1

    fake.create_topic("t", 2)
    async with open_fake_producer(fake, **exact(partitioner=partitioner)) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        group = await producer.send_many(
            [ProducerMessage("t", v, key=v.split(b":")[1]) for v in (b"a:ok", b"b:boom", b"c:far")]
        )
        with trio.fail_after(10):  # every message settled, none left waiting
            result = await group
        assert trio.current_time() == t0
    assert (result.delivered, result.failed) == (1, 2)
    causes = [e.cause for e in result.errors]
    assert isinstance(causes[0], RuntimeError) and str(causes[0]) == "partitioner bug"
    assert isinstance(causes[1], ValueError) and "returned partition 7" in str(causes[1])
    assert values_in_log(fake, "t", 1) == [b"a:ok"] and values_in_log(fake, "t", 0) == []
