"""Transactional send throughput per transaction size and transaction version: this producer against
confluent-kafka's transactional producer (librdkafka), on a 1-node Apache Kafka.

    python -m bench.txn_bench                          # sizes 10,100,1000,10000; 10,000 msgs
    python -m bench.txn_bench --sizes 100 --messages 50000 --clients pipeline

Each (client, size) runs in a fresh interpreter (``--worker``) so its CPU seconds are its
own: it opens the producer, commits one warm-up transaction (producer id, coordinator and
connections in place), then, on the clock, sends ``--messages`` values of 100 bytes
(keyless, acks=all, linger 5 ms) in transactions of ``size`` messages: begin, send each,
commit; the clock stops when the last commit returns. Once on a cluster formatted with
``transaction.version`` 2 (KIP-890, a fresh Kafka 4.x) and once with 1
(``--transaction-versions``). Clients:

* ``pipeline``: ``open_producer(transactional_id=)``, ``begin_transaction()``,
  ``await send()`` per message, ``commit_transaction()`` (which flushes);
* ``confluent``: ``Producer({"transactional.id": ...})``, ``begin_transaction()``,
  ``produce()`` + ``poll(0)`` per message, ``commit_transaction()`` (which flushes).

Each run's topic is then read with confluent-kafka's consumer at ``read_committed``: the
run counts only if exactly ``--messages`` records are visible. The report
(``--json``, default ``bench/results/transactions.json``) has msgs/s, transactions/s and
CPU seconds per run; the median of ``--repeats`` runs goes in the table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

CLIENTS = ("pipeline", "confluent")
SIZES = (10, 100, 1000, 10_000)
VALUE = b"v" * 100
LINGER_S = 0.005
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "transactions.json"


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_pipeline(bootstrap: str, topic: str, warmup: str, n: int, size: int) -> dict[str, Any]:
    import trio

    from pipeline import open_producer

    async def main() -> dict[str, Any]:
        async with open_producer(bootstrap, transactional_id=f"bench-{uuid.uuid4().hex}",
                                 acks="all", linger=LINGER_S) as producer:
            async with producer.transaction():
                await producer.send(warmup, VALUE)
            t0, c0 = time.perf_counter(), _cpu()
            send = producer.send
            for start in range(0, n, size):
                await producer.begin_transaction()
                for _ in range(min(size, n - start)):
                    await send(topic, VALUE)
                await producer.commit_transaction()
            return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu() - c0}

    return trio.run(main)


def run_confluent(bootstrap: str, topic: str, warmup: str, n: int, size: int) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "transactional.id": f"bench-{uuid.uuid4().hex}",
                         "linger.ms": int(LINGER_S * 1000)})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(warmup, VALUE)
    producer.commit_transaction(30)
    full_waits = 0
    t0, c0 = time.perf_counter(), _cpu()
    produce, poll = producer.produce, producer.poll
    for start in range(0, n, size):
        producer.begin_transaction()
        for _ in range(min(size, n - start)):
            while True:
                try:
                    produce(topic, VALUE)
                    break
                except BufferError:  # local queue full: serve delivery reports, retry
                    full_waits += 1
                    poll(0.005)
            poll(0)
        producer.commit_transaction(60)
    return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu() - c0,
            "buffer_full_waits": full_waits}


RUNNERS = {"pipeline": run_pipeline, "confluent": run_confluent}


def count_committed(bootstrap: str, topic: str, partitions: int,
                    timeout: float = 60.0) -> int:
    """Records of ``topic`` visible to confluent-kafka's ``read_committed`` consumer."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"txn-bench-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0)
                         for p in range(partitions)])
        todo, count = set(range(partitions)), 0
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is None:
                    count += 1
                elif err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                else:
                    raise RuntimeError(f"the read_committed reader failed: {err}")
        if todo:
            raise RuntimeError(f"the reader did not reach the end of partitions {sorted(todo)}")
        return count
    finally:
        consumer.close()


