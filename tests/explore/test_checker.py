"""The explorer's invariant checker on hand-made traces: each invariant flags
the outcome it forbids and accepts what it allows (duplicates and late failed
copies without idempotence, overlapping calls in any order)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.producer._stages.partitioner import murmur2
from pipeline.testing.explore import generate
from pipeline.testing.explore.checker import check
from pipeline.testing.explore.runner import Attempt, Flush, Message, Trace, value_of
from pipeline.testing.explore.schedule import Event, Schedule, with_options


def schedule(idempotent: bool) -> Schedule:
    s = generate(1)
    # (every send pinned to partition 0, where the traces below write them: P1)
    s = replace(s, idempotent=idempotent, heal_at=1.0, close_at=50.0, max_message_bytes=300,
                sends=tuple(replace(x, partition=0, key=None) for x in s.sends))
    return with_options(s, delivery_timeout=5.0, request_timeout=1.0, close_timeout=2.0,
                        retries=2**31 - 1)


DUE = -1.0  # settled when it is due: acknowledged at 0.5, expired at its deadline


def msg(index: int, *, ok: bool = True, offset: int = -1, call: int | None = None,
        at: float = 0.0, settled: float | None = DUE, partition: int = 0) -> Message:
    """Message `index`, sent by its own call number `call` (default: index)."""
    step = 2 * (index if call is None else call)
    if settled == DUE:
        settled = 0.5 if ok else at + 5.0
    return Message(index, index + 1, value_of(index, 0), at, at + 5.0, call=(step, step + 1, 0),
                   partition=partition, ok=ok, offset=offset, settled_at=settled,
                   cause="" if ok else "DeliveryTimeoutError: expired")


def trace(idempotent: bool, messages: list[Message], log: list[int]) -> Trace:
    t = Trace(schedule(idempotent), messages=messages, close_start=50.0, close_end=50.0)
    t.logs = {0: [value_of(i, 0) for i in log]}
    return t


def kinds(t: Trace) -> list[str]:
    return [v.kind for v in check(t)]


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_clean_trace_passes(idempotent: bool) -> None:
    assert kinds(trace(idempotent, [msg(0, offset=0), msg(1, offset=1)], [0, 1])) == []


def test_duplicates_only_without_idempotence() -> None:
    ms = [msg(0, offset=0), msg(1, offset=2)]
    assert kinds(trace(False, ms, [0, 0, 1])) == []  # a retry after a lost ack
    assert kinds(trace(True, ms, [0, 0, 1])) == ["I1 duplicate"]


def test_order_of_acknowledged_messages() -> None:
    ms = [msg(0), msg(1)]
    assert kinds(trace(False, ms, [1, 0])) == ["N2 reordered"]
    assert kinds(trace(True, ms, [1, 0])) == ["I2 reordered"]


def test_a_failed_message_may_be_written_late_only_without_idempotence() -> None:
    ms = [msg(0, ok=False), msg(1)]  # 0's request was given up, then applied late
    assert kinds(trace(False, ms, [1, 0])) == []
    assert kinds(trace(True, ms, [1, 0])) == ["I2 reordered"]


def test_overlapping_calls_have_no_order() -> None:
    ms = [msg(0, call=0), msg(1, call=0)]  # same call step range: overlapping
    ms[0].call, ms[1].call = (0, 5, 0), (1, 4, 0)
    assert kinds(trace(True, ms, [1, 0])) == []
    ms[1].call = (0, 5, 1)  # one send_many call: list order counts
    assert kinds(trace(True, ms, [1, 0])) == ["I2 reordered"]


def test_acknowledged_but_missing_or_elsewhere() -> None:
    assert kinds(trace(True, [msg(0, offset=0), msg(1, offset=1)], [0])) == ["A1 lost"]
    assert kinds(trace(True, [msg(0, offset=1)], [0])) == ["A1 offset"]
    assert kinds(trace(True, [msg(0, partition=1)], [0])) == ["A2 wrong partition",
                                                              "P1 routing"]


def test_records_go_where_their_partition_key_and_partitioner_say() -> None:
    """P1 (routing.py): a pinned record to its partition, or failed with
    PartitionOutOfRangeError naming the topic's partitions when it has no such
    partition; a keyed one to murmur2(key) % partitions (the default partitioner) or
    to the custom partitioner's choice, or failed with the custom partitioner's
    error for the records it refuses; no routable record fails with a routing error."""
    from pipeline.testing.explore.routing import route
    from pipeline.testing.explore.schedule import Send

    base = replace(schedule(True), partitions=2)

    def judged(send: Send, m: Message, log: dict[int, list[int]], *,
               partitioner: str = "default") -> list[str]:
        t = Trace(replace(base, sends=(send,), partitioner=partitioner), messages=[m],
                  close_start=50.0, close_end=50.0)
        t.logs = {p: [value_of(i, 0) for i in log.get(p, [])] for p in range(2)}
        return [v.kind for v in check(t) if v.kind.startswith("P1")]

    def failed(cause: str) -> Message:
        return replace(msg(0, ok=False), cause=cause)

    pinned = Send(0.0, 0, 0, partition=1)
    assert judged(pinned, msg(0, partition=1), {1: [0]}) == []
    assert judged(pinned, failed("PartitionOutOfRangeError: partition 1 does not exist: "
                                 "topic 't' has 2 partitions (0..1)"), {}) == ["P1 routing"]
    beyond = Send(0.0, 0, 0, partition=2)
    refused = "PartitionOutOfRangeError: partition 2 does not exist: topic 't' has 2 partitions"
    assert judged(beyond, failed(refused + " (0..1)"), {}) == []
    assert judged(beyond, failed(refused + " (0..0)"), {}) == ["P1 routing"]  # the wrong range
    assert judged(beyond, msg(0, partition=0), {0: [0]}) == ["P1 routing"]
    keys = [f"k{i}" for i in range(8)]
    home = {k: route("default", 2, None, k, value_of(0, 0)) for k in keys}
    assert set(home.values()) == {0, 1}  # (both partitions appear among these keys)
    for k in keys:
        p = home[k]
        assert isinstance(p, int)
        assert judged(Send(0.0, 0, 0, key=k), msg(0, partition=p), {p: [0]}) == []
        assert judged(Send(0.0, 0, 0, key=k), msg(0, partition=1 - p), {1 - p: [0]}) == [
            "P1 routing"]
    # librdkafka's "murmur2": keyed records as the default's, keyless ones all to the
    # partition of the empty key's hash
    assert all(route("murmur2", 2, None, k, value_of(0, 0)) == home[k] for k in keys)
    empty = route("murmur2", 2, None, None, value_of(0, 0))
    assert empty == (murmur2(b"") & 0x7FFFFFFF) % 2
    assert route("default", 2, None, None, value_of(0, 0)) is None  # (sticky: K1 judges)
    # A custom schedule: value 0's record is routed; a value its partitioner refuses.
    keyed = Send(0.0, 0, 0, key="k1")
    p = route("custom", 2, None, "k1", value_of(0, 0))
    assert isinstance(p, int)
    assert judged(keyed, msg(0, partition=p), {p: [0]}, partitioner="custom") == []
    assert judged(keyed, failed("PartitionerBug: refuses"), {}, partitioner="custom") == [
        "P1 routing"]
    size = next(n for n in range(200) if route("custom", 2, None, "k1", value_of(0, n))
                == "PartitionerBug")
    bad = Send(0.0, 0, size, key="k1")
    t_bad = replace(msg(0, ok=False), value=value_of(0, size), cause="PartitionerBug: refuses")
    assert judged(bad, t_bad, {}, partitioner="custom") == []
    assert judged(bad, replace(t_bad, ok=True, cause="", partition=0), {},
                  partitioner="custom") == ["P1 routing"]


def test_phantom_records() -> None:
    t = trace(False, [msg(0)], [0])
    t.logs[0].append(b"")  # e.g. an empty record: a control item on the wire (sarama #2150)
    assert kinds(t) == ["A2 phantom"]


def test_outcomes_and_timing() -> None:
    assert kinds(trace(True, [msg(0, ok=False, settled=None)], [])) == ["O1 no outcome"]
    assert kinds(trace(True, [msg(0, ok=False, settled=5.0)], [])) == []  # at its deadline
    # a request_timeout (1 s here) later is late too: nothing waits past the deadline
    assert kinds(trace(True, [msg(0, ok=False, settled=5.01)], [])) == ["O1 late"]
    t = trace(True, [], [])
    t.double_settles, t.outstanding_after_close, t.buffered_after_close = 1, 2, 3
    assert kinds(t) == ["O1 double settle", "O1 unsettled", "O1 buffer"]


def test_flush_and_close_bounds() -> None:
    t = trace(False, [], [])
    t.flushes = [Flush(1.0, 7.0, 0, (), False), Flush(1.0, 7.01, 0, (), False),
                 Flush(1.0, 2.0, 3, (3,), False)]
    assert kinds(t) == ["O2 flush late", "O2 flush early"]
    t.flushes = []
    t.close_end = 52.01  # close_timeout 2
    assert kinds(t) == ["O3 close"]
    t = trace(True, [], [])
    t.close_end = 53.0  # + request_timeout 1 when idempotent
    assert kinds(t) == []


def test_liveness_after_healing() -> None:
    # heal 1 + delivery 5 + request 1 = 7; close 50 - delivery 5 = 45
    assert kinds(trace(True, [msg(0, ok=False, at=7.5)], [])) == ["L1 stuck"]
    assert kinds(trace(True, [msg(0, ok=False, at=6.5)], [])) == []  # older than the window
    assert kinds(trace(True, [msg(0, ok=False, at=45.5)], [])) == []  # close may fail it


def test_size_refusals_follow_the_documented_bound() -> None:
    t = trace(False, [], [])
    t.attempts = [Attempt((0,), (300,), ""), Attempt((1,), (301,), "MessageTooLargeError"),
                  Attempt((2,), (301,), "ProducerClosed"), Attempt((3,), (301,), "Cancelled")]
    assert kinds(t) == []  # (a call cancelled at its first checkpoint never got to the check)
    t.attempts = [Attempt((0,), (300,), "MessageTooLargeError"), Attempt((1,), (301,), "")]
    assert kinds(t) == ["S1 size", "S1 size"]
    t = trace(False, [msg(0, ok=False)], [])
    t.messages[0].cause = "BrokerResponseError: MESSAGE_TOO_LARGE (10)"
    assert kinds(t) == ["S1 broker size"]
    t = trace(False, [msg(0)], [0])
    assert kinds(t) == []
    t.oversized = [(0, 301), (0, 400)]  # a batch the broker would refuse (one report)
    assert kinds(t) == ["S1 batch size"]


def test_a_settled_chunk_of_rows_holding_its_columns_is_a_violation() -> None:
    t = trace(False, [msg(0)], [0])
    assert kinds(t) == []
    t.unfreed = 2  # (runner._unfreed counts them on the objects after the close)
    assert kinds(t) == ["M1 unfreed"]


def test_a_crash_is_a_violation() -> None:
    t = trace(False, [], [])
    t.crash = "RuntimeError: boom\nTraceback ..."
    assert kinds(t) == ["crash"]


def test_records_written_after_the_broker_forgot_the_producer_are_exempt() -> None:
    """Kafka accepts any sequence from a producer it has no state for: after a
    restart that lost the state, a retry is written again, a later batch can
    overtake. The fake marks those records; I1/I2 exempt them, nothing else."""
    ms = [msg(0), msg(1)]
    t = trace(True, ms, [0, 0, 1])
    t.state_lost = {0: {1}}
    assert kinds(t) == []
    t = trace(True, ms, [1, 0])
    t.state_lost = {0: {0}}
    assert kinds(t) == []
    t.state_lost = {0: set()}
    assert kinds(t) == ["I2 reordered"]


def test_a_failed_message_written_after_a_later_one_is_reordered() -> None:
    """With idempotence a failed message (its fate unknown) may be absent, or in
    its place; written after a later message it is a violation, also when a
    different producer id wrote it (a straggler of a replaced id: the epoch bump
    fences it, a new id would not)."""
    ms = [msg(0, ok=False), msg(1)]
    assert kinds(trace(True, ms, [1])) == []
    assert kinds(trace(True, ms, [0, 1])) == []
    assert kinds(trace(True, ms, [1, 0])) == ["I2 reordered"]


def test_rows_of_send_bursts_get_exactly_one_outcome() -> None:
    """Rows of columnar send() bursts: one settled by two runs, a delivery
    still pending after close, an await returning another outcome than the
    delivery reports, or an on_delivery called otherwise than once with that
    outcome is a violation; the same row settled once and awaited or called
    back consistently is not."""
    row = msg(0, offset=0)
    row.row, row.awaited = True, "ok 0 0 at -1"  # (offset 0, timestamp -1)
    assert kinds(trace(True, [row], [0])) == []
    row.awaited = "ok 0 1 at -1"
    assert kinds(trace(True, [row], [0])) == ["O1 await"]
    failed = msg(1, ok=False)
    failed.row, failed.awaited = True, "failed DeliveryTimeoutError: expired"
    assert kinds(trace(True, [failed], [])) == []
    failed.awaited = "never returned"
    assert kinds(trace(True, [failed], [])) == ["O1 await"]
    pending = msg(2, ok=False, settled=None)
    pending.row, pending.pending, pending.cause = True, True, ""
    assert kinds(trace(True, [pending], [])) == ["O1 no outcome", "O1 no outcome"]
    t = trace(True, [], [])
    t.rows_settled_twice = 3
    assert kinds(t) == ["O1 double settle"]
    row.awaited, row.called = "", "ok 0 0 at -1"
    assert kinds(trace(True, [row], [0])) == []
    for wrong in ("ok 0 0 at -1; ok 0 0 at -1", "never called", "ok 1 0 at -1", "ok 0 0 at 7"):  # twice, never, elsewhere
        row.called = wrong
        assert kinds(trace(True, [row], [0])) == ["O1 callback"]


def test_producer_closed_only_from_the_close_and_for_all_an_abort_left() -> None:
    closed = msg(0, ok=False)
    closed.cause = "ProducerClosed: the producer closed before this message was acknowledged"
    assert kinds(trace(False, [closed], [])) == ["C1 closed early"]
    closed.settled_closing = True
    assert kinds(trace(False, [closed], [])) == []
    s = replace(schedule(False), abort=True)
    other = msg(1, ok=False, at=46.0, settled=50.0)
    # Settled with its own outcome in the close's instant: the pipeline's last step
    # (a response read before the close) ends before the close fails the rest.
    other.settled_closing = True
    t = Trace(s, messages=[closed, other], close_start=50.0, close_end=50.0)
    t.logs = {0: []}
    assert kinds(t) == []
    other.settled_at = 50.25  # later: the pipeline ran on after a close without flush
    assert kinds(t) == ["C1 close"]
    t.schedule = replace(s, idempotent=True)  # (the bounded drain may still settle it)
    assert kinds(t) == []


def test_nothing_expires_before_the_oldest_deadline_of_its_batch() -> None:
    """A delivery timeout before the message's own deadline is allowed only when an
    older message of its partition was due (a batch expires whole, at its first
    message's deadline, as the Java client's do)."""
    early = msg(0, ok=False, settled=4.0)
    assert kinds(trace(True, [early], [])) == ["O1 early"]
    older = msg(1, ok=False, at=-1.0)  # accepted first (lower id), due at 4.0
    older.id, early.id = 1, 2
    assert kinds(trace(True, [older, early], [])) == []
    older.partition = 1  # another partition's deadline does not count
    assert kinds(trace(True, [older, early], [])) == ["O1 early"]
    # a producer.input message keeps the deadline it entered the input channel with:
    # accepted after `early` (a higher id), due at 4.0, it expired with it in one batch
    stamped = msg(1, ok=False, at=-1.0, settled=4.0)
    stamped.id, early.id = 3, 2
    t = trace(True, [early, stamped], [])
    assert kinds(t) == ["O1 early"]
    t.schedule = replace(t.schedule, sends=tuple(
        replace(x, via="input") if i == 1 else x for i, x in enumerate(t.schedule.sends)))
    assert kinds(t) == []
    stamped.settled_at = 4.5  # (not in early's batch: it expired at another time)
    assert "O1 early" in kinds(t)


def test_statistics_count_what_the_messages_report() -> None:
    t = trace(True, [msg(0, offset=0), msg(1, ok=False)], [0])
    t.counted = (2, 1, 1, 0)
    assert kinds(t) == []
    t.counted = (2, 2, 1, 0)
    assert kinds(t) == ["O4 statistics"]
    t.counted = (2, 1, 1, 0)
    t.callbacks_raised = 3  # on_delivery calls that raised (calls.raises), all counted
    t.callback_errors = 3
    assert kinds(t) == []
    t.callback_errors = 2
    assert kinds(t) == ["O4 statistics"]
    t.callback_errors = 3
    t.produce_written = 0  # (the probe's count of Produce requests the connections wrote)
    assert kinds(t) == []
    t.produce_written = 1
    assert kinds(t) == ["O4 statistics"]


def test_an_input_outcome_never_handed_over_is_counted_by_the_close() -> None:
    """O5 at the close: a ``producer.input`` outcome that came out of neither channel
    is one the close counted in its warning (the probe's ``lost_reports``)."""
    m = msg(0, ok=False)
    m.reported, m.settled_closing = (0, 0), True
    t = trace(True, [m], [])
    t.lost_reports = 1
    assert kinds(t) == []
    t.lost_reports = 0
    assert kinds(t) == ["O5 reports"]


def test_statistics_count_each_partitions_outcomes_and_their_gauges_add_up() -> None:
    """O4 per partition (failed and delivered records; -1: failed unrouted) and O9
    (statistics() read during the run: no negative gauge, a batch in flight holds a
    record and a batch's overhead, no more queued or in flight than unsettled)."""
    from pipeline.testing.explore.trace import Gauges

    unrouted = msg(1, ok=False)
    unrouted.partition = None
    t = trace(True, [msg(0, offset=0), unrouted], [0])
    t.partition_counts = {0: (0, 1), -1: (1, 0)}
    assert kinds(t) == []
    t.partition_counts = {0: (1, 1)}  # the unrouted failure counted under partition 0
    assert kinds(t) == ["O4 statistics", "O4 statistics"]  # (0 and -1 both wrong)
    t.partition_counts = {0: (0, 1), -1: (1, 0)}
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 2, 150)})]
    assert kinds(t) == []
    for bad in [(-1, 70, 1, 2, 150), (1, 70, 1, 2, 0), (1, 70, 1, 0, 150), (1, 0, 0, 0, 0),
                (1, 70, 1, 3, 150)]:  # (the last: 4 records waiting, 3 unsettled)
        t.gauges = [Gauges(0.1, 3, {0: bad})]
        assert kinds(t) == ["O9 gauges"], bad


