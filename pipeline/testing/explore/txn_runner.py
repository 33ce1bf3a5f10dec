"""The ``transactions`` workload: a transactional producer's calls against the fake
cluster's transaction coordinator, under the schedule's faults (`txn_schedule.py`).

One task makes the schedule's calls in order (``begin_transaction``, ``send``,
``send_offsets_to_transaction``, ``commit_transaction``, ``abort_transaction``), as an
application would: a commit refused as abortable is followed by an abort; a producer
that turned fenced or fatal is closed and a new one with the same transactional id
opened at its next call (a restarted service: it fences whatever took over). Each
``fence`` event runs a successor: a producer of the same transactional id opened at
that time (fencing the one running), which may commit a transaction of its own.

What each transaction was told is recorded as its outcome (`TxnRecord.outcome`):

* ``committed``: ``commit_transaction()`` returned;
* ``aborted``: ``abort_transaction()`` was called and returned or failed, or the commit
  raised ``TransactionAbortedError`` (a lost commit answer retried as an abort), or
  the producer closed with it open: never committed;
* ``failed``: the producer turned fenced or fatal before its commit was called;
* ``fenced``: the commit raised ``ProducerFencedError`` (at ``end_called``: before
  the fence that commit may already have been applied, its answer lost);
* ``unknown``: the commit raised ``TransactionFatalError`` (EndTxn unanswered).

After the close the run waits (virtual time) until the coordinator has ended every
transaction (its timeout aborts what a fatal producer left open), then reads each
partition as a read_committed reader (`committed_view`).
"""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.producer._api import Producer, open_producer
from pipeline.producer._errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionError,
    TransactionFatalError,
    TransactionStateError,
)
from pipeline.producer._message import OK, PENDING
from pipeline.protocol.api import ApiKey
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.fake.state import parse_batch_header
from pipeline.testing.fake_cluster import FakeCluster, FaultHandle

from .calls import Rows
from .clock import describe_exception
from .driver import drive_faults, fault
from .probes import Watch
from .runner import _instrument, workload
from .schedule import TOPIC, Event, Schedule, Send
from .trace import Trace, value_of
from .txn_schedule import GROUP_ID, OFFSETS_PARTITION, TRANSACTIONAL_ID

__all__ = ["Generation", "TxnBook", "TxnRecord", "committed_view"]

#: the producer options a transactional schedule may set (the shrinker may add others)
_OPTIONS = ("linger", "max_in_flight", "max_batch_messages", "retry_backoff",
            "retry_backoff_max", "request_timeout", "delivery_timeout", "close_timeout",
            "max_block", "transaction_timeout", "metadata_max_age")


@dataclass(slots=True)
class TxnRecord:
    """One transaction as its producer saw it."""

    producer: str  # "main" or "successor-<n>": whose order its records follow
    seq: int  # its place among that producer's transactions
    generation: int  # the main producer's generation (a successor: -1)
    begun_at: float
    wanted: str = ""  # "commit" / "abort": what the schedule asked
    end_called: float = -1.0  # when commit_transaction() (or the abort) was called
    outcome: str = "open"
    errors: list[str] = field(default_factory=list)
    # Its records in send order: (value, partition routed to, ok, offset, cause).
    records: list[tuple[bytes, int | None, bool, int, str]] = field(default_factory=list)
    offsets: int | None = None  # the consumer offset it committed (send_offsets...)
    abort_called: float = -1.0  # when abort_transaction() was called (-1: never)
    # Its records that succeeded after abort_transaction() was called.
    succeeded_after_abort: int = 0


