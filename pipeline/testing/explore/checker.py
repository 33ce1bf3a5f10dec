"""The invariants a run must keep, checked on the fake's logs and the outcomes.

Notation: *accepted* messages are those ``send()``/``send_many()`` accepted
(ledger ids give their acceptance order, which is the send order; the rows of
a columnar ``send()`` burst, ``burst.py``, are messages like any other:
their ids are their chunk's first id + their row numbers, and their outcomes
are what their ``RowDelivery`` reports);
*acknowledged* ones got a success; *failed* ones got an error. The log of a
partition is the fake broker's, record by record (values are unique, so a
record names its message).

Per partition, with idempotence (the producer's promise, as Kafka's for an
idempotent producer):

* I1 no record is written twice;
* I2 the log holds its records in send order: all of them, acknowledged or
  failed (a failed message's fate may be unknown, but if it was written it
  is in its place);
* except for a record the broker appended after it had *forgotten* this
  producer's state (a restart that lost it): Kafka (>= 2.5, KIP-360) accepts
  any sequence from a producer it has no state for, so a retry of a batch
  it had written is written again, and a later batch can overtake. No client
  can prevent that; the fake marks such records and I1/I2 exempt them;
* a failed message gets no exemption: the producer recovers by bumping its
  own epoch (KIP-360), which the broker accepts and which fences a request of
  the old epoch still on its way (INVALID_PRODUCER_EPOCH) once the new epoch
  has written to the partition, so a message whose fate was unknown is absent
  or in its place. (With a new producer id instead, such a straggler is in
  sequence for the old id and lands after later messages: that is what the
  checker catches when the local bump is disabled: docs/testing.md, "Does it
  have teeth?". On tansu, which refuses the bump, the producer falls back to new
  ids and keeps that weakness; docs/architecture.md, Recovery.)

Without idempotence (acks 1 or all, one batch per partition in flight, as
Kafka's Java client and sarama >= 1.48 guarantee it): a retry after a lost
answer can write a batch twice, so

* N1 duplicates are allowed;
* N2 the *first* copy of an acknowledged message comes before the first copy
  of every message sent after it. A failed message may be anywhere after its
  predecessors (a request the client gave up on can still be applied later:
  Kafka handles requests of a closed connection, and so does the fake).

Both modes:

* A1 every acknowledged message is in its partition's log, at the offset it
  was acknowledged with (when the broker gave one);
* A3 an acknowledged message reports its record's timestamp: on a LogAppendTime topic
  the time the broker appended the record it was acknowledged with, on a CreateTime
  topic its own create time (each record's is distinct: ``producer_options``);
* A2 every record in a log is an accepted message routed to that partition
  (nothing else reaches the wire: sarama #2150);
* O1 every accepted message is settled exactly once (``double_settles == 0``,
  none outstanding after close, no row of a ``send()`` burst settled by two
  runs, no delivery still pending after close, awaiting a delivery returns
  exactly the outcome it reports, and its ``on_delivery`` is called once,
  with that outcome), and no later than its delivery deadline (the Java client's
  promise for ``delivery.timeout.ms``: wherever it waits, in flight too, it fails
  then); every byte of ``buffer_memory`` reserved is released by the end of the close;
* M1 a chunk of rows whose last row settled lets go of what only unsettled rows need
  (its runs, a ``send()`` burst's outcomes and callbacks and its runs' packed columns,
  ``send_many``'s messages): a kept delivery holds no packed columns;
* O2 a ``flush()`` returns by its start + ``delivery_timeout`` +
  ``request_timeout``, with every message accepted before it settled (the
  ledger's own last id and, independently of it, every ``send()`` call that
  returned before ``flush()`` was called);
* O3 close returns within ``close_timeout``, plus ``request_timeout`` when
  idempotent (the bounded drain of requests on the wire);
* C1 no message fails with ProducerClosed before the close began; when the
  block ends by an error (``Schedule.abort``: no flush) without idempotence
  (no drain of requests on the wire either), every message not settled
  before the close fails with ProducerClosed (rows of a burst the dispatcher
  never took included);
* L1 once the cluster is healed and everything older has settled (``heal_at
  + delivery_timeout + request_timeout``), every message accepted no later
  than ``close_at - delivery_timeout`` (``- request_timeout`` more when the
  close flushes nothing: ``Schedule.abort``) succeeds, if ``retries >= 5`` (a
  first answer after healing may still be NOT_LEADER from stale metadata);
  with fewer retries, such a message may fail, but only after it was sent
  (a partition must not stay dead after a failure);
* S1 ``send()`` refuses a message with MessageTooLargeError exactly when its
  size bound (``batch_size_for_record``) exceeds ``max_message_bytes``; no
  batch on the wire is larger than ``max_message_bytes`` (the broker, enforcing
  the same limit, would refuse it: the producer splits a refused batch, KIP-126,
  but that costs a round trip and a retry level per split), and no message
  fails with MESSAGE_TOO_LARGE;
* P1 every record goes where its partition, key and partitioner say, or fails
  with the routing error they call for (``placement.py``);
* K1 keyless records spread as Kafka's sticky partitioner spreads them
  (KIP-480/794): ``batch_bytes`` of them (their size bounds) to one partition,
  the record that reaches it included, then another partition (``placement.py``);
* S2 no batch over ``max_batch_messages`` records or (several records)
  ``batch_bytes``, no request of several batches over ``max_request_bytes``
  (``wire_limits.py``);
* E1 a message failed with a broker's answer got it for a request holding it (not
  the answer to another batch); R1 also holds a failure with an answer idempotence
  recovers from (UNKNOWN_PRODUCER_ID, a fenced epoch, an explained
  OUT_OF_ORDER_SEQUENCE_NUMBER) to spent retries, and none fails with
  DUPLICATE_SEQUENCE_NUMBER;
* P2 InitProducerId asks for a new id and backs off between failed attempts
  (``producer_ids.py``); W1 each recovery is announced by one warning (ibid.);
* O4 / O9 ``statistics()`` counts what the outcomes and the wire say, and its gauges
  add up while the run goes on, exactly when nothing is between the stages
  (``counts.py``);
* B1 ``buffer_memory`` takes a message's bytes exactly when they fit or the buffer is
  empty (``probes_buffer.py``); a ``send()`` cancelled by its caller's timeout was not
  accepted (A2: nothing of it is written; O1: it gets no outcome);
* O7 the close's count of undelivered messages (logged) is what it failed;
* O8 every failure nobody read is named by an unobserved-failure warning by the
  end of the close, and the warnings name no failure a callback or
  ``producer.errors`` reported;
* no exception escapes the producer (a crash is a violation).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.protocol.errors import ErrorCode

from .routing import ROUTING_ERRORS
from .trace import Message, Trace

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


Invariant = Callable[[Trace], list[Violation]]
# Every invariant `check` applies to a workload's traces (`Schedule.workload`), in
# report order; a new state machine's invariants join with `invariant_of`
# (docs/testing.md, "Built to grow"), the producer's with `invariant`.
INVARIANTS: dict[str, list[Invariant]] = {}


def invariant_of(workload: str) -> Callable[[Invariant], Invariant]:
    def register(fn: Invariant) -> Invariant:
        INVARIANTS.setdefault(workload, []).append(fn)
        return fn
    return register


invariant = invariant_of("producer")


def check(trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    for fn in INVARIANTS.get(trace.schedule.workload, []):
        out += fn(trace)
    return out


@invariant
def _settled_once(trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    if trace.crash:
        out.append(Violation("crash", trace.crash.strip().splitlines()[0][:300]))
    if trace.double_settles != trace.resettled:
        out.append(Violation("O1 double settle", f"{trace.double_settles} messages settled twice"
                             + (f", {trace.resettled} of them by the resettle probe"
                                if trace.resettled else "")))
    if trace.rows_settled_twice:
        out.append(Violation("O1 double settle", f"{trace.rows_settled_twice} rows of send() "
                             "bursts settled by two runs"))
    if trace.outstanding_after_close:
        out.append(Violation("O1 unsettled", f"{trace.outstanding_after_close} messages "
                             "still outstanding after close"))
    if trace.unfreed and not trace.crash:
        out.append(Violation("M1 unfreed", f"{trace.unfreed} settled runs of rows whose "
                             "chunk settled its last row still hold its columns, runs, "
                             "outcomes or messages"))
    if trace.buffered_after_close and not trace.crash:
        out.append(Violation("O1 buffer", f"{trace.buffered_after_close} bytes of "
                             "buffer_memory still reserved after close"))
    return out


@invariant
def _guards(trace: Trace) -> list[Violation]:
    """G*: the guards' own invariants, as the probes saw them (probes.py)."""
    return [Violation(kind, detail) for kind, detail in trace.guard_violations.items()]