def test_a_callback_hears_the_metadata_an_await_returns() -> None:
    """O1: an on_delivery call and an await agree, the offset's being known included
    (``RecordMetadata.offset_known``: False only with no offset, acks=0 or a
    duplicate answered without one), and the timestamp."""
    m = msg(0, offset=0)
    m.called = m.awaited = "ok 0 0 at -1"
    assert kinds(trace(True, [m], [0])) == []
    m.called = "ok 0 0 offset unknown at -1"
    assert kinds(trace(True, [m], [0])) == ["O1 callback"]


def test_an_acknowledged_message_reports_the_brokers_append_time() -> None:
    """A3: on a LogAppendTime topic the timestamp a message reports is its record's in
    the log (the batch's max timestamp, the broker's append time)."""
    m = msg(0, offset=0)
    t = trace(True, [m], [0])
    t.schedule = replace(t.schedule, log_append_time=True)
    t.log_times = {0: [1_750_000_000_125]}
    m.timestamp = 1_750_000_000_125
    assert kinds(t) == []
    m.timestamp = 1_700_000_000_000  # its create time
    assert kinds(t) == ["A3 timestamp"]


def test_an_acknowledged_message_reports_its_own_create_time() -> None:
    """A3 on a CreateTime topic: its record's create time, not a batch-mate's (the max
    timestamp Kafka echoes in its answer to a duplicate)."""
    m = msg(0, offset=0)
    t = trace(True, [m], [0])
    t.log_times = {0: [1_700_000_000_003]}
    m.timestamp = 1_700_000_000_003
    assert kinds(t) == []
    m.timestamp = 1_700_000_000_007  # the batch's max timestamp
    assert kinds(t) == ["A3 timestamp"]


