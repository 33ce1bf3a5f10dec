"""What one run of a schedule did (`Trace`), as the checker reads it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .schedule import Schedule

__all__ = ["Attempt", "Flush", "Message", "Trace", "value_of"]


@dataclass(slots=True)
class Message:
    """One accepted message and its outcome."""

    index: int  # position in Schedule.sends
    id: int  # ledger id: acceptance order
    value: bytes
    accepted_at: float
    deadline: float
    # The send()/send_many() call that accepted it: when it started and returned
    # (a global step counter) and the message's place in it. Calls that overlap
    # (two sources at once) have no order between them; a call that returned
    # before another started comes first.
    call: tuple[int, int, int] = (0, 0, 0)
    partition: int | None = None
    ok: bool = False
    offset: int = -1
    timestamp: int = -1  # an acknowledged message's, as its delivery reports it
    cause: str = ""
    settled_at: float | None = None
    settled_closing: bool = False  # settled once the close had begun
    # A row of a columnar send() burst (a RowDelivery: its outcome read from
    # the burst, not set on a message by the ledger).
    row: bool = False
    # The delivery still said "pending" after the close (its settle was never
    # recorded where it reads its outcome).
    pending: bool = False
    # What awaiting the delivery returned ("ok <partition> <offset>" or "failed
    # <cause>"), when a "wait" loop awaited it; "" if not awaited.
    awaited: str = ""
    # What its on_delivery callback was called with, each call ("; "-joined, in
    # the awaited form), when a "callback" loop passed one; "" if none.
    called: str = ""
    # A producer.input message: how often it came out of producer.successes and
    # producer.errors (None: not sent that way).
    reported: tuple[int, int] | None = None
    # How many requests the producer built with it (its attempts, also those never
    # received), and how often a batch holding it was split (KIP-126); -1: not
    # counted (a row: its run may be split into new runs).
    attempts: int = -1
    splits: int = 0


@dataclass(slots=True)
class Attempt:
    """One send()/send_many() call, for the size-limit check."""

    indexes: tuple[int, ...]
    bounds: tuple[int, ...]  # batch_size_for_record of each message
    refused: str  # exception type name, "" if accepted
    detail: str = ""
    # A send_many() call: what awaiting its group gave, (delivered, failed, the
    # values of the messages its first errors name), or "never returned".
    group: tuple[int, int, tuple[bytes, ...]] | str | None = None
    rows: bool = False  # a send_batch() call: its errors name runs of rows


@dataclass(slots=True)
class Flush:
    start: float
    end: float
    last_id: int  # the last id accepted when flush() was called
    unsettled: tuple[int, ...]  # ids <= last_id still unsettled when it returned
    cut: bool  # the explorer gave up waiting (the checker reports how late it was)
    # The call step when flush() was called: a send() call that returned before
    # it (Message.call[1] < step) was accepted before it (0: not recorded).
    step: int = 0


@dataclass(frozen=True, slots=True)
class Gauges:
    """``statistics()`` read at ``at``: the records not settled yet (accepted -
    succeeded - failed), and per partition (queued messages, queued bytes, batches in
    flight, their messages, their bytes)."""

    at: float
    unsettled: int
    partitions: dict[int, tuple[int, int, int, int, int]]
    # Nothing was between the stages (runner._at_rest): every record not settled was
    # queued or in flight at a partition.
    at_rest: bool = False
    # The most Produce requests one broker producer had on the wire.
    requests: int = 0
    # The size bounds of the records the ledger waits for (-1: rows among them).
    outstanding_bytes: int = -1


@dataclass
class Trace:
    schedule: Schedule
    messages: list[Message] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    logs: dict[int, list[bytes]] = field(default_factory=dict)
    # Each logged record's timestamp (its batch's max on a LogAppendTime topic).
    log_times: dict[int, list[int]] = field(default_factory=dict)
    # Values of every record some Produce request carried (filled only when a
    # message accepted after healing failed: L1 asks whether it was ever sent).
    sent: set[bytes] = field(default_factory=set)
    # Each record value's error codes in the Produce answers the fake wrote for it, one
    # per answer (recorded only when a message failed with a broker's answer: E1; None: not).
    answered: dict[bytes, list[int]] | None = None
    # The Produce requests the fake received, (arrival time, request).
    produce_requests: list[tuple[float, Any]] = field(default_factory=list)
    # The InitProducerId requests the fake received, (arrival time, request), and the
    # answers it wrote, (when, error code).
    init_requests: list[tuple[float, Any]] = field(default_factory=list)
    init_answers: list[tuple[float, int]] = field(default_factory=list)
    # (partition, bytes) of every batch a Produce request carried over max_message_bytes
    oversized: list[tuple[int, int]] = field(default_factory=list)
    # {partition: offsets of records the broker appended after it had forgotten
    # the producer's state (Kafka accepts any sequence then)}
    state_lost: dict[int, set[int]] = field(default_factory=dict)
    flushes: list[Flush] = field(default_factory=list)
    close_start: float = -1.0
    close_end: float = -1.0
    double_settles: int = 0
    resettled: int = 0  # messages the resettle probe settled a second time
    rows_settled_twice: int = 0  # rows of send() bursts in two settled runs
    # Runs of rows whose chunk settled its last row yet still holds its columns, runs,
    # outcomes or messages (runner._unfreed): memory kept past the last outcome.
    unfreed: int = 0
    outstanding_after_close: int = 0
    buffered_after_close: int = 0
    crash: str = ""
    # What the probes saw (probes.py): guards reached, and the guards' own
    # invariants broken (kind -> the first case).
    reached: Counter[str] = field(default_factory=Counter)
    guard_violations: dict[str, str] = field(default_factory=dict)
    # The ledger's own counts (statistics()), against the outcomes seen.
    counted: tuple[int, int, int, int] = (0, 0, 0, 0)  # accepted, succeeded, failed, requests
    callback_errors: int = 0  # statistics().callback_errors: on_delivery calls that raised
    callbacks_raised: int = 0  # the on_delivery calls that raised (calls.raises)
    # Sends a send_many() took on its columnar path (a run of rows, as a send_batch()'s
    # rows: K1 does not judge them).
    columnar: set[int] = field(default_factory=set)
    # What the probes counted (probes_counts.py): Produce requests written, and the
    # outcomes the close logged as not handed over (-1: not counted).
    produce_written: int = -1
    lost_reports: int = -1
    connections_failed: int = 0  # client connections closed or lost (probes_counts)
    # statistics() after the close, per partition (-1: records failed before one was
    # chosen): (failed_messages, delivered_messages).
    partition_counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    # and (batches, retries, retried_messages, delivered_bytes) per partition.
    wire_counts: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    # statistics() read while the run goes on (`Gauges`), at the instants of sends,
    # faults and flushes.
    gauges: list[Gauges] = field(default_factory=list)
    # Idempotence's own counts of (epochs bumped, new producer ids) (None: not
    # idempotent), and the ones the probes saw start.
    idem_counts: tuple[int, int] | None = None
    epochs_started: tuple[int, int] = (0, 0)
    # The producer's warnings that a recovery starts (-1: not counted).
    recovery_warnings: int = -1
    # What the close's fail_all_outstanding returned (the count it logs) and how
    # many messages and rows it settled; None: it never ran.
    close_failed: tuple[int, int] | None = None
    # Records the unobserved-failure warnings named (Unobserved.reported); None:
    # not recorded.
    unobserved_reported: int | None = None
    end_time: float = 0.0
    # What another workload records for its own invariants (runner.WORKLOADS).
    extra: dict[str, Any] = field(default_factory=dict)
    steps: int = 0  # the call step counter
    # received()'s decoding, kept with the request list it decoded
    _received: tuple[Any, int, list[tuple[float, list[tuple[int, int, list[bytes]]]]]] | None = \
        field(default=None, repr=False, compare=False)

    def step(self) -> int:
        self.steps += 1
        return self.steps

    @property
    def size_bounds(self) -> dict[int, int]:
        """Each send's size bound (``batch_size_for_record``), by its index."""
        return {i: b for a in self.attempts for i, b in zip(a.indexes, a.bounds, strict=True)}

    def received(self) -> list[tuple[float, list[tuple[int, int, list[bytes]]]]]:
        """The Produce requests the fake received, decoded once for the invariants that
        read them (again only when ``produce_requests`` is replaced): (arrival time, per
        batch: (partition, its partition data's bytes, the values of its records))."""
        from pipeline.protocol.batch_decoder import decode_record_batches

        requests = self.produce_requests
        memo = self._received
        if memo is not None and memo[0] is requests and memo[1] == len(requests):
            return memo[2]
        out: list[tuple[float, list[tuple[int, int, list[bytes]]]]] = []
        for at, request in requests:
            parts: list[tuple[int, int, list[bytes]]] = []
            for topic in request.topic_data:
                for part in topic.partition_data:
                    raw = bytes(part.records or b"")
                    for batch in decode_record_batches(raw):
                        parts.append((part.index, len(raw), [r.value or b"" for r in batch.records]))
            out.append((at, parts))
        self._received = (requests, len(requests), out)
        return out

    @property
    def rows(self) -> int:
        """Accepted messages that were rows of a columnar send() burst."""
        return sum(m.row for m in self.messages)

    def fingerprint(self) -> tuple[Any, ...]:
        """Everything observable, to check that a replay is identical."""
        return (
            tuple((m.id, m.index, m.partition, m.ok, m.offset, m.cause, m.settled_at, m.row,
                   m.awaited, m.called) for m in self.messages),
            tuple((a.indexes, a.refused) for a in self.attempts),
            tuple(sorted(self.logs.items())),
            tuple((f.start, f.end, f.unsettled) for f in self.flushes),
            self.close_start, self.close_end, self.crash, self.end_time,
        )


def value_of(index: int, size: int) -> bytes:
    """A unique value of at least `size` bytes: the log tells messages apart by it."""
    head = b"%d|" % index
    return head + b"." * max(0, size - len(head))