@invariant
def _outcomes(trace: Trace) -> list[Violation]:
    s = trace.schedule
    out: list[Violation] = []
    # id -> the earliest deadline among messages of its partition accepted up to it
    oldest: dict[int, float] = {}
    running: dict[int | None, float] = {}
    for m in sorted(trace.messages, key=lambda m: m.id):
        running[m.partition] = min(running.get(m.partition, math.inf), m.deadline)
        oldest[m.id] = running[m.partition]
    for m in trace.messages:
        what = "row" if m.row else "message"
        if m.pending:
            out.append(Violation("O1 no outcome", f"{what} #{m.index} (id {m.id}): its delivery "
                                 "is still pending after close"))
        else:
            if m.awaited and m.awaited != _outcome_of(m):
                out.append(Violation("O1 await", f"awaiting {what} #{m.index} (id {m.id}) gave "
                                     f"{m.awaited[:160]!r}, its delivery reports "
                                     f"{_outcome_of(m)[:160]!r}"))
            if m.reported is not None:
                out += _reported(m, s.option("return_successes"))
            if m.called and m.called != _outcome_of(m):
                out.append(Violation("O1 callback", f"the on_delivery of {what} #{m.index} "
                                     f"(id {m.id}) was called with {m.called[:160]!r}, its "
                                     f"delivery reports {_outcome_of(m)[:160]!r}"))
        if m.settled_at is None:
            out.append(Violation("O1 no outcome", f"{what} #{m.index} (id {m.id}) never settled"))
        elif m.settled_at > m.deadline + EPS:
            out.append(Violation("O1 late", f"message #{m.index} settled at {m.settled_at:.4f}, "
                                 f"after its delivery deadline {m.deadline:.4f}"))
        elif (m.cause.startswith("DeliveryTimeoutError") and m.settled_at < oldest[m.id] - EPS
              and not _expired_with_an_input(m, trace)):
            # A batch expires whole at its first (oldest) message's deadline, as the
            # Java client's do; nothing expires before the oldest deadline around it.
            out.append(Violation("O1 early", f"message #{m.index} failed with a delivery timeout "
                                 f"at {m.settled_at:.4f}, before its deadline {m.deadline:.4f} "
                                 "and that of every earlier message of its partition"))
    return out