def test_acks_0_reports_no_offset() -> None:
    t = trace(False, [msg(0, offset=-1)], [])
    t.schedule = with_options(t.schedule, acks=0)
    assert kinds(t) == []  # not in the log: acks=0 promises nothing more
    t.messages[0].offset = 0
    assert kinds(t) == ["A1 offset"]


def test_acks_0_keeps_the_order_of_writes_while_no_connection_failed() -> None:
    """With acks=0 the order holds on one connection; once the client closed or lost a
    connection, what it had written there may be applied after what a later connection
    wrote (Kafka applies what it already read), so N2 judges nothing more."""
    t = trace(False, [msg(0), msg(1)], [1, 0])
    t.schedule = with_options(t.schedule, acks=0)
    assert kinds(t) == ["N2 reordered"]
    t.connections_failed = 1
    assert kinds(t) == []


def test_guard_violations_seen_by_the_probes_are_violations() -> None:
    t = trace(True, [], [])
    t.guard_violations = {"G1 below the watermark": "partition 0: ..."}
    assert kinds(t) == ["G1 below the watermark"]


def test_keyless_messages_spread_as_the_sticky_partitioner_spreads_them() -> None:
    """K1: a batch's worth of keyless messages (by their size bounds) to one
    partition, the one reaching batch_bytes included, then the next partition."""
    from pipeline.testing.explore.calls import bound_of
    from pipeline.testing.explore.schedule import Send

    sends = tuple(Send(0.0, 0, 20) for _ in range(12))
    size = bound_of(sends[0], 0)
    assert all(bound_of(sends[i], i) == size for i in range(10))  # (one-digit indexes)
    s = with_options(replace(schedule(True), partitions=3, sends=sends),
                     batch_bytes=3 * size)

    def spread(partitions: list[int], rows: tuple[int, ...] = (),
               partitioner: str = "default", columnar: tuple[int, ...] = ()) -> list[str]:
        ms = [msg(i, partition=p, offset=-1) for i, p in enumerate(partitions)]
        for m in ms:
            m.row = m.index in rows
        t = Trace(replace(s, partitioner=partitioner), messages=ms, close_start=50.0,
                  close_end=50.0, columnar=set(columnar))
        t.logs = {p: [value_of(m.index, 20) for m in ms if m.partition == p] for p in range(3)}
        for m in ms:
            m.value = value_of(m.index, 20)
        return [v.kind for v in check(t) if v.kind.startswith("K1")]

    assert spread([0, 0, 0, 2, 2, 2, 1, 1, 1, 0]) == []
    assert spread([0, 0, 0, 0, 2]) == ["K1 sticky"]  # stayed past batch_bytes
    assert spread([0, 0, 0, 2, 2, 1]) == ["K1 sticky"]  # moved on too early
    assert spread([0, 0, 2, 2, 2, 1]) == []  # (the first run's earlier bytes are unknown)
    assert spread([0, 0, 0, 2, 2, 1, 1], rows=(5,)) == []  # a keyless row: a new stretch
    # A send_many()'s messages on its columnar path move on as rows do (Trace.columnar).
    assert spread([0, 0, 0, 2, 2, 1, 1], columnar=(5,)) == []
    # A user's partitioner is asked per row too: its rows are judged like messages.
    assert spread([0, 0, 0, 2, 2, 1, 1], rows=(5,), partitioner="custom") == ["K1 sticky"]
    assert spread([0, 0, 0, 2, 2, 2, 1], rows=(4, 5), partitioner="custom") == []


