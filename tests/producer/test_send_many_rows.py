"""``send_many`` of plain ``ProducerMessage`` objects rides the columnar path
(``_columnar/messages.py``): ``_send.c``'s ``take_messages`` / ``accept_messages`` /
``settle_messages``, their pure-Python twins, and the per-message path it replaces
put the same records on the wire and leave every message, every group and every
error exactly as the per-message path does; a bad message anywhere in a call is
refused with the per-message path's error and nothing of the call is accepted,
while what was accepted before is delivered; order holds across send() and
send_many() calls.
"""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
import trio

from pipeline.producer import ProducerMessage
from pipeline.producer._columnar import messages as _messages
from pipeline.producer._columnar.burst import COLUMNS_MIN
from pipeline.producer._errors import MessageTooLargeError
from pipeline.producer._intake import bulk as _bulk
from pipeline.producer._intake import send_path as _send_path
from pipeline.protocol.records import batch_size_for_record, decode_record_batches
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

T = 1_700_000_000_000  # the scenario conftest's injected CreateTime
PARTITIONS = 3


def _messages_of(seed: int, n: int, topic: str = "ta") -> list[ProducerMessage]:
    """``n`` messages of every plain shape: headers as pairs, tuples, a dict (non-ASCII
    keys, bytes and None values, empty), keys (bytes, str, None), str and null values,
    pinned partitions (7 and 9: past the topic's, they fail), own timestamps, metadata."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        shape = rng.randrange(6)
        headers: Any = None
        if shape == 1:
            headers = [("trace-id", b"%016x" % i), ("source", b"checkout")]
        elif shape == 2:
            headers = {"cl\u00e9": b"v" * rng.randrange(70), "null": None}
        elif shape == 3:
            headers = (("h", None),)
        elif shape == 4:
            headers = []
        key_kind = rng.randrange(3)
        key: Any = None
        if key_kind:
            key = b"k%d" % rng.randrange(13) if key_kind == 1 else f"s\u00e9{i}"
        value: Any = b"value-%d-" % i + bytes(rng.choice([rng.randrange(40), 100, 9000]))
        if rng.random() < 0.05:
            value = None
        elif rng.random() < 0.05:
            value = f"text-\u00e9-{i}"
        partition = rng.choice([0, 1, 2, 2, 7, 9]) if rng.random() < 0.3 else None
        timestamp = T - rng.randrange(10_000) if rng.random() < 0.3 else None
        metadata = {"i": i} if rng.random() < 0.3 else None
        out.append(ProducerMessage(topic, value, key, headers, partition, timestamp, metadata))
    return out


def _seen(msg: ProducerMessage) -> tuple[Any, ...]:
    """Everything a user can read of a message after its call's group settled (and that
    it has the delivery deadline it was accepted with, which the explorer reads)."""
    cause = msg._outcome
    return (msg.topic, msg.value, msg.key, msg.headers, msg.partition, msg.offset,
            msg.timestamp, msg.metadata, msg.done(), msg._state, msg._id != 0,
            None if cause is None else (type(cause).__name__, str(cause)), repr(msg),
            msg._deadline > 0)


def _group_seen(result: Any, msgs: list[ProducerMessage]) -> tuple[Any, ...]:
    index = {id(m): i for i, m in enumerate(msgs)}
    return (result.delivered, result.failed,
            [(index.get(id(e.message)), str(e), type(e).__name__, type(e.cause).__name__)
             for e in result.errors])


async def _run(kind: str, script: list[Any], *, partitions: int = PARTITIONS,
               **options: Any) -> tuple[Any, ...]:
    """One run on a fresh fake cluster: ``kind`` "c" or "python" (the columnar
    send_many), or "messages" (the per-message send_many). ``script``: a list of
    ("many", [messages]) and ("send", value, kwargs) steps, in order. Returns each
    partition's records as read back (and its raw batches), every message's and
    every send's outcome, and every group's result."""
    _send_path.use("c" if kind == "c" else "python")
    _messages._use(_send_path._c if kind == "c" else None)
    min_rows, take = _bulk.COLUMNS_MIN, _bulk.take
    _bulk.COLUMNS_MIN = 1 << 40 if kind == "messages" else min_rows
    as_rows = []

    def spy(*args: Any) -> Any:
        got = take(*args)
        as_rows.append(got is not None)
        return got

    _bulk.take = spy  # type: ignore[assignment]
    try:
        async with trio.open_nursery() as nursery:
            fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
            await nursery.start(fake.run)
            fake.create_topic("ta", partitions)
            groups, deliveries, sent = [], [], []
            async with open_fake_producer(fake, max_message_bytes=1 << 20, **options) as producer:
                await producer._core.cluster.partitions_for("ta")
                for step in script:
                    if step[0] == "many":
                        sent.append(step[1])
                        groups.append(await producer.send_many(step[1]))
                    else:
                        deliveries.append(await producer.send("ta", step[1], **step[2]))
                await producer.flush()
                results = [await g for g in groups]
                failed_at = dict(producer._ledger.failed_by_partition)  # (statistics())
            nursery.cancel_scope.cancel()
    finally:
        _bulk.COLUMNS_MIN, _bulk.take = min_rows, take
    # (the columnar path took every call; the per-message path none)
    assert as_rows == ([] if kind == "messages" else [True] * len(as_rows))
    assert kind == "messages" or len(as_rows) == sum(1 for s in script if s[0] == "many")
    wire: dict[int, list[bytes]] = {}
    for req in fake.requests_of(0):
        for topic in req.request.topic_data:
            for data in topic.partition_data:
                wire.setdefault(data.index, []).append(bytes(data.records))
    records = {p: [(b.base_timestamp + r.timestamp_delta, r.key, r.value, r.headers)
                   for raw in batches for b in decode_record_batches(raw) for r in b.records]
               for p, batches in wire.items()}
    outcomes = []
    for d in deliveries:
        try:
            meta = d.result()
            outcomes.append(("ok", meta.partition, meta.offset, meta.timestamp))
        except Exception as exc:  # (its text is compared)
            outcomes.append(("failed", str(exc)))
    seen = [[_seen(m) for m in msgs] for msgs in sent]
    group_results = [_group_seen(r, msgs) for r, msgs in zip(results, sent, strict=True)]
    return records, wire, seen, outcomes, group_results, failed_at


async def _compare(script_of: Any, *, sticky: bool = False, **options: Any) -> tuple[Any, ...]:
    """Run ``script_of()`` (fresh messages each time) on the three paths and check they
    agree: C and twin byte for byte, the per-message path record for record. ``sticky``:
    null-key messages on the default partitioner, whose sticky partition moves on after
    a batch's worth of *size bounds* per message and of *encoded bytes* per run (either
    is Kafka's rule: KIP-480 leaves the size to the client), so against the per-message
    path only what does not depend on that placement is compared."""
    before = _send_path.SEND_PATH
    try:
        runs = {}
        for kind in (["c"] if _send_path._c is not None else []) + ["python", "messages"]:
            runs[kind] = await _run(kind, script_of(), **options)
    finally:
        _send_path.use(before)
        _messages._use(_send_path._c if before == "c" else None)
    first = runs.get("c", runs["python"])
    assert runs["python"][1] == first[1]  # the same record batches, byte for byte
    for kind, run in runs.items():
        if sticky and kind == "messages":
            _same_but_placement(run, first)
            continue
        assert run[0] == first[0], kind  # the same records, in order per partition
        assert run[2] == first[2], kind  # every message as the user sees it
        assert run[3] == first[3], kind  # every send()'s outcome
        assert run[4] == first[4], kind  # every group's counts and errors
        assert run[5] == first[5], kind  # the failures each partition counts
    return first


def _same_but_placement(run: tuple[Any, ...], first: tuple[Any, ...]) -> None:
    """Every record and outcome but the partition and offset a null-key message got:
    the same records overall, each partition's in call order, each message at the
    offset of its record, the same groups."""
    for records in (run[0], first[0]):
        assert sorted(r for rs in records.values() for r in rs) == sorted(
            r for rs in first[0].values() for r in rs)
    for seen, records in ((run[2], run[0]), (first[2], first[0])):
        flat = [s for call in seen for s in call]
        for s in flat:  # (value at its partition and offset; offsets in call order)
            assert records[s[4]][s[5]][2] == s[1]
        for p in records:
            offsets = [s[5] for s in flat if s[4] == p]
            assert offsets == sorted(offsets)
    strip = [[s[:4] + s[6:12] for s in call] for call in first[2]]
    assert [[s[:4] + s[6:12] for s in call] for call in run[2]] == strip
    assert run[3] == first[3] or all(o[0] == "ok" for o in run[3] + first[3])
    assert run[4] == first[4]


@pytest.mark.parametrize("seed", [1, 2])
async def test_c_twin_and_messages_agree_on_records_and_outcomes(seed: int) -> None:
    """Messages of every plain shape, some pinned past the topic's partitions, between
    send() calls (with and without extras) of the same topic."""
    def script() -> list[Any]:
        return [("send", b"s0", {}),
                ("many", _messages_of(seed, 300)),
                ("send", b"s1", {"key": b"k1", "headers": [("h", b"x")]}),
                ("many", _messages_of(seed + 100, 150)),
                ("send", b"s2", {"partition": 1})]

    records, _, seen, _, groups, _ = await _compare(script)
    flat = [s for call in seen for s in call]
    assert len(seen) == 2
    failed = [s for s in flat if s[9] == 2]
    assert failed and {s[11][0] for s in failed} == {"PartitionOutOfRangeError"}
    assert {s[4] for s in failed} == {7, 9}  # (a pinned message keeps its partition)
    assert all(s[8] and s[10] for s in flat)  # every message settled, marked sent
    assert groups[0][1] == sum(1 for s in seen[0] if s[9] == 2)
    assert groups[0][2] and all(e[3] == "PartitionOutOfRangeError" for e in groups[0][2])
    assert sum(len(r) for r in records.values()) == len(flat) - len(failed) + 3
    assert any(s[3] for s in flat) and any(s[7] for s in flat)


@pytest.mark.parametrize("linger", [0.0, 0.005])
async def test_null_key_calls_on_the_sticky_partitioner_agree(linger: float) -> None:
    """Calls without keys or pins (the default partitioner's sticky choice, one batch's
    worth at a time, split as ranges of rows), some values large enough to fill a
    batch, between send() calls."""
    def script() -> list[Any]:
        out: list[Any] = [("send", b"first", {})]
        for c in range(3):
            out.append(("many", [ProducerMessage("ta", b"n%d-%d-" % (c, i) + bytes(i % 300))
                                 for i in range(400)]))
            out.append(("send", b"between-%d" % c, {}))
        return out

    _, _, seen, _, groups, _ = await _compare(script, sticky=True, linger=linger,
                                              batch_bytes=16384)
    assert [g[:2] for g in groups] == [(400, 0)] * 3
    assert len({s[4] for call in seen for s in call}) > 1  # (the sticky partition moved)


async def test_order_across_send_and_send_many_calls() -> None:
    """One partition: the records are in call order whichever call sent them."""
    def script() -> list[Any]:
        out: list[Any] = []
        for i in range(4):
            out.append(("send", b"before-%d" % i, {}))
            out.append(("many", [ProducerMessage("ta", b"m%d-%d" % (i, j), b"k")
                                 for j in range(COLUMNS_MIN + i)]))
            out.append(("send", b"after-%d" % i, {"headers": [("h", b"v")]}))
        return out

    records, _, seen, _, _, _ = await _compare(script, partitions=1)
    values = [r[2] for r in records[0]]
    expected = []
    for i in range(4):
        expected += [b"before-%d" % i] + [b"m%d-%d" % (i, j) for j in range(COLUMNS_MIN + i)]
        expected.append(b"after-%d" % i)
    assert values == expected
    offsets = [s[5] for call in seen for s in call]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


async def test_a_partitioner_is_asked_per_message() -> None:
    """A custom partitioner is asked per message, as on the per-message path; one that
    raises fails that message only, with its error."""
    class Odd:
        def partition(self, topic: str, key: Any, value: Any, n: int) -> int:
            if value.endswith(b"-13"):
                raise RuntimeError("no partition for 13")
            return int(value[2:]) % n

        def on_new_batch(self, topic: str, n: int, previous: int) -> None:
            pass

    def script() -> list[Any]:
        return [("many", [ProducerMessage("ta", b"v-%d" % i, None if i % 3 else b"k")
                          for i in range(100)])]

    _, _, seen, _, groups, _ = await _compare(script, partitioner=Odd())
    assert groups[0][1] == 1 and "no partition for 13" in groups[0][2][0][1]
    assert {s[4] for s in seen[0] if s[9] == 1} == {0, 1, 2}


def _plain(n: int) -> list[ProducerMessage]:
    return [ProducerMessage("ta", b"m-%d" % i, b"k%d" % (i % 5)) for i in range(n)]


@pytest.mark.parametrize(("bad", "error", "match"), [
    (lambda m: setattr(m, "value", 42), TypeError, r"value must be bytes"),
    (lambda m: setattr(m, "headers", [(b"h", b"x")]), TypeError, r"header key must be str"),
    (lambda m: setattr(m, "partition", -1), ValueError, r"partition must be None or an int"),
    (lambda m: setattr(m, "timestamp", 1.5), ValueError, r"timestamp must be None"),
    (lambda m: setattr(m, "value", b"x" * 5000), MessageTooLargeError, r"max_message_bytes"),
], ids=["value type", "header key", "partition", "timestamp", "too large"])
async def test_a_bad_message_in_the_middle_refuses_the_call_and_loses_nothing(
    nursery: trio.Nursery, send_path: str, bad: Any, error: type[Exception], match: str
) -> None:
    """The per-message path's error, naming what is wrong; nothing of the call is
    accepted (no id, no byte, no message marked sent) and the messages accepted
    before it are delivered; the same list, fixed, is sent whole afterwards."""
    _messages._use(_send_path._c if send_path == "c" else None)
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    async with open_fake_producer(fake, max_message_bytes=4096) as producer:
        earlier = await producer.send_many(_plain(100))
        msgs = _plain(200)
        bad(msgs[120])
        ledger = producer._ledger
        before = (ledger._next_id, ledger.buffered_bytes)
        with pytest.raises(error, match=match):
            await producer.send_many(msgs)
        assert (ledger._next_id, ledger.buffered_bytes) == before
        assert not any(m._id for m in msgs)
        result = await earlier
        assert (result.delivered, result.failed) == (100, 0)
        msgs[120] = ProducerMessage("ta", b"fixed")
        result = await (await producer.send_many(msgs))
        assert (result.delivered, result.failed) == (200, 0)
        assert [m.offset for m in msgs if m.partition == 0] == sorted(
            m.offset for m in msgs if m.partition == 0)


async def test_messages_that_are_not_plain_take_the_per_message_path(
    nursery: trio.Nursery, send_path: str
) -> None:
    """A bytearray value, an int subclass partition, or a second topic: the whole
    call goes per message (and is delivered as before); a plain call goes as rows."""
    _messages._use(_send_path._c if send_path == "c" else None)
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    fake.create_topic("tb", 1)
    assert _messages.take(_plain(70), T, 1 << 20) is not None
    for change in (lambda m: setattr(m, "value", bytearray(b"x")),
                   lambda m: setattr(m, "key", memoryview(b"x")),
                   lambda m: setattr(m, "partition", True),
                   lambda m: setattr(m, "partition", 2**31),
                   lambda m: setattr(m, "timestamp", 2**63),
                   lambda m: setattr(m, "headers", [("h", "str value")]),
                   lambda m: setattr(m, "headers", [["h", b"x"]]),
                   lambda m: setattr(m, "headers", [("h", b"x", b"y")]),
                   lambda m: setattr(m, "topic", "tb")):
        msgs = _plain(70)
        change(msgs[69])
        assert _messages.take(msgs, T, 1 << 20) is None

    class Mine(ProducerMessage):  # (a subclass may shadow a field: not plain)
        __slots__ = ()

    msgs = _plain(70)
    msgs[69] = Mine("ta", b"x")
    assert _messages.take(msgs, T, 1 << 20) is None
    async with open_fake_producer(fake) as producer:
        msgs = _plain(70)
        msgs[3].value = bytearray(b"ba")
        msgs[4].topic = "tb"
        result = await (await producer.send_many(msgs))
        assert (result.delivered, result.failed) == (70, 0)
        assert msgs[3].value == b"ba" and type(msgs[3].value) is bytes


@pytest.mark.parametrize("seed", range(3))
def test_take_sizes_are_the_per_message_bound(send_path: str, seed: int) -> None:
    """Each message's size bound is ``batch_size_for_record``'s (what the per-message
    path reserves and checks), and normalize's changes are written back."""
    _messages._use(_send_path._c if send_path == "c" else None)
    msgs = [m for m in _messages_of(seed, 200) if m.partition != 7]
    rows = _messages.take(msgs, T, 1 << 30)
    assert rows is not None
    for m, size in zip(msgs, rows.sizes, strict=True):
        assert size == batch_size_for_record(m.key, m.value, m.headers)
        assert m.timestamp is not None
        assert m.value is None or type(m.value) is bytes
        assert type(m.headers) is tuple or not m.headers


