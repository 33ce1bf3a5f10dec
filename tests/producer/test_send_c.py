"""``producer.send``'s row branch in C (``pipeline/producer/_speedups/_send.c``) against its twin.

``Intake.send`` defines what a call does; the C ``Sender`` may take a call only when
every condition of ``Intake.send``'s row branch holds, and must then leave exactly the
state the Python branch leaves. Each condition has its own case here (if C skipped a
check, it would take the call: the count of calls that reach ``Intake.send`` shows
it), a scripted run compares the state after every call on both paths, and the
awaitable keeps a coroutine's manners (lazy, one use, cancellable, a trio task).
"""

from __future__ import annotations

import collections
import enum
import gc
import itertools
import warnings
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
import trio

from pipeline.producer._columnar.burst import MetadataRowDelivery, RowDelivery
from pipeline.producer._errors import MessageTooLargeError, ProducerClosed
from pipeline.producer._intake import intake
from pipeline.producer._intake import send_path as _send_path
from pipeline.producer._intake.intake import Intake
from pipeline.producer._intake.normalize import SIZE_BASE, normalize
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.delivery import MessageDelivery
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

T = 1_700_000_000_000  # the scenario conftest's injected CreateTime
H2 = [("trace-id", b"0123456789abcdef"), ("source", b"checkout")]
MANY = [(f"h{i}", b"v%d" % i) for i in range(64)]


class SubStr(str):
    pass


class Part(enum.IntEnum):
    ZERO = 0


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=1, seed=5, auto_create_topics=False)
    await nursery.start(cluster.run)
    cluster.create_topic("ta", 1)
    cluster.create_topic("b", 1)
    return cluster


@pytest.fixture
def python_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The calls that reach ``Intake.send`` (the Python path) from now on."""
    calls: list[tuple[Any, ...]] = []
    original = Intake.send

    def counted(self: Intake, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Intake, "send", counted)
    return calls


def step_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.time`` as intake.py reads it: 0.3 ms more on every read (a millisecond
    is shared by three or four rows, then the next one starts)."""
    ticks = itertools.count()
    monkeypatch.setattr(intake, "_time", lambda: 1_700_000_000.0 + next(ticks) * 0.0003)


@pytest.fixture
def stepped_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    step_the_clock(monkeypatch)


async def open_burst(producer: Any) -> None:
    """Open a columnar burst of topic "ta" with one row (the Python path opens it)."""
    producer._intake._columns_next = True
    first = await producer.send("ta", b"first")
    assert type(first) is RowDelivery


async def test_a_producer_takes_the_c_path_when_it_is_built(fake: FakeCluster) -> None:
    async with open_fake_producer(fake) as producer:
        kind = type(producer.send).__name__
    assert kind == ("Sender" if _send_path._c is not None else "method")


@pytest.mark.parametrize("partitioner", ["default", "round_robin"])
async def test_which_send_a_producer_gets(fake: FakeCluster, send_path: str,
                                          partitioner: str) -> None:
    async with open_fake_producer(fake, partitioner=partitioner) as producer:
        kind = type(producer.send).__name__
    assert kind == ("Sender" if send_path == "c" else "method")  # (every partitioner: rows)


async def test_the_common_call_never_reaches_python(
    fake: FakeCluster, send_path: str, python_calls: list[Any]
) -> None:
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        assert len(python_calls) == 1  # no burst open yet: the Python path opens one
        python_calls.clear()
        sent = [await producer.send("ta", b"v%d" % i) for i in range(100)]
        await producer.flush()
    assert len(python_calls) == (0 if send_path == "c" else 100)
    assert [(type(d), d.offset, d.timestamp) for d in sent] == [
        (RowDelivery, i + 1, T) for i in range(100)]


def _set(path: str, value: Any) -> Callable[[Any], None]:
    def apply(producer: Any) -> None:
        obj = producer
        *parents, name = path.split(".")
        for parent in parents:
            obj = getattr(obj, parent)
        setattr(obj, name, value)
    return apply


def _nothing(producer: Any) -> None:
    pass