def test_the_close_reports_what_it_failed() -> None:
    """O7: the count the close logs is what it failed."""
    t = trace(True, [msg(0, offset=0)], [0])
    t.close_failed = (3, 3)
    assert kinds(t) == []
    t.close_failed = (1, 3)
    assert kinds(t) == ["O7 close report"]


def test_a_failure_nobody_reads_is_reported_and_nothing_more() -> None:
    """O8: a failed send() nobody awaited is named by an unobserved-failure
    warning; one reported through a callback is not."""
    from pipeline.testing.explore.schedule import Send

    s = replace(schedule(True), sends=(Send(0.0, 0, 0, partition=0),) * 3)
    t = Trace(s, messages=[msg(0, offset=0), msg(1, ok=False), msg(2, ok=False)],
              close_start=50.0, close_end=50.0)
    t.logs = {0: [value_of(0, 0)]}
    t.unobserved_reported = 2
    assert kinds(t) == []
    t.unobserved_reported = 1
    assert kinds(t) == ["O8 unobserved"]  # one failure went unseen
    t.messages[2].called = "failed DeliveryTimeoutError: expired"
    assert kinds(t) == []  # its callback saw it
    t.unobserved_reported = 2
    assert kinds(t) == ["O8 unobserved"]  # named one the callback had reported
    t.messages[2].called = ""
    t.messages[2].cause, t.messages[2].settled_closing = "ProducerClosed: closed", True
    t.unobserved_reported = 1
    assert kinds(t) == []
    t.unobserved_reported = 2
    assert kinds(t) == ["O8 unobserved"]  # named one the close failed (and reports: O7)


