"""partitionProducer: one task per partition; leader tracking and ordered retries.

Strategy (sarama's watermark / fin-chaser protocol, see docs/architecture.md):

Every message carries a retry *level* (how often a broker producer sent it
back). ``hwm`` is the highest level this partition is working on.

1. A message arrives at a level above ``hwm``: our broker producer failed the
   partition. Raise ``hwm`` to that level, send a ``Fin`` chaser down the old
   path (that broker producer), detach, back off, then re-attach to the
   current leader and send the message there. Leaving a broker producer that
   gave up on the partition without sending anything back, after an error that
   says the leader may be gone (``leader_changed``), works the same way, one
   level up, without a backoff: a broker producer that told us ends its retry
   state for the partition only when the chaser reaches it.
2. A message below ``hwm`` is held back in its level's buffer (this includes
   every new level-0 message while a retry is under way).
3. The ``Fin`` comes back (at ``hwm``): the old path is empty, so the held-back
   levels are sent top-down.
4. A message at ``hwm`` goes to the current broker producer.

Invariant: a message at a higher level was accepted before every pending
message at a lower level, so sending top-down keeps the partition's order.
A broker producer bounces a partition only once none of its batches is in
flight, and sends nothing more of it until the chaser arrives, so the chaser
finds nothing left there (this closes the pipelining gap, sarama #2619). We
leave a broker producer only with a chaser, and re-attach only once a
metadata refresh completes after we left; the old broker producer answers
the chaser from its intake, which runs as soon as the chaser is in its input,
and hands it straight back to us (``retry``), while a refresh needs a network
round trip, so the chaser is back first. Hence at most one chaser is ever out,
it returns at ``hwm``, and only the broker producer we are attached to can
send anything above ``hwm`` back (both asserted).

The retry back-edge is direct: a broker producer's ``retry()`` appends to a
deque and interrupts our wait for the inbox; the next pass handles the deque
(in order) with whatever the inbox holds. No forwarder task, no loopback
channel: the deque never blocks (the pipeline is a cycle; a blocking
back-edge would deadlock it), and it is bounded by ``buffer_memory`` like
every queue here, since each item is an accepted message holding its bytes.

Backoff never blocks: while backing off or waiting for a leader, the task
keeps draining its input into buffers, so other partitions never wait on this
one, and it sleeps only until the earlier of its backoff deadline and the next
delivery-timeout expiry.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._columnar.rows import record_count
from pipeline.producer._errors import DeliveryTimeoutError
from pipeline.producer._message import PENDING, ProducerMessage
from pipeline.producer._stages.envelopes import (
    BrokerItem,
    Fin,
    Handoff,
    RetryItem,
    SealedBatch,
    TopicPartition,
)

if TYPE_CHECKING:
    from pipeline.cluster.pool import RefreshRound
    from pipeline.producer._stages.context import StageContext
    from pipeline.producer._stages.ports import BrokerInbox, BrokerInboxes

log = logging.getLogger("pipeline.producer")

class RetryList(list[RetryItem]):
    """Items that came back from broker producers, handed to ``_handle`` as one
    list; anything else it is given is a list of fresh level-0 messages from
    the topic producer (the inbox carries only those)."""


Inbound = list[ProducerMessage] | RetryList


Unit = ProducerMessage | SealedBatch


class PartitionProducer:
    def __init__(
        self,
        ctx: StageContext,
        tp: TopicPartition,
        brokers: BrokerInboxes,
    ) -> None:
        self.tp = tp
        self._config = ctx.config
        self._cluster = ctx.cluster
        self._ledger = ctx.ledger
        self._idem = ctx.idempotence
        self._backoff = ctx.backoff
        self._errors = ctx.retry_errors
        self._brokers = brokers
        # Our inbox: the topic producer sends to ``inbox``; we read ``_inbox``.
        self.inbox: trio.MemorySendChannel[list[ProducerMessage]]
        self.inbox, self._inbox = trio.open_memory_channel[list[ProducerMessage]](
            ctx.config.channel_capacity)
        # The retry back-edge: broker producers append here without ever
        # blocking (the pipeline is a cycle; a blocking back-edge deadlocks it,
        # sarama wiki), then ``_wake`` us.
        self._retries: deque[RetryItem] = deque()
        # Set by ``_wake``: the next pass must not wait for the inbox. While the
        # main loop waits for it, ``_waiting`` is that wait's cancel scope.
        self._woken = False
        self._waiting: trio.CancelScope | None = None
        self.hwm = 0
        # Per level below hwm: its messages, held back until the chaser is back.
        self._levels: dict[int, list[Unit]] = {}
        self.bp: BrokerInbox | None = None
        # Messages at level ``hwm`` waiting for a leader or for the backoff.
        self._held: list[Unit] = []
        self._backoff_until = 0.0
        # False from a failure until a metadata refresh that started after it
        # completed: re-attaching earlier would pick the stale leader again.
        self._metadata_fresh = True
        self._refreshing = False
        self._round: RefreshRound | None = None  # the latest refresh asked for
        self._reroute = False  # set by leader_changed(): leave our broker producer at the next tick
        self._nursery: trio.Nursery | None = None
        self._out: list[Unit] = []  # for ``bp``, gathered during one pass
        # Items for broker producers in the order they must arrive; a Fin must
        # follow every message sent before it on the same path.
        self._outbox: list[tuple[BrokerInbox, BrokerItem]] = []

    # -- called by broker producers (sync, never blocks) --------------------
    def retry(self, items: list[RetryItem]) -> None:
        self._retries.extend(items)
        self._wake()

    def leader_changed(self) -> None:
        """Our broker producer gave up on this partition and sent nothing back
        (retries or delivery_timeout ran out), after an error that says the
        leader may be gone (no answer, NOT_LEADER, ...). It bounces the partition
        until our chaser reaches it: we leave it with one at the next tick, and
        re-attach (to it if still the leader) once metadata fresher than the
        failure is in (#294)."""
        self._reroute = True
        self._refresh_metadata()

    # -- tasks -------------------------------------------------------------
    def _wake(self) -> None:
        """Make the main loop run a pass now: interrupt its wait for the inbox."""
        self._woken = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # the metadata waiter runs here
            task_status.started()
            await self._main()
            nursery.cancel_scope.cancel()

    def _refresh_metadata(self) -> None:
        """Start one bounded metadata refresh; its end wakes us. The round is
        chosen now (the next one to start), so it is fresher than whatever made
        us ask, whenever the waiter task runs."""
        self._metadata_fresh = False
        if self._nursery is None:
            return
        try:
            self._round = self._cluster.queue_refresh([self.tp.topic])
        except KafkaError as exc:
            # The cluster client closed (it does only after the pipeline was
            # cancelled): nothing fresher will come; the cached view it is.
            log.debug("%s: no metadata refresh: %s", self.tp, exc)
            self._metadata_fresh = True
            return
        if not self._refreshing:
            self._refreshing = True
            self._nursery.start_soon(self._await_refresh)

    async def _await_refresh(self) -> None:
        """Wait for the latest round asked for: one asked for while an earlier one
        ran may have started before the failure that asked (G12)."""
        try:
            round_ = None
            while round_ is not self._round:
                round_ = self._round
                assert round_ is not None
                with trio.move_on_after(self._config.request_timeout):
                    await round_.wait()
        except Exception as exc:  # any failure: fall back to the cached view
            log.debug("%s: metadata refresh failed: %s", self.tp, exc)
        finally:
            self._refreshing = False
            self._metadata_fresh = True
            self._wake()

    async def _main(self) -> None:
        inbox = self._inbox
        retries = self._retries
        while True:
            if not self._woken:
                # Wait for the inbox until the next deadline, or until _wake.
                # A cancelled receive takes nothing out of the channel.
                first: list[ProducerMessage] | None = None
                self._waiting = wait = trio.CancelScope(deadline=self._wake_at())
                with wait:
                    try:
                        first = await inbox.receive()
                    except trio.EndOfChannel:
                        return
                self._waiting = None
                if first is not None:
                    self._handle(first)
            self._woken = False
            if retries:
                items = RetryList(retries)
                retries.clear()
                self._handle(items)
            while True:
                try:
                    more = inbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self._handle(more)
            await self._tick()

    def _wake_at(self) -> float:
        wake = math.inf
        # While a refresh runs, its completion wakes us (_wake); waiting on an
        # expired backoff instead would spin.
        if self.bp is None and self._held and self._metadata_fresh:
            wake = self._backoff_until
        head = self._oldest_deadline()
        return min(wake, head)

    def _oldest_deadline(self) -> float:
        oldest = math.inf
        if self._held:
            oldest = self._held[0]._deadline
        for buf in self._levels.values():
            if buf:
                oldest = min(oldest, buf[0]._deadline)
        return oldest

    # -- the watermark rules ----------------------------------------------
    def _handle(self, items: Inbound) -> None:
        if type(items) is not RetryList:
            # Fresh level-0 messages: the whole list follows one rule.
            if self.hwm == 0:
                if self.bp is not None:
                    self._out.extend(items)  # type: ignore[arg-type]
                else:
                    self._held.extend(items)  # type: ignore[arg-type]
            else:
                self._levels.setdefault(0, []).extend(items)  # type: ignore[arg-type]
            return
        for item in items:
            if isinstance(item, Fin):
                # Our chaser is back. It is the only one out (see the module
                # doc): we left its broker producer at this level and have not
                # raised since, because only that broker producer held anything.
                assert item.level == self.hwm, "one chaser out at a time, at hwm"
                self._flush_retry_buffers()
                continue
            level = item._level
            if level > self.hwm:
                self._raise_watermark(level)
                self._held.append(item)
            elif level < self.hwm:
                self._levels.setdefault(level, []).append(item)
            else:
                self._send_or_hold(item)

    def _raise_watermark(self, level: int, *, retry: bool = True) -> None:
        log.debug("%s: retry level %d (was %d)", self.tp, level, self.hwm)
        self._flush_out()
        if self._held:
            # Messages held at the old level now sit below the watermark.
            self._levels.setdefault(self.hwm, [])[:0] = self._held
            self._held = []
        # Only the broker producer we are attached to holds anything of the
        # partition (every one we left before returned its chaser before we
        # attached again), so only it can send something above hwm back.
        assert self.bp is not None, "a raise always has a path to chase"
        self.hwm = level
        self._outbox.append((self.bp, Fin(self.tp, level - 1)))
        self.bp = None
        if retry:
            self._backoff_until = trio.current_time() + self._backoff(level)
            self._refresh_metadata()

    def _leave_with_chaser(self) -> None:
        """Leave our broker producer after it gave up on the partition
        (``leader_changed``): like a retry, a level above ``hwm`` with a chaser
        down the old path, but no backoff (nothing failed here yet) and no second
        refresh (``leader_changed`` started one). What was gathered for it stays
        here: it would only be bounced (or failed, with retries disabled)."""
        self._held[:0] = self._out
        self._out = []
        self._raise_watermark(self.hwm + 1, retry=False)

    def _flush_retry_buffers(self) -> None:
        """The old path is drained: send every held-back level, top-down (a higher
        level was accepted before every message of a lower one)."""
        while self.hwm > 0:
            self.hwm -= 1
            for msg in self._levels.pop(self.hwm, ()):
                self._send_or_hold(msg)

    def _send_or_hold(self, msg: Unit) -> None:
        if self.bp is not None:
            self._out.append(msg)
        else:
            self._held.append(msg)

    # -- talking to the broker producer -----------------------------------
    def _flush_out(self) -> None:
        if self._out:
            assert self.bp is not None
            self._outbox.append((self.bp, Handoff(self.tp, self._out)))
            self._out = []

    async def _tick(self) -> None:
        now = trio.current_time()
        horizon = self._errors.expiry_horizon(now)  # (every deadline: a failed transaction)
        if self._oldest_deadline() <= horizon:
            self._expire(horizon)
        if self._reroute:
            self._reroute = False
            if self.bp is not None:
                self._leave_with_chaser()
        if self.bp is None and self._held and now >= self._backoff_until and self._metadata_fresh:
            await self._attach()
        if self.bp is not None:
            self._flush_out()
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            for bp, item in outbox:
                try:
                    bp.inbox.send_nowait(item)
                except trio.WouldBlock:
                    await bp.inbox.send(item)

    async def _attach(self) -> None:
        leader = self._cluster.metadata.leader_for(self.tp.topic, self.tp.partition)
        if leader is None or leader < 0:
            self._refresh_metadata()
            self._backoff_until = trio.current_time() + self._backoff(max(self.hwm, 1))
            return
        self.bp = await self._brokers.broker_producer(leader)
        held, self._held = self._held, []
        self._out.extend(held)

    def waiting(self) -> tuple[int, int]:
        """Records and bytes waiting here (for a leader, a backoff, a chaser), for
        ``producer.statistics()``: usually none, so walking them costs nothing."""
        records = nbytes = 0
        bufs: list[Iterable[RetryItem]] = [self._held, self._out, self._retries,
                                           *self._levels.values()]
        for buf in bufs:
            for unit in buf:
                if isinstance(unit, Fin):
                    continue
                if isinstance(unit, SealedBatch):
                    records += record_count(unit.messages)
                    nbytes += unit.nbytes
                else:
                    records += getattr(unit, "count", 1)  # (a RowRun: its rows)
                    nbytes += unit._size
        return records, nbytes

    def expire_all(self) -> None:
        """Fail what waits here with no outcome yet (an aborted transaction: the
        delivery-deadline path, with every deadline taken as passed)."""
        self._expire(math.inf)

    def _expire(self, now: float) -> None:
        idem = self._idem

        def split(units: list[Unit]) -> list[Unit]:
            alive = [u for u in units if u._deadline > now]
            if len(alive) != len(units):
                dead: list[ProducerMessage] = []
                for u in units:
                    if u._deadline <= now:
                        dead.extend(u.messages if isinstance(u, SealedBatch) else [u])
                        if isinstance(u, SealedBatch) and idem is not None:
                            idem.batch_failed(u, "delivery timeout")
                self._ledger.fail([m for m in dead if m._state == PENDING], self._timeout_error())
            return alive

        self._held = split(self._held)
        for level, buf in self._levels.items():
            self._levels[level] = split(buf)

    def _timeout_error(self) -> KafkaError:
        if self._errors.abort is not None or self.tp in self._errors.last:
            # (an aborted transaction's error, or: waiting to retry after a broker error)
            return self._errors.delivery_timeout_error(self.tp, None)
        return DeliveryTimeoutError(
            f"not delivered within delivery_timeout={self._config.delivery_timeout}s "
            f"(partition {self.tp.topic}[{self.tp.partition}] had no usable leader)"
        )
