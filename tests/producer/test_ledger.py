"""The ledger's write-once outcome, tested directly.

An accepted message is settled once: PENDING -> OK or FAILED. A second settle,
success or failure, must change nothing the first one decided (state, offset,
cause, timestamp, who was told, the counters, the buffer bytes) and must be
counted in ``double_settles`` (the number every scenario asserts is 0).

Bugs these tests found (fixed in ``Ledger.succeed``): a repeated success with a
LogAppendTime timestamp rewrote the timestamp of messages settled before, and
in a batch holding a message settled before, the messages after it were given
offsets one too low (the repeat did not count as a position in the batch).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from pipeline.producer._message import FAILED, OK, TO_CHANNELS, ProducerMessage
from pipeline.producer._outcomes.delivery import DeliveryGroup
from pipeline.producer._outcomes.ledger import Ledger, Reporter


def accepted(ledger: Ledger, n: int, sink: Any = None, size: int = 100) -> list[ProducerMessage]:
    msgs = []
    for i in range(n):
        msg = ProducerMessage("t", b"v%d" % i)
        msg._size = size
        msg._sink = sink() if callable(sink) else sink
        assert ledger.try_reserve(size)
        ledger.accept(msg, deadline=10.0)
        msgs.append(msg)
    return msgs


def snapshot(ledger: Ledger, msgs: list[ProducerMessage]) -> tuple[Any, ...]:
    return (
        [(m._state, m.offset, m._outcome, m.timestamp) for m in msgs],
        ledger.succeeded,
        ledger.failed,
        ledger.buffered_bytes,
        dict(ledger.outstanding),
        list(ledger.reports),
    )


@pytest.mark.parametrize("sink", [None, trio.Event, "group", TO_CHANNELS], ids=["none", "event", "group", "channels"])
@pytest.mark.parametrize("first", ["succeed", "fail"])
@pytest.mark.parametrize("second", ["succeed", "fail", "succeed-no-offset"])
def test_a_second_settle_never_changes_the_first_outcome(first: str, second: str, sink: Any) -> None:
    ledger = Ledger(buffer_memory=10_000, max_block=1.0)
    ledger.return_successes = True
    group = DeliveryGroup(3) if sink == "group" else None
    msgs = accepted(ledger, 3, sink=group if sink == "group" else sink)
    cause = RuntimeError("first cause")
    if first == "succeed":
        ledger.succeed(msgs, base_offset=40, timestamp=1234)
        assert [(m._state, m.offset, m.timestamp) for m in msgs] == [
            (OK, 40, 1234), (OK, 41, 1234), (OK, 42, 1234)
        ]
    else:
        ledger.fail(msgs, cause)
        assert [(m._state, m._outcome) for m in msgs] == [(FAILED, cause)] * 3
    before = snapshot(ledger, msgs)
    events = [m._sink for m in msgs if isinstance(m._sink, trio.Event)]
    assert all(e.is_set() for e in events)
    group_before = (group.delivered, group.failed, group.pending, len(group.errors)) if group else None

    if second == "succeed":
        ledger.succeed(msgs, base_offset=99, timestamp=5678)
    elif second == "succeed-no-offset":
        ledger.succeed(msgs, base_offset=-1, timestamp=-1)
    else:
        ledger.fail(msgs, RuntimeError("second cause"))

    assert snapshot(ledger, msgs) == before
    assert ledger.double_settles == 3
    if group is not None:
        assert (group.delivered, group.failed, group.pending, len(group.errors)) == group_before


def test_one_failure_of_many_partitions_counts_each_topic_and_partition_its_own() -> None:
    """One ``fail()`` of messages of several topics and partitions, interleaved (a close
    fails all that is left at once): each (topic, partition) counts its own, the same
    partition of another topic apart, a message with no partition yet under -1, and a
    repeat under none."""
    ledger = Ledger(buffer_memory=10_000, max_block=1.0)
    msgs = []
    for topic, partition in [("a", 0), ("a", 0), ("a", 1), ("b", 1), ("b", 1), ("a", 1),
                             ("b", None), ("a", 0)]:
        msg = ProducerMessage(topic, b"v", partition=partition)
        msg._size = 100
        assert ledger.try_reserve(100)
        ledger.accept(msg, deadline=10.0)
        msgs.append(msg)
    ledger.fail(msgs, RuntimeError("closed"))
    counted = {("a", 0): 3, ("a", 1): 2, ("b", 1): 2, ("b", -1): 1}
    assert ledger.failed_by_partition == counted
    ledger.fail(msgs[2:4], RuntimeError("again"))
    assert (ledger.failed_by_partition, ledger.double_settles) == (counted, 2)


def test_settling_part_of_a_batch_twice_counts_only_the_repeats() -> None:
    """A batch where some messages were settled before (e.g. expired in flight,
    then the late answer succeeds): the others settle normally, the repeats are
    counted, and their bytes are not released a second time."""
    ledger = Ledger(buffer_memory=10_000, max_block=1.0)
    msgs = accepted(ledger, 4, size=250)
    assert ledger.buffered_bytes == 1000
    expired = RuntimeError("expired")
    ledger.fail(msgs[:2], expired)
    assert ledger.buffered_bytes == 500
    ledger.succeed(msgs, base_offset=7, timestamp=-1)
    assert [m._state for m in msgs] == [FAILED, FAILED, OK, OK]
    assert [m._outcome for m in msgs[:2]] == [expired, expired]
    assert [m.offset for m in msgs[2:]] == [9, 10]  # their own positions in the batch
    assert (ledger.succeeded, ledger.failed, ledger.double_settles) == (2, 2, 2)
    assert ledger.buffered_bytes == 0
    assert not ledger.outstanding


def test_fail_all_outstanding_leaves_settled_messages_alone() -> None:
    ledger = Ledger(buffer_memory=10_000, max_block=1.0)
    msgs = accepted(ledger, 3)
    ledger.succeed(msgs[:1], base_offset=0, timestamp=-1)
    assert ledger.fail_all_outstanding(RuntimeError("closed")) == 2
    assert [m._state for m in msgs] == [OK, FAILED, FAILED]
    assert msgs[0].offset == 0
    assert ledger.double_settles == 0


async def test_an_outcome_caught_in_the_hand_over_by_the_close_is_lost_once_and_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The report task is blocked handing an outcome over (nobody reads ``successes``)
    when it is cancelled, and close() runs before the task sees the cancellation: that
    outcome is counted lost once (logged) and its bytes released, not queued again, and
    the one that fit is still readable."""
    ledger = Ledger(buffer_memory=10_000, max_block=1.0)
    ledger.return_successes = True
    reporter = Reporter(ledger, channel_capacity=1)
    msgs = accepted(ledger, 2, sink=TO_CHANNELS)
    ledger.succeed(msgs, base_offset=0, timestamp=-1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reporter.run)
        await trio.testing.wait_all_tasks_blocked()
        assert ledger.buffered_bytes == 100  # the first handed over, the second in send()
        nursery.cancel_scope.cancel()
        reporter.close()  # (no checkpoint since the cancel: the task has not seen it)
    assert ledger.buffered_bytes == 0 and not ledger.reports
    lost = [r.getMessage() for r in caplog.records if "could not be handed over" in r.getMessage()]
    assert lost == ["1 outcomes could not be handed over: producer.successes/errors were not "
                    "drained"]
    assert [m.offset async for m in reporter.successes] == [0]