def test_a_failed_row_of_a_loop_nobody_awaits_is_reported() -> None:
    """O8 on send() loops: a failed delivery of a loop (a row of a columnar burst too)
    is unread unless its loop's wait task read it or its on_delivery heard it (two
    sends of three in a callback loop)."""
    from pipeline.testing.explore.schedule import Send

    def loop_trace(wait: bool = False, callback: bool = False) -> Trace:
        s = replace(schedule(True), sends=tuple(
            Send(1.0, 0, 0, partition=0, via="loop", wait=wait, callback=callback)
            for _ in range(3)))
        t = Trace(s, messages=[msg(i, ok=False) for i in range(3)], close_start=50.0,
                  close_end=50.0)
        for m in t.messages:
            m.row = True
        t.logs = {0: []}
        return t

    t = loop_trace()
    t.unobserved_reported = 3
    assert kinds(t) == []
    t.unobserved_reported = 2
    assert kinds(t) == ["O8 unobserved"]
    t = loop_trace(wait=True)  # another task awaited each: read
    for m in t.messages:
        m.awaited = "failed DeliveryTimeoutError: expired"
    t.unobserved_reported = 0
    assert kinds(t) == []
    t = loop_trace(callback=True)  # sends 1 and 2 carry on_delivery, send 0 none
    for m in t.messages[1:]:
        m.called = "failed DeliveryTimeoutError: expired"
    t.unobserved_reported = 0
    assert kinds(t) == ["O8 unobserved"]
    t.unobserved_reported = 1
    assert kinds(t) == []