# (case, what to change first, the call's args, its kwargs, calls that reach
# Intake.send on the C path, the outcome on both paths: a type or an exception)
CASES: list[tuple[str, Callable[[Any], None], tuple[Any, ...], dict[str, Any], int, type]] = [
    ("the common call", _nothing, ("ta", b"v"), {}, 0, RowDelivery),
    # ("ta", not "a": CPython keeps one object per one-letter str)
    ("an equal topic, another str", _nothing, ("".join(["t", "a"]), b"v"), {}, 0, RowDelivery),
    ("a value of 8191 bytes", _nothing, ("ta", b"x" * 8191), {}, 0, RowDelivery),
    ("a value of 8192 bytes", _nothing, ("ta", b"x" * 8192), {}, 0, RowDelivery),
    ("a schedule point due", _set("_intake._until_yield", 1), ("ta", b"v"), {}, 1, object),
    ("the countdown one before", _set("_intake._until_yield", 2), ("ta", b"v"), {}, 0,
     RowDelivery),
    ("closing", _set("_intake._closing", True), ("ta", b"v"), {}, 1, ProducerClosed),
    ("a str value", _nothing, ("ta", "v\u00e9"), {}, 0, RowDelivery),
    ("a str value that is no UTF-8", _nothing, ("ta", "v\ud800"), {}, 1, UnicodeEncodeError),
    ("a bytearray value", _nothing, ("ta", bytearray(b"v")), {}, 1, object),
    ("another topic", _nothing, ("b", b"v"), {}, 1, object),
    ("an empty topic", _nothing, ("", b"v"), {}, 1, TypeError),
    ("a str subclass topic", _nothing, (type("S", (str,), {})("ta"), b"v"), {}, 1, object),
    ("over max_message_bytes", _set("_intake._max_message_bytes", 40), ("ta", b"v" * 40), {}, 1,
     MessageTooLargeError),
    ("a row exactly at max_message_bytes", _set("_intake._max_message_bytes", 7 + SIZE_BASE + 2),
     ("ta", b"v" * 7), {}, 0, RowDelivery),
    ("a row one byte over", _set("_intake._max_message_bytes", 7 + SIZE_BASE + 1),
     ("ta", b"v" * 7), {}, 1, MessageTooLargeError),
    ("a row at max_message_bytes, value of 64", _set("_intake._max_message_bytes",
                                                     64 + SIZE_BASE + 3),
     ("ta", b"v" * 64), {}, 0, RowDelivery),
    ("a value of 64, one byte over", _set("_intake._max_message_bytes", 64 + SIZE_BASE + 2),
     ("ta", b"v" * 64), {}, 1, MessageTooLargeError),
    ("a key", _nothing, ("ta", b"v"), {"key": b"k"}, 0, RowDelivery),
    ("key=None by keyword", _nothing, ("ta", b"v"), {"key": None}, 0, RowDelivery),
    # (a keyword name made at run time is another str object than the call sites' "key")
    ("a key= name built at run time", _nothing, ("ta", b"v"), {"".join(["k", "ey"]): b"k"}, 0,
     RowDelivery),
    ("a key of 63 bytes", _nothing, ("ta", b"v"), {"key": b"k" * 63}, 0, RowDelivery),
    ("a key of 64 bytes", _nothing, ("ta", b"v"), {"key": b"k" * 64}, 0, RowDelivery),
    ("a str key", _nothing, ("ta", b"v"), {"key": "k\u00e9"}, 0, RowDelivery),
    ("a str key that is no UTF-8", _nothing, ("ta", b"v"), {"key": "k\ud800"}, 1,
     UnicodeEncodeError),
    ("a str key of 64 bytes in UTF-8", _nothing, ("ta", b"v"), {"key": "\u00e9" * 32}, 0,
     RowDelivery),
    ("a bytearray key", _nothing, ("ta", b"v"), {"key": bytearray(b"k")}, 1, object),
    ("partition=None by keyword", _nothing, ("ta", b"v"), {"partition": None}, 0, RowDelivery),
    ("a key at max_message_bytes", _set("_intake._max_message_bytes", 7 + 5 + SIZE_BASE + 2),
     ("ta", b"v" * 7), {"key": b"k" * 5}, 0, RowDelivery),
    ("a key one byte over", _set("_intake._max_message_bytes", 7 + 5 + SIZE_BASE + 1),
     ("ta", b"v" * 7), {"key": b"k" * 5}, 1, MessageTooLargeError),
    ("an on_delivery callback", _nothing, ("ta", b"v"), {"on_delivery": lambda m, e: None}, 0,
     RowDelivery),
    ("on_delivery=None", _nothing, ("ta", b"v"), {"on_delivery": None}, 0, RowDelivery),
    ("a non-callable on_delivery", _nothing, ("ta", b"v"), {"on_delivery": 3}, 1, TypeError),
    ("on_delivery and a key", _nothing, ("ta", b"v"), {"on_delivery": None, "key": b"k"}, 0,
     RowDelivery),
    ("a key and on_delivery", _nothing, ("ta", b"v"), {"key": b"k", "on_delivery": print}, 0,
     RowDelivery),
    ("metadata=None by keyword", _nothing, ("ta", b"v"), {"metadata": None}, 0, RowDelivery),
    ("a third positional argument", _nothing, ("ta", b"v", b"k"), {}, 1, TypeError),
    ("one positional argument", _nothing, ("ta",), {}, 1, TypeError),
    ("an unknown keyword", _nothing, ("ta", b"v"), {"color": 1}, 1, TypeError),
    ("a None value (a tombstone)", _nothing, ("ta", None), {}, 0, RowDelivery),
    ("a None value and a key", _nothing, ("ta", None), {"key": b"k"}, 0, RowDelivery),
    # headers: a list or tuple of (str, bytes | None) tuples, or a dict, in C
    ("headers, a list of pairs", _nothing, ("ta", b"v"), {"headers": H2}, 0, RowDelivery),
    ("headers, a tuple of pairs", _nothing, ("ta", b"v"), {"headers": tuple(H2)}, 0,
     RowDelivery),
    ("headers, a dict", _nothing, ("ta", b"v"), {"headers": dict(H2)}, 0, RowDelivery),
    ("headers, a None value", _nothing, ("ta", b"v"), {"headers": [("h", None)]}, 0,
     RowDelivery),
    ("headers, a dict with a None value", _nothing, ("ta", b"v"), {"headers": {"h": None}}, 0,
     RowDelivery),
    ("headers, empty", _nothing, ("ta", b"v"), {"headers": []}, 0, RowDelivery),
    ("headers, an empty dict", _nothing, ("ta", b"v"), {"headers": {}}, 0, RowDelivery),
    ("headers, an empty key and value", _nothing, ("ta", b"v"), {"headers": [("", b"")]}, 0,
     RowDelivery),
    ("16 headers", _nothing, ("ta", b"v"), {"headers": MANY[:16]}, 0, RowDelivery),
    ("17 headers (past the stack)", _nothing, ("ta", b"v"), {"headers": MANY[:17]}, 0,
     RowDelivery),
    ("64 headers (a two-byte count)", _nothing, ("ta", b"v"), {"headers": MANY}, 0,
     RowDelivery),
    ("a non-ASCII header key", _nothing, ("ta", b"v"), {"headers": [("cl\u00e9", b"x")]}, 0,
     RowDelivery),
    ("a header value of 64 bytes", _nothing, ("ta", b"v"), {"headers": [("h", b"x" * 64)]}, 0,
     RowDelivery),
    ("a header key of 64 bytes", _nothing, ("ta", b"v"), {"headers": [("k" * 64, b"x")]}, 0,
     RowDelivery),
    ("headers at max_message_bytes", _set("_intake._max_message_bytes", 1 + SIZE_BASE + 2 + 4),
     ("ta", b"v"), {"headers": [("h", b"x")]}, 0, RowDelivery),
    ("headers one byte over", _set("_intake._max_message_bytes", 1 + SIZE_BASE + 2 + 3),
     ("ta", b"v"), {"headers": [("h", b"x")]}, 1, MessageTooLargeError),
    ("headers, a list of lists", _nothing, ("ta", b"v"), {"headers": [["h", b"x"]]}, 1,
     RowDelivery),
    ("headers, a pair of three", _nothing, ("ta", b"v"), {"headers": [("h", b"x", b"y")]}, 1,
     TypeError),
    ("headers, a bytearray value", _nothing, ("ta", b"v"), {"headers": [("h", bytearray(b"x"))]},
     1, RowDelivery),
    ("headers, a str value", _nothing, ("ta", b"v"), {"headers": [("h", "x\u00e9")]}, 1,
     RowDelivery),
    ("headers, a dict with a bytearray value", _nothing, ("ta", b"v"),
     {"headers": {"h": bytearray(b"x")}}, 1, RowDelivery),
    ("headers, a str subclass key", _nothing, ("ta", b"v"), {"headers": [(SubStr("h"), b"x")]}, 1,
     MessageDelivery),
    ("headers, a bytes key", _nothing, ("ta", b"v"), {"headers": [(b"h", b"x")]}, 1, TypeError),
    ("headers, an int value", _nothing, ("ta", b"v"), {"headers": [("h", 3)]}, 1, TypeError),
    ("headers, a key that is no UTF-8", _nothing, ("ta", b"v"), {"headers": [("\ud800", b"x")]},
     1, UnicodeEncodeError),
    ("headers, a str", _nothing, ("ta", b"v"), {"headers": "h=x"}, 1, TypeError),
    ("headers, a mapping that is no dict", _nothing, ("ta", b"v"),
     {"headers": MappingProxyType({"h": b"x"})}, 1, RowDelivery),
    ("headers, a deque", _nothing, ("ta", b"v"), {"headers": collections.deque(H2)}, 1,
     RowDelivery),
    # partition: an int in 0..2**31-1
    ("partition 0", _nothing, ("ta", b"v"), {"partition": 0}, 0, RowDelivery),
    ("partition 2**31-1", _nothing, ("ta", b"v"), {"partition": 2**31 - 1}, 0, RowDelivery),
    ("partition 2**31", _nothing, ("ta", b"v"), {"partition": 2**31}, 1, MessageDelivery),
    ("partition -1", _nothing, ("ta", b"v"), {"partition": -1}, 1, ValueError),
    ("partition True", _nothing, ("ta", b"v"), {"partition": True}, 1, ValueError),
    ("partition, an int subclass", _nothing, ("ta", b"v"), {"partition": Part.ZERO}, 1,
     MessageDelivery),
    ("partition, a str", _nothing, ("ta", b"v"), {"partition": "0"}, 1, ValueError),
    # timestamp: an int in 0..2**63-1
    ("timestamp 0", _nothing, ("ta", b"v"), {"timestamp": 0}, 0, RowDelivery),
    ("a timestamp", _nothing, ("ta", b"v"), {"timestamp": T - 5}, 0, RowDelivery),
    ("timestamp 2**63-1", _nothing, ("ta", b"v"), {"timestamp": 2**63 - 1}, 0, RowDelivery),
    ("timestamp 2**63", _nothing, ("ta", b"v"), {"timestamp": 2**63}, 1, ValueError),
    ("timestamp -1", _nothing, ("ta", b"v"), {"timestamp": -1}, 1, ValueError),
    ("timestamp True", _nothing, ("ta", b"v"), {"timestamp": True}, 1, ValueError),
    ("timestamp, a float", _nothing, ("ta", b"v"), {"timestamp": 1.5}, 1, ValueError),
    # metadata: anything; the row's delivery holds it
    ("metadata", _nothing, ("ta", b"v"), {"metadata": {"id": 7}}, 0, MetadataRowDelivery),
    ("everything at once", _nothing, ("ta", b"v"),
     {"key": b"k", "headers": H2, "partition": 0, "timestamp": T + 9, "metadata": "m",
      "on_delivery": print}, 0, MetadataRowDelivery),
    ("everything and a bad partition", _nothing, ("ta", b"v"),
     {"key": b"k", "headers": H2, "partition": -3, "timestamp": T + 9, "metadata": "m"}, 1,
     ValueError),
]