def _expired_with_an_input(m: Message, trace: Trace) -> bool:
    """A ``producer.input`` message keeps the deadline it was stamped with as it entered
    the input channel, and the dispatcher may accept it after messages sent later, with
    later deadlines: m expired early with such a message of its partition, accepted after
    it, whose deadline had come (their batch's first deadline)."""
    sends = trace.schedule.sends
    return any(
        x.id > m.id and x.partition == m.partition and not x.row
        and sends[x.index].via == "input" and x.settled_at is not None
        and m.settled_at is not None and abs(x.settled_at - m.settled_at) <= EPS
        and x.deadline <= m.settled_at + EPS
        and x.cause.startswith("DeliveryTimeoutError")
        for x in trace.messages)


@invariant
def _groups(trace: Trace) -> list[Violation]:
    """O6: a send_many() (send_batch()) call's group counts its messages' (rows')
    outcomes: delivered and failed as they report, its first errors (up to 10)
    naming failed messages of the call, once each (runs of failed rows); and
    awaiting it returns once they all settled."""
    by_index = {m.index: m for m in trace.messages}
    out: list[Violation] = []
    for a in trace.attempts:
        if a.group is None:
            continue
        mine = [by_index[i] for i in a.indexes if i in by_index]
        if isinstance(a.group, str):
            out.append(Violation("O6 group", f"awaiting the send_many() of messages "
                                 f"{a.indexes[:5]}... {a.group}"))
            continue
        delivered, failed, errors = a.group
        ok = sum(m.ok for m in mine)
        bad = {m.value for m in mine if not m.ok}
        if a.rows:  # send_batch(): one error per failed run of rows
            wrong_errors = not (bool(bad) <= bool(errors) and len(errors) <= min(len(bad), 10))
        else:
            wrong_errors = len(errors) != min(len(bad), 10) or (
                len(set(errors)) != len(errors) or not set(errors) <= bad)
        if (delivered, failed) != (ok, len(bad)) or wrong_errors:
            out.append(Violation("O6 group", f"the send_many() of messages {a.indexes[:5]}... "
                                 f"counts {delivered} delivered, {failed} failed, "
                                 f"{len(errors)} errors; its messages report {ok} and "
                                 f"{len(bad)}"))
    return out[:3]