def test_a_flush_covers_every_send_that_returned_before_it() -> None:
    """O2, judged by the calls: a message whose send() returned before flush()
    was called is settled when flush() returns, whatever the ledger's last id."""
    ms = [msg(0, offset=0, settled=0.5), msg(1, offset=1, settled=3.0)]  # calls at steps 0-1, 2-3
    t = trace(True, ms, [0, 1])
    t.flushes = [Flush(0.2, 3.0, 0, (), False, step=4)]
    assert kinds(t) == []
    t.flushes = [Flush(0.2, 2.0, 0, (), False, step=4)]  # returned before #1 settled
    assert kinds(t) == ["O2 flush early"]
    t.flushes = [Flush(0.2, 2.0, 0, (), False, step=3)]  # #1's call had not returned
    assert kinds(t) == []


def wire(*batches: tuple[int, list[int]], acks: int = -1, timeout_ms: int = 1000) -> object:
    """A Produce request as the fake received it: per (partition, message indexes), one
    batch of those messages' values."""
    from pipeline.protocol.messages import produce as pm
    from pipeline.protocol.records import BatchBuilder

    parts = []
    for p, indexes in batches:
        builder = BatchBuilder()
        for i in indexes:
            builder.append(0, None, value_of(i, 0))
        parts.append(pm.PartitionProduceData(index=p, records=builder.build()))
    return pm.ProduceRequest(acks=acks, timeout_ms=timeout_ms,
                             topic_data=(pm.TopicProduceData(name="t", partition_data=tuple(parts)),))