@pytest.mark.parametrize(("state", "offset", "append_time"),
                         [(1, 40, -1), (1, -1, -1), (1, 7, T + 5), (2, -1, -1)])
def test_settle_writes_what_the_per_message_ledger_writes(
    send_path: str, state: int, offset: int, append_time: int
) -> None:
    """A run's outcome onto its rows' messages, in the run's (wire) order: offsets
    base + k (-1 for all when unknown), the run's partition, LogAppendTime; a
    failure's cause, and the run's partition only when it has one."""
    _messages._use(_send_path._c if send_path == "c" else None)

    class Run:
        count = 3
        rows = memoryview(bytearray(b"".join(i.to_bytes(8, "little") for i in (4, 0, 2)))).cast("q")
        _state = state
        partition = 2 if state == 1 else None
        timestamp = append_time
        _outcome = None if state == 1 else RuntimeError("gone")

    Run.offset = offset  # type: ignore[attr-defined]
    msgs = [ProducerMessage("t", b"v%d" % i, partition=5 if i == 0 else None, timestamp=T)
            for i in range(5)]
    _messages.settle(msgs, Run)
    for k, row in enumerate((4, 0, 2)):
        m = msgs[row]
        assert m._state == state
        if state == 1:
            assert m.offset == (offset + k if offset >= 0 else -1)
            assert m.partition == 2
            assert m.timestamp == (append_time if append_time >= 0 else T)
            assert m._outcome is None
        else:
            assert m._outcome is Run._outcome and m.offset == -1
            assert m.partition == (5 if row == 0 else None)
    for row in (1, 3):
        assert msgs[row]._state == 0 and msgs[row].offset == -1 and msgs[row].partition is None


