"""The client under test, one run, in its own interpreter: ``python -m chaoslab.worker ...``.

Every client does the same: connect, deliver message 0 and print ``ready``; then send
keyed, sequenced messages at ``--rate`` per second (paced from the ready moment, a burst
every ``--burst`` seconds, batches of at most ``--batch-bytes``) until
the runner writes ``stop`` on stdin; close with ``--close-timeout``; write every
accepted message's outcome as JSON to ``--out``. ``heal`` on stdin marks the moment the
faults ended: the first message sent after it, and the first acknowledged, are recorded.

Message ``seq`` has key ``k<seq % keys>`` and value ``<run>:<seq>:`` plus padding, so an
independent reader can tell each record's run and place in the send order.

Clients (``--client``):

* ``pipeline``: this project's producer, idempotent (the default), acks=all;
* ``confluent``: confluent-kafka (librdkafka), ``enable.idempotence=true``; close is
  ``flush(close_timeout)``, then ``purge()`` of what is left (whose reports say so);
* ``aiokafka``: ``AIOKafkaProducer(enable_idempotence=True)``; close is ``stop()`` under
  ``close_timeout`` (aiokafka has no delivery timeout for idempotent batches);
* ``pipeline-nonidem``: the control, this producer with ``idempotent=False`` (acks=all):
  under lost responses its retries must show duplicates, or the faults did not bite;
* ``pipeline-txn``, ``confluent-txn``: the transactional clients of the transactional
  schedules (``chaoslab.txn_worker``: every message in a transaction).

A message's outcome: ``1`` acknowledged (with partition and offset; offset -1 when
unknown), ``2`` failed (with the error's name), ``0`` none (stuck). A second report for
the same message is counted in ``multi``. A message whose send raised or was cancelled
was never accepted: it is ``3`` (refused) and has no outcome to judge.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENTS = ("pipeline", "confluent", "aiokafka")
CONTROLS = ("pipeline-nonidem",)  # not run by default (see above)
NON_IDEMPOTENT = frozenset(CONTROLS)
PENDING, OK, FAILED, REFUSED = 0, 1, 2, 3
PAD = b"." * 60
TICK = 0.01  # pacing granularity, seconds


@dataclass
class Settings:
    client: str
    bootstrap: str
    topic: str
    run_id: int
    rate: int
    burst: float
    batch_bytes: int
    keys: int
    request_timeout: float
    delivery_timeout: float
    close_timeout: float
    max_seconds: float
    out: Path
    # Transactional clients only.
    txn_size: int = 0
    transaction_timeout: float = 0.0
    transactional_id: str = ""

    @property
    def max_messages(self) -> int:
        return int(self.rate * self.max_seconds) + 1


class Control:
    """``heal`` and ``stop`` from the runner, read from stdin by a daemon thread."""

    def __init__(self) -> None:
        self.heal = threading.Event()
        self.heal_at = 0.0
        self.stop = threading.Event()
        self.stop_at = 0.0
        threading.Thread(target=self._read, daemon=True, name="chaos-control").start()

    def _read(self) -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "heal":
                self.heal_at = time.monotonic()
                self.heal.set()
            elif word == "stop":
                break
        self.stop_at = time.monotonic()
        self.stop.set()  # "stop", or the runner went away (EOF)


class Record:
    """Outcomes by seq, filled by the client's callbacks."""

    def __init__(self) -> None:
        self.status = bytearray()
        self.partition = array("i")
        self.offset = array("q")
        self.acked_at = array("d")  # time.monotonic() of the acknowledgement, 0.0 if none
        self.errors: dict[str, int] = {}
        self.first_error: dict[str, str] = {}
        self.multi = 0
        self.heal_seq: int | None = None  # the first seq sent after "heal"
        self.extra: dict[str, Any] = {}

    def new(self) -> int:
        self.status.append(PENDING)
        self.partition.append(-1)
        self.offset.append(-1)
        self.acked_at.append(0.0)
        return len(self.status) - 1

    def refused(self, seq: int, name: str) -> None:
        self.status[seq] = REFUSED
        self._count(f"refused: {name}", "")

    def ok(self, seq: int, partition: int, offset: int) -> None:
        if self.status[seq] != PENDING:
            self.multi += 1
            return
        self.status[seq] = OK
        self.partition[seq] = partition
        self.offset[seq] = offset
        self.acked_at[seq] = time.monotonic()

    def failed(self, seq: int, name: str, detail: str) -> None:
        if self.status[seq] != PENDING:
            self.multi += 1
            return
        self.status[seq] = FAILED
        self._count(name, detail)

    def _count(self, name: str, detail: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1
        self.first_error.setdefault(name, detail[:300])

    def recover_s(self, heal_at: float) -> float | None:
        """Seconds from the heal to the first acknowledgement of a message sent after it."""
        if self.heal_seq is None:
            return None
        times = [t for t in self.acked_at[self.heal_seq:] if t > 0.0]
        return max(0.0, min(times) - heal_at) if times else None


def value_of(run_id: int, seq: int) -> bytes:
    return b"%d:%d:" % (run_id, seq) + PAD


def seq_of(value: bytes) -> int:
    return int(value.split(b":", 2)[1])


def due(s: Settings, t0: float) -> int:
    """How many messages should have been sent by now (message 0 is sent before t0): a
    burst of ``rate * burst`` at the start of every ``burst`` seconds."""
    bursts = int((time.monotonic() - t0) // s.burst) + 1
    return min(s.max_messages, 1 + bursts * max(1, int(s.rate * s.burst)))


def say(line: str) -> None:
    print(line, flush=True)


# --------------------------------------------------------------------------- pipeline


def run_pipeline(s: Settings, control: Control, rec: Record, *, idempotent: bool = True
                 ) -> float:
    import trio

    from pipeline import ProducerError, open_producer
    from pipeline.producer._errors import BrokerResponseError

    def cause_name(exc: ProducerError) -> str:
        cause = exc.cause
        if isinstance(cause, BrokerResponseError):
            return cause.code.name
        return type(cause).__name__

    deliveries: list[Any] = []

    async def watch_recovery() -> None:
        """The first post-heal acknowledgement, observed by awaiting in send order."""
        while rec.heal_seq is None:
            await trio.sleep(TICK)
        seq = rec.heal_seq
        while True:
            while seq >= len(deliveries):
                await trio.sleep(TICK)
            try:
                await deliveries[seq]
            except ProducerError:
                seq += 1
                continue
            rec.extra["first_post_heal_ack_seen_at"] = time.monotonic()
            return

    async def main() -> float:
        close_s = -1.0
        async with trio.open_nursery() as nursery:
            async with open_producer(
                s.bootstrap, acks="all", idempotent=idempotent, client_id=f"chaos-{s.run_id}",
                request_timeout=s.request_timeout, delivery_timeout=s.delivery_timeout,
                close_timeout=s.close_timeout, batch_bytes=s.batch_bytes,
            ) as producer:
                send = producer.send
                topic = s.topic

                async def send_one(seq: int) -> None:
                    try:
                        deliveries.append(await send(topic, value_of(s.run_id, seq),
                                                     key=b"k%d" % (seq % s.keys)))
                    except Exception as exc:  # not accepted: BufferFullError, ...
                        deliveries.append(None)
                        rec.refused(seq, type(exc).__name__)

                await send_one(rec.new())
                first = deliveries[0]
                if first is not None:
                    with trio.move_on_after(60):
                        try:
                            await first
                        except ProducerError:
                            pass
                say("ready")
                nursery.start_soon(watch_recovery)
                t0 = time.monotonic()
                limit = s.max_messages
                while not control.stop.is_set() and len(deliveries) < limit:
                    n = due(s, t0)
                    while len(deliveries) < n:
                        if rec.heal_seq is None and control.heal.is_set():
                            rec.heal_seq = len(deliveries)
                        await send_one(rec.new())
                    await trio.sleep(TICK)
                stats = producer.statistics()
                rec.extra["statistics_before_close"] = {
                    "accepted": stats.accepted, "succeeded": stats.succeeded,
                    "failed": stats.failed, "outstanding": stats.outstanding,
                }
                closing = time.monotonic()
            close_s = time.monotonic() - closing
            stats = producer.statistics()
            rec.extra["double_settles"] = stats.double_settles
            rec.multi += stats.double_settles
            idem = producer._core.idempotence
            if idem is not None:
                rec.extra["epoch_bumps"] = idem.bumps
                rec.extra["new_producer_ids"] = idem.new_ids
            nursery.cancel_scope.cancel()
        for seq, delivery in enumerate(deliveries):
            if delivery is None or not delivery.done():
                continue
            try:
                meta = delivery.result()
            except ProducerError as exc:
                rec.failed(seq, cause_name(exc), str(exc))
            else:
                if rec.status[seq] == PENDING:
                    acked_at = rec.acked_at[seq]
                    rec.ok(seq, meta.partition, meta.offset if meta.offset_known else -1)
                    rec.acked_at[seq] = acked_at  # only the recovery watcher timed acks
        seen = rec.extra.pop("first_post_heal_ack_seen_at", None)
        if seen is not None and rec.heal_seq is not None:
            rec.extra["recover_at"] = seen
        return close_s

    return trio.run(main)


# --------------------------------------------------------------------------- confluent


def run_confluent(s: Settings, control: Control, rec: Record) -> float:
    from confluent_kafka import KafkaException, Producer

    def report(err: Any, msg: Any) -> None:
        try:
            seq = seq_of(msg.value())
            if err is None:
                rec.ok(seq, msg.partition(), msg.offset())
            else:
                rec.failed(seq, err.name(), err.str())
        except Exception as exc:  # never raise into librdkafka's poll
            callback_errors.append(f"{type(exc).__name__}: {exc}")

    def on_error(err: Any) -> None:
        # Client-level errors (brokers down, fatal idempotence errors): counted.
        name = f"{'fatal ' if err.fatal() else ''}{err.name()}"
        client_errors[name] = client_errors.get(name, 0) + 1
        if err.fatal() and not fatal:
            fatal.append(err.str())

    callback_errors: list[str] = []
    client_errors: dict[str, int] = {}
    fatal: list[str] = []

    producer = Producer({
        "bootstrap.servers": s.bootstrap,
        "client.id": f"chaos-{s.run_id}",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": s.batch_bytes,
        "request.timeout.ms": int(s.request_timeout * 1000),
        "message.timeout.ms": int(s.delivery_timeout * 1000),
        "error_cb": on_error,
    })

    def send_one(seq: int) -> None:
        value = value_of(s.run_id, seq)
        for _ in range(1000):  # bounded: a full local queue is served, then retried
            try:
                producer.produce(s.topic, value, key=b"k%d" % (seq % s.keys), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.005)
            except KafkaException as exc:  # a fatal error: nothing is accepted any more
                rec.refused(seq, exc.args[0].name() if exc.args else "KafkaException")
                if not fatal:
                    fatal.append(str(exc))
                return
        else:
            rec.refused(seq, "BufferError")
            return
        producer.poll(0)

    send_one(rec.new())
    deadline = time.monotonic() + 60
    while rec.status[0] == PENDING and time.monotonic() < deadline:
        producer.poll(0.05)
    say("ready")
    t0 = time.monotonic()
    limit = s.max_messages
    while not control.stop.is_set() and len(rec.status) < limit:
        n = due(s, t0)
        while len(rec.status) < n:
            if rec.heal_seq is None and control.heal.is_set():
                rec.heal_seq = len(rec.status)
            send_one(rec.new())
        producer.poll(TICK)
    closing = time.monotonic()
    remaining = producer.flush(s.close_timeout)
    if remaining:
        # The close_timeout ran out: fail what is left (queued and in flight), as a
        # Java client's close(timeout) does; librdkafka reports each purged message.
        rec.extra["purged"] = remaining
        producer.purge()
        producer.flush(5.0)
    close_s = time.monotonic() - closing
    if fatal:
        rec.extra["fatal_error"] = fatal[0]
    if client_errors:
        rec.extra["client_errors"] = client_errors
    if callback_errors:
        rec.extra["callback_errors"] = callback_errors[:5]
    return close_s


# --------------------------------------------------------------------------- aiokafka


def run_aiokafka(s: Settings, control: Control, rec: Record) -> float:
    import asyncio

    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    async def main() -> float:
        producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap, client_id=f"chaos-{s.run_id}", acks="all",
            enable_idempotence=True, linger_ms=5, max_batch_size=s.batch_bytes,
            request_timeout_ms=int(s.request_timeout * 1000),
        )
        await asyncio.wait_for(producer.start(), 60)

        def done(seq: int, fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                rec.failed(seq, "CancelledError", "")
            elif fut.exception() is not None:
                exc = fut.exception()
                rec.failed(seq, type(exc).__name__, str(exc))
            else:
                meta = fut.result()
                rec.ok(seq, meta.partition, meta.offset)

        async def send_one(seq: int) -> None:
            try:
                fut = await producer.send(s.topic, value_of(s.run_id, seq),
                                          key=b"k%d" % (seq % s.keys))
            except asyncio.CancelledError:
                rec.refused(seq, "cancelled at stop")
                raise
            except Exception as exc:
                rec.refused(seq, type(exc).__name__)
                return
            fut.add_done_callback(lambda f, seq=seq: done(seq, f))

        async def sending() -> None:
            await send_one(rec.new())
            deadline = time.monotonic() + 60
            while rec.status[0] == PENDING and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            say("ready")
            t0 = time.monotonic()
            limit = s.max_messages
            while len(rec.status) < limit:
                n = due(s, t0)
                while len(rec.status) < n:
                    if rec.heal_seq is None and control.heal.is_set():
                        rec.heal_seq = len(rec.status)
                    await send_one(rec.new())
                await asyncio.sleep(TICK)

        task = asyncio.create_task(sending())
        while not control.stop.is_set() and not task.done():
            await asyncio.sleep(TICK)
        task.cancel()  # a send() blocked on a full batch is abandoned (not accepted)
        try:
            await task
        except asyncio.CancelledError:
            pass
        closing = time.monotonic()
        try:
            await asyncio.wait_for(producer.stop(), s.close_timeout)
        except TimeoutError:
            rec.extra["stop_timed_out"] = True
        close_s = time.monotonic() - closing
        await asyncio.sleep(0)  # let done-callbacks of the last futures run
        return close_s

    # Not asyncio.run(): its clean-up waits for every task, and a stop() cancelled
    # mid-way may leave one that never ends. The process exits right after the report.
    return asyncio.new_event_loop().run_until_complete(main())


# --------------------------------------------------------------------------- main

RUNNERS = {"pipeline": run_pipeline, "confluent": run_confluent, "aiokafka": run_aiokafka,
           "pipeline-nonidem": functools.partial(run_pipeline, idempotent=False)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaoslab.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from chaoslab.txn_worker import TXN_CLIENTS, run_txn

    parser.add_argument("--client", choices=CLIENTS + CONTROLS + TXN_CLIENTS, required=True)
    for name in ("--bootstrap", "--topic"):
        parser.add_argument(name, required=True)
    parser.add_argument("--run-id", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    for name, kind, default in (("rate", int, 1000), ("burst", float, 0.5),
                                ("batch-bytes", int, 4096), ("keys", int, 60),
                                ("request-timeout", float, 5.0),
                                ("delivery-timeout", float, 60.0),
                                ("close-timeout", float, 15.0), ("max-seconds", float, 300.0),
                                ("txn-size", int, 200), ("transaction-timeout", float, 20.0),
                                ("transactional-id", str, "")):
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args(argv)
    s = Settings(args.client, args.bootstrap, args.topic, args.run_id, args.rate, args.burst,
                 args.batch_bytes, args.keys, args.request_timeout, args.delivery_timeout,
                 args.close_timeout, args.max_seconds, args.out, args.txn_size,
                 args.transaction_timeout, args.transactional_id)
    control = Control()
    if s.client in TXN_CLIENTS:
        txn_report = run_txn(s, control)
        s.out.write_text(json.dumps(txn_report) + "\n")
        say("done")
        return 0 if "error" not in txn_report else 2
    rec = Record()
    report: dict[str, Any] = {"client": s.client}
    started = time.monotonic()
    try:
        report["close_s"] = RUNNERS[s.client](s, control, rec)
    except BaseException as exc:
        import traceback

        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-4000:]
    heal_at = control.heal_at if control.heal.is_set() else None
    recover = None
    if heal_at is not None:
        recover_at = rec.extra.pop("recover_at", None)
        recover = (max(0.0, recover_at - heal_at) if recover_at is not None
                   else rec.recover_s(heal_at))
    report.update(
        seconds=time.monotonic() - started,
        status=rec.status.hex(),
        partition=list(rec.partition),
        offset=list(rec.offset),
        errors=rec.errors,
        first_error=rec.first_error,
        multi=rec.multi,
        heal_seq=rec.heal_seq,
        recover_s=recover,
        extra=rec.extra,
    )
    s.out.write_text(json.dumps(report) + "\n")
    say("done")
    return 0 if "error" not in report else 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A client's leftover threads or tasks (a cancelled aiokafka stop(), librdkafka's
    # threads) must not keep the process alive after its report is written.
    os._exit(code)