def test_a_failure_names_its_own_batchs_answer() -> None:
    """E1: a message fails with a broker's answer only if a request holding it got it
    (not the answer of the batch behind it); R1: with idempotence, a failure with an
    answer the producer recovers from only once its retries are spent, and never with
    DUPLICATE_SEQUENCE_NUMBER."""
    m = msg(0, ok=False)
    m.cause = "BrokerResponseError: OUT_OF_ORDER_SEQUENCE_NUMBER (45) gap"
    m.attempts = 2
    t = trace(True, [m], [])
    t.schedule = with_options(t.schedule, retries=1)
    t.answered = {m.value: [6, 6]}  # (NOT_LEADER_OR_FOLLOWER twice)
    assert kinds(t) == ["E1 cause"]
    t.answered = {m.value: [6, 45]}
    assert kinds(t) == []
    m.attempts = 1  # (the answer it recovers from, one retry left)
    assert kinds(t) == ["R1 retries"]
    # unless the schedule has a leader answer so with nothing to explain it: that fails
    # its batch at once (sweep.unexplained_gap)
    gap = Event(0.0, "error", partition=0, code=45, count=1)
    t.schedule = replace(t.schedule, events=(*t.schedule.events, gap))
    assert kinds(t) == []
    t.schedule = replace(t.schedule, events=t.schedule.events[:-1])
    m.cause, t.answered = "BrokerResponseError: DUPLICATE_SEQUENCE_NUMBER (46) dup", {m.value: [46]}
    assert kinds(t) == ["R1 retries"]
    t.answered = None  # (not recorded: E1 judges nothing)
    m.cause, m.attempts = "BrokerResponseError: INVALID_RECORD (87) bad", 1
    assert kinds(t) == []


def test_statistics_count_retries_batches_and_bytes_the_wire_saw() -> None:
    """O4 against the wire: per partition, ``delivered_bytes`` is the size bounds of the
    records acknowledged; at least as many batches sealed, and retries of at least as
    many batches and records, as the brokers received (again)."""
    t = trace(True, [msg(0, offset=0), msg(1, offset=1)], [0, 1])
    t.attempts = [Attempt((0,), (80,), ""), Attempt((1,), (81,), "")]
    t.produce_requests = [(0.1, wire((0, [0, 1]))), (0.2, wire((0, [0, 1])))]
    t.wire_counts = {0: (1, 1, 2, 161)}
    assert kinds(t) == []
    for bad in [(1, 1, 2, 160), (0, 1, 2, 161), (1, 0, 2, 161), (1, 1, 1, 161)]:
        t.wire_counts = {0: bad}
        assert kinds(t) == ["O4 statistics"], bad


def test_gauges_at_rest_add_up_exactly_and_requests_stay_within_max_in_flight() -> None:
    """O9: with nothing between the stages, queued and in-flight records are exactly
    those not settled, with their bytes; no broker producer has more than
    ``max_in_flight`` requests."""
    from pipeline.testing.explore.trace import Gauges

    t = trace(True, [msg(0, offset=0)], [0])
    t.schedule = with_options(t.schedule, max_in_flight=2)
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 2, 150)}, at_rest=True, requests=2)]
    assert kinds(t) == []
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 1, 150)}, at_rest=True)]
    assert kinds(t) == ["O9 gauges"]
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 1, 150)}, at_rest=False)]  # (one on its way)
    assert kinds(t) == []
    t.gauges = [Gauges(0.1, 3, {}, requests=3)]
    assert kinds(t) == ["O9 gauges"]
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 2, 150)}, at_rest=True, outstanding_bytes=220)]
    assert kinds(t) == []
    t.gauges = [Gauges(0.1, 3, {0: (1, 70, 1, 2, 150)}, at_rest=True, outstanding_bytes=200)]
    assert kinds(t) == ["O9 gauges"]  # (their bytes too)