@pytest.mark.parametrize(("case", "change", "args", "kwargs", "c_calls", "outcome"), CASES,
                         ids=[c[0] for c in CASES])
async def test_each_condition_of_the_row_branch(
    fake: FakeCluster, send_path: str, python_calls: list[Any], case: str,
    change: Callable[[Any], None], args: tuple[Any, ...], kwargs: dict[str, Any], c_calls: int,
    outcome: type,
) -> None:
    async with open_fake_producer(fake, max_message_bytes=100_000) as producer:
        await open_burst(producer)
        python_calls.clear()
        change(producer)
        try:
            result: Any = await producer.send(*args, **kwargs)
        except Exception as exc:  # (the outcome is compared below)
            result = exc
        finally:
            producer._intake._closing = False
            producer._intake._max_message_bytes = 100_000
        await producer.flush()
    assert len(python_calls) == (c_calls if send_path == "c" else 1)
    assert isinstance(result, outcome), result
    if isinstance(result, (RowDelivery, MessageDelivery)):
        # its fields, whichever path took it: the message path's normalized ones
        expected = ProducerMessage(args[0], args[1], kwargs.get("key"), kwargs.get("headers"),
                                   kwargs.get("partition"), kwargs.get("timestamp", T),
                                   kwargs.get("metadata"))
        normalize(expected, lambda: T, 1 << 30)
        assert (result.key, result.value, result.headers, result.timestamp, result.metadata) == (
            expected.key, expected.value, tuple(expected.headers), expected.timestamp,
            expected.metadata)
        if expected.partition is not None:  # (None: failed before routing)
            assert result.partition in (expected.partition, None)