def test_take_checks_the_size_bound_against_max_bytes_inclusively(send_path: str) -> None:
    """A message of exactly ``max_bytes`` is taken (normalize refuses only above it)."""
    _messages._use(_send_path._c if send_path == "c" else None)
    size = batch_size_for_record(b"k", b"v" * 200, (("h", b"x"),))
    msgs = [ProducerMessage("t", b"v" * 200, b"k", [("h", b"x")]) for _ in range(3)]
    assert _messages.take(msgs, T, size) is not None
    assert _messages.take(msgs, T, size - 1) is None


def test_accept_numbers_the_messages_and_unaccept_frees_them(send_path: str) -> None:
    _messages._use(_send_path._c if send_path == "c" else None)
    msgs = _plain(5)
    _messages.accept(msgs, 41, 12.5)
    assert [(m._id, m._deadline) for m in msgs] == [(41 + i, 12.5) for i in range(5)]
    _messages.unaccept(msgs)
    assert [m._id for m in msgs] == [0] * 5
    held = [ProducerMessage("t", b"v", metadata={"i": i}) for i in range(3)]
    _messages.accept(held, 7, 1.0)
    assert not any(map(gc.is_tracked, held)) or send_path == "python"
    _messages.unaccept(held)  # the caller's alone again: seen by the collector
    assert all(map(gc.is_tracked, held))