@dataclass(slots=True)
class Generation:
    """One producer of the transactional id (main's successive ones, or a successor)."""

    name: str
    opened_at: float  # when its InitProducerId began (open_producer was called)
    ready_at: float = -1.0  # when it was initialised (-1: never)
    closed_at: float = -1.0
    fenced: bool = False  # some call raised ProducerFencedError
    # (time, call, the open transaction had records or offsets) of each call it made
    calls: list[tuple[float, str, bool]] = field(default_factory=list)
    # (producer id, epoch) it held at each of its calls: whose requests were its own
    epochs: set[tuple[int, int]] = field(default_factory=set)
    open_error: str = ""
    close_error: str = ""
    double_settles: int = 0
    outstanding: int = 0
    pending: int = 0  # deliveries still pending after the close
    late: int = 0  # settled after their delivery deadline
    unexpected: list[str] = field(default_factory=list)  # errors outside the documented classes
    # (time, when its transaction began or -1, text) of each TransactionFatalError raised
    fatal: list[tuple[float, float, str]] = field(default_factory=list)


@dataclass(slots=True)
class TxnBook:
    """Everything the transactional invariants read (``Trace.extra["txn"]``)."""

    txns: list[TxnRecord] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    # partition -> [(offset, value)] visible to read_committed, in offset order
    visible: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    open_at_end: list[str] = field(default_factory=list)  # partitions with an open txn
    committed_offset: int | None = None
    hung: list[str] = field(default_factory=list)
    # (arrival, producer id, epoch) of every request of a transaction the brokers got:
    # AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, transactional Produce
    txn_requests: list[tuple[float, int, int]] = field(default_factory=list)


def _options(schedule: Schedule) -> dict[str, Any]:
    opts = {k: v for k, v in schedule.options if k in _OPTIONS}
    opts.update(transactional_id=TRANSACTIONAL_ID, rng=random.Random(schedule.seed),
                timestamp_ms=lambda: 1_700_000_000_000)
    return opts


def _bound(schedule: Schedule) -> float:
    """Far beyond any wait a call may have (flush, EndTxn, backoffs): only a hang."""
    o = dict(schedule.options)
    return 3.0 * float(o["delivery_timeout"] + o["transaction_timeout"] + o["close_timeout"]
                + o["max_block"] + 2 * o["request_timeout"])


