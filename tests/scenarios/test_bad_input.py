"""Bad input (issue 4, acceptance 3): each case gets a specific error, nothing accepted is lost.

Against the FakeCluster on autojump_clock, so every "within a bounded time" is asserted
exactly in virtual time. Two families of errors (pipeline/producer/_errors.py):

* raised by ``send`` / ``send_nowait`` / ``send_many`` / ``open_producer``: the message
  was not accepted (bad type, too large, buffer full, closed, bad config);
* the outcome of an accepted message: a ``ProducerError`` whose ``cause`` is specific
  (unknown topic, partition out of range).

In every test the messages accepted around the bad one are still delivered, in order.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
import trio.lowlevel

from pipeline import (
    BrokerConnectionError,
    BufferFullError,
    ConfigError,
    MessageTooLargeError,
    ProducerClosed,
    ProducerConfig,
    ProducerError,
    ProducerMessage,
    RecordMetadata,
    UnknownTopicError,
    open_producer,
)
from pipeline.producer._outcomes.delivery import Delivery
from pipeline.protocol.api import ApiKey
from pipeline.protocol.records import batch_size_for_record
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

from .conftest import open_fake_producer, producer_options, values_in_log


async def outcome(delivery: Delivery) -> RecordMetadata | ProducerError:
    try:
        return await delivery
    except ProducerError as exc:
        return exc


def single(exc: BaseException) -> BaseException:
    """The one real exception inside (possibly nested) trio exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        assert len(exc.exceptions) == 1, exc
        exc = exc.exceptions[0]
    return exc


def stall_produce(fake: FakeCluster) -> trio.Event:
    """Hold every Produce request until the returned event is set (then handle it
    normally): accepted messages stay in the buffer meanwhile."""
    gate = trio.Event()

    async def hold(ctx: ControlContext) -> None:
        await gate.wait()
        return None

    fake.control(ApiKey.PRODUCE, hold, sticky=True)
    return gate


# Options for tests that stall the broker: no request or delivery timeout may fire.
PATIENT = dict(request_timeout=100.0, delivery_timeout=300.0, close_timeout=30.0)


# --------------------------------------------------------------------------- oversized


