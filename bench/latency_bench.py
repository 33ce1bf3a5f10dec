"""Send-to-ack latency at a paced rate: pipeline beside confluent-kafka.

    python -m bench.latency_bench [--rate 20000] [--seconds 5] [--rounds 3] [--quick]
                                  [--broker tansu|kafka] [--json PATH]
    python -m bench latency          # (make bench) the defaults

Each client sends 100-byte values (no key) at a paced ``rate`` (default 20k msg/s) for
``seconds`` to a fresh 6-partition topic, acks=all, idempotent, linger 5 ms, and records
per message the time from the send call to its acknowledgement, on one clock
(``time.perf_counter``) in both clients:

* pipeline: ``await producer.send()``; each pacing step's deliveries are awaited by a
  task of their own (the awaited result): every wake-up stamps all of that step's
  settled deliveries with the same instant (no checkpoint per message, and a delivery
  that settles before an older one, on another partition, is not held back behind
  it), and drops them, as a user would (a million live ``Delivery`` objects would bill
  the producer for the GC passes over them);
* pipeline-callback: ``await producer.send(..., on_delivery=cb)``, the callback stamping
  its message when the producer settles it (as confluent-kafka's below: the same way of
  learning of the acknowledgement, without a task of the caller's in between);
* confluent-kafka: ``produce(on_delivery=cb)``; the pacing loop waits in ``poll()``, so
  delivery callbacks run as soon as librdkafka queues them.

Pacing: message ``i`` is due at ``start + i / rate``; the loop sends every message that is
due, then waits until the next one is due (trio: ``sleep_until``; confluent: ``poll``). Its
accuracy is measured and reported: the achieved rate, and how late each send was against
its schedule. Every run is a fresh interpreter (as in the producer bench); the clients
alternate (round 1: both, round 2: both, ...); the broker is shared by all runs and the
count that landed is checked. Target: pipeline's p99 <= linger + 5 ms, for each of its two
ways of hearing of the acknowledgement.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.brokers import add_broker_argument, open_broker

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_JSON = BENCH_DIR / "results" / "latency.json"

RATE = 20_000
SECONDS = 5.0
QUICK_SECONDS = 2.0
ROUNDS = 3
LINGER_MS = 5
PARTITIONS = 6
VALUE = b"v" * 100
TARGET_MS = LINGER_MS + 5
CLIENTS = ("pipeline", "pipeline-callback", "confluent")
LABELS = {"pipeline": "pipeline await send() + awaited deliveries",
          "pipeline-callback": "pipeline await send(on_delivery=)",
          "confluent": "confluent-kafka produce() + delivery callback"}
#: the percentiles reported (and drawn)
POINTS = (50, 90, 95, 99, 99.9)


# =========================================================================== the clients


def _succeeded(delivery: Any) -> bool:
    from pipeline.producer._errors import ProducerError

    try:
        delivery.result()
    except ProducerError:
        return False
    return True


def _pipeline(bootstrap: str, topic: str, n: int, rate: float, *, callbacks: bool = False
              ) -> tuple[list[float], list[float], list[float]]:
    """(scheduled, sent, acked) perf_counter times per message; acked 0.0 if it failed.
    ``callbacks``: each message stamped by its ``on_delivery`` (no watching tasks)."""
    import trio

    from pipeline.producer._api import open_producer
    from pipeline.producer._errors import ProducerError

    perf = time.perf_counter
    scheduled = [0.0] * n
    sent = [0.0] * n
    acked = [0.0] * n

    async def watch(burst: list[Any]) -> None:
        """Await one pacing step's deliveries: each wake-up stamps *every* settled one
        of them with that instant, so one settling before an older one is not held back
        behind it; then await the oldest still pending. Nothing kept once settled."""
        while burst:
            now = perf()
            pending = []
            for k, d in burst:
                if d.done():
                    # what awaiting it gives: the metadata, or the error
                    acked[k] = now if _succeeded(d) else 0.0
                else:
                    pending.append((k, d))
            burst = pending
            if burst:
                try:
                    await burst[0][1]
                except ProducerError:
                    pass

    async def pace(due: float) -> None:
        """Wait until ``due`` (perf_counter time), and at least 1 ms: as the confluent
        loop's ``poll`` and as epoll's whole-ms timeouts would anyway. Without the
        floor, ``sleep_until`` returns on the run loop's next pass whenever another
        task is runnable, so the loop sent a message or two per pass and woke every
        stage for each: measured, ~3,000 passes a second and a whole core at 20k
        msg/s, where confluent's loop sends ~20 messages per ms."""
        now = perf()
        await trio.sleep(max(due - now, 0.001))

    def stamp(k: int, error: Any) -> None:
        acked[k] = perf() if error is None else 0.0

    async def main() -> None:
        async with open_producer(bootstrap, acks="all", idempotent=True,
                                 linger=LINGER_MS / 1000) as producer:
            await producer.send_and_wait(topic, VALUE)  # connect, producer id, metadata
            async with trio.open_nursery() as nursery:
                send = producer.send
                start = perf() + 0.01
                i = 0
                while callbacks and i < n:
                    due = min(n, int((perf() - start) * rate) + 1)
                    while i < due:
                        scheduled[i] = start + i / rate
                        sent[i] = perf()
                        await send(topic, VALUE, on_delivery=lambda meta, err, i=i: stamp(i, err))
                        i += 1
                    if i < n:
                        await pace(start + i / rate)
                while i < n:
                    due = min(n, int((perf() - start) * rate) + 1)
                    if due > i:
                        burst = []
                        while i < due:
                            scheduled[i] = start + i / rate
                            sent[i] = perf()
                            burst.append((i, await send(topic, VALUE)))
                            i += 1
                        nursery.start_soon(watch, burst)
                    if i < n:
                        await pace(start + i / rate)
            await producer.flush()

    trio.run(main)
    return scheduled, sent, acked