class _Client:
    """A producer generation and the transaction it has open."""

    def __init__(self, fake: FakeCluster, schedule: Schedule, book: TxnBook, trace: Trace,
                 name: str) -> None:
        self.fake, self.schedule, self.book, self.trace = fake, schedule, book, trace
        self.name = name
        self.stack = AsyncExitStack()
        self.producer: Producer | None = None
        self.gen: Generation | None = None
        self.dead = False
        self.txn: TxnRecord | None = None
        self.deliveries: list[tuple[TxnRecord, int, Any, float]] = []
        self.settled: dict[int, tuple[float, bool]] = {}
        self.seq = 0

    async def open(self, generation: int) -> bool:
        self.gen = Generation(self.name, trio.current_time())
        self.book.generations.append(self.gen)
        self.generation, self.dead, self.txn = generation, False, None
        self.deliveries = []
        try:
            self.producer = await self.stack.enter_async_context(open_producer(
                self.fake.bootstrap, connector=self.fake.connector, **_options(self.schedule)))
        except Exception as exc:  # (a TransactionError, or max_block passing)
            self.gen.open_error = describe_exception(exc).splitlines()[0][:300]
            self.gen.closed_at = trio.current_time()
            self.producer, self.dead = None, True
            self.stack = AsyncExitStack()
            return False
        self.settled = _instrument(self.producer, self.trace, Rows())
        self.gen.ready_at = trio.current_time()
        return True

    def _error(self, exc: BaseException, what: str) -> None:
        assert self.gen is not None
        text = f"{what}: {type(exc).__name__}: {exc}"[:300]
        if self.txn is not None:
            self.txn.errors.append(text)
        if isinstance(exc, ProducerFencedError):
            self.gen.fenced = True
        if isinstance(exc, TransactionFatalError):
            began = self.txn.begun_at if self.txn is not None else -1.0
            self.gen.fatal.append((trio.current_time(), began, text))
        if isinstance(exc, ProducerFencedError | TransactionFatalError):
            self.dead = True
        elif isinstance(exc, TransactionStateError) or not isinstance(
                exc, TransactionError | TransactionAbortedError):
            # (the workload makes only the calls the state allows: a state error is
            # the producer's confusion, like an error outside the documented classes)
            self.gen.unexpected.append(text)

    async def call(self, send: Send, index: int) -> None:
        """Make one of the schedule's calls (bounded: a hang is recorded)."""
        assert self.producer is not None
        assert self.gen is not None
        busy = self.txn is not None and (bool(self.txn.records) or self.txn.offsets is not None)
        self.gen.calls.append((trio.current_time(), send.via, busy))
        idem = self.producer._core.idempotence
        if idem is not None:
            self.gen.epochs.add((idem.producer_id, idem.producer_epoch))
        with trio.move_on_after(_bound(self.schedule)) as scope:
            await self._call(self.producer, send, index)
        if scope.cancelled_caught:
            self.book.hung.append(f"{self.name}: {send.via} (send #{index}) at "
                                  f"{trio.current_time():.3f}")
            self.dead = True

    async def _call(self, producer: Producer, send: Send, index: int) -> None:
        via = send.via
        if via == "begin":
            if self.txn is not None:
                return  # (a shrunk schedule lost the end of the one open)
            try:
                await producer.begin_transaction()
            except BaseException as exc:
                self._error(exc, "begin_transaction()")
                return
            self.txn = TxnRecord(self.name, self.seq, self.generation, trio.current_time())
            self.seq += 1
            self.book.txns.append(self.txn)
            return
        if self.txn is None:
            return  # (a shrunk schedule lost this transaction's begin)
        txn = self.txn
        if via == "send":
            value = value_of(index, send.size)
            try:
                delivery = await producer.send(
                    TOPIC, value, key=send.key.encode() if send.key is not None else None,
                    partition=send.partition)
            except BaseException as exc:
                self._error(exc, "send()")
                return
            self.deliveries.append((txn, len(txn.records), delivery, trio.current_time()))
            txn.records.append((value, None, False, -1, ""))
        elif via == "offsets":
            try:
                await producer.send_offsets_to_transaction({OFFSETS_PARTITION: send.size},
                                                           GROUP_ID)
                txn.offsets = send.size
            except BaseException as exc:
                self._error(exc, "send_offsets_to_transaction()")
        elif via in ("commit", "abort"):
            txn.wanted = via
            txn.end_called = trio.current_time()
            if via == "commit":
                await self._commit(producer, txn)
            else:
                await self._abort(producer, txn)
            self.txn = None

    async def _commit(self, producer: Producer, txn: TxnRecord) -> None:
        try:
            await producer.commit_transaction()
        except TransactionAbortedError as exc:
            self._error(exc, "commit_transaction()")
            txn.outcome = "aborted"
        except ProducerFencedError as exc:
            self._error(exc, "commit_transaction()")
            txn.outcome = "fenced"
        except TransactionFatalError as exc:
            self._error(exc, "commit_transaction()")
            txn.outcome = "unknown"
        except TransactionAbortableError as exc:
            self._error(exc, "commit_transaction()")
            await self._abort(producer, txn)
        except BaseException as exc:
            self._error(exc, "commit_transaction()")
            txn.outcome = "unknown"
        else:
            txn.outcome = "committed"

    async def _abort(self, producer: Producer, txn: TxnRecord) -> None:
        txn.abort_called = trio.current_time()
        try:
            await producer.abort_transaction()
        except ProducerFencedError as exc:
            self._error(exc, "abort_transaction()")
            txn.outcome = "failed"
        except BaseException as exc:
            self._error(exc, "abort_transaction()")
            txn.outcome = "aborted"
        else:
            txn.outcome = "aborted"

    async def close(self) -> None:
        gen = self.gen
        if gen is None or gen.closed_at >= 0:
            return
        if self.txn is not None and self.txn.outcome == "open":
            self.txn.outcome = "failed" if self.dead else "aborted"
        producer = self.producer
        # (Not under a cancel scope of its own: the producer's nursery was opened
        # outside it. The close is bounded by close_timeout; a hang is the run's.)
        try:
            await self.stack.aclose()
        except Exception as exc:
            if not isinstance(exc, TransactionError):
                gen.close_error = describe_exception(exc).splitlines()[0][:300]
        gen.closed_at = trio.current_time()
        self.stack = AsyncExitStack()
        if producer is None:
            return
        stats = producer.statistics()
        gen.double_settles, gen.outstanding = stats.double_settles, stats.outstanding
        for txn, pos, d, _at in self.deliveries:
            value = txn.records[pos][0]
            cause = f"{type(d._outcome).__name__}: {d._outcome}" if d._outcome else ""
            txn.records[pos] = (value, d.partition, d._state == OK, d.offset, cause)
            if d._state == PENDING:
                gen.pending += 1
            settled = self.settled.get(d._id)
            if settled is not None and settled[0] > d._deadline + 1e-9:
                gen.late += 1
            if (settled is not None and d._state == OK and txn.abort_called >= 0
                    and settled[0] > txn.abort_called + 1e-9):
                txn.succeeded_after_abort += 1
        self.producer = None