def test_take_leaves_the_headers_it_writes_out_of_the_gc(send_path: str) -> None:
    """The tuple of plain pairs take writes (from a mapping, here) holds nothing that can
    lead back: untracked in C, as ProducerMessage() leaves atomic headers."""
    _messages._use(_send_path._c if send_path == "c" else None)
    msgs = [ProducerMessage("t", b"v", headers={"a": b"1", "b": None}) for _ in range(3)]
    assert _messages.take(msgs, T, 1 << 20) is not None
    for m in msgs:
        assert m.headers == (("a", b"1"), ("b", None))
        if send_path == "c":  # (Python's own collector untracks such tuples lazily)
            assert not gc.is_tracked(m.headers)


@pytest.mark.parametrize("rows", [range(5), range(2, 4), range(0), range(6), range(-1, 2),
                                  range(0, 4, 2), [0, 5], [-1]], ids=str)
def test_settle_refuses_rows_outside_the_messages(send_path: str, rows: Any) -> None:
    """Row indices are checked before anything is written (C trusts no index)."""
    _messages._use(_send_path._c if send_path == "c" else None)
    from array import array

    msgs = _plain(5)
    arg = rows if type(rows) is range else memoryview(array("q", rows))
    if type(rows) is range and rows.step == 1 and rows.start >= 0 and rows.stop <= 5:
        _messages._settle(msgs, arg, 1, 10, 0, -1, None)  # (within: fine)
        assert [m.offset for m in msgs] == [10 + k - rows.start if k in rows else -1
                                            for k in range(5)]
        return
    with pytest.raises(ValueError, match="settle_messages"):
        _messages._settle(msgs, arg, 1, 0, 0, -1, None)
    assert all(m._state == 0 for m in msgs)