async def test_a_full_buffer_goes_to_python(
    fake: FakeCluster, send_path: str, python_calls: list[Any], autojump_clock: Any
) -> None:
    """Ledger.admit_row's rule: no room (and something buffered) sends the call to
    the Python path, which waits for space (here: the burst's first row settles)
    and then sends the row again (a second Python call): a row still, of a new
    columnar burst, not a per-message delivery."""
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        python_calls.clear()
        ledger = producer._ledger
        buffered, ledger.buffer_memory = ledger.buffer_memory, ledger.buffered_bytes
        try:
            delivery = await producer.send("ta", b"v")
        finally:
            ledger.buffer_memory = buffered
        assert type(delivery) is RowDelivery
        assert (await delivery).offset == 1
    assert len(python_calls) == 2


@pytest.mark.parametrize(("room", "c_calls"), [(0, 0), (-1, 1)], ids=["just fits", "one over"])
async def test_the_buffer_bound_is_admit_rows(
    fake: FakeCluster, send_path: str, python_calls: list[Any], autojump_clock: Any, room: int,
    c_calls: int,
) -> None:
    """A row that fills the buffer exactly is admitted in C; one byte more goes to
    the Python path (which waits for the burst's first row to free its bytes)."""
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        python_calls.clear()
        ledger = producer._ledger
        size = 1 + SIZE_BASE + 2  # a 1-byte value, no key
        buffered, ledger.buffer_memory = ledger.buffer_memory, ledger.buffered_bytes + size + room
        try:
            delivery = await producer.send("ta", b"v")
        finally:
            ledger.buffer_memory = buffered
        assert (await delivery).offset == 1
    # (one over: the Python path waits, then sends the row again: a second call)
    assert len(python_calls) == (2 * c_calls if send_path == "c" else 1 + (room < 0))