async def _main_client(fake: FakeCluster, schedule: Schedule, book: TxnBook,
                       trace: Trace) -> None:
    client = _Client(fake, schedule, book, trace, "main")
    generation = 0
    for index, send in enumerate(schedule.sends):
        await trio.sleep_until(send.at)
        if client.producer is None or client.dead:
            await client.close()
            if not await client.open(generation):
                generation += 1
                continue
            generation += 1
        await client.call(send, index)
    await trio.sleep_until(schedule.close_at)
    await client.close()


async def _successor(fake: FakeCluster, schedule: Schedule, event: Event, n: int,
                     book: TxnBook, trace: Trace) -> None:
    await trio.sleep_until(event.at)
    client = _Client(fake, schedule, book, trace, f"successor-{n}")
    if await client.open(-1):
        if event.flag:
            base = 1_000_000 * (n + 1)  # values no schedule send has
            calls = [Send(0.0, 1, 0, via="begin")]
            calls += [Send(0.0, 1, 8, partition=i % schedule.partitions)
                      for i in range(event.count)]
            calls.append(Send(0.0, 1, 0, via="commit"))
            for i, call in enumerate(calls):
                if client.dead:
                    break
                await client.call(call, base + i)
    await client.close()


@workload("transactions")
async def _transactions(schedule: Schedule, trace: Trace, watch: Watch) -> None:
    fake = FakeCluster(
        brokers=schedule.brokers, seed=schedule.seed, auto_create_topics=False,
        transaction_version=schedule.transaction_version,
        txn_marker_delay=schedule.txn_marker_delay,
    )
    book = TxnBook()
    trace.extra["txn"] = book
    async with trio.open_nursery() as root:
        await root.start(fake.run)
        fake.create_topic(TOPIC, schedule.partitions, leaders=list(schedule.leaders))
        root.start_soon(drive_faults, fake, schedule)
        try:
            async with trio.open_nursery() as users:
                fences = [e for e in schedule.events if e.kind == "fence"
                          and e.at < schedule.heal_at]
                for n, event in enumerate(fences):
                    users.start_soon(_successor, fake, schedule, event, n, book, trace)
                await _main_client(fake, schedule, book, trace)
        except Exception as exc:
            trace.crash = describe_exception(exc)
        trace.close_end = trio.current_time()
        # Wait for the coordinator to end what is open (its timeout aborts what a
        # fenced or fatal producer left) and for the markers, as a reader would.
        await trio.sleep_until(max(trio.current_time(), schedule.heal_at))
        meta = fake.txn.get(TRANSACTIONAL_ID)
        waits = int((dict(schedule.options)["transaction_timeout"] + 5.0) / 0.1)
        for _ in range(waits):  # (polled: the coordinator has no event to wait on)
            if meta is None or meta.state not in ("Ongoing", "PrepareCommit", "PrepareAbort"):
                break
            await trio.sleep(0.1)
        await trio.sleep(schedule.txn_marker_delay + 0.01)
        for p in range(schedule.partitions):
            part = fake.partition(TOPIC, p)
            book.visible[p] = committed_view(part.batches)
            trace.logs[p] = [e.record.value or b"" for e in fake.log(TOPIC, p)]
            if part.open_txns:
                book.open_at_end.append(f"partition {p}: open from offset "
                                        f"{min(part.open_txns.values())}")
        book.txn_requests = _txn_requests(fake)
        committed = fake.offsets.fetch(GROUP_ID, OFFSETS_PARTITION)
        book.committed_offset = committed.offset if committed is not None else None
        trace.end_time = trio.current_time()
        root.cancel_scope.cancel()


