"""Consumer benchmark: our group consumer against confluent-kafka's, on one topic.

One topic of ``PARTITIONS`` partitions is filled once with ``n`` records of 100 B (by
librdkafka); then each client reads all of them **in a consumer group** (a fresh group
id per run, ``auto.offset.reset=earliest``), in a process of its own, touching every
record's value:

* ``confluent``: ``Consumer.consume(1000)`` in a loop (librdkafka, C);
* ``pipeline-iter``: ``async for record in consumer`` (one ``ConsumedRecord`` per record);
* ``pipeline-batches``: ``async for batch in consumer.batches()``;
* ``pipeline-columns``: ``async for batch in consumer.batches(columns=True)`` (a
  ``ConsumedColumns`` per run; every value taken out as ``bytes``, as ``m.value()`` does).

Rates are records per second from the first record to the last (the join is not timed:
it is the same protocol for both), the median of ``repeats`` rounds (each round runs
every client once, the order rotating). Targets (issue 36): per-record iteration >= 1.2x
confluent-kafka, ``batches()`` >= 3x (both forms are measured against it).

    python -m bench.consumer_bench [--n 1000000] [--repeats 3] [--broker kafka]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

PARTITIONS = 6
DEFAULT_N = 1_000_000
QUICK_N = 100_000
DEFAULT_REPEATS = 3
CLIENTS = ("confluent", "pipeline-iter", "pipeline-batches", "pipeline-columns")
TARGETS = {"pipeline-iter": 1.2, "pipeline-batches": 3.0, "pipeline-columns": 3.0}


def _fill(bootstrap: str, topic: str, n: int) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                         "batch.size": 1_000_000})
    value = b"x" * 100
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i % 1000).encode())
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unsent")


def _worker(client: str, bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    """Read ``n`` records as ``client`` in a fresh group; the timed section starts at
    the first record."""
    group = f"bench-{client}-{uuid.uuid4().hex[:8]}"
    started: list[float] = []
    if client == "confluent":
        import confluent_kafka

        c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                      "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        got = 0
        while got < n:
            msgs = c.consume(1000, 1.0)
            if msgs and not started:
                started.append(time.perf_counter())
            for m in msgs:
                if m.error() is None:
                    m.value()
                    got += 1
        end = time.perf_counter()
        c.close()
    else:
        import trio

        from pipeline import open_consumer

        async def read() -> float:
            async with open_consumer(bootstrap, group_id=group, topics=[topic],
                                     auto_offset_reset="earliest") as consumer:
                got = 0
                if client == "pipeline-iter":
                    async for record in consumer:
                        if not started:
                            started.append(time.perf_counter())
                        record.value  # noqa: B018 - touch it, as the confluent loop does
                        got += 1
                        if got >= n:
                            break
                elif client == "pipeline-batches":
                    async for batch in consumer.batches():
                        if not started:
                            started.append(time.perf_counter())
                        for record in batch:
                            record.value  # noqa: B018
                        got += len(batch)
                        if got >= n:
                            break
                else:
                    async for columns in consumer.batches(columns=True):
                        if not started:
                            started.append(time.perf_counter())
                        for value in columns.values:  # each value as bytes
                            pass
                        got += len(columns)
                        if got >= n:
                            break
                return time.perf_counter()

        end = trio.run(read)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = end - started[0]
    return {"client": client, "n": n, "seconds": seconds, "records_per_s": n / seconds,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def _run_client(client: str, bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.consumer_bench", "--worker", client, bootstrap, topic,
         str(n)], capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        return {"client": client, "status": "failed", "error": out.stderr[-2000:]}
    record: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    record["status"] = "ok"
    return record


def run(n: int | None = None, repeats: int | None = None, *, quick: bool = False,
        broker: str = "tansu") -> dict[str, Any]:
    from bench.brokers import open_broker

    n = n or (QUICK_N if quick else DEFAULT_N)
    repeats = repeats or (1 if quick else DEFAULT_REPEATS)
    topic = f"consumer-bench-{uuid.uuid4().hex[:6]}"
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
    with open_broker(broker) as b:
        b.create_topics({topic: PARTITIONS})
        _fill(b.bootstrap, topic, n)
        for rnd in range(repeats):
            order = CLIENTS[rnd % len(CLIENTS):] + CLIENTS[:rnd % len(CLIENTS)]
            for client in order:
                rec = _run_client(client, b.bootstrap, topic, n)
                rec["round"] = rnd + 1
                runs[client].append(rec)
                rate = rec.get("records_per_s")
                print(f"[consumer] round {rnd + 1}/{repeats} {client}: "
                      f"{'failed' if rate is None else f'{rate:,.0f} records/s'}", flush=True)
        description = b.description
    results = {}
    for client, recs in runs.items():
        rates = [r["records_per_s"] for r in recs if r.get("status") == "ok"]
        results[client] = {"records_per_s": statistics.median(rates) if rates else None,
                           "runs_records_per_s": rates,
                           "cpu_s": statistics.median([r["cpu_s"] for r in recs
                                                       if r.get("status") == "ok"] or [0.0])}
    base = results["confluent"]["records_per_s"]
    targets = []
    for client, goal in TARGETS.items():
        rate = results[client]["records_per_s"]
        ratio = None if not base or rate is None else rate / base
        targets.append({"client": client, "target": f">= {goal}x confluent-kafka",
                        "ratio": ratio,
                        "verdict": "?" if ratio is None else ("PASS" if ratio >= goal else "MISS")})
    return {"meta": {"n": n, "value_size": 100, "partitions": PARTITIONS, "repeats": repeats,
                     "broker": description, "statistic": "median",
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                     "loadavg": os.getloadavg()},
            "results": results, "targets": targets}


def format_table(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [f"Consumer (in a group): {meta['n']:,} x {meta['value_size']} B from "
             f"{meta['partitions']} partitions, {meta['broker']}; median of {meta['repeats']}",
             f"{'client':<18} {'records/s':>11} {'CPU s':>6}  runs"]
    for client, row in report["results"].items():
        rate = row["records_per_s"]
        runs = ", ".join(f"{r / 1000:.0f}k" for r in row["runs_records_per_s"])
        lines.append(f"{client:<18} {'failed' if rate is None else f'{rate:,.0f}':>11} "
                     f"{row['cpu_s']:>6.2f}  {runs}")
    lines.append("targets:")
    for t in report["targets"]:
        got = "" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        lines.append(f"  {t['verdict']:<4} {t['client']} {t['target']:<28} {got}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--worker":
        client, bootstrap, topic, n = args[1:5]
        print(json.dumps(_worker(client, bootstrap, topic, int(n))), flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.consumer_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    ns = parser.parse_args(args)
    report = run(ns.n, ns.repeats, quick=ns.quick, broker=ns.broker)
    print(format_table(report))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