def run_all(clients: list[str], sizes: list[int], n: int, repeats: int,
            versions: list[int], partitions: int = 6) -> dict[str, Any]:
    from pipeline.testing.kafka import KAFKA_VERSION, KafkaCluster

    runs: list[dict[str, Any]] = []
    for version in versions:
        print(f"Kafka {KAFKA_VERSION}, 1 node, transaction.version {version}", flush=True)
        with KafkaCluster(nodes=1, features={"transaction.version": version}) as cluster:
            bootstrap = cluster.bootstrap
            cluster.create_topic("txn-bench-warmup", partitions=1, replication_factor=1)
            for size in sizes:
                for client in clients:
                    for r in range(repeats):
                        topic = f"txn-bench-{client}-{size}-{r}"
                        cluster.create_topic(topic, partitions=partitions, replication_factor=1)
                        result = _run_one(client, bootstrap, topic, n, size)
                        visible = count_committed(bootstrap, topic, partitions)
                        if visible != n:
                            raise RuntimeError(f"{client} size {size}: {visible} records "
                                               f"visible to read_committed, {n} sent")
                        txns = -(-n // size)
                        result.update(client=client, size=size, repeat=r, messages=n,
                                      transaction_version=version, transactions=txns,
                                      msgs_per_s=n / result["seconds"],
                                      txns_per_s=txns / result["seconds"])
                        runs.append(result)
                        print(f"  v{version} {client:<10} size {size:>6}: "
                              f"{result['msgs_per_s']:>9,.0f} msgs/s "
                              f"{result['txns_per_s']:>8,.1f} txns/s "
                              f"cpu {result['cpu_s']:.2f}s", flush=True)
    return {"meta": {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                     "broker": f"Apache Kafka {KAFKA_VERSION}, 1 KRaft node (KafkaCluster), "
                               "127.0.0.1", "messages": n, "repeats": repeats,
                     "partitions": partitions, "value_bytes": len(VALUE),
                     "linger_s": LINGER_S, "versions": _versions()},
            "runs": runs, "table": _table(runs)}


def _run_one(client: str, bootstrap: str, topic: str, n: int, size: int) -> dict[str, Any]:
    """One (client, size) run in a fresh interpreter; its result line."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.txn_bench", "--worker", client, "--bootstrap",
         bootstrap, "--topic", topic, "--messages", str(n), "--sizes", str(size)],
        capture_output=True, text=True, timeout=600, check=False,
        cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"{client} size {size} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import confluent_kafka

    return {"python": sys.version.split()[0], "confluent-kafka": version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0]}


def run(quick: bool = False, broker: str = "tansu") -> dict[str, Any]:
    """``python -m bench txn`` / ``make bench BROKER=kafka``: every size and client on both
    transaction versions (quick: 2,000 messages, 1 run; else 10,000, 2 runs). Apache Kafka
    only (the embedded broker has no transactions): with ``broker="tansu"`` a report that
    says so."""
    if broker != "kafka":
        return {"skipped": "transactions are measured on Apache Kafka only: "
                           "make bench BROKER=kafka, or python -m bench.txn_bench"}
    return run_all(list(CLIENTS), list(SIZES), 2_000 if quick else 10_000, 1 if quick else 2,
                   [2, 1])


def format_table(report: dict[str, Any]) -> str:
    """The report's table (``python -m bench``'s hook)."""
    return str(report.get("table") or report.get("skipped", ""))


def _table(runs: list[dict[str, Any]]) -> str:
    """Median msgs/s (and transactions/s, CPU s) per transaction.version, size and
    client, and the ratio."""
    lines = ["| transaction.version | messages per transaction | pipeline msgs/s | confluent-kafka msgs/s "
             "| pipeline / confluent | pipeline txns/s | confluent txns/s "
             "| pipeline CPU s | confluent CPU s |", "|" + "---|" * 9]
    version = 0

    def med(client: str, size: int, key: str) -> float | None:
        values = [r[key] for r in runs if r["client"] == client and r["size"] == size
                  and r["transaction_version"] == version]
        return statistics.median(values) if values else None

    def cell(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for version, size in dict.fromkeys((r["transaction_version"], r["size"]) for r in runs):
        p, c = med("pipeline", size, "msgs_per_s"), med("confluent", size, "msgs_per_s")
        ratio = f"{p / c:.2f}x" if p and c else "-"
        lines.append(
            f"| {version} | {size:,} | {cell(p, ',.0f')} | {cell(c, ',.0f')} | {ratio} "
            f"| {cell(med('pipeline', size, 'txns_per_s'), ',.1f')} "
            f"| {cell(med('confluent', size, 'txns_per_s'), ',.1f')} "
            f"| {cell(med('pipeline', size, 'cpu_s'), '.2f')} "
            f"| {cell(med('confluent', size, 'cpu_s'), '.2f')} |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--sizes", type=_ints, default=list(SIZES),
                        help="messages per transaction, comma-separated")
    parser.add_argument("--messages", type=int, default=10_000, help="per run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--transaction-versions", type=_ints, default=[2, 1],
                        help="the clusters' finalized transaction.version, one cluster each")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--worker", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = RUNNERS[args.worker](args.bootstrap, args.topic, "txn-bench-warmup",
                                      args.messages, args.sizes[0])
        print(json.dumps(result))
        return 0
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or not clients:
        parser.error(f"unknown client(s) {unknown}; choose from {', '.join(CLIENTS)}")
    report = run_all(clients, args.sizes, args.messages, args.repeats,
                     args.transaction_versions)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(report["table"])
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