async def test_an_injected_clock_and_a_patched_time_stamp_rows_in_c(
    fake: FakeCluster, send_path: str, python_calls: list[Any], stepped_clock: None
) -> None:
    """Rows of the C branch get the injected clock's CreateTime, or the patched
    ``time.time``'s millisecond (shared within a millisecond)."""
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        python_calls.clear()
        injected = [await producer.send("ta", b"v") for _ in range(3)]
        first = len(python_calls)
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        await open_burst(producer)  # its row reads the clock once: 1_700_000_000.0
        python_calls.clear()
        walled = [await producer.send("ta", b"v") for _ in range(8)]
    assert (first, len(python_calls)) == ((0, 0) if send_path == "c" else (3, 8))
    assert [d.timestamp for d in injected] == [T] * 3
    # reads 1..8: +0.3 ms each
    assert [d.timestamp - T for d in walled] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert walled[0].timestamp is walled[1].timestamp  # one int per millisecond


def _snapshot(producer: Any, delivery: Any) -> tuple[Any, ...]:
    rows, ledger, it = producer._intake._rows, producer._ledger, producer._intake
    columns = None if rows is None else (
        len(rows.values), rows.size, rows.timestamps[-1], rows.on_delivery is None,
        rows.values[-1])
    return (type(delivery).__name__, getattr(delivery, "_row", None), it._until_yield,
            it._ms, it._ms_ends, ledger._next_id, ledger.buffered_bytes, columns)