def _confluent(bootstrap: str, topic: str, n: int, rate: float
               ) -> tuple[list[float], list[float], list[float]]:
    from confluent_kafka import KafkaException, Producer

    perf = time.perf_counter
    scheduled = [0.0] * n
    sent = [0.0] * n
    acked = [0.0] * n
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": LINGER_MS})
    producer.produce(topic, VALUE)  # connect, producer id, metadata
    if producer.flush(30):
        raise KafkaException("warm-up message not delivered within 30 s")

    def on_delivery(i: int, err: Any, msg: Any) -> None:
        acked[i] = perf() if err is None else 0.0

    produce, poll = producer.produce, producer.poll
    start = perf() + 0.01
    i = 0
    while i < n:
        due = min(n, int((perf() - start) * rate) + 1)
        while i < due:
            scheduled[i] = start + i / rate
            sent[i] = perf()
            produce(topic, VALUE, on_delivery=lambda err, msg, i=i: on_delivery(i, err, msg))
            i += 1
        wait = start + i / rate - perf()
        # As trio's sleep_until (epoll rounds a timeout up to whole ms): wait at least
        # 1 ms when the next send is not due yet; poll() returns early to run callbacks.
        poll(max(wait, 0.001) if wait > 0 and i < n else 0)
    if producer.flush(60):
        raise KafkaException("flush left messages undelivered")
    return scheduled, sent, acked


RUNNERS: dict[str, Callable[[str, str, int, float], tuple[list[float], list[float], list[float]]]]
RUNNERS = {"pipeline": _pipeline, "confluent": _confluent,
           "pipeline-callback": lambda *args: _pipeline(*args, callbacks=True)}


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize_latencies(scheduled: list[float], sent: list[float], acked: list[float]
                        ) -> dict[str, Any]:
    lat = sorted((a - s) * 1000 for s, a in zip(sent, acked, strict=True) if a > 0)
    late = sorted((s - d) * 1000 for d, s in zip(scheduled, sent, strict=True))
    n = len(sent)
    span = sent[-1] - sent[0] if n > 1 else 0.0
    out: dict[str, Any] = {
        "messages": n, "acked": len(lat), "failed": n - len(lat),
        "achieved_rate": (n - 1) / span if span > 0 else None,
        "send_span_s": span,
        "latency_ms": {f"p{p:g}": _percentile(lat, p) for p in POINTS} if lat else {},
        "schedule_lateness_ms": {"p50": _percentile(late, 50), "p99": _percentile(late, 99),
                                 "max": late[-1]},
    }
    if lat:
        out["latency_ms"].update(mean=statistics.fmean(lat), max=lat[-1], min=lat[0])
        out["latency_curve_ms"] = [_percentile(lat, p) for p in range(1, 100)] + [
            _percentile(lat, 99.5), _percentile(lat, 99.9)]
    return out