async def test_a_chunk_lets_go_of_its_messages_with_its_last_row(
    nursery: trio.Nursery, send_path: str
) -> None:
    """The call's chunk holds its messages only until its last row settles (then they
    are the caller's alone, and its runs are dropped: no cycle keeps them)."""
    _messages._use(_send_path._c if send_path == "c" else None)
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    async with open_fake_producer(fake, linger=0.05) as producer:
        msgs = _plain(100)
        group = await producer.send_many(msgs)
        chunks = [e for e in producer._ledger.outstanding.values()
                  if getattr(e, "messages", None) is msgs]
        assert len(chunks) == 1
        result = await group
        assert (result.delivered, result.failed) == (100, 0)
        assert chunks[0].messages is None and chunks[0].runs == []


async def test_messages_leave_the_gc_in_flight_and_a_settled_one_that_can_cycle_is_back(
    nursery: trio.Nursery, send_path: str
) -> None:
    """In flight its chunk holds every message, so C takes them out of the cyclic GC
    (``accept_messages``); settling puts them back, so a message holding something that
    can lead back to it (its metadata, a failure's cause) is seen by the collector."""
    _messages._use(_send_path._c if send_path == "c" else None)
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    async with open_fake_producer(fake, linger=0.05) as producer:
        msgs = [ProducerMessage("ta", b"v%d" % i, metadata={"i": i} if i % 2 else None,
                                partition=7 if i % 5 == 0 else None) for i in range(100)]
        assert all(gc.is_tracked(m) is (m.metadata is not None) for m in msgs) or (
            _message_init_is_python())
        group = await producer.send_many(msgs)
        if send_path == "c":
            assert not any(map(gc.is_tracked, msgs))
        result = await group
        assert (result.delivered, result.failed) == (80, 20)
        for m in msgs:
            if m.metadata is not None or m._outcome is not None:
                assert gc.is_tracked(m), m
            if send_path == "c":
                assert gc.is_tracked(m)  # (settle_messages tracks every one)