def _reported(m: Message, return_successes: bool) -> list[Violation]:
    """O5: a ``producer.input`` message's outcome comes out of ``producer.errors``
    (a failure) or ``producer.successes`` (with ``return_successes``), once; an
    outcome settled during the close is handed over only if the channel has room
    (never twice, never on the other channel)."""
    successes, errors = m.reported or (0, 0)
    want = (0, 1) if not m.ok else (1, 0) if return_successes else (0, 0)
    got = (successes, errors)
    if got == want or (m.settled_closing and got == (0, 0)):
        return []
    return [Violation("O5 reports", f"input message #{m.index} ({'ok' if m.ok else 'failed'}, "
                      f"settled at {m.settled_at}) came out of successes {successes} and errors "
                      f"{errors} times")]


def _outcome_of(m: Message) -> str:
    """The outcome as the runner writes what an await returned."""
    if not m.ok:
        return f"failed {m.cause}"
    return (f"ok {m.partition} {m.offset}" + ("" if m.offset >= 0 else " offset unknown")
            + f" at {m.timestamp}")


def _index_of(value: bytes) -> int:
    head, _, _ = value.partition(b"|")
    return int(head) if head.isdigit() else -1


@invariant
def _logs(trace: Trace) -> list[Violation]:
    s = trace.schedule
    out: list[Violation] = []
    by_index = {m.index: m for m in trace.messages}
    for p, values in sorted(trace.logs.items()):
        lost = trace.state_lost.get(p, set())
        first: dict[int, int] = {}  # message index -> position of its first copy
        for pos, value in enumerate(values):
            m = by_index.get(_index_of(value))
            if m is None or m.value != value:
                out.append(Violation("A2 phantom", f"partition {p} offset {pos}: {value[:30]!r} "
                                     "is no accepted message"))
                continue
            if m.partition != p:
                out.append(Violation("A2 wrong partition", f"message #{m.index} routed to "
                                     f"{m.partition} but written to {p} (offset {pos})"))
            if m.index in first:
                if s.idempotent and pos not in lost:
                    out.append(Violation("I1 duplicate", f"partition {p}: message #{m.index} at "
                                         f"offsets {first[m.index]} and {pos}"))
                continue
            first[m.index] = pos
        present = [by_index[i] for i in first]
        if not (s.option("acks") == 0 and trace.connections_failed):
            # (acks=0 promises the order of one connection's writes: Kafka applies what
            # it had read of a connection the client closed, after a later one's)
            out += _order(p, present, first, s.idempotent, lost)
        for m in trace.messages:
            if m.ok and m.partition == p and s.option("acks") == 0:
                if m.offset != -1:  # acks=0: written to the socket, nothing more is known
                    out.append(Violation("A1 offset", f"message #{m.index} sent with acks=0 "
                                         f"reports offset {m.offset}, not -1 (unknown)"))
            elif m.ok and m.partition == p:
                if m.index not in first:
                    out.append(Violation("A1 lost", f"message #{m.index} acknowledged "
                                         f"(offset {m.offset}) but not in partition {p}'s log"))
                elif m.offset >= 0 and (m.offset >= len(values) or values[m.offset] != m.value):
                    out.append(Violation("A1 offset", f"message #{m.index} acknowledged at "
                                         f"offset {m.offset}, found at {first[m.index]}"))
                elif (m.offset >= 0 and p in trace.log_times
                      and (s.log_append_time or not (m.row and s.sends[m.index].via == "batch"))
                      and m.timestamp != trace.log_times[p][m.offset]):
                    # (a send_batch() reports no create time per row: only counts)
                    what = "the broker appended it at" if s.log_append_time else "its record says"
                    out.append(Violation("A3 timestamp", f"message #{m.index} acknowledged "
                                         f"with timestamp {m.timestamp}; {what} "
                                         f"{trace.log_times[p][m.offset]}"))
    return out


