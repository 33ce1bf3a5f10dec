"""The transactional clients of the chaos lab (``python -m chaoslab.worker --client
pipeline-txn|confluent-txn``): the same paced, keyed, numbered messages as the other
clients, every one inside a transaction.

The messages are cut into batches of ``--txn-size`` (batch ``b`` holds seqs
``b * size ..``); each batch is written by one transaction *attempt* (attempts are
numbered in order; a record's value is ``<run>:<seq>:<attempt>:`` plus padding, so the
judge knows which attempt wrote it). A batch's attempt ends, as the client reports it:

* ``committed``: the commit returned; the next batch follows;
* ``aborted``: the client aborted it, or reported it aborted (a commit whose answer was
  lost and that was aborted instead, an error before the commit was sent): the same
  batch is written again by the next attempt, as an application redoes its work;
* ``unknown``: the commit raised an error that leaves its outcome open (fenced, fatal):
  the batch is not written again (it may be whole or absent, never partial or twice),
  and the client is closed and opened again with the same transactional id (the new one
  fences the old and aborts what it left open).

Pacing: batch ``b`` is due ``(b - 1) * size / rate`` seconds after ``ready`` (batch 0,
the first commit); a client behind schedule runs its transactions back to back. On
``stop`` a transaction still sending is aborted (``aborted``, error ``stopped``); one
committing finishes. ``close_s`` is the close alone (no transaction is open then);
``stop_s`` from ``stop`` until closed.

Clients:

* ``pipeline-txn``: this project's producer, ``transactional_id=``,
  ``begin_transaction`` / ``send`` / ``commit_transaction`` (``abort_transaction``
  after an abortable error);
* ``confluent-txn``: confluent-kafka (librdkafka) with ``transactional.id``:
  ``init_transactions`` / ``begin_transaction`` / ``produce`` / ``commit_transaction``,
  a retriable commit error retried (bounded), ``txn_requires_abort`` aborted, a fatal
  error closing the producer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaoslab.worker import Control, Settings

__all__ = ["TXN_CLIENTS", "TxnRecord", "run_txn"]

TXN_CLIENTS = ("pipeline-txn", "confluent-txn")
COMMITTED, ABORTED, UNKNOWN, OPEN = "committed", "aborted", "unknown", "open"
PAD = b"." * 60
TICK = 0.01


def txn_value(run_id: int, seq: int, attempt: int) -> bytes:
    return b"%d:%d:%d:" % (run_id, seq, attempt) + PAD


class _Stopped(Exception):
    """``stop`` arrived while the transaction was still sending."""


class TxnRecord:
    """Transaction attempts and their reported outcomes."""

    def __init__(self) -> None:
        # [attempt, batch, first seq, count, outcome, error name, monotonic end time]
        self.txns: list[list[Any]] = []
        self.errors: dict[str, int] = {}
        self.first_error: dict[str, str] = {}
        self.extra: dict[str, Any] = {"recreated": 0}
        self.heal_attempt: int | None = None  # the first attempt begun after "heal"
        self.sent = 0

    def begin(self, batch: int, size: int) -> int:
        self.txns.append([len(self.txns), batch, batch * size, size, OPEN, "", 0.0])
        return len(self.txns) - 1

    def end(self, attempt: int, outcome: str, error: BaseException | str | None = None,
            detail: str = "") -> None:
        row = self.txns[attempt]
        if row[4] != OPEN:
            self.extra["second_outcomes"] = self.extra.get("second_outcomes", 0) + 1
            return
        name = error if isinstance(error, str) else "" if error is None else type(error).__name__
        row[4], row[5], row[6] = outcome, name, time.monotonic()
        if name:
            key = f"{outcome}: {name}"
            self.errors[key] = self.errors.get(key, 0) + 1
            self.first_error.setdefault(key, (detail or str(error))[:300])

    def recover_s(self, heal_at: float) -> float | None:
        """From the heal to the commit of the first transaction begun after it."""
        if self.heal_attempt is None:
            return None
        for row in self.txns[self.heal_attempt:]:
            if row[4] == COMMITTED:
                return max(0.0, float(row[6]) - heal_at)
        return None

    def report(self) -> dict[str, Any]:
        return {"txns": [row[:6] for row in self.txns], "errors": self.errors,
                "first_error": self.first_error, "extra": self.extra,
                "heal_attempt": self.heal_attempt, "sent": self.sent}


def _due_at(s: Settings, t0: float, batch: int) -> float:
    return t0 + max(0, batch - 1) * s.txn_size / s.rate


def _mark_heal(control: Control, rec: TxnRecord) -> None:
    if rec.heal_attempt is None and control.heal.is_set():
        rec.heal_attempt = len(rec.txns)


# --------------------------------------------------------------------------- pipeline


def run_pipeline_txn(s: Settings, control: Control, rec: TxnRecord) -> float:
    import trio

    from chaoslab.worker import say
    from pipeline import (
        KafkaError,
        ProducerFencedError,
        TransactionAbortedError,
        TransactionFatalError,
        TransactionStateError,
        open_producer,
    )

    async def one(producer: Any, batch: int) -> tuple[str, bool]:
        """One attempt at ``batch``: (its outcome, whether to open a new producer)."""
        attempt = rec.begin(batch, s.txn_size)
        phase = "begin"
        try:
            await producer.begin_transaction()
            phase = "send"
            for seq in range(batch * s.txn_size, (batch + 1) * s.txn_size):
                if control.stop.is_set():
                    raise _Stopped
                await producer.send(s.topic, txn_value(s.run_id, seq, attempt),
                                    key=b"k%d" % (seq % s.keys))
                rec.sent += 1
            phase = "commit"
            await producer.commit_transaction()
        except _Stopped:
            await producer.abort_transaction()
            rec.end(attempt, ABORTED, "stopped")
            return ABORTED, False
        except TransactionAbortedError as exc:  # the commit's answer was lost: aborted
            rec.end(attempt, ABORTED, exc)
            return ABORTED, False
        except (ProducerFencedError, TransactionFatalError) as exc:
            # Before the commit nothing could commit it; a commit's outcome is open.
            rec.end(attempt, UNKNOWN if phase == "commit" else ABORTED, exc)
            return (UNKNOWN if phase == "commit" else ABORTED), True
        except KafkaError as exc:  # abortable (a record failed, timed out, ...): abort
            try:
                await producer.abort_transaction()
            except TransactionStateError:
                pass  # nothing open any more
            except (ProducerFencedError, TransactionFatalError) as abort_error:
                rec.end(attempt, ABORTED, exc, f"{exc}; the abort: {abort_error}")
                return ABORTED, True
            rec.end(attempt, ABORTED, exc)
            return ABORTED, False
        rec.end(attempt, COMMITTED)
        return COMMITTED, False

    async def main() -> float:
        batch = 0
        t0: float | None = None
        while True:
            recreate = False
            closing = 0.0
            async with open_producer(
                s.bootstrap, transactional_id=s.transactional_id, acks="all",
                client_id=f"chaos-{s.run_id}", request_timeout=s.request_timeout,
                delivery_timeout=s.delivery_timeout, close_timeout=s.close_timeout,
                transaction_timeout=s.transaction_timeout, batch_bytes=s.batch_bytes,
            ) as producer:
                while not control.stop.is_set() and not recreate:
                    if t0 is not None:
                        while time.monotonic() < _due_at(s, t0, batch):
                            if control.stop.is_set():
                                break
                            await trio.sleep(TICK)
                        if control.stop.is_set():
                            break
                        _mark_heal(control, rec)
                    outcome, recreate = await one(producer, batch)
                    if outcome != ABORTED:
                        batch += 1
                    if t0 is None and outcome == COMMITTED:
                        say("ready")
                        t0 = time.monotonic()
                closing = time.monotonic()
            if not recreate:
                return time.monotonic() - closing
            rec.extra["recreated"] += 1

    return trio.run(main)


# --------------------------------------------------------------------------- confluent


def run_confluent_txn(s: Settings, control: Control, rec: TxnRecord) -> float:
    from confluent_kafka import KafkaException, Producer

    from chaoslab.worker import say

    client_errors: dict[str, int] = {}

    def on_error(err: Any) -> None:
        name = f"{'fatal ' if err.fatal() else ''}{err.name()}"
        client_errors[name] = client_errors.get(name, 0) + 1

    def make() -> Any:
        producer = Producer({
            "bootstrap.servers": s.bootstrap, "client.id": f"chaos-{s.run_id}",
            "transactional.id": s.transactional_id,
            "transaction.timeout.ms": int(s.transaction_timeout * 1000),
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "batch.size": s.batch_bytes, "request.timeout.ms": int(s.request_timeout * 1000),
            "message.timeout.ms": int(s.delivery_timeout * 1000), "error_cb": on_error,
        })
        producer.init_transactions(60)
        return producer

    def produce(producer: Any, seq: int, attempt: int) -> None:
        value = txn_value(s.run_id, seq, attempt)
        for _ in range(2000):  # bounded: a full local queue is served, then retried
            try:
                producer.produce(s.topic, value, key=b"k%d" % (seq % s.keys))
                break
            except BufferError:
                producer.poll(0.005)
        else:
            raise BufferError("the local queue stayed full for 10 s")
        producer.poll(0)

    def commit(producer: Any) -> None:
        """commit_transaction, retried while its error is retriable (the Java and
        librdkafka contract), up to twice the transaction timeout."""
        deadline = time.monotonic() + 2 * s.transaction_timeout
        while True:
            try:
                producer.commit_transaction(s.transaction_timeout)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise

    def abort(producer: Any) -> bool:
        """abort_transaction, retried while retriable; False if it failed otherwise."""
        deadline = time.monotonic() + 2 * s.transaction_timeout
        while True:
            try:
                producer.abort_transaction(s.transaction_timeout)
                return True
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    return False

    def one(producer: Any, batch: int) -> tuple[str, bool]:
        attempt = rec.begin(batch, s.txn_size)
        phase = "begin"
        try:
            producer.begin_transaction()
            phase = "send"
            for seq in range(batch * s.txn_size, (batch + 1) * s.txn_size):
                if control.stop.is_set():
                    raise _Stopped
                produce(producer, seq, attempt)
                rec.sent += 1
            phase = "commit"
            commit(producer)
        except _Stopped:
            ok = abort(producer)
            rec.end(attempt, ABORTED, "stopped")
            return ABORTED, not ok
        except (KafkaException, BufferError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            name = err.name() if err is not None else type(exc).__name__
            detail = err.str() if err is not None else str(exc)
            if err is not None and err.txn_requires_abort():
                ok = abort(producer)
                rec.end(attempt, ABORTED, name, detail)
                return ABORTED, not ok
            outcome = UNKNOWN if phase == "commit" else ABORTED
            if outcome == ABORTED and (err is None or not err.fatal()):
                ok = abort(producer)
                rec.end(attempt, ABORTED, name, detail)
                return ABORTED, not ok
            rec.end(attempt, outcome, f"{'fatal ' if err is not None and err.fatal() else ''}"
                    f"{name}", detail)
            return outcome, True
        rec.end(attempt, COMMITTED)
        return COMMITTED, False

    batch = 0
    t0: float | None = None
    producer = make()
    while True:
        recreate = False
        while not control.stop.is_set() and not recreate:
            if t0 is not None:
                while time.monotonic() < _due_at(s, t0, batch) and not control.stop.is_set():
                    producer.poll(TICK)
                if control.stop.is_set():
                    break
                _mark_heal(control, rec)
            outcome, recreate = one(producer, batch)
            if outcome != ABORTED:
                batch += 1
            if t0 is None and outcome == COMMITTED:
                say("ready")
                t0 = time.monotonic()
        if not recreate:
            break
        rec.extra["recreated"] += 1
        producer.purge()
        producer = make()  # fences the old one's epoch, aborts what it left open
    closing = time.monotonic()
    remaining = producer.flush(s.close_timeout)
    close_s = time.monotonic() - closing
    if remaining:
        rec.extra["unflushed_at_close"] = remaining
    if client_errors:
        rec.extra["client_errors"] = client_errors
    return close_s


RUNNERS = {"pipeline-txn": run_pipeline_txn, "confluent-txn": run_confluent_txn}


def run_txn(s: Settings, control: Control) -> dict[str, Any]:
    """Run the transactional client ``s.client``; its report (``worker.main`` adds the
    common fields)."""
    rec = TxnRecord()
    report: dict[str, Any] = {"client": s.client, "transactional": True}
    stop_at: list[float] = []
    try:
        report["close_s"] = RUNNERS[s.client](s, control, rec)
        if control.stop.is_set():
            stop_at.append(control.stop_at)
    except BaseException as exc:
        import traceback

        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-4000:]
    if stop_at and stop_at[0] > 0:
        report["stop_s"] = time.monotonic() - stop_at[0]
    open_left = [row[0] for row in rec.txns if row[4] == OPEN]
    if open_left:
        rec.extra["open_at_exit"] = open_left
    report.update(rec.report())
    heal_at = control.heal_at if control.heal.is_set() else None
    report["recover_s"] = rec.recover_s(heal_at) if heal_at is not None else None
    return report