def _message_init_is_python() -> bool:
    from pipeline.producer import _message

    return ProducerMessage.__init__ is _message.init_py


async def test_a_chunk_reserves_what_its_messages_hold_and_gives_it_all_back(
    nursery: trio.Nursery, send_path: str
) -> None:
    """In flight a chunk holds its messages: their objects count in buffer_memory beside
    their rows' bytes and the packed copy, and every byte comes back when they settle."""
    _messages._use(_send_path._c if send_path == "c" else None)
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    async with open_fake_producer(fake, linger=0.05) as producer:
        msgs = [ProducerMessage("ta", b"v%d" % i, b"k", [("a", b"1"), ("b", None)])
                for i in range(100)]
        bounds = sum(batch_size_for_record(b"k", m.value, m.headers) for m in msgs)
        group = await producer.send_many(msgs)
        ledger = producer._ledger
        held = (100 * _messages.MESSAGE_BYTES + 200 * _messages.HEADER_BYTES
                + 100 * _messages.HEADERS_BYTES)
        assert ledger.buffered_bytes >= bounds + held
        assert ledger.buffered_bytes <= 2 * bounds + held + 64  # (and the packed copy)
        result = await group
        assert (result.delivered, result.failed) == (100, 0)
        await producer.flush()
        assert ledger.buffered_bytes == 0


async def test_a_call_of_tiny_messages_is_cut_in_chunks_of_an_eighth_of_the_buffer(
    nursery: trio.Nursery,
) -> None:
    """Tiny messages hold far more than their rows' bytes: a call is cut in chunks of
    about an eighth of buffer_memory counting both, not on the rows' bytes alone."""
    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 2)
    async with open_fake_producer(fake, buffer_memory=64_000, max_message_bytes=8_000) as producer:
        counts: list[int] = []
        accept_rows = producer._ledger.accept_rows

        def counting(chunk: Any, count: int) -> None:
            counts.append(count)
            accept_rows(chunk, count)

        producer._ledger.accept_rows = counting  # type: ignore[method-assign]
        msgs = [ProducerMessage("ta", None) for _ in range(1000)]
        result = await (await producer.send_many(msgs))
        assert (result.delivered, result.failed) == (1000, 0)
        assert sum(counts) == 1000 and len(counts) >= 20
        each = batch_size_for_record(None, None, ()) + _messages.MESSAGE_BYTES
        assert 64_000 // 8 - each < max(counts) * each <= 64_000 // 8  # as big as allowed


