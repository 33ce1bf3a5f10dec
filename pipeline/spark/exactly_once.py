"""One Spark partition, exported exactly once: transactions, a ledger, fencing.

What runs in a task when ``export_dataframe(..., exactly_once=True)``:

1. **Fence.** The task opens a transactional producer whose transactional id is the
   export id and the partition (:meth:`ExactlyOnce.transactional_id`): one id per
   partition, reused by every attempt and rerun. Its InitProducerId fences every
   earlier or concurrent attempt of the partition (a failed attempt whose process lives
   on, a speculative copy): their open transaction is aborted, a commit in progress
   completes first, and none of them can write again.
2. **Read the ledger** (:func:`pipeline.spark.ledger.read_markers`, ``read_committed``,
   after the fencing): the partition's latest marker, which says how many of its rows
   are committed. The task re-reads those rows from its input, compares their
   fingerprint with the marker's, and resumes after them; a mismatch (the partition's
   content or order changed between attempts) fails the task rather than writing rows
   twice. If nothing follows them, nothing is written.
3. **Write in transactions.** Rows go out in transactions of at most
   ``commit_interval`` seconds (and ``commit_rows`` rows, when set), each closed by
   sending the partition's marker (rows done, their fingerprint, whether the input
   ended) to the ledger, then committing (the commit waits for every row's
   acknowledgement and refuses when one failed): the marker is visible exactly when its
   rows are. A pull from Spark that outlasts the
   interval does not hold the transaction open: it commits what it has and goes on after.
4. **Fenced?** When a later attempt fenced this one (``ProducerFencedError``), this
   attempt must not succeed before the partition is done: Spark would take its result
   and kill the attempt that writes. And failing at once would make Spark start yet
   another attempt, which would fence the writer. So it waits, polling the ledger, until
   a marker says its writer's input ended; then it checks that its own input holds the
   same rows and no more, and reports the partition (else it fails: the writer's input
   was cut short, and a retry resumes).

**The end of the input is not the end of the partition.** When the computation
upstream of the export fails in Spark (a UDF raising, a lost shuffle block), PySpark
ends the Python worker's Arrow input *as if the partition were complete* (measured on
4.2: the rest of the partition never arrives, no error), and fails the task only in
the JVM. So a marker's ``complete`` only says that its attempt's input ended there: no
attempt ever skips a partition on that word alone. Every attempt re-reads its input and
writes whatever follows the committed rows; only a job that Spark finished marks the
export done (:mod:`pipeline.spark.exactly_once_job`).

Any other error fails the task (``ExportTaskError``); closing the producer aborts its
open transaction, and Spark's next attempt fences and resumes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from pipeline.spark.fingerprint import Fingerprint
from pipeline.spark.ledger import Marker, ledger_key, read_markers
from pipeline.spark.rows import _Converter, _Outcomes, _Rows, _send_rows
from pipeline.spark.status import ExactlyOnce, ExportConfig, ExportTaskError, PartitionStatus

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pipeline.producer._config import ProducerConfig

__all__ = ["export_exactly_once", "fenced_wait_bound"]


def fenced_wait_bound(transaction_timeout: float) -> float:
    """How long a fenced attempt waits for the partition's writer to make progress
    (a new marker): a live writer commits at least every ``transaction_timeout``; a
    restarted one may first re-read the rows it resumes after."""
    return max(3 * transaction_timeout, 120.0)


def _ledger_wait(transaction_timeout: float) -> float:
    """How long a task waits for open ledger transactions to be decided: a live one is
    decided within a commit, a dead one when its coordinator aborts it."""
    return transaction_timeout + 30.0


class _Fenced(Exception):
    """Internal: a later attempt of this partition took over."""

    def __init__(self, marker: Marker | None) -> None:
        super().__init__("fenced")
        self.marker = marker  # the latest committed marker this attempt knew of


async def export_exactly_once(
    batches: Iterable[pa.RecordBatch], cfg: ExportConfig, status: PartitionStatus
) -> None:
    from pipeline.producer._config import make_config

    eo = cfg.exactly_once
    assert eo is not None
    part = status.partition
    raw = eo.markers.get(part)
    before = Marker.decode(raw) if raw is not None else None
    converter = _Converter(batches, cfg, part)
    try:
        if eo.done:  # a rerun of a finished export: nothing to write
            if before is None:
                raise ExportTaskError(
                    f"export {eo.export_id!r} finished with fewer Spark partitions than "
                    f"this DataFrame has (none was committed as partition {part}): the "
                    "DataFrame changed since; export it under a new export_id")
            if eo.verify_done:
                await _verify_committed(converter, before)
            _finish(status, before, eo, before)
            status.resumed_rows = before.rows
            return
        pcfg = make_config(None, {**cfg.open_options(),
                                  "transactional_id": eo.transactional_id(part)})
        try:
            marker = await _write_partition(converter, cfg, eo, pcfg, status, before)
        except _Fenced as fenced:
            marker = await _wait_for_writer(converter, cfg, eo, pcfg, status,
                                            fenced.marker)
        _finish(status, marker, eo, before)
    finally:
        status.rows = max(status.rows, converter.rows)
        status.bytes = converter.bytes


def _finish(status: PartitionStatus, marker: Marker, eo: ExactlyOnce,
            before: Marker | None) -> None:
    """Report the partition as its latest marker says (which may have been written by
    another attempt, or by an earlier run: then every row was committed before this run,
    and the partition is ``skipped``)."""
    earlier = before.rows if before is not None else 0
    status.outcome = "skipped" if before is not None and marker.rows == earlier else "committed"
    status.committed_rows = marker.rows
    status.rows = max(status.rows, marker.rows)
    status.delivered = marker.rows - earlier
    status.writer_attempt = marker.attempt if marker.run_id == eo.run_id else -1


async def _write_partition(
    converter: _Converter, cfg: ExportConfig, eo: ExactlyOnce, pcfg: ProducerConfig,
    status: PartitionStatus, before: Marker | None,
) -> Marker:
    """Fence, read the ledger, resume, write (steps 1-3); the partition's final marker.
    Raises ``_Fenced`` when another attempt took over."""
    from pipeline.producer._api import open_producer
    from pipeline.producer._errors import ProducerFencedError

    part = status.partition
    async with open_producer(cfg.bootstrap, pcfg) as producer:  # InitProducerId: fences
        found = await read_markers(
            cfg.bootstrap, eo.ledger_topic, eo.ledger_partition, eo.ledger_start, eo.export_id,
            cluster=pcfg.cluster, wait=_ledger_wait(pcfg.transaction_timeout),
            partition=part)
        marker = before
        if part in found and found[part].newer_than(marker):
            marker = found[part]
        if marker is not None:
            await _resume_after(converter, marker, status)
        writer = _Writer(producer, converter, cfg, eo, status, marker)
        try:
            return await writer.run()
        except ProducerFencedError:
            raise _Fenced(writer.marker) from None


async def _verify_committed(converter: _Converter, marker: Marker) -> None:
    """A finished run committed the whole partition: check that this partition holds
    the same rows (count and fingerprint), so that a DataFrame or partitioning that
    changed since is refused instead of skipped."""
    got = await trio.to_thread.run_sync(converter.skip, marker.rows + 1)
    assert converter.fingerprint is not None
    if got != marker.rows or converter.fingerprint.digest() != marker.fingerprint:
        what = ("has more rows" if got > marker.rows else f"has only {got} rows"
                if got < marker.rows else "has other content or another order")
        raise ExportTaskError(
            f"export {marker.export_id!r}: Spark partition {marker.partition} was committed "
            f"whole by a finished run ({marker.rows} rows), but this run's partition {what}: "
            "the DataFrame or its partitioning changed since. Export the new data under a new "
            "export_id")


async def _resume_after(converter: _Converter, marker: Marker, status: PartitionStatus) -> None:
    """Skip the rows earlier attempts committed, checking that they are the same rows."""
    await trio.to_thread.run_sync(converter.skip, marker.rows - converter.rows)
    assert converter.fingerprint is not None
    if converter.rows < marker.rows or converter.fingerprint.digest() != marker.fingerprint:
        what = (f"has only {converter.rows} rows" if converter.rows < marker.rows
                else "has other content or another order in them")
        raise ExportTaskError(
            f"export {marker.export_id!r}: Spark partition {marker.partition} cannot resume: "
            f"earlier attempts committed its first {marker.rows} rows, but this attempt's "
            f"partition {what} (fingerprint {converter.fingerprint.digest()} != "
            f"{marker.fingerprint}). Resuming needs a deterministic partition (a file scan, "
            "a sort within partitions); nothing more was written. Those rows stay committed: "
            "make the input deterministic and export it under a new export_id")
    status.resumed_rows = marker.rows


class _Writer:
    """The transactions of one attempt (step 4 of the module docstring)."""

    def __init__(self, producer: Any, converter: _Converter, cfg: ExportConfig,
                 eo: ExactlyOnce, status: PartitionStatus, marker: Marker | None) -> None:
        self.producer = producer
        self.converter = converter
        self.cfg = cfg
        self.eo = eo
        self.status = status
        #: The latest committed marker of the partition (None: nothing committed yet).
        self.marker = marker
        self.key = ledger_key(eo.export_id, status.partition)
        self.fault_at = cfg.fail_first_attempt_after_rows if status.attempt == 0 else None
        self._pending: list[_Rows] = []
        self._done = False  # the partition has no more rows

    async def run(self) -> Marker:
        from pipeline.util.groups import unwrap_single_errors

        with unwrap_single_errors():
            return await self._run()

    async def _run(self) -> Marker:
        async with trio.open_nursery() as nursery:
            send, receive = trio.open_memory_channel[list[_Rows] | None](1)
            nursery.start_soon(self._prefetch, send)
            while True:
                if not self._pending and not self._done:
                    await self._take(await receive.receive())
                if self._done and not self._pending and self.marker is not None and (
                        self.marker.complete):
                    return self.marker  # the committed rows were all of them: no write
                marker = await self._transaction(receive)
                if marker.complete:
                    nursery.cancel_scope.cancel()
                    return marker

    async def _prefetch(self, send: trio.MemorySendChannel[list[_Rows] | None]) -> None:
        """Pull chunks from Spark off the event loop, one ahead of the sender."""
        async with send:
            while True:
                chunk = await trio.to_thread.run_sync(self.converter.next_chunk)
                await send.send(chunk)
                if chunk is None:
                    return

    async def _take(self, chunk: list[_Rows] | None) -> None:
        if chunk is None:
            self._done = True
        else:
            self._pending.extend(chunk)

    async def _transaction(self, receive: trio.MemoryReceiveChannel[list[_Rows] | None],
                           ) -> Marker:
        """One transaction: rows until the interval, ``commit_rows`` or the end of the
        partition, then the marker, then the commit. Returns the committed marker."""
        from pipeline.producer._errors import TransactionAbortableError

        producer, eo = self.producer, self.eo
        outcomes = _Outcomes()
        await producer.begin_transaction()
        deadline = trio.current_time() + eo.commit_interval
        last = self.marker
        end, digest = ((last.rows, last.fingerprint) if last is not None
                       else (0, Fingerprint().digest()))
        sent = 0
        try:
            while True:
                boundary = False
                while self._pending and not boundary:
                    rows = self._pending.pop(0)
                    await self._send(rows, outcomes)
                    sent += len(rows)
                    end, digest = rows.end, rows.digest
                    boundary = eo.commit_rows is not None and end % eo.commit_rows == 0
                outcomes.fold()
                if outcomes.failed or self._done or trio.current_time() >= deadline:
                    break
                if self._pending:  # (a commit_rows boundary with rows after it)
                    break
                # Nothing pending: wait for more rows, but only until the deadline. At a
                # commit_rows boundary this only learns whether the partition ended (so
                # that the marker can say complete).
                with trio.move_on_at(deadline):
                    await self._take(await receive.receive())
                if boundary or not (self._pending or self._done):
                    break  # the boundary, or the deadline passed first
            # No wait for the rows' acknowledgements here: the commit flushes them, and
            # refuses when one failed, and stops waiting as soon as the transaction
            # became abortable (a fenced epoch, say), whose rows the producer would
            # otherwise retry until their delivery_timeout.
            complete = self._done and not self._pending
            marker = Marker(
                export_id=eo.export_id, partition=self.status.partition,
                rows=end, fingerprint=digest, complete=complete,
                chunks=(last.chunks if last is not None else 0) + 1, topic=self.cfg.topic,
                run_id=eo.run_id, attempt=self.status.attempt, at=time.time())
            await producer.send(eo.ledger_topic, marker.encode(), key=self.key,
                                partition=eo.ledger_partition)
            await producer.commit_transaction()
        except TransactionAbortableError as exc:
            outcomes.fold()
            cause: BaseException = exc
            if outcomes.failed:  # the rows' own errors say more than the commit's refusal
                cause = TransactionAbortableError(
                    f"{outcomes.failed} row(s) were not delivered; first error: "
                    f"{outcomes.first_error}")
            await self._abort(cause)
        self.marker = marker
        self.status.transactions += 1
        self.status.delivered += sent
        return marker

    async def _send(self, rows: _Rows, outcomes: _Outcomes) -> None:
        if self.fault_at is not None and rows.end >= self.fault_at:
            head = len(rows) - (rows.end - self.fault_at)
            if head > 0:
                await _send_rows(self.producer, rows.slice(0, head), self.cfg.topic, outcomes)
            await outcomes.wait_all()
            raise ExportTaskError(
                f"injected fault: Spark partition {self.status.partition} attempt 0 failed on "
                f"purpose after {self.fault_at} rows")
        await _send_rows(self.producer, rows, self.cfg.topic, outcomes)

    async def _abort(self, cause: BaseException) -> NoReturn:
        """The transaction cannot commit: abort it (a fenced producer raises
        ``ProducerFencedError`` here), then fail the task; the next attempt resumes
        after the last committed marker."""
        from pipeline.producer._errors import TransactionTimedOutError

        await self.producer.abort_transaction()
        advice = ""
        if isinstance(cause, TransactionTimedOutError):
            advice = (" (lower commit_interval, or raise transaction_timeout up to the "
                      "broker's transaction.max.timeout.ms)")
        raise ExportTaskError(
            f"export {self.eo.export_id!r}: Spark partition {self.status.partition} (attempt "
            f"{self.status.attempt}): the transaction was aborted: {cause}{advice}; a retry "
            f"resumes after the {self.marker.rows if self.marker else 0} rows committed "
            "before it")


async def _wait_for_writer(converter: _Converter, cfg: ExportConfig, eo: ExactlyOnce,
                           pcfg: ProducerConfig, status: PartitionStatus,
                           current: Marker | None) -> Marker:
    """Step 4: another attempt owns the partition. Once a marker says its input ended,
    check that this attempt's input holds those rows and no more; then they are the
    partition."""
    part = status.partition
    bound = fenced_wait_bound(pcfg.transaction_timeout)
    progress_at = trio.current_time()
    while current is None or not current.complete:
        if trio.current_time() - progress_at > bound:
            raise ExportTaskError(
                f"export {eo.export_id!r}: Spark partition {part} (attempt {status.attempt}) "
                f"was fenced by another attempt of the partition, which then committed "
                f"nothing for {bound:.0f}s")
        await trio.sleep(0.5)
        found = await read_markers(
            cfg.bootstrap, eo.ledger_topic, eo.ledger_partition, eo.ledger_start, eo.export_id,
            cluster=pcfg.cluster, wait=_ledger_wait(pcfg.transaction_timeout),
            partition=part)
        newer = found.get(part)
        if newer is not None and newer.newer_than(current):
            current, progress_at = newer, trio.current_time()
    if converter.rows <= current.rows:
        await _resume_after(converter, current, status)
        if await trio.to_thread.run_sync(converter.skip, 1) == 0:
            status.resumed_rows = 0
            return current
    raise ExportTaskError(
        f"export {eo.export_id!r}: Spark partition {part} (attempt {status.attempt}) was "
        f"fenced by another attempt, whose input ended after {current.rows} rows, but this "
        "attempt's input has more: that attempt's input was cut short (its task fails); a "
        "retry resumes after the committed rows")