def _order(p: int, present: list[Message], first: dict[int, int], idem: bool,
           lost: set[int]) -> list[Violation]:
    """I2 / N2 on the messages present in partition p's log.

    Message a must come before b when a's call returned before b's call
    started, or both are in one send_many() call and a is earlier in it."""
    out: list[Violation] = []
    by_start = sorted(present, key=lambda m: m.call[0])
    starts = [m.call[0] for m in by_start]
    # suffix[k]: the earliest first copy among by_start[k:]
    suffix = [(math.inf, -1)] * (len(by_start) + 1)
    for k in range(len(by_start) - 1, -1, -1):
        suffix[k] = min(suffix[k + 1], (first[by_start[k].index], k))
    calls: dict[tuple[int, int], list[Message]] = {}
    for m in present:
        calls.setdefault(m.call[:2], []).append(m)
    for m in present:
        if not (idem or m.ok):
            continue
        pos_m = first[m.index]
        earliest, k = suffix[bisect_right(starts, m.call[1])]
        overtaker = by_start[k] if earliest < pos_m else None
        if overtaker is None:
            overtaker = next((x for x in calls[m.call[:2]]
                              if x.call[2] > m.call[2] and first[x.index] < pos_m), None)
        if overtaker is not None and not (idem and {pos_m, first[overtaker.index]} & lost):
            out.append(Violation(
                "I2 reordered" if idem else "N2 reordered",
                f"partition {p}: message #{overtaker.index} (sent later) written at offset "
                f"{first[overtaker.index]}, before {'acknowledged' if m.ok else 'failed'} "
                f"message #{m.index} at {pos_m}",
            ))
            break  # one is enough; the rest usually follows from it
    return out