def test_init_producer_id_asks_for_a_new_id_and_backs_off() -> None:
    """P2: an idempotent producer's InitProducerId asks (None, -1, -1, delivery_timeout)
    and, after an error answer, asks again no sooner than that attempt's shortest
    backoff."""
    from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest

    t = trace(True, [msg(0, offset=0)], [0])
    t.schedule = with_options(t.schedule, retry_backoff=0.1, retry_backoff_max=1.0,
                              retry_backoff_jitter=0.0)
    ask = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=5000,
                                producer_id=-1, producer_epoch=-1)
    t.init_requests = [(0.0, ask), (0.1, ask), (0.3, ask)]
    t.init_answers = [(0.0, 15), (0.1, 15), (0.3, 0)]  # (backoffs 0.1, then 0.2)
    assert kinds(t) == []
    t.init_requests[2] = (0.25, ask)
    assert kinds(t) == ["P2 InitProducerId backoff"]
    t.init_requests = [(0.0, replace(ask, transaction_timeout_ms=60000))]
    t.init_answers = []
    assert kinds(t) == ["P2 InitProducerId"]
    t.init_requests = [(0.0, ask), (0.5, ask)]  # (two ids granted, one taken)
    t.init_answers, t.idem_counts = [(0.0, 0), (0.5, 0)], (0, 0)
    assert kinds(t) == ["P2 InitProducerId"]
    t.idem_counts = (0, 1)  # (a recovery took the second)
    assert kinds(t) == []


def test_each_recovery_is_announced_once() -> None:
    """W1: one warning per recovery started (epoch bumps and new ids), and one more at
    most, for a recovery the close cut short."""
    t = trace(True, [msg(0, offset=0)], [0])
    t.epochs_started, t.recovery_warnings = (1, 1), 2
    assert kinds(t) == []
    t.recovery_warnings = 3  # (the last one's recovery never ran)
    assert kinds(t) == []
    t.recovery_warnings = 1  # a recovery nobody was told of
    assert kinds(t) == ["W1 recovery warnings"]
    t.recovery_warnings = 4  # a request that joined one under way warned again
    assert kinds(t) == ["W1 recovery warnings"]
    t.recovery_warnings = -1  # (not counted)
    assert kinds(t) == []


def test_batches_and_requests_keep_their_limits() -> None:
    """S2: at most ``max_batch_messages`` records a batch, a batch of several within
    ``batch_bytes``, a request of several batches within ``max_request_bytes``."""
    t = trace(True, [msg(0, offset=0), msg(1, offset=1), msg(2, offset=2)], [0, 1, 2])
    t.schedule = with_options(t.schedule, max_batch_messages=2, batch_bytes=16384,
                              max_request_bytes=1 << 20)
    t.produce_requests = [(0.1, wire((0, [0, 1]))), (0.2, wire((0, [2])))]
    assert kinds(t) == []
    t.produce_requests = [(0.1, wire((0, [0, 1, 2])))]
    assert kinds(t) == ["S2 batch"]
    t.schedule = with_options(t.schedule, max_batch_messages=5, batch_bytes=80)
    assert kinds(t) == ["S2 batch"]
    t.schedule = with_options(t.schedule, batch_bytes=16384, max_request_bytes=100)
    t.produce_requests = [(0.1, wire((0, [0]), (1, [1])))]
    assert kinds(t) == ["S2 request"]
    t.produce_requests = [(0.1, wire((0, [0, 1])))]  # (one batch goes alone)
    assert kinds(t) == []


def test_a_record_that_fits_the_topic_alone_is_never_refused_as_too_large() -> None:
    """S1 with the topic's own limit: MESSAGE_TOO_LARGE fails a record only if alone it
    is over the limit, or its batch's fate was unknown (never split)."""
    m = msg(0, ok=False)
    m.cause, m.attempts = "BrokerResponseError: MESSAGE_TOO_LARGE (10) big", 1
    t = trace(False, [m], [])
    t.schedule = replace(t.schedule, topic_max_message_bytes=200)
    t.attempts = [Attempt((0,), (150,), "")]
    t.answered = {m.value: [10]}
    assert kinds(t) == ["S1 broker size"]
    t.attempts = [Attempt((0,), (250,), "")]  # (alone over the limit)
    assert kinds(t) == []
    t.attempts, m.attempts = [Attempt((0,), (150,), "")], 2  # (an attempt unanswered)
    assert kinds(t) == []
    m.attempts, t.answered = 2, {m.value: [7, 10]}  # (REQUEST_TIMED_OUT: maybe written)
    assert kinds(t) == []