def _txn_requests(fake: FakeCluster) -> list[tuple[float, int, int]]:
    """(arrival, producer id, epoch) of each request of a transaction the fake received."""
    out: list[tuple[float, int, int]] = []
    for r in fake.requests:
        q = r.request
        if q is None:
            continue
        if r.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            if q.transactions:
                out += [(r.time, t.producer_id, t.producer_epoch) for t in q.transactions]
            else:
                out.append((r.time, q.v3_and_below_producer_id, q.v3_and_below_producer_epoch))
        elif r.api_key in (ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN):
            out.append((r.time, q.producer_id, q.producer_epoch))
        elif r.api_key == ApiKey.PRODUCE and q.transactional_id is not None:
            for topic in q.topic_data:
                for part in topic.partition_data:
                    if part.records:
                        header = parse_batch_header(bytes(part.records))
                        out.append((r.time, header.producer_id, header.producer_epoch))
    return out


def committed_view(batches: Any) -> list[tuple[int, bytes]]:
    """What a read_committed reader of a partition returns, (offset, value) in offset
    order: a non-transactional batch's records; a transactional batch's once a COMMIT
    marker of its producer id follows it, never once an ABORT marker does, and nothing
    at or past the first offset of a transaction still open (the last stable offset)."""
    out: list[tuple[int, bytes]] = []
    pending: dict[int, list[tuple[int, bytes]]] = {}
    for stored in batches:
        header = parse_batch_header(stored.data)
        batch = decode_record_batches(stored.data)[0]
        if header.is_control:
            # the control record's key: version (int16), type (int16; 0 abort, 1 commit)
            key = batch.records[0].key or b"\x00\x00\x00\x00"
            held = pending.pop(header.producer_id, [])
            if int.from_bytes(key[2:4], "big") == 1:
                out.extend(held)
            continue
        records = [(batch.base_offset + r.offset_delta, r.value or b"") for r in batch.records]
        if header.is_transactional:
            pending.setdefault(header.producer_id, []).extend(records)
        else:
            out.extend(records)
    stable = min((held[0][0] for held in pending.values() if held), default=None)
    return sorted(r for r in out if stable is None or r[0] < stable)


# -- the faults of the transaction coordinator (driver.FAULTS) ---------------------------

@fault("coord_move")
def _coord_move(fake: FakeCluster, e: Event) -> None:
    if fake.state.brokers[e.node].alive:
        fake.move_coordinator(TRANSACTIONAL_ID, to=e.node)


@fault("end_txn_error")
def _end_txn_error(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_next(ApiKey.END_TXN, e.code, count=e.count)


@fault("add_txn_error")
def _add_txn_error(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_next(ApiKey.ADD_PARTITIONS_TO_TXN, e.code, count=e.count)


@fault("offsets_error")
def _offsets_error(fake: FakeCluster, e: Event) -> FaultHandle:
    fake.fail_next(ApiKey.ADD_OFFSETS_TO_TXN, e.code, count=e.count)
    return fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, e.code, count=e.count)


@fault("find_error")
def _find_error(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_next(ApiKey.FIND_COORDINATOR, e.code, count=e.count)


def _lost(api: int) -> Any:
    def apply(fake: FakeCluster, e: Event) -> FaultHandle:
        if e.flag:
            return fake.drop_response_after_apply(api)
        return fake.drop_next_request(api)
    return apply


fault("end_txn_lost")(_lost(ApiKey.END_TXN))
fault("add_txn_lost")(_lost(ApiKey.ADD_PARTITIONS_TO_TXN))


@fault("fence")
def _fence(fake: FakeCluster, e: Event) -> None:
    """Run by the transactions workload (a successor producer of its own)."""