@invariant
def _flushes_and_close(trace: Trace) -> list[Violation]:
    s = trace.schedule
    dt, rt, ct = (s.option(n) for n in ("delivery_timeout", "request_timeout", "close_timeout"))
    out: list[Violation] = []
    for f in trace.flushes:
        if f.cut or f.end > f.start + dt + rt + EPS:
            out.append(Violation("O2 flush late", f"flush() at {f.start:.4f} returned at "
                                 f"{f.end:.4f}{' (cut)' if f.cut else ''}, bound "
                                 f"{f.start + dt + rt:.4f}"))
        if f.unsettled:
            out.append(Violation("O2 flush early", f"flush() at {f.start:.4f} returned with "
                                 f"{len(f.unsettled)} earlier messages unsettled"))
        elif f.step and not f.cut:
            # (the same, judged by the calls, not by the ledger's own last id)
            early = next((m for m in trace.messages if m.call[1] < f.step
                          and m.reported is None and not m.row
                          and (m.settled_at is None or m.settled_at > f.end + EPS)), None)
            if early is not None:
                out.append(Violation("O2 flush early", f"flush() at {f.start:.4f} returned at "
                                     f"{f.end:.4f}; message #{early.index}, sent before it, "
                                     f"settled at {early.settled_at}"))
    for m in trace.messages:
        closed = m.cause.startswith("ProducerClosed")
        if closed and m.settled_at is not None and not m.settled_closing:
            out.append(Violation("C1 closed early", f"message #{m.index} failed with "
                                 f"ProducerClosed at {m.settled_at:.4f}, before the close "
                                 f"began"))
        elif (s.abort and not s.idempotent and not closed and m.settled_closing
              and (m.settled_at is None or m.settled_at > trace.close_start + EPS)):
            # A close without flush stops the pipeline, then fails what is left:
            # a step already under way (a response read, a timer fired) ends
            # first, in the close's instant, with the message's real outcome (as
            # the Java client's sender finishes its last loop on a forced close).
            # Anything later means the pipeline ran on.
            out.append(Violation("C1 close", f"message #{m.index} unsettled when the close "
                                 f"(no flush) began at {trace.close_start:.4f} "
                                 f"{'succeeded' if m.ok else 'failed: ' + m.cause[:120]}"
                                 f" at {m.settled_at}"))
    if trace.close_start >= 0:
        if trace.close_end < 0:
            out.append(Violation("O3 close", "close never returned"))
        else:
            bound = ct + (rt if s.idempotent else 0.0)
            took = trace.close_end - trace.close_start
            if took > bound + EPS:
                out.append(Violation("O3 close", f"close took {took:.4f}s, bound {bound}s"))
    return out


@invariant
def _liveness(trace: Trace) -> list[Violation]:
    s = trace.schedule
    dt, rt = s.option("delivery_timeout"), s.option("request_timeout")
    patient = s.option("retries") >= 5
    start, end = s.heal_at + dt + rt, s.close_at - dt - (rt if s.abort else 0.0)
    out: list[Violation] = []
    for m in trace.messages:
        if start <= m.accepted_at <= end and not m.ok and not m.cause.startswith("MessageTooLarge") \
                and not (s.topic_max_message_bytes and "MESSAGE_TOO_LARGE" in m.cause) \
                and not m.cause.startswith(ROUTING_ERRORS):  # (P1 judges those)
            # sent: the producer built a request with it (a write may still fail);
            # a row's attempts are its run's, not counted: what a broker received.
            sent = m.attempts > 0 if m.attempts >= 0 else m.value in trace.sent
            if patient or not sent:
                what = "failed" if patient else "failed without ever being sent"
                out.append(Violation("L1 stuck", f"message #{m.index} accepted at "
                                     f"{m.accepted_at:.4f}, after healing, {what}: "
                                     f"{m.cause[:160]}"))
    return out[:3]


