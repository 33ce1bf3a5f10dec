"""``send()`` with headers, a partition, a timestamp, ``on_delivery`` and ``metadata``
rides the columnar burst (``RowBurst.add_extras``; ``_send.c``'s row branch in C): the
C path, its pure-Python twin and the per-message path put the same bytes on the wire
and give every call the same outcome; bad input is refused with the per-message
path's error, naming what is wrong, and changes nothing.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import MetadataRowDelivery, RowDelivery
from pipeline.producer._intake import send_path as _send_path
from pipeline.producer._message import ProducerError
from pipeline.producer._stages.partitioner import java_positive, murmur2
from pipeline.protocol.records import batch_size_for_record
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

T = 1_700_000_000_000  # the scenario conftest's injected CreateTime
PARTITIONS = 3


def _calls(seed: int, n: int) -> list[tuple[bytes | None, dict[str, Any]]]:
    """``n`` send() calls of every shape: headers as pairs, tuples, a dict (str keys,
    non-ASCII ones, bytes and None values, empty), keys (bytes, str, None), null
    values, pinned partitions (some past the topic's: they fail), own timestamps,
    metadata, callbacks; values distinct."""
    rng = random.Random(seed)
    out: list[tuple[bytes | None, dict[str, Any]]] = []
    for i in range(n):
        kwargs: dict[str, Any] = {}
        shape = rng.randrange(6)
        if shape == 1:
            kwargs["headers"] = [("trace-id", b"%016x" % i), ("source", b"checkout")]
        elif shape == 2:
            kwargs["headers"] = {"cl\u00e9": b"v" * rng.randrange(70), "null": None}
        elif shape == 3:
            kwargs["headers"] = (("h", None),)
        elif shape == 4:
            kwargs["headers"] = []
        key_kind = rng.randrange(3)
        if key_kind:
            kwargs["key"] = b"k%d" % rng.randrange(13) if key_kind == 1 else f"s\u00e9{i}"
        if rng.random() < 0.3:
            kwargs["partition"] = rng.choice([0, 1, 2, 2, 7])  # (7: out of range)
        if rng.random() < 0.3:
            kwargs["timestamp"] = T - rng.randrange(10_000)
        if rng.random() < 0.3:
            kwargs["metadata"] = {"i": i}
        if rng.random() < 0.5:
            kwargs["on_delivery"] = True  # (the run's recording callback)
        value = None if rng.random() < 0.05 else b"value-%d-" % i + bytes(rng.randrange(40))
        out.append((value, kwargs))
    return out


def _outcome(delivery: Any) -> tuple[Any, ...]:
    try:
        meta = delivery.result()
    except ProducerError as exc:
        msg = exc.message
        return ("failed", type(exc.cause).__name__, str(exc.cause), msg.topic, msg.key,
                msg.value, tuple(msg.headers), msg.timestamp, msg.metadata)
    return ("ok", meta.topic, meta.partition, meta.offset, meta.timestamp)


def _by_partition(heard: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for h in heard:
        out.setdefault(h[1] if h[0] == "ok" else h[4], []).append(h)
    return out


async def _run(kind: str, calls: list[tuple[bytes | None, dict[str, Any]]]
               ) -> tuple[dict[int, list[bytes]], list[Any], list[Any], set[str]]:
    """One run on a fresh fake cluster: ``kind`` "c" or "python" (rows: a burst is
    opened first), "messages" (none is: every call is a message of one list burst).
    Returns the wire (each partition's produced record batches, in order), every
    call's delivery fields and outcome, what the callbacks heard, and the delivery
    types seen."""
    _send_path.use("c" if kind == "c" else "python")
    heard: list[Any] = []

    def callback(meta: Any, error: Any) -> None:
        heard.append(("ok", meta.partition, meta.offset, meta.timestamp) if error is None
                     else ("failed", str(error), tuple(error.message.headers),
                           error.message.metadata, error.message.partition))

    async with trio.open_nursery() as nursery:
        fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
        await nursery.start(fake.run)
        fake.create_topic("ta", PARTITIONS)
        deliveries = []
        async with open_fake_producer(fake, max_message_bytes=1 << 20) as producer:
            await producer._core.cluster.partitions_for("ta")
            it = producer._intake
            it._until_yield = 1 << 30  # (no schedule point: one burst, fixed batching)
            it._columns_next = kind != "messages"
            for value, kwargs in calls:
                if kwargs.get("on_delivery"):
                    kwargs = {**kwargs, "on_delivery": callback}
                deliveries.append(await producer.send("ta", value, **kwargs))
            fields = [(d.topic, d.key, d.value, tuple(d.headers), d.timestamp, d.metadata)
                      for d in deliveries]
            await producer.flush()
        nursery.cancel_scope.cancel()
    wire: dict[int, list[bytes]] = {}
    for req in fake.requests_of(0):
        for topic in req.request.topic_data:
            for data in topic.partition_data:
                wire.setdefault(data.index, []).append(data.records)
    results = [f + _outcome(d) for f, d in zip(fields, deliveries, strict=True)]
    return wire, results, heard, {type(d).__name__ for d in deliveries}


@pytest.mark.parametrize("seed", [1, 2])
async def test_c_twin_and_messages_agree_on_the_wire_and_the_outcomes(seed: int) -> None:
    if _send_path._c is None:
        pytest.skip("pipeline.producer._speedups._send is not built (or PIPELINE_PURE_PYTHON is set)")
    calls = _calls(seed, 400)
    before = _send_path.SEND_PATH
    try:
        c = await _run("c", calls)
        py = await _run("python", calls)
        msgs = await _run("messages", calls)
    finally:
        _send_path.use(before)
    assert c[3] <= {"RowDelivery", "MetadataRowDelivery"}
    assert py[3] <= {"RowDelivery", "MetadataRowDelivery"}
    assert msgs[3] == {"MessageDelivery"}
    for run in (py, msgs):
        assert run[0] == c[0]  # the same record batches, byte for byte
        assert run[1] == c[1]  # every call's fields and outcome
        # every callback with the same arguments, in order per partition (the order
        # of partitions answered in one response is not the send order's)
        assert _by_partition(run[2]) == _by_partition(c[2])
    # (the script sends what it means to: headers on the wire, failures pinned to 7)
    failed = [r for r in c[1] if r[6] == "failed"]
    assert failed and {r[7] for r in failed} == {"PartitionOutOfRangeError"}
    assert len(failed) == sum(1 for _, k in calls if k.get("partition") == 7)
    assert sum(len(b) for b in c[0].values()) >= PARTITIONS
    assert any(h for r in c[1] for h in r[3]) and any(r[5] for r in c[1])
    assert any(h[0] == "failed" and h[3] is not None for h in c[2])


async def _open_burst(fake: FakeCluster, producer: Any) -> None:
    await producer._core.cluster.partitions_for("ta")
    producer._intake._columns_next = True
    assert type(await producer.send("ta", b"first")) is RowDelivery


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"headers": [(b"h", b"x")]}, TypeError, r"header key must be str, not bytes"),
    ({"headers": [("h", 3)]}, TypeError, r"header 'h' value"),
    ({"headers": {"h": 3.5}}, TypeError, r"header 'h' value"),
    ({"headers": "h=x"}, TypeError, r"headers must be a sequence of \(str, bytes \| None\) "
                                    r"pairs or a mapping, not str"),
    ({"headers": [("h", b"x", b"y")]}, TypeError, r"headers must be a sequence"),
    ({"partition": -1}, ValueError, r"partition must be None or an int >= 0, not -1"),
    ({"partition": "0"}, ValueError, r"partition must be None or an int >= 0, not '0'"),
    ({"timestamp": -5}, ValueError, r"timestamp must be None or milliseconds since the epoch"),
    ({"timestamp": 2**63}, ValueError, r"an int in 0..2\*\*63-1: a record's int64"),
    ({"timestamp": 1.5}, ValueError, r"not 1.5"),
    ({"on_delivery": 3}, TypeError, r"on_delivery"),
    ({"key": b"k", "headers": [("h", b"x")], "partition": 0, "timestamp": True},
     ValueError, r"not True"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD,
                         ids=[repr(sorted(k.items()))[:60] for k, _, _ in BAD])
@pytest.mark.parametrize("burst", ["open", "none"])
async def test_bad_input_is_refused_naming_what_is_wrong(
    nursery: trio.Nursery, send_path: str, kwargs: dict[str, Any], error: type[Exception],
    match: str, burst: str
) -> None:
    """A bad header, partition, timestamp or callback raises the per-message path's
    error whichever path sees it (a burst open or not, C or Python), and the call
    leaves no trace: no row, no reserved byte, no id; the next call goes on."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    async with open_fake_producer(fake) as producer:
        if burst == "open":
            await _open_burst(fake, producer)
        rows, ledger = producer._intake._rows, producer._ledger
        before = (None if rows is None else len(rows.values), ledger.buffered_bytes,
                  ledger._next_id)
        with pytest.raises(error, match=match):
            await producer.send("ta", b"v", **kwargs)
        assert (None if rows is None else len(rows.values), ledger.buffered_bytes,
                ledger._next_id) == before
        if rows is not None:
            assert rows.header_ends is None and rows.partitions is None and not rows.extras
        ok = await producer.send("ta", b"after", headers=[("h", b"1")], partition=0)
        await producer.flush()
        assert (await ok).offset == (1 if burst == "open" else 0)
    assert [(e.record.value, tuple(e.record.headers)) for e in fake.log("ta", 0)] == (
        [(b"first", ())] if burst == "open" else []) + [(b"after", (("h", b"1"),))]


async def test_a_rows_delivery_reads_its_extras(nursery: trio.Nursery, send_path: str) -> None:
    """A row's delivery gives its headers (as normalize leaves them: a tuple of
    pairs), its pinned partition while pending, its own timestamp, and its metadata
    (a row with metadata is a MetadataRowDelivery, which holds it); after the flush,
    the partition and offset it was written at."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", PARTITIONS)
    marker = object()
    async with open_fake_producer(fake) as producer:
        await _open_burst(fake, producer)
        plain = await producer.send("ta", b"plain")
        extra = await producer.send("ta", b"x", key="k", headers={"a": b"1", "b": None},
                                    partition=2, timestamp=T - 7, metadata=marker)
        tomb = await producer.send("ta", None, key=b"gone", headers=[("h", b"")])
        assert (type(plain), type(extra), type(tomb)) == (
            RowDelivery, MetadataRowDelivery, RowDelivery)
        assert (extra.key, extra.headers, extra.partition, extra.timestamp, extra.metadata) == (
            b"k", (("a", b"1"), ("b", None)), 2, T - 7, marker)
        assert (plain.headers, plain.partition, plain.metadata) == ((), None, None)
        assert (tomb.value, tomb.headers) == (None, (("h", b""),))
        msg = extra.message
        assert (msg.headers, msg.partition, msg.metadata) == (extra.headers, 2, marker)
        await producer.flush()
        meta = await extra
        assert (meta.partition, meta.timestamp) == (2, T - 7)
    [entry] = [e for e in fake.log("ta", 2) if e.record.value == b"x"]
    assert (entry.record.key, tuple(entry.record.headers),
            entry.batch.base_timestamp + entry.record.timestamp_delta) == (
        b"k", (("a", b"1"), ("b", None)), T - 7)
    [gone] = [e for p in range(PARTITIONS) for e in fake.log("ta", p)
              if e.record.key == b"gone"]
    assert gone.record.value is None


async def test_a_custom_partitioner_is_asked_per_row(nursery: trio.Nursery,
                                                     send_path: str) -> None:
    """Rows of a producer with a custom partitioner: asked once per row not pinned
    (keyed or not), its choice honoured, a pinned row never asked; a row whose
    partitioner raised or chose no partition of the topic fails alone, naming it."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", PARTITIONS)
    asked: list[Any] = []

    class Last:
        def partition(self, topic: str, key: bytes | None, value: bytes | None, n: int) -> Any:
            asked.append(value)
            if value == b"boom":
                raise RuntimeError("no partition for boom")
            if value == b"far":
                return 9
            return n - 1

        def on_new_batch(self, topic: str, n: int, previous: int) -> None:
            pass

    async with open_fake_producer(fake, partitioner=Last()) as producer:
        await _open_burst(fake, producer)
        sent = [await producer.send("ta", v, key=k, partition=p) for v, k, p in [
            (b"a", b"k", None), (b"b", None, None), (b"c", None, 0), (b"boom", None, None),
            (b"far", b"k", None), (b"d", None, None)]]
        assert all(type(d) is RowDelivery for d in sent)
        await producer.flush()
        out = []
        for d in sent:
            try:
                out.append((await d).partition)
            except ProducerError as exc:
                out.append(str(exc.cause))
    assert asked == [b"first", b"a", b"b", b"boom", b"far", b"d"]
    assert out[:3] == [2, 2, 0] and out[5] == 2
    assert out[3] == "no partition for boom"
    assert "Last' returned partition 9 for topic 'ta', which has 3 partition(s)" in out[4]


class _StickyRecorder:
    """A user's sticky partitioner (KIP-480's contract): a keyed row goes by its key's
    length, a null-key row to one partition until every second ``on_new_batch`` for that
    partition moves it on (the first keeps it: a partitioner may), or until a ``jump``
    row moves it on by itself. Every call is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.sticky = 0
        self.new_batches = 0

    def partition(self, topic: str, key: bytes | None, value: bytes | None, n: int) -> int:
        self.calls.append(("partition", value))
        if key is not None:
            return len(key) % n
        if value == _JUMP:
            self.sticky = (self.sticky + 1) % n
        return self.sticky

    def on_new_batch(self, topic: str, n: int, previous: int) -> None:
        self.calls.append(("on_new_batch", previous))
        self.new_batches += 1
        if previous == self.sticky and self.new_batches % 2 == 0:
            self.sticky = (self.sticky + 1) % n


_JUMP = b"jump-00000"
# (value, key, partition) of two bursts: null-key rows of one size (10-byte values),
# keyed rows and a pinned row between them (neither counts towards the sticky batch)
_STICKY_BURSTS: list[list[tuple[bytes, bytes | None, int | None]]] = [
    [(b"null-%05d" % i, None, None) for i in range(2)]
    + [(b"keyed-0000", b"kk", None), (b"null-00002", None, None), (b"null-00003", None, None),
       (b"pinned-000", None, 2), (b"null-00004", None, None), (_JUMP, None, None)],
    [(b"null-%05d" % i, None, None) for i in range(5, 16)],
]


def _sticky_definition(batch_bytes: int) -> tuple[list[tuple[str, Any]], dict[bytes, int]]:
    """What the partitioner hears and where each row goes, one row at a time: a null-key
    row adds its size bound to its partition's count, reset whenever the partition
    changes; ``on_new_batch`` once the count reaches ``batch_bytes``; the count carries
    from one burst to the next."""
    partitioner = _StickyRecorder()
    where: dict[bytes, int] = {}
    sticky, count = -1, 0
    for burst in _STICKY_BURSTS:
        for value, key, pinned in burst:
            if pinned is not None:
                where[value] = pinned
                continue
            p = where[value] = partitioner.partition("ta", key, value, PARTITIONS)
            if key is not None:
                continue
            if p != sticky:
                sticky, count = p, 0
            count += batch_size_for_record(None, value)
            if count >= batch_bytes:
                partitioner.on_new_batch("ta", PARTITIONS, p)
                count = 0
    return partitioner.calls, where


@pytest.mark.parametrize("path", ["rows", "messages"])
@pytest.mark.parametrize("extra", [-1, 0, 1])  # batch_bytes at, below and past a row edge
async def test_a_custom_sticky_partitioner_hears_what_each_message_would_tell_it(
    nursery: trio.Nursery, send_path: str, path: str, extra: int
) -> None:
    """A custom partitioner asked per row hears what it hears per message: each row it
    is asked for, and ``on_new_batch`` once ``batch_bytes`` of null-key rows went to its
    partition (keyed and pinned rows do not count; ``on_new_batch`` and a change of
    partition restart the count; the count carries over to the next burst). Both paths against the
    definition, with ``batch_bytes`` at, one byte below and one past three rows."""
    row = batch_size_for_record(None, b"null-00000")
    batch_bytes = 3 * row + extra
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", PARTITIONS)
    partitioner = _StickyRecorder()
    async with open_fake_producer(fake, partitioner=partitioner,
                                  batch_bytes=batch_bytes) as producer:
        await producer._core.cluster.partitions_for("ta")
        sent = []
        for burst in _STICKY_BURSTS:
            producer._intake._columns_next = path == "rows"
            sent += [await producer.send("ta", v, key=k, partition=p) for v, k, p in burst]
            await producer.flush()
        assert {type(d) is RowDelivery for d in sent} == {path == "rows"}
        where = {d.value: (await d).partition for d in sent}
    calls, expected = _sticky_definition(batch_bytes)
    assert len([c for c in calls if c[0] == "on_new_batch"]) >= 3, "the sticky batch fills"
    assert (partitioner.calls, where) == (calls, expected)


async def test_rows_of_a_murmur2_producer_go_where_librdkafka_puts_them(
    nursery: trio.Nursery, send_path: str
) -> None:
    """``partitioner="murmur2"`` (librdkafka's ``murmur2``) on rows: a keyed row goes to
    its key's murmur2 partition (hashed in one C loop), a null-key row to the empty
    key's, a pinned row where it is pinned."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", PARTITIONS)
    rows = [(b"v%d" % i, None if i % 5 == 0 else b"key-%d" % i, 1 if i % 7 == 0 else None)
            for i in range(1, 40)]
    async with open_fake_producer(fake, partitioner="murmur2") as producer:
        await _open_burst(fake, producer)
        sent = [await producer.send("ta", v, key=k, partition=p) for v, k, p in rows]
        assert all(type(d) is RowDelivery for d in sent)
        await producer.flush()
        where = [(await d).partition for d in sent]
    assert where == [p if p is not None else java_positive(murmur2(k or b"")) % PARTITIONS
                     for _, k, p in rows]
    assert len(set(where)) == PARTITIONS


@pytest.mark.parametrize("spread", ["pinned", "round_robin"])
async def test_keyless_rows_spread_over_partitions_find_their_offsets(
    nursery: trio.Nursery, send_path: str, spread: str
) -> None:
    """Keyless rows pinned to partitions, or spread by a partitioner asked per row,
    are split by partition: their wire order is not the call order, and each row's
    delivery and callback still give its own partition and offset."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", PARTITIONS)
    heard: list[tuple[int, int]] = []

    def callback(meta: Any, error: Any) -> None:
        assert error is None
        heard.append((meta.partition, meta.offset))

    options = {"partitioner": "round_robin"} if spread == "round_robin" else {}
    async with open_fake_producer(fake, **options) as producer:
        await _open_burst(fake, producer)
        sent = [await producer.send("ta", b"v%d" % i, on_delivery=callback if i % 2 else None,
                                    partition=(i * 7) % PARTITIONS if spread == "pinned" else None)
                for i in range(60)]
        assert all(type(d) is RowDelivery for d in sent)
        await producer.flush()
        got = {d.value: ((await d).partition, (await d).offset) for d in sent}
    logged = {e.record.value: (p, e.offset) for p in range(PARTITIONS) for e in fake.log("ta", p)}
    assert got == {v: logged[v] for v in got}
    assert len({p for p, _ in got.values()}) == PARTITIONS
    assert sorted(heard) == sorted(got[b"v%d" % i] for i in range(1, 60, 2))


def _sized(n: int) -> bytes:
    return b"x" * n


# (value, kwargs) at the size bound's edges: varint prefix widths (63/64, 8191/8192 bytes),
# a null value, header counts (63/64: a one- and a two-byte count), None header values
EDGES: list[tuple[bytes | None, dict[str, Any]]] = [
    (_sized(0), {}), (_sized(63), {}), (_sized(64), {}), (_sized(8191), {}),
    (_sized(8192), {}), (_sized(1 << 20), {}), (None, {}), (None, {"key": b"k"}),
    (b"v", {"key": _sized(63)}), (b"v", {"key": _sized(64)}), (b"v", {"key": _sized(8191)}),
    (b"v", {"headers": [("h", None)]}), (b"v", {"headers": [("h" * 64, _sized(64))]}),
    (b"v", {"headers": [("k%d" % i, None) for i in range(63)]}),  # noqa: UP031
    (b"v", {"headers": [("k%d" % i, b"") for i in range(64)]}),  # noqa: UP031
    (b"v", {"headers": {"\u00e9" * 40: _sized(8191)}}),
    (None, {"key": b"k", "headers": [("", None)], "partition": 0, "timestamp": 5,
            "metadata": 1}),
]


async def test_a_row_reserves_its_records_size_bound(nursery: trio.Nursery,
                                                     send_path: str) -> None:
    """Each row reserves what ``batch_size_for_record`` says its record takes (the
    per-message path's bound), at every varint width of its value, key, header count,
    header key and value, and for null values: C computes it itself."""
    from pipeline.producer._intake.normalize import as_headers
    from pipeline.protocol.records import batch_size_for_record

    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    async with open_fake_producer(fake, max_message_bytes=4 << 20,
                                  buffer_memory=64 << 20) as producer:
        await _open_burst(fake, producer)
        producer._intake._until_yield = 1 << 30  # (one burst: no schedule point)
        rows = producer._intake._rows
        for value, kwargs in EDGES:
            before, buffered = rows.size, producer._ledger.buffered_bytes
            delivery = await producer.send("ta", value, **kwargs)
            assert type(delivery) in (RowDelivery, MetadataRowDelivery)
            bound = batch_size_for_record(kwargs.get("key"), value,
                                          as_headers(kwargs.get("headers")))
            assert (rows.size - before, producer._ledger.buffered_bytes - buffered) == (
                bound, bound), (value if value is None else len(value), kwargs.keys())
        await producer.flush()


@pytest.mark.parametrize("kind", ["plain", "keyed", "headers"])
async def test_a_burst_with_callbacks_reserves_what_its_rows_keep_until_they_settle(
        nursery: trio.Nursery, send_path: str, kind: str) -> None:
    """Sealed, a burst whose rows have callbacks keeps its column lists (their objects)
    until its last row settles, so its chunk reserves them beyond the packed copy a burst
    without callbacks reserves: per row ``KEPT_ROW_BYTES``, a key ``KEPT_KEY_BYTES``, a
    header ``KEPT_HEADER_BYTES`` and the row's header end; all released once settled."""
    from pipeline.producer._columnar import burst as _burst

    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    n = 50
    extras = []
    for callbacks in (False, True):
        async with open_fake_producer(fake, buffer_memory=64 << 20) as producer:
            await _open_burst(fake, producer)
            producer._intake._until_yield = 1 << 30  # (one burst: no schedule point)
            rows = producer._intake._rows
            for i in range(n):
                kwargs: dict[str, Any] = {}
                if kind != "plain":
                    kwargs["key"] = b"k%d" % (i % 7)
                if kind == "headers":
                    kwargs["headers"] = [("trace-id", b"%016x" % i), ("source", b"x")]
                if callbacks:
                    kwargs["on_delivery"] = lambda meta, error: None
                await producer.send("ta", b"v%d" % i, **kwargs)
            expected = 0 if not callbacks else (n + 1) * _burst.KEPT_ROW_BYTES + (
                0 if kind == "plain" else (n + 1) * _burst.KEPT_KEY_BYTES) + (
                0 if kind != "headers" else 2 * n * _burst.KEPT_HEADER_BYTES
                + (n + 1) * _burst.KEPT_ENDS_BYTES)
            assert rows.kept() == expected
            await producer.flush()
            assert rows.chunk.extra >= expected
            extras.append(rows.chunk.extra)
            assert producer._ledger.buffered_bytes == 0
    assert extras[1] - extras[0] == expected


@pytest.mark.parametrize("order", ["metadata-first", "headers-first"])
async def test_a_burst_makes_each_extra_column_at_its_first_row_and_keeps_it_aligned(
        nursery: trio.Nursery, send_path: str, order: str) -> None:
    """A burst's headers, pinned-partition and metadata columns are each made by the
    first row that has one (the rows before it filled in), not by a row with another
    extra; once one exists every later row adds to each, so a failed row's callback
    names its own value, metadata and headers. A pending row pinned to partition 0
    reads 0."""
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    heard: list[Any] = []

    def callback(meta: Any, error: Any) -> None:
        assert error is not None
        msg = error.message
        heard.append((msg.value, msg.metadata, tuple(msg.headers)))

    m1, m2 = {"m": 1}, {"m": 2}
    async with open_fake_producer(fake) as producer:
        await _open_burst(fake, producer)
        producer._intake._until_yield = 1 << 30  # (one burst: no schedule point)
        rows = producer._intake._rows
        send = producer.send
        await send("ta", b"a", on_delivery=callback)
        if order == "metadata-first":
            await send("ta", b"b", metadata=m1, on_delivery=callback)
            assert (rows.metadata, rows.header_ends, rows.partitions) == (
                [None, None, m1], None, None)
            await send("ta", b"c", on_delivery=callback)
            pinned = await send("ta", b"d", headers=[("h", b"1")], partition=0,
                                on_delivery=callback)
            expected_ends = [0, 0, 0, 0, 0, 1, 1]
            expected = [(b"a", None, ()), (b"b", m1, ()), (b"c", None, ()),
                        (b"d", None, (("h", b"1"),)), (b"e", m2, ())]
        else:
            await send("ta", b"b", headers=[("h", b"1")], on_delivery=callback)
            assert (rows.metadata, rows.header_ends, rows.partitions) == (
                None, [0, 0, 0, 1], None)
            await send("ta", b"c", on_delivery=callback)
            pinned = await send("ta", b"d", partition=0, on_delivery=callback)
            assert rows.metadata is None
            expected_ends = [0, 0, 0, 1, 1, 1, 1]
            expected = [(b"a", None, ()), (b"b", None, (("h", b"1"),)), (b"c", None, ()),
                        (b"d", None, ()), (b"e", m2, ())]
        assert pinned.partition == 0  # (pending: its pinned partition)
        await send("ta", b"e", metadata=m2, on_delivery=callback)
        assert rows.header_ends == expected_ends
        assert rows.partitions == [-1, -1, -1, -1, 0, -1]
        assert rows.metadata == (
            [None] * 5 + [m2] if order == "headers-first" else [None, None, m1, None, None, m2])
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_RECORD, topic="ta")
        await producer.flush()
    assert sorted(heard, key=lambda h: h[0]) == expected


async def test_a_sealed_burst_keeps_no_metadata_for_its_deliveries(
        nursery: trio.Nursery, send_path: str) -> None:
    """Sealed, a burst drops its metadata column: a row sent with metadata holds its
    own in its delivery (``MetadataRowDelivery``), so a plain row's delivery, which
    holds the burst, keeps no other row's metadata alive."""
    import gc
    import weakref

    class Marker:
        pass

    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    async with open_fake_producer(fake) as producer:
        await _open_burst(fake, producer)
        producer._intake._until_yield = 1 << 30  # (one burst: no schedule point)
        markers = [Marker() for _ in range(3)]
        refs = [weakref.ref(m) for m in markers]
        for i, marker in enumerate(markers):
            await producer.send("ta", b"m%d" % i, metadata=marker)
        plain = await producer.send("ta", b"plain")  # kept: it holds the burst
        del markers, marker
        await producer.flush()
        assert (await plain).offset == 4
        gc.collect()
        assert [r() for r in refs] == [None, None, None]


@pytest.mark.parametrize("shape", ["plain", "nulls", "keys", "headers", "pinned", "all"])
def test_packing_a_burst_counts_every_byte_of_the_copy(shape: str) -> None:
    """``pack_columns`` returns the bytes of the packed copy it made, buffer by buffer
    (what the burst reserves once sealed): values, keys, each headers buffer, pinned
    partitions and timestamps."""
    from pipeline.producer._columnar.burst import pack_columns

    n = 37
    values: list[bytes | None] = [b"v" * (i % 5) for i in range(n)]
    if shape in ("nulls", "all"):
        values[3] = values[20] = None
    keys: list[bytes | None] | None = None
    if shape in ("keys", "all"):
        keys = [None if i % 4 == 0 else b"k%d" % i for i in range(n)]
    hkeys = hvalues = hends = None
    if shape in ("headers", "all"):
        hkeys, hvalues, hends = [], [], [0]
        for i in range(n):
            for j in range(i % 3):
                hkeys.append(f"h{j}")
                hvalues.append(None if j == 1 else b"x" * i)
            hends.append(len(hkeys))
    parts = [i % 3 - 1 for i in range(n)] if shape in ("pinned", "all") else None
    stamps = [T + i for i in range(n)]
    columns, copied = pack_columns(values, keys, hkeys, hvalues, hends, stamps, parts)

    def binary(col: Any) -> int:
        return col.offsets.nbytes + col.data.nbytes + (
            0 if col.validity is None else col.validity.nbytes)

    expected = binary(columns.values) + columns.timestamps.nbytes
    if keys is not None:
        expected += binary(columns.keys)
    if hends is not None:
        h = columns.headers
        expected += h.offsets.nbytes + binary(h.keys) + binary(h.values)
        assert h.offsets.nbytes > 0 and binary(h.keys) > 0 and binary(h.values) > 0
    if parts is not None:
        expected += columns.partitions.nbytes
        assert list(columns.partitions) == parts
    assert copied == expected