async def _scripted_run(fake: FakeCluster, kind: str) -> tuple[list[Any], list[Any], list[Any]]:
    """Phases without a schedule point inside (the countdown is reset to 512 at each
    start, and no call waits), so each call's state is fixed by the calls before it."""
    _send_path.use(kind)
    heard: list[Any] = []

    def callback(meta: Any, error: Any) -> None:
        heard.append((meta.offset, error))

    states: list[Any] = []
    sent: list[Any] = []
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        it = producer._intake

        async def send(*args: Any, **kwargs: Any) -> None:
            delivery = await producer.send(*args, **kwargs)
            sent.append(delivery)
            states.append(_snapshot(producer, delivery))

        it._until_yield = 512
        await open_burst(producer)
        for i in range(150):
            await send("ta", b"p1-%d" % i)
        await send("ta", b"cb", on_delivery=callback)
        for i in range(40):
            await send("ta", b"after-cb-%d" % i)
            if i % 10 == 9:
                await send("ta", b"cb-%d" % i, on_delivery=callback)
        await send("ta", b"y" * 9000)
        await send("".join(["t", "a"]), b"equal-topic")
        await send("b", b"other-topic")  # a message: the columnar burst ends
        for i in range(20):
            await send("ta", b"p1-tail-%d" % i)  # messages of the list burst
        await producer.flush()
        it._until_yield = 512
        await open_burst(producer)
        for i in range(300):
            await send("ta", bytes(i % 200))
        await producer.flush()
    results = [(type(d).__name__, d.topic, d.partition, d.offset, d.timestamp, d.value)
               for d in sent]
    return states, results, heard


async def test_both_paths_leave_the_same_state_after_every_call(
    fake: FakeCluster, stepped_clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _send_path._c is None:
        pytest.skip("pipeline.producer._speedups._send is not built (or PIPELINE_PURE_PYTHON is set)")
    before = _send_path.SEND_PATH
    try:
        c_states, c_results, c_heard = await _scripted_run(fake, "c")
        step_the_clock(monkeypatch)  # the same clock again
        p_states, p_results, p_heard = await _scripted_run(fake, "python")
    finally:
        _send_path.use(before)
    assert len(c_states) == len(p_states) == 518
    for i, (c, p) in enumerate(zip(c_states, p_states, strict=True)):
        assert c == p, f"call {i}"
    # The second run's offsets follow the first's in the same logs: compare the rest.
    assert [r[:3] + r[4:] for r in c_results] == [r[:3] + r[4:] for r in p_results]
    assert {r[0] for r in c_results} == {"RowDelivery", "MessageDelivery"}
    assert [e for _, e in c_heard] == [e for _, e in p_heard] == [None] * 5


# -- a coroutine's manners -----------------------------------------------------------


async def test_a_call_never_awaited_sends_nothing_and_says_so(
    fake: FakeCluster, send_path: str
) -> None:
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        accepted = producer.statistics().accepted
        def forget() -> None:
            producer.send("ta", b"forgotten")  # (dropped at once)
            gc.collect()

        with pytest.warns(RuntimeWarning, match="never awaited"):
            forget()
        assert producer.statistics().accepted == accepted
        assert (await (await producer.send("ta", b"next"))).offset == 1


async def test_a_call_is_awaited_once(fake: FakeCluster, send_path: str) -> None:
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        call = producer.send("ta", b"v")
        await call
        with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
            await call
        await producer.flush()
    assert producer.statistics().accepted == 2


async def test_a_waiting_call_is_cancelled_without_a_trace(
    fake: FakeCluster, send_path: str, autojump_clock: Any
) -> None:
    """A two-argument call that has to wait (no room) is the Python path's coroutine
    behind the C awaitable: the cancellation reaches it and nothing is accepted."""
    async with open_fake_producer(fake, buffer_memory=200, max_message_bytes=200, max_block=60.0) as producer:
        await open_burst(producer)
        producer._ledger.buffered_bytes += 1000  # as if full of unsettled messages
        accepted = producer.statistics().accepted
        start = trio.current_time()
        with trio.move_on_after(5) as scope:
            await producer.send("ta", b"v")
        producer._ledger.buffered_bytes -= 1000
        assert scope.cancelled_caught
        assert trio.current_time() - start == 5
        assert producer.statistics().accepted == accepted


async def test_throw_and_close_reach_a_waiting_call(fake: FakeCluster, send_path: str) -> None:
    """Stepped by hand: the call parks (no room), then throw() raises inside it and
    close() ends it; before its first step, throw() raises at once and close() ends
    it silently. Either way nothing is accepted, and it cannot be awaited again."""
    async with open_fake_producer(fake, buffer_memory=200, max_message_bytes=200, max_block=60.0) as producer:
        await open_burst(producer)
        ledger = producer._ledger
        accepted = producer.statistics().accepted
        ledger.buffered_bytes += 1000
        try:
            parked = producer.send("ta", b"v")
            assert parked.send(None) is not None  # trio's trap, yielded to us
            with pytest.raises(KeyError, match="thrown"):
                parked.throw(KeyError("thrown"))
            other = producer.send("ta", b"w")
            other.send(None)
            other.close()
            fresh = producer.send("ta", b"x")
            with pytest.raises(KeyError, match="unstarted"):
                fresh.throw(KeyError("unstarted"))
            unstarted = producer.send("ta", b"y")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                unstarted.close()
                del unstarted
                gc.collect()
        finally:
            ledger.buffered_bytes -= 1000
        # (where the row branch would take the call, so C must refuse it itself)
        with pytest.raises(TypeError, match="non-None value to a just-started"):
            producer.send("ta", b"z").send(1)
        for used in (parked, other, fresh):
            with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
                await used
        assert producer.statistics().accepted == accepted


async def test_send_can_be_a_trio_task(fake: FakeCluster, send_path: str) -> None:
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer.send, "ta", b"from a task")
        await producer.flush()
    assert producer.statistics().accepted == 2