@invariant
def _sizes(trace: Trace) -> list[Violation]:
    limit = trace.schedule.max_message_bytes
    out: list[Violation] = []
    for a in trace.attempts:
        too_big = any(b > limit for b in a.bounds)
        # (a call cancelled at its first checkpoint never reached the size check)
        if too_big and a.refused not in ("MessageTooLargeError", "ProducerClosed", "Cancelled"):
            out.append(Violation("S1 size", f"sends {a.indexes} with size bounds {a.bounds} > "
                                 f"{limit} were {a.refused or 'accepted'}"))
        elif not too_big and a.refused == "MessageTooLargeError":
            out.append(Violation("S1 size", f"sends {a.indexes} with size bounds {a.bounds} <= "
                                 f"{limit} refused: {a.detail[:120]}"))
    for p, nbytes in trace.oversized[:1]:
        out.append(Violation("S1 batch size", f"a batch of {nbytes} bytes for partition {p} "
                             f"was sent, over max_message_bytes={limit}"))
    topic_limit = trace.schedule.topic_max_message_bytes
    bounds = trace.size_bounds
    for m in trace.messages:
        if "MESSAGE_TOO_LARGE" not in m.cause:
            continue
        # With the topic's own limit lower, a record alone over it is refused by
        # design, and so is a batch of unknown fate (never split: an attempt without
        # an answer, or one answered with an error after the append).
        answers = (trace.answered or {}).get(m.value, [])
        fate_known = 0 <= m.attempts <= len(answers) and not MAYBE_WRITTEN.intersection(answers)
        refused = m.cause.startswith("BrokerResponseError: MESSAGE_TOO_LARGE")
        if not topic_limit or (refused and fate_known
                               and bounds.get(m.index, topic_limit + 1) <= topic_limit):
            out.append(Violation("S1 broker size", f"message #{m.index} failed: {m.cause[:160]}"))
    return out


# Answers Kafka also gives after appending the batch, so it may be written (stated
# here apart from the producer's own ``MAYBE_WRITTEN``, which the checker judges).
MAYBE_WRITTEN = frozenset(int(code) for code in (
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))


@invariant
def _retries(trace: Trace) -> list[Violation]:
    """R1: the producer builds a request with a message at most ``retries + 1``
    times (a retry is a send that failed and went back; what only waited behind a
    failed batch spends none, and neither does a KIP-126 split), and a message that
    failed with a broker's answer the producer retries (``_retried_answer``) after a
    send spent them all, with the answer to its own last send; never with
    DUPLICATE_SEQUENCE_NUMBER (tansu's answer to a batch it has: written)."""
    s = trace.schedule
    limit = s.option("retries")
    if limit >= 2**31 - 1 or trace.crash:
        return []
    # (a scripted OUT_OF_ORDER_SEQUENCE_NUMBER that nothing explains fails its batch at once)
    scripted_gap = any(e.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER for e in s.events)
    out: list[Violation] = []
    for m in trace.messages:
        if m.attempts < 0:
            continue  # (rows: checked as runs, which a split replaces)
        allowed = limit + 1 + m.splits
        if m.attempts > allowed:
            out.append(Violation("R1 retries", f"message #{m.index} was sent {m.attempts} times "
                                 f"with retries={limit} ({m.splits} splits)"))
        elif m.cause.startswith("BrokerResponseError: DUPLICATE_SEQUENCE_NUMBER"):
            out.append(Violation("R1 retries", f"message #{m.index} failed with "
                                 f"{m.cause[:80]!r}: the broker has its batch"))
        elif (not m.ok and _retried_answer(m.cause, s.idempotent) and m.attempts != allowed
              and not (scripted_gap and m.cause.startswith(_GAP))):
            out.append(Violation("R1 retries", f"message #{m.index} failed with {m.cause[:80]!r} "
                                 f"after {m.attempts} sends, with retries={limit} "
                                 f"({m.splits} splits)"))
        if len(out) >= 3:
            break
    return out


@invariant
def _answered(trace: Trace) -> list[Violation]:
    """E1: a message that failed with a broker's answer failed with one a broker gave
    to a request holding it (its own batch's answer, not a later batch's)."""
    answered = trace.answered
    if trace.crash or answered is None:
        return []
    for m in trace.messages:
        code = _answer_code(m.cause) if not m.ok else None
        if code is not None and code not in answered.get(m.value, ()):
            return [Violation("E1 cause", f"message #{m.index} failed with {m.cause[:80]!r}; "
                              f"its batches were answered with "
                              f"{sorted(answered.get(m.value, ()))}")]
    return []