def test_what_a_span_of_messages_holds_counts_its_messages_and_their_headers() -> None:
    msgs = [ProducerMessage("t", b"v", headers=[("a", b"1")] * (i % 3)) for i in range(9)]
    rows = _messages.take(msgs, T, 1 << 20)
    assert rows is not None
    m, h, t = _messages.MESSAGE_BYTES, _messages.HEADER_BYTES, _messages.HEADERS_BYTES
    assert rows.held(0, 9) == 9 * m + 9 * h + 9 * t  # (9 headers: at most 9 tuples)
    assert rows.held(4, 7) == 3 * m + (1 + 2 + 0) * h + 3 * t  # messages 4, 5, 6
    assert rows.held(5, 6) == m + 2 * h + t  # 2 headers, one message: one tuple
    assert rows.held(5, 5) == 0
    plain = _messages.take([ProducerMessage("t", b"v") for _ in range(3)], T, 1 << 20)
    assert plain is not None and plain.held(0, 3) == 3 * m  # (no header lists at all)


def test_the_send_path_switch_binds_send_many_steps_to_c_or_their_twins() -> None:
    """``send_path.use`` binds ``send_many``'s three message steps at once: to
    ``_send.c``'s for "c", to the Python twins for "python" (so the tests comparing
    the two compare two things)."""
    before = _send_path.SEND_PATH
    try:
        _send_path.use("python")
        assert (_messages._take, _messages._accept, _messages._settle) == (
            _messages._take_py, _messages._accept_py, _messages._settle_py)
        if _send_path._c is None:
            return
        _send_path.use("c")
        c = _send_path._c
        assert (_messages._take, _messages._accept, _messages._settle) == (
            c.take_messages, c.accept_messages, c.settle_messages)
    finally:
        _send_path.use(before)


@pytest.mark.parametrize("n", [3, COLUMNS_MIN + 1])  # (the per-message path, the rows)
async def test_send_many_on_a_closed_producer_is_refused_before_it_takes_anything(
        nursery: trio.Nursery, n: int) -> None:
    """Called once the producer closed, ``send_many`` refuses at its entry, with the
    closed producer's error (not one of waiting for room), and leaves its messages
    as they were: no id, no outcome, free to be sent by another producer."""
    from pipeline.producer import ProducerClosed

    fake = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("ta", 1)
    async with open_fake_producer(fake) as producer:
        await producer.send_and_wait("ta", b"warm")
    msgs = [ProducerMessage("ta", b"m%d" % i) for i in range(n)]
    with pytest.raises(ProducerClosed, match=r"^the producer is closed: no new messages"):
        await producer.send_many(msgs)
    assert not any(m._id or m._sink is not None for m in msgs)


def _both() -> list[Any]:
    """The send path switches to try a step of send_many's with: C (when built) and
    its twin."""
    return [c for c in (_send_path._c,) if c is not None] + [None]


@pytest.mark.parametrize(("args", "error"), [
    ((range(-1, 2), 1), "settle_messages: rows range(-1, 2, 1) is not within 0..4 in steps of 1"),
    ((range(0, 6), 1), "settle_messages: rows range(0, 6, 1) is not within 0..4 in steps of 1"),
    (([0, 5], 1), "settle_messages: row 5 is outside 0..4"),
    (([-1], 2), "settle_messages: row -1 is outside 0..4"),
    ((range(5), 0), "settle_messages: state 0 is not OK or FAILED"),
    ((range(5), 3), "settle_messages: state 3 is not OK or FAILED"),
], ids=str)
def test_settle_refuses_with_the_same_words_in_c_and_its_twin(args: Any, error: str) -> None:
    """A refused settle names the rows (as a range's start, stop and step) or the state,
    word for word in C and in its twin, and writes nothing."""
    from array import array

    rows, state = args
    arg = rows if type(rows) is range else memoryview(array("q", rows))
    try:
        for c in _both():
            _messages._use(c)
            msgs = _plain(5)
            with pytest.raises(ValueError, match=r"^settle_messages: ") as info:
                _messages._settle(msgs, arg, state, 0, 0, -1, RuntimeError("x"))
            assert str(info.value) == error
            assert all(m._state == 0 for m in msgs)
    finally:
        _messages._use(_send_path._c if _send_path.SEND_PATH == "c" else None)


def test_a_failed_run_with_a_partition_gives_it_to_its_messages(send_path: str) -> None:
    """FAILED: the run's partition onto its messages when it has one; OK: a
    LogAppendTime of 0 is a time (only a negative one means CreateTime)."""
    _messages._use(_send_path._c if send_path == "c" else None)
    msgs = [ProducerMessage("t", b"v", partition=5 if i == 0 else None, timestamp=T)
            for i in range(3)]
    _messages._settle(msgs, range(0, 2), 2, -1, 1, -1, RuntimeError("gone"))
    assert [(m._state, m.partition) for m in msgs] == [(2, 1), (2, 1), (0, None)]
    _messages._settle(msgs, range(2, 3), 1, 9, 0, 0, None)
    assert (msgs[2].offset, msgs[2].partition, msgs[2].timestamp) == (9, 0, 0)