def worker(client: str, bootstrap: str, topic: str, n: int, rate: float, out: Path) -> int:
    import resource

    report: dict[str, Any] = {"client": client, "topic": topic, "rate": rate}
    try:
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        scheduled, sent, acked = RUNNERS[client](bootstrap, topic, n, rate)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        report.update(summarize_latencies(scheduled, sent, acked))
        report["cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        code = 0
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        code = 2
    out.write_text(json.dumps(report) + "\n")
    return code


# =========================================================================== orchestration


def run_client_once(client: str, bootstrap: str, create_topics: Callable[[dict[str, int]], None],
                    *, rate: float, seconds: float) -> dict[str, Any]:
    from bench.producer_bench import verify_topic

    topic = f"latency-{client}-{uuid.uuid4().hex[:8]}"
    create_topics({topic: PARTITIONS})
    n = int(rate * seconds)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pipeline-latency-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "bench.latency_bench", "--client", client,
               "--bootstrap", bootstrap, "--topic", topic, "--n", str(n),
               "--rate", str(rate), "--out", str(out)]
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True,
                                  text=True, timeout=120 + 4 * seconds, check=False)
        except subprocess.TimeoutExpired:
            return {"client": client, "status": "failed", "error": "timed out"}
        try:
            record: dict[str, Any] = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            return {"client": client, "status": "failed",
                    "error": f"worker exited {proc.returncode}: " + " | ".join(tail)}
    record["loadavg_1m"] = load
    if "error" in record:
        record["status"] = "failed"
        return record
    highs, _ = verify_topic(bootstrap, topic, PARTITIONS)
    record["landed"] = sum(highs)
    expected = n + 1  # the warm-up message went to the same topic
    ok = record["landed"] == expected and record["failed"] == 0
    record["status"] = "ok" if ok else "INVALID"
    if not ok:
        record["invalid_reason"] = (f"landed {record['landed']} of {expected}, "
                                    f"{record['failed']} failed")
    return record


def _summarize(client: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r.get("status") == "ok"]
    row: dict[str, Any] = {"label": LABELS[client], "runs": runs}
    if not good:
        row.update(status="failed", reason=(runs[0].get("error") or runs[0].get(
            "invalid_reason", "no runs")) if runs else "no runs")
        return row
    keys = [f"p{p:g}" for p in POINTS] + ["mean", "max"]
    row["latency_ms"] = {
        k: {"median": statistics.median(r["latency_ms"][k] for r in good),
            "min": min(r["latency_ms"][k] for r in good),
            "max": max(r["latency_ms"][k] for r in good)} for k in keys}
    row["achieved_rate"] = {"median": statistics.median(r["achieved_rate"] for r in good),
                            "min": min(r["achieved_rate"] for r in good),
                            "max": max(r["achieved_rate"] for r in good)}
    row["schedule_lateness_ms"] = {
        k: statistics.median(r["schedule_lateness_ms"][k] for r in good)
        for k in ("p50", "p99", "max")}
    row["cpu_s"] = statistics.median(r["cpu_s"] for r in good)
    # CPU per message (the client's whole process, every thread): steady where wall-clock
    # latency is not, on a shared machine; the share of a core the rate needs.
    row["cpu_us_per_msg"] = statistics.median(r["cpu_s"] / r["messages"] * 1e6 for r in good)
    row["latency_curve_ms"] = [statistics.median(v) for v in
                               zip(*(r["latency_curve_ms"] for r in good), strict=True)]
    bad = [r for r in runs if r.get("status") != "ok"]
    row["status"] = "ok" if not bad else "INVALID"
    if bad:
        row["reason"] = bad[0].get("error") or bad[0].get("invalid_reason")
    return row


def _print(msg: str) -> None:
    print(msg, flush=True)