async def test_oversized_message_rejected_by_every_entry_point(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    limit = 1000
    async with open_fake_producer(fake, max_message_bytes=limit) as producer:
        before = [await producer.send("t", b"ok-%d" % i) for i in range(3)]
        big = b"x" * 2000

        with pytest.raises(MessageTooLargeError) as info:
            await producer.send("t", big)
        text = str(info.value)
        size = int(re.search(r"message of (\d+) bytes", text).group(1))  # type: ignore[union-attr]
        assert size >= batch_size_for_record(None, big) > limit
        assert f"max_message_bytes={limit}" in text
        assert isinstance(info.value, ValueError)

        with pytest.raises(MessageTooLargeError, match=f"max_message_bytes={limit}"):
            producer.send_nowait("t", big, key=b"k")
        # Headers count toward the size.
        with pytest.raises(MessageTooLargeError, match=r"message of \d+ bytes"):
            await producer.send("t", b"small", headers=[("h", b"y" * 1500)])
        # A big key too.
        with pytest.raises(MessageTooLargeError):
            await producer.send("t", None, key=b"k" * 1500)

        middle = producer.send_nowait("t", b"ok-3")
        # send_many validates everything first: nothing of the call is accepted.
        accepted = producer.statistics().accepted
        with pytest.raises(MessageTooLargeError):
            await producer.send_many(
                [
                    ProducerMessage("t", b"many-0"),
                    ProducerMessage("t", big),
                    ProducerMessage("t", b"many-2"),
                ]
            )
        assert producer.statistics().accepted == accepted
        after = await producer.send("t", b"ok-4")
        # Just under the limit is fine.
        fits = b"f" * (limit - batch_size_for_record(None, b"") - 8)
        at_limit = await producer.send("t", fits)
        metas = [await d for d in [*before, middle, after, at_limit]]
    assert [m.offset for m in metas] == list(range(6))
    assert values_in_log(fake, "t", 0) == [b"ok-0", b"ok-1", b"ok-2", b"ok-3", b"ok-4", fits]
    assert producer.statistics().failed == 0


async def test_oversized_on_input_channel_reported_on_errors(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake, max_message_bytes=1000, return_successes=True) as producer:
        good = [ProducerMessage("t", b"g%d" % i) for i in range(2)]
        big = ProducerMessage("t", b"x" * 5000)
        await producer.input.send(good[0])
        await producer.input.send(big)
        await producer.input.send(good[1])
        error = await producer.errors.receive()
        ok = [await producer.successes.receive() for _ in good]
        # (Leaving the block at once here trips the reporter race covered by
        # test_leave_block_right_after_last_outcome; this test is about the size check.)
        await trio.sleep(0.1)
    assert isinstance(error, ProducerError)
    assert error.message is big
    assert isinstance(error.cause, MessageTooLargeError)
    assert "max_message_bytes=1000" in str(error.cause)
    assert ok == good
    assert [m.offset for m in ok] == [0, 1]
    assert values_in_log(fake, "t", 0) == [b"g0", b"g1"]


async def test_leave_block_right_after_last_outcome(fake: FakeCluster, autojump_clock: Any) -> None:
    """Channel mode: receiving the last outcome and leaving the block at once must close
    cleanly, with each outcome handed over exactly once and the buffer fully released.

    (The race depends on trio's randomized scheduling order, so it is tried 12 times.)"""
    fake.create_topic("t", 1)
    for attempt in range(12):
        async with open_fake_producer(fake, return_successes=True) as producer:
            msgs = [ProducerMessage("t", b"c%d-%d" % (attempt, i)) for i in range(3)]
            for m in msgs:
                await producer.input.send(m)
            got = [await producer.successes.receive() for _ in msgs]
        assert got == msgs
        extra = [m async for m in producer.successes]  # closed at shutdown
        assert extra == [], "an outcome was handed over twice"
        stats = producer.statistics()
        assert (stats.succeeded, stats.buffered_bytes, stats.double_settles) == (3, 0, 0)


# --------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize("value", [{"a": 1}, 42, [b"a", b"b"], 1.5, object()])
async def test_wrong_value_type(fake: FakeCluster, autojump_clock: Any, value: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        first = await producer.send("t", b"first")
        accepted = producer.statistics().accepted
        type_name = type(value).__name__
        for call in (
            lambda: producer.send("t", value),
            lambda: producer.send_and_wait("t", value),
            lambda: producer.send_many(
                [ProducerMessage("t", b"fine"), ProducerMessage("t", value)]
            ),
        ):
            with pytest.raises(TypeError) as info:
                await call()
            text = str(info.value)
            assert text.startswith("value must be bytes"), text
            assert f"not {type_name}" in text
            assert "serialize it first" in text
        with pytest.raises(TypeError, match=f"value must be bytes.*not {type_name}"):
            producer.send_nowait("t", value)
        assert producer.statistics().accepted == accepted
        last = await producer.send("t", b"last")
        assert [(await d).offset for d in (first, last)] == [0, 1]
    assert values_in_log(fake, "t", 0) == [b"first", b"last"]


async def test_accepted_value_types(fake: FakeCluster, autojump_clock: Any) -> None:
    """The documented alternatives to bytes really are sent as bytes."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        for value in (b"b", bytearray(b"ba"), memoryview(b"mv"), "strü", None, b""):
            await producer.send("t", value, key="kü", headers=[("h", bytearray(b"hv"))])
    log = fake.log("t", 0)
    assert [e.record.value for e in log] == [b"b", b"ba", b"mv", "strü".encode(), None, b""]
    assert {e.record.key for e in log} == {"kü".encode()}
    assert {tuple(e.record.headers) for e in log} == {(("h", b"hv"),)}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(key=123), r"^key must be bytes.*not int"),
        (dict(key={"k": 1}), r"^key must be bytes.*not dict"),
        (dict(headers=[(1, b"v")]), r"header key must be str, not int"),
        (dict(headers=[(b"k", b"v")]), r"header key must be str, not bytes"),
        (dict(headers=[("k", 5)]), r"header 'k' value must be bytes.*not int"),
        (dict(headers=[("k", {"x": 1})]), r"header 'k' value must be bytes.*not dict"),
        (
            dict(headers=[("k", b"v", b"extra")]),
            r"headers must be a sequence of \(str, bytes \| None\) pairs",
        ),
        (dict(headers=[b"kv"]), r"headers must be a sequence of \(str, bytes \| None\) pairs"),
        (dict(headers=5), r"headers must be a sequence"),
    ],
)
async def test_wrong_key_or_header_types(
    fake: FakeCluster, autojump_clock: Any, kwargs: dict[str, Any], match: str
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        first = await producer.send("t", b"first")
        with pytest.raises(TypeError, match=match):
            await producer.send("t", b"v", **kwargs)
        with pytest.raises(TypeError, match=match):
            producer.send_nowait("t", b"v", **kwargs)
        with pytest.raises(TypeError, match=match):
            await producer.send_many([ProducerMessage("t", b"v", **kwargs)])
        assert producer.statistics().accepted == 1
        await first
    assert values_in_log(fake, "t", 0) == [b"first"]


async def test_dict_headers_are_not_silently_mangled(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """headers={"ab": b"x"} must either be sent as [("ab", b"x")] or refused with a
    TypeError; iterating the dict's keys and unpacking the string "ab" into the pair
    ("a", "b") sends a header the caller never wrote."""
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        try:
            await producer.send("t", b"v", headers={"ab": b"x"})  # type: ignore[arg-type]
        except TypeError:
            return
    assert [tuple(e.record.headers) for e in fake.log("t", 0)] == [(("ab", b"x"),)]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(topic=b"t"), TypeError, r"topic must be a non-empty str"),
        (dict(topic=""), TypeError, r"topic must be a non-empty str"),
        (dict(partition=-1), ValueError, r"partition must be None or an int >= 0, not -1"),
        (dict(partition="0"), ValueError, r"partition must be None or an int >= 0"),
        (dict(timestamp=-5), ValueError, r"timestamp must be None or milliseconds"),
        (dict(timestamp=1.5), ValueError, r"timestamp must be None or milliseconds"),
    ],
)
async def test_wrong_topic_partition_timestamp(
    fake: FakeCluster, autojump_clock: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        args = {"topic": "t", **kwargs}
        topic = args.pop("topic")
        with pytest.raises(error, match=match):
            await producer.send(topic, b"v", **args)
        assert producer.statistics().accepted == 0
        await producer.send_and_wait("t", b"fine")
    assert values_in_log(fake, "t", 0) == [b"fine"]


# --------------------------------------------------------------------------- unknown topic / partition


async def test_unknown_topic_fails_its_messages_only(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("events", 2)
    async with open_fake_producer(fake, allow_auto_topic_creation=False) as producer:
        t0 = trio.current_time()
        deliveries = []
        for i in range(10):  # interleaved: the same flight through the dispatcher
            deliveries.append(await producer.send("events", b"e%d" % i, partition=i % 2))
            deliveries.append(await producer.send("no-such-topic", b"m%d" % i))
        results = [await outcome(d) for d in deliveries]
        elapsed = trio.current_time() - t0
        # Later messages are looked up again: once the topic exists they go through.
        fake.create_topic("no-such-topic", 1)
        late = await producer.send_and_wait("no-such-topic", b"late")
    good, bad = results[0::2], results[1::2]
    assert all(isinstance(r, RecordMetadata) for r in good)
    assert [(r.partition, r.offset) for r in good] == [(i % 2, i // 2) for i in range(10)]
    for i, r in enumerate(bad):
        assert isinstance(r, ProducerError)
        assert r.message.value == b"m%d" % i
        assert isinstance(r.cause, UnknownTopicError)
        assert r.cause.topic == "no-such-topic"
        assert "'no-such-topic' does not exist" in str(r.cause)
        assert "allow_auto_topic_creation" in str(r.cause)
        assert "no-such-topic" in str(r)
    # Fails fast on the broker's answer, not after a timeout.
    assert elapsed < 1.0
    assert late.offset == 0
    assert values_in_log(fake, "events", 0) == [b"e%d" % i for i in range(0, 10, 2)]
    assert values_in_log(fake, "events", 1) == [b"e%d" % i for i in range(1, 10, 2)]
    stats = producer.statistics()
    assert (stats.succeeded, stats.failed, stats.double_settles) == (11, 10, 0)


async def test_explicit_partition_out_of_range(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 3)
    async with open_fake_producer(fake) as producer:
        deliveries = [
            await producer.send("t", b"a", partition=0),
            await producer.send("t", b"bad3", partition=3),
            await producer.send("t", b"b", partition=2),
            await producer.send("t", b"bad99", partition=99),
            await producer.send("t", b"c", partition=0),
        ]
        results = [await outcome(d) for d in deliveries]
    ok = [results[i] for i in (0, 2, 4)]
    assert [(m.partition, m.offset) for m in ok] == [(0, 0), (2, 0), (0, 1)]  # type: ignore[union-attr]
    for r, p in ((results[1], 3), (results[3], 99)):
        assert isinstance(r, ProducerError)
        assert isinstance(r.cause, ValueError)  # PartitionOutOfRangeError
        text = str(r.cause)
        assert f"partition {p} does not exist" in text
        assert "3 partitions (0..2)" in text
        assert f"t[{p}]" in str(r)
    assert values_in_log(fake, "t", 0) == [b"a", b"c"]
    assert values_in_log(fake, "t", 1) == []
    assert values_in_log(fake, "t", 2) == [b"b"]


# --------------------------------------------------------------------------- invalid config

BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    (dict(acks=2), r"invalid acks=2: use 0, 1 or \"all\""),
    (dict(acks="1"), r"invalid acks='1'"),
    (
        dict(compression="brotli"),
        r"invalid compression='brotli': use one of \['gzip', 'lz4', 'none', 'snappy', 'zstd'\]",
    ),
    (
        dict(compression="gzip", compression_level=10),
        r"invalid compression_level=10: gzip levels are 1..9",
    ),
    (
        dict(compression="gzip", compression_level=0),
        r"invalid compression_level=0: gzip levels are 1..9",
    ),
    (
        dict(compression="zstd", compression_level=23),
        r"invalid compression_level=23: zstd levels are",
    ),
    (
        dict(compression="lz4", compression_level=18),
        r"invalid compression_level=18: lz4 levels are 1..17",
    ),
    (dict(compression="snappy", compression_level=1), r"compression='snappy' takes no level"),
    (dict(compression="none", compression_level=1), r"compression='none' takes no level"),
    (dict(linger=-1), r"invalid linger=-1: must be a number of seconds >= 0"),
    (dict(batch_bytes=0), r"invalid batch_bytes=0: must be a positive integer"),
    (dict(batch_bytes=-1), r"invalid batch_bytes=-1"),
    (dict(buffer_memory=0), r"invalid buffer_memory=0"),
    (dict(max_block=0), r"invalid max_block=0: must be a number of seconds > 0"),
    (
        dict(max_message_bytes=8 * 1024 * 1024),  # (max_request_bytes is 4 MiB)
        r"invalid max_message_bytes=.*must be <= max_request_bytes",
    ),
    (
        dict(lingerr=0.1),
        r"unknown producer option\(s\) \['lingerr'\]; valid options are \[.*'linger'.*\]",
    ),
    (dict(idempotent=True, acks=1), r"idempotent=True requires acks=\"all\" \(got acks=1\)"),
    (dict(idempotent=True, acks=0), r"idempotent=True requires acks=\"all\""),
    (dict(partitioner="nope"), r"invalid partitioner='nope'"),
]


@pytest.mark.parametrize(("options", "match"), BAD_CONFIGS, ids=lambda x: str(x)[:40])
async def test_invalid_config(
    fake: FakeCluster, autojump_clock: Any, options: dict[str, Any], match: str
) -> None:
    opts = producer_options(**options)
    t0 = trio.current_time()
    with pytest.raises(ConfigError, match=match) as info:
        async with open_producer(fake.bootstrap, connector=fake.connector, **opts):
            pytest.fail("opened with an invalid config")
    assert isinstance(info.value, ValueError)
    assert trio.current_time() == t0
    assert fake.requests == []
    if "lingerr" not in options:
        with pytest.raises(ConfigError, match=match):
            ProducerConfig(**options)
        # Options over a valid config are validated too.
        with pytest.raises(ConfigError, match=match):
            async with open_producer(
                fake.bootstrap, ProducerConfig(acks="all"), connector=fake.connector, **options
            ):
                pass


def test_unknown_option_lists_every_valid_option() -> None:
    import dataclasses

    from pipeline.producer._config import make_config

    with pytest.raises(ConfigError) as info:
        make_config(None, {"acks": "all", "retires": 3, "batch_size": 5})
    text = str(info.value)
    assert "['batch_size', 'retires']" in text
    for field in dataclasses.fields(ProducerConfig):
        if field.init:  # not the TLS context the options build
            assert repr(field.name) in text


# --------------------------------------------------------------------------- unreachable


async def _open_unreachable(
    fake: FakeCluster, bootstrap: str, request_timeout: float
) -> tuple[BaseException, float]:
    t0 = trio.current_time()
    try:
        async with open_producer(
            bootstrap,
            connector=fake.connector,
            **producer_options(request_timeout=request_timeout, delivery_timeout=60.0),
        ):
            pytest.fail("opened without a reachable broker")
    except BaseException as exc:
        return exc, trio.current_time() - t0
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "where",
    [
        "unknown address",
        "stopped brokers",
        # Was a hang: the connection's reader never signalled it was done when
        # cancelled, and connect()/aclose() waited for it inside a shield.
        "hung broker",
    ],
)
async def test_broker_unreachable_at_start(
    fake: FakeCluster, autojump_clock: Any, where: str
) -> None:
    """The open fails after connect_timeout (5 s by default, shorter than the
    request_timeout), naming each bootstrap address and why its attempts failed."""
    timeout = 7.5
    bootstrap = fake.bootstrap
    cause, elapsed_by = "connection refused", 5.0
    if where == "unknown address":
        bootstrap = "nobody-listens:9092"
        cause = "fake cluster: no broker at nobody-listens:9092"
    elif where == "stopped brokers":
        for node in range(3):
            fake.stop_broker(node)
    else:  # accepts connections, never answers anything
        cause = "timed out: connected, but no answer to ApiVersions within 5.0s"
        # The three addresses start 0.25 s apart (connect_bootstrap's stagger), and
        # each gets its whole connect_timeout.
        elapsed_by = 5.5

        async def hang(ctx: ControlContext) -> None:
            await trio.sleep_forever()

        for api in (18, 3):  # ApiVersions, Metadata
            fake.control(api, hang, sticky=True)
    raised, elapsed = await _open_unreachable(fake, bootstrap, timeout)
    exc = single(raised)
    assert isinstance(exc, BrokerConnectionError), repr(exc)
    assert elapsed == elapsed_by
    text = str(exc)
    for address in bootstrap.split(","):
        assert f"{address}: {cause}" in text


async def test_broker_unreachable_raises_bare_error(fake: FakeCluster, autojump_clock: Any) -> None:
    """``except BrokerConnectionError:`` around ``open_producer`` must work: the error
    may not come wrapped in a trio ExceptionGroup."""
    with pytest.raises(BrokerConnectionError, match=r"request_timeout=2\.0s"):
        async with open_producer(
            "nobody-listens:9092",
            connector=fake.connector,
            **producer_options(request_timeout=2.0),
        ):
            pass


# --------------------------------------------------------------------------- buffer full


async def _fill_buffer(producer: Any, topic: str, value: bytes) -> list[Delivery]:
    """send_nowait until BufferFullError; returns the accepted deliveries."""
    accepted: list[Delivery] = []
    with pytest.raises(BufferFullError) as info:  # noqa: PT012
        for i in range(1000):
            accepted.append(producer.send_nowait(topic, value + b"-%d" % i))
            await trio.lowlevel.checkpoint()  # let the first request go out (and stall)
    text = str(info.value)
    assert "buffer_memory is full" in text
    assert "of 4000 bytes used" in text
    assert "message needs" in text
    return accepted


async def test_buffer_full(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    async with open_fake_producer(
        fake, buffer_memory=4000, max_message_bytes=1000, max_block=2.5, **PATIENT
    ) as producer:
        accepted = await _fill_buffer(producer, "t", b"v" * 400)
        assert 3 <= len(accepted) < 10
        stats = producer.statistics()
        assert stats.accepted == len(accepted)
        assert stats.buffered_bytes <= 4000
        # send() waits max_block for space, then gives up: exactly max_block.
        t0 = trio.current_time()
        with pytest.raises(
            BufferFullError, match=r"buffer_memory \(4000 bytes\) stayed full for max_block=2.5s"
        ):
            await producer.send("t", b"too many" * 25)  # more than the space left
        assert trio.current_time() == t0 + 2.5
        # send_many too (it reserves in chunks and waits like send()).
        t0 = trio.current_time()
        with pytest.raises(BufferFullError):
            await producer.send_many([ProducerMessage("t", b"many-%d" % i) for i in range(3)])
        assert trio.current_time() == t0 + 2.5
        assert producer.statistics().accepted == len(accepted)
        # The broker recovers: every accepted message is delivered, in order.
        gate.set()
        metas = [await d for d in accepted]
        # And the buffer is free again.
        after = await producer.send_and_wait("t", b"after")
    assert [m.offset for m in metas] == list(range(len(accepted)))
    assert after.offset == len(accepted)
    assert values_in_log(fake, "t", 0) == [d.message.value for d in accepted] + [b"after"]
    assert producer.statistics().buffered_bytes == 0


async def test_send_waits_for_space_then_succeeds(fake: FakeCluster, autojump_clock: Any) -> None:
    """A blocked send() is accepted as soon as space frees up, before max_block."""
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    async with open_fake_producer(
        fake, buffer_memory=4000, max_message_bytes=1000, max_block=10.0, **PATIENT
    ) as producer:
        accepted = await _fill_buffer(producer, "t", b"v" * 400)

        async def release_later() -> None:
            await trio.sleep(3.0)
            gate.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            t0 = trio.current_time()
            waited = await producer.send("t", b"waited" * 30)  # more than the space left
            assert trio.current_time() == t0 + 3.0
        meta = await waited
    assert meta.offset == len(accepted)
    assert values_in_log(fake, "t", 0)[-1] == b"waited" * 30


# --------------------------------------------------------------------------- closed


async def test_send_after_close_raises_producer_closed(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    async with open_fake_producer(fake) as producer:
        d = await producer.send("t", b"inside")
    assert (await d).offset == 0
    with pytest.raises(ProducerClosed, match="closed"):
        await producer.send("t", b"after")
    with pytest.raises(ProducerClosed):
        producer.send_nowait("t", b"after")
    with pytest.raises(ProducerClosed):
        await producer.send_and_wait("t", b"after")
    with pytest.raises(ProducerClosed):
        await producer.send_many([ProducerMessage("t", b"after")])
    assert values_in_log(fake, "t", 0) == [b"inside"]
    assert producer.statistics().accepted == 1


# --------------------------------------------------------------------------- cancellation


async def test_cancel_send_blocked_on_buffer_sends_nothing(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    async with open_fake_producer(
        fake, buffer_memory=4000, max_message_bytes=1000, max_block=30.0, **PATIENT
    ) as producer:
        accepted = await _fill_buffer(producer, "t", b"v" * 400)
        stats = producer.statistics()
        log_before = values_in_log(fake, "t", 0)
        with trio.move_on_after(1.0) as scope:
            await producer.send("t", b"CANCELLED" * 20)  # more than the space left
        assert scope.cancelled_caught
        with trio.move_on_after(1.0) as scope:
            await producer.send_many([ProducerMessage("t", b"CANCELLED-MANY")])
        assert scope.cancelled_caught
        now = producer.statistics()
        assert (now.accepted, now.buffered_bytes) == (stats.accepted, stats.buffered_bytes)
        assert values_in_log(fake, "t", 0) == log_before
        gate.set()
        await producer.flush()
    assert values_in_log(fake, "t", 0) == [d.message.value for d in accepted]
    final = producer.statistics()
    assert (final.accepted, final.succeeded, final.failed) == (len(accepted), len(accepted), 0)
    assert final.buffered_bytes == 0


async def test_cancel_after_acceptance_still_gets_outcome(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    fake.create_topic("t", 1)
    gate = stall_produce(fake)
    async with open_fake_producer(fake, **PATIENT) as producer:
        d1 = await producer.send("t", b"one")
        # Waiting for the outcome is cancelled: the message is not.
        with trio.move_on_after(1.0) as scope:
            await d1
        assert scope.cancelled_caught
        assert not d1.done()
        # send_and_wait cancelled after acceptance (while waiting for the ack).
        with trio.move_on_after(1.0) as scope:
            await producer.send_and_wait("t", b"two")
        assert scope.cancelled_caught
        assert producer.statistics().accepted == 2
        gate.set()
        meta1 = await d1
        await producer.flush()
    assert meta1.offset == 0
    assert values_in_log(fake, "t", 0) == [b"one", b"two"]
    stats = producer.statistics()
    assert (stats.succeeded, stats.failed, stats.double_settles) == (2, 0, 0)


async def test_cancelled_block_fails_outstanding_with_producer_closed(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Cancelling the whole ``async with`` block after acceptance: each accepted message
    still gets exactly one outcome (ProducerClosed, since nothing was acknowledged)."""
    fake.create_topic("t", 1)
    stall_produce(fake)
    deliveries: list[Delivery] = []
    with trio.move_on_after(2.0):
        async with open_fake_producer(fake, **PATIENT) as producer:
            for i in range(5):
                deliveries.append(await producer.send("t", b"c%d" % i))
            await trio.sleep_forever()
    results = [await outcome(d) for d in deliveries]
    assert all(
        isinstance(r, ProducerError) and isinstance(r.cause, ProducerClosed) for r in results
    )
    assert producer.statistics().double_settles == 0