def test_unaccept_leaves_the_deadline(send_path: str) -> None:
    """Unaccepting (first id 0) gives every id back and writes no deadline."""
    _messages._use(_send_path._c if send_path == "c" else None)
    msgs = _plain(3)
    _messages.accept(msgs, 7, 9.5)
    _messages._accept(msgs, 0, 1.0)
    assert [(m._id, m._deadline) for m in msgs] == [(0, 9.5)] * 3


def test_take_at_the_edges(send_path: str) -> None:
    """What take accepts at its bounds and what it leaves to the per-message path,
    the same in C and its twin: no messages or an empty topic (None); one message; the
    last partition and the first and last timestamps (taken); a header key not
    encodable as UTF-8 or headers in a container other than a dict, list or tuple
    (None); and the columns only when a message has one."""
    from pipeline.producer._intake.normalize import MAX_PARTITION, MAX_TIMESTAMP

    _messages._use(_send_path._c if send_path == "c" else None)
    take = _messages.take
    assert take([], T, 1 << 20) is None
    assert take([ProducerMessage("", b"v")], T, 1 << 20) is None
    one = take([ProducerMessage("t", b"v")], T, 1 << 20)
    assert one is not None
    assert (one.topic, one.values, one.keys, one.header_ends, one.partitions) == (
        "t", [b"v"], None, None, None)
    edges = [ProducerMessage("t", b"a", partition=MAX_PARTITION, timestamp=0),
             ProducerMessage("t", b"b", timestamp=MAX_TIMESTAMP)]
    rows = take(edges, T, 1 << 20)
    assert rows is not None
    assert (rows.partitions, rows.timestamps, rows.keys) == (
        [MAX_PARTITION, -1], [0, MAX_TIMESTAMP], None)
    assert take([ProducerMessage("t", b"v", headers=[("\ud800", b"x")])], T, 1 << 20) is None
    assert take([ProducerMessage("t", b"v", headers=frozenset({("h", b"x")}))],
                T, 1 << 20) is None


@pytest.mark.parametrize("count", [63, 64, 200])
def test_take_sizes_count_a_header_count_of_two_varint_bytes(send_path: str,
                                                             count: int) -> None:
    """64 headers or more take a two-byte count on the wire: the size bound says so."""
    _messages._use(_send_path._c if send_path == "c" else None)
    headers = [(f"h{i}", b"x") for i in range(count)]
    msgs = [ProducerMessage("t", b"v", b"k", headers) for _ in range(2)]
    rows = _messages.take(msgs, T, 1 << 20)
    assert rows is not None
    assert rows.sizes == [batch_size_for_record(b"k", b"v", tuple(headers))] * 2


@pytest.mark.parametrize(("start", "stop"), [(0, 7), (1, 7), (2, 5), (0, 3), (6, 7)])
def test_a_span_of_messages_packs_as_those_messages_alone(send_path: str, start: int,
                                                          stop: int) -> None:
    """``MessageRows.pack(start, stop)`` (a chunk of a call) packs exactly those
    messages' values, keys, headers, timestamps and partitions, as taking them alone
    would (the call's columns, sliced: a span may keep a column none of its messages
    uses)."""
    _messages._use(_send_path._c if send_path == "c" else None)

    def msgs() -> list[ProducerMessage]:
        return [ProducerMessage("t", b"v%d" % i, None if i % 3 else b"k%d" % i,
                                [(f"h{j}", b"x" * i) for j in range(i % 3)],
                                i % 2 if i % 4 == 1 else None, T + i) for i in range(7)]

    rows = _messages.take(msgs(), T, 1 << 20)
    alone = _messages.take(msgs()[start:stop], T, 1 << 20)
    assert rows is not None
    assert alone is not None
    got, got_bytes = rows.pack(start, stop)
    want, want_bytes = alone.pack(0, stop - start)

    def view(columns: Any) -> list[Any]:  # (a missing column reads as its rows' default)
        h, pinned = columns.headers, columns.partitions
        return [(columns.values[r], None if columns.keys is None else columns.keys[r],
                 [] if h is None else list(h[r]), columns.timestamps[r],
                 -1 if pinned is None else pinned[r])
                for r in range(len(columns.values))]

    assert view(got) == view(want)
    assert len(got.values) == stop - start
    if (start, stop) == (0, 7):
        assert got_bytes == want_bytes