def run(rate: float = RATE, seconds: float | None = None, rounds: int | None = None, *,
        quick: bool = False, broker: str = "tansu",
        log: Callable[[str], None] = _print) -> dict[str, Any]:
    from bench.producer_bench import _machine

    seconds = seconds or (QUICK_SECONDS if quick else SECONDS)
    rounds = rounds or (1 if quick else ROUNDS)
    started = time.time()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
    with open_broker(broker) as b:
        for rnd in range(rounds):
            for client in (CLIENTS if rnd % 2 == 0 else CLIENTS[::-1]):
                rec = run_client_once(client, b.bootstrap, b.create_topics, rate=rate,
                                      seconds=seconds)
                rec["round"] = rnd + 1
                runs[client].append(rec)
                log(_run_line(rec, rounds))
        description = b.description
    results = {c: _summarize(c, runs[c]) for c in CLIENTS}
    targets: list[dict[str, Any]] = []
    for client in ("pipeline", "pipeline-callback"):
        target: dict[str, Any] = {"target": f"{client} p99 <= linger + 5 ms = {TARGET_MS} ms"}
        p99 = results[client].get("latency_ms", {}).get("p99", {}).get("median")
        if p99 is None:
            target.update(verdict="n/a", value=None)
        else:
            target.update(verdict="PASS" if p99 <= TARGET_MS else "MISS", value=p99)
        targets.append(target)
    return {
        "meta": {
            "rate": rate, "seconds": seconds, "rounds": rounds, "value_size": len(VALUE),
            "partitions": PARTITIONS, "acks": "all", "idempotent": True,
            "linger_ms": LINGER_MS, "statistic": "median over rounds (min/max beside)",
            "clock": "time.perf_counter in both clients",
            "broker": description,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "machine": _machine(),
        },
        "results": results,
        "targets": targets,
    }


def _run_line(rec: dict[str, Any], rounds: int) -> str:
    head = f"[latency] round {rec['round']}/{rounds} {rec['client']:<17}"
    if rec.get("status") == "failed":
        return f"{head} FAILED: {rec.get('error', '')[:300]}"
    lat = rec["latency_ms"]
    return (f"{head} p50 {lat['p50']:6.2f}  p95 {lat['p95']:6.2f}  p99 {lat['p99']:6.2f}  "
            f"max {lat['max']:7.2f} ms  rate {rec['achieved_rate']:,.0f}/s  late p99 "
            f"{rec['schedule_lateness_ms']['p99']:.2f} ms  cpu {rec['cpu_s']:.2f}s  "
            f"load {rec['loadavg_1m']:.1f}  landed {rec.get('landed')}  {rec['status']}")


def format_table(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"Latency: paced {meta['rate']:,.0f} msg/s for {meta['seconds']:g} s, "
        f"{meta['value_size']} B values -> {meta['partitions']} partitions, acks=all, "
        f"idempotent, linger {meta['linger_ms']} ms; send -> ack, ms, median [min - max] of "
        f"{meta['rounds']} round(s) ({meta['date']}, load average "
        f"{meta['loadavg_before'][0]:.1f} -> {meta['loadavg_after'][0]:.1f})",
        f"{'client':<48} {'p50':>16} {'p95':>16} {'p99':>16} {'p99.9':>16} "
        f"{'achieved msg/s':>15} {'late p99':>8} {'CPU us/msg':>10}",
    ]

    def cell(v: dict[str, float]) -> str:
        return f"{v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}]"

    for row in report["results"].values():
        if "latency_ms" not in row:
            lines.append(f"{row['label']:<48} {row['status']}: {row.get('reason', '')}")
            continue
        lat = row["latency_ms"]
        status = "" if row["status"] == "ok" else f"  [{row['status']}: {row.get('reason')}]"
        lines.append(
            f"{row['label']:<48} {cell(lat['p50']):>16} {cell(lat['p95']):>16} "
            f"{cell(lat['p99']):>16} {cell(lat['p99.9']):>16} "
            f"{row['achieved_rate']['median']:>15,.0f} "
            f"{row['schedule_lateness_ms']['p99']:>8.2f} {row['cpu_us_per_msg']:>10.1f}{status}")
    lines.append("(late p99: how late the 99th-percentile send was against its schedule, ms; "
                 "CPU us/msg: the client process's CPU per message, all threads)")
    lines.append("targets:")
    for t in report["targets"]:
        got = "" if t["value"] is None else f"{t['value']:.2f} ms"
        lines.append(f"  {t['verdict']:<4} {t['target']:<40} {got}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=RATE, help=f"msg/s (default {RATE:,})")
    parser.add_argument("--seconds", type=float, default=None,
                        help=f"per run (default {SECONDS:g}; --quick {QUICK_SECONDS:g})")
    parser.add_argument("--rounds", type=int, default=None, help=f"default {ROUNDS}")
    parser.add_argument("--quick", action="store_true")
    add_broker_argument(parser)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    # worker mode (one client, one run, in this fresh interpreter)
    parser.add_argument("--client", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return worker(args.client, args.bootstrap, args.topic, args.n, args.rate, args.out)
    report = run(args.rate, args.seconds, args.rounds, quick=args.quick, broker=args.broker)
    print(format_table(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