def _answer_code(cause: str) -> int | None:
    """The error code of a failure by a broker's answer (None: another failure)."""
    if not cause.startswith("BrokerResponseError: "):
        return None
    name = cause.removeprefix("BrokerResponseError: ").split(" ", 1)[0]
    code = ErrorCode.__members__.get(name)
    return None if code is None else int(code)


_GAP = "BrokerResponseError: OUT_OF_ORDER_SEQUENCE_NUMBER"


def _retried_answer(cause: str, idempotent: bool) -> bool:
    """An answer to a send that the producer retries (the batch got that far each
    time): a retriable error, and with idempotence also the ones it recovers from
    with a new epoch or producer id, and an OUT_OF_ORDER_SEQUENCE_NUMBER an earlier
    failed batch explains (the fake gives no other: G10)."""
    value = _answer_code(cause)
    if value is None:
        return False
    code = ErrorCode(value)
    return code.retriable or (idempotent and code in (
        ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER))


@invariant
def _requests(trace: Trace) -> list[Violation]:
    """P1: every Produce request says what the producer was configured to ask:
    its acks and request timeout (the broker waits that long for replication)."""
    s = trace.schedule
    acks = {"all": -1}.get(s.option("acks"), s.option("acks"))
    timeout_ms = int(s.option("request_timeout") * 1000)
    for _, request in trace.produce_requests:
        if request.acks != acks or request.timeout_ms != timeout_ms:
            return [Violation("P1 request", f"a Produce request with acks={request.acks}, "
                              f"timeout_ms={request.timeout_ms}; configured acks={acks}, "
                              f"timeout_ms={timeout_ms}")]
    return []


@invariant
def _close_report(trace: Trace) -> list[Violation]:
    """O7: the close reports what it failed: the count of undelivered messages
    it logs ("producer closed with N undelivered messages") is the number of
    messages and rows it failed with ProducerClosed."""
    if trace.close_failed is None or trace.crash:
        return []
    reported, failed = trace.close_failed
    if reported != failed:
        return [Violation("O7 close report", f"the close reports {reported} undelivered "
                          f"messages; it failed {failed}")]
    return []


@invariant
def _unobserved(trace: Trace) -> list[Violation]:
    """O8: no failure goes unseen: every failed ``send()`` whose outcome nobody
    read (the explorer never awaits a plain ``send()``'s delivery; a loop's, rows of
    columnar bursts included, only when its ``wait`` task got to it) is named by an
    unobserved-failure warning by the end of the close, unless the close itself
    failed it (and reported it so: O7); and the warnings name no more records
    than failed without an ``on_delivery`` callback or ``producer.errors``, which
    report every failure they get."""
    reported = trace.unobserved_reported
    if reported is None or trace.crash:
        return []
    s = trace.schedule
    unread = possible = 0
    for m in trace.messages:
        if m.ok or m.pending or m.cause.startswith("TransactionAbortedError"):
            continue
        send = s.sends[m.index] if m.index < len(s.sends) else None
        if send is None or m.called or send.via == "input":
            continue
        if m.cause.startswith("ProducerClosed") and m.settled_closing:
            continue  # the close reports what it fails itself (O7), not as unobserved
        possible += 1
        # (a send() loop's deliveries too, rows of its columnar bursts included, unless
        # another task read them: a callback's are skipped above)
        alone = send.via in ("send", "headers", "nowait", "timed") and not m.row
        looped = send.via == "loop" and not m.awaited
        if (alone or looped) and not m.cause.startswith("ProducerClosed"):
            unread += 1
    if reported < unread:
        return [Violation("O8 unobserved", f"{unread} failed send()s nobody read; the "
                          f"unobserved-failure warnings named {reported} records")]
    if reported > possible:
        return [Violation("O8 unobserved", f"the unobserved-failure warnings named {reported} "
                          f"records; only {possible} failed without a callback or "
                          "producer.errors")]
    return []