def test_the_path_switch_names_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="send path must be 'c' or 'python', not 'rust'"):
        _send_path.use("rust")
    monkeypatch.setattr(_send_path, "_c", None)
    with pytest.raises(RuntimeError, match="_send is not built or is disabled"):
        _send_path.use("c")
    assert _send_path.SEND_PATH in ("c", "python")  # unchanged by the refusals


async def test_a_kept_metadata_never_changes(fake: FakeCluster, await_path: str) -> None:
    """The C await refills the last RecordMetadata it made when nobody holds it any
    more (``_delivery.c``, new_metadata): one that is held (kept in a list, or by a
    callback) keeps its own row's fields, whatever is awaited after it."""
    kept: list[Any] = []
    async with open_fake_producer(fake) as producer:
        await open_burst(producer)
        sent = [await producer.send("ta", b"v%d" % i, on_delivery=(
            (lambda m, e: kept.append(m)) if i % 7 == 0 else None)) for i in range(60)]
        await producer.flush()
        held = []
        for i, d in enumerate(sent):
            meta = await d
            assert meta.offset == i + 1  # what the await gives, read at once
            if i % 3 == 0:
                held.append(meta)
            del meta
    assert [m.offset for m in held] == [i + 1 for i in range(0, 60, 3)]
    assert [m.offset for m in kept] == [i + 1 for i in range(0, 60, 7)]
    assert {(m.topic, m.partition, m.offset_known) for m in held + kept} == {("ta", 0, True)}


def test_a_bursts_columns_are_not_walked_by_the_gc(send_path: str) -> None:
    """A burst's values (bytes) and timestamps (ints) are lists the cyclic GC does
    not track when ``_send`` is loaded (kept bursts made young collections walk them:
    30 ms of 1M kept deliveries' GC, against 14 untracked)."""
    from pipeline.producer._columnar.burst import RowBurst, new_column

    rows = RowBurst.__new__(RowBurst)
    rows.values, rows.timestamps = new_column(), new_column()
    tracked = _send_path._c is None
    assert gc.is_tracked(rows.values) is tracked and gc.is_tracked(rows.timestamps) is tracked
    rows.values.append(b"v")
    rows.timestamps.append(T)
    assert gc.is_tracked(rows.values) is tracked  # (a list is never tracked again)


@pytest.mark.parametrize("first_key_at", [0, 5, 8])
async def test_a_bursts_key_column_is_not_walked_by_the_gc(
    fake: FakeCluster, send_path: str, first_key_at: int
) -> None:
    """The keys a burst collects (bytes and None) go into a list the cyclic GC does
    not track when ``_send`` is loaded, whether the burst's first row is keyed or a
    later one (``RowBurst.first_key``, or the C branch's list); each row keeps its
    own key, None before the first keyed one. A burst of keyless rows has none."""
    async with open_fake_producer(fake, max_message_bytes=100_000) as producer:
        await open_burst(producer)
        rows = producer._intake._rows
        before = len(rows.values)
        sent = [await producer.send("ta", b"v", key=None if i < first_key_at else b"k%d" % i)
                for i in range(8)]
        if first_key_at == 8:  # no row had a key: no key column (split as keyless rows)
            assert rows.keys is None
            await producer.flush()
            return
        assert rows.keys is not None
        assert gc.is_tracked(rows.keys) is (_send_path._c is None)
        assert rows.keys == [None] * before + [
            None if i < first_key_at else b"k%d" % i for i in range(8)]
        assert [d.key for d in sent] == [None if i < first_key_at else b"k%d" % i
                                         for i in range(8)]
        await producer.flush()
