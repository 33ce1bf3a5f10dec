"""RecordBatch v2 encode/decode throughput, uncompressed and per codec, per-message and columnar.

    python -m bench.codec_bench [--json PATH] [--records N] [--batch-records M] [--repeats R]

Each run encodes N records of 100-byte values (no key, no headers) into batches
of M records, then decodes those bytes with ``decode_record_batches``:

* ``builder``: ``BatchBuilder`` append + build, the per-message producer path;
* ``columnar``: ``columnar.encode_batch`` over row ranges of a ``Columns`` built
  from an Arrow binary array (zero-copy; the build is inside the timed section);
* ``columnar from lists``: the same, the ``Columns`` packed from a Python list of
  bytes inside the timed section;
* ``columnar, python kernel``: the pure-Python fallback (uncompressed only).

The columnar batches are checked byte-identical to the builder's before timing.
Numbers are the median of R runs (a columnar run repeats the encode until it
lasts 0.2 s: one pass takes milliseconds); MB/s counts value payload bytes
(N * 100) per second. The machine may be shared: the report records the load
average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.protocol import _columns, _kernel_py, columnar
from pipeline.protocol.compression import Compression
from pipeline.protocol.records import BatchBuilder, decode_record_batches

VALUE_SIZE = 100
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "codec.json"


def _values(count: int, seed: int = 0) -> list[bytes]:
    """Semi-compressible 100-byte values (JSON-ish text with varying numbers)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        v = (b'{"id":%d,"user":"u%05d","amount":%d.%02d,"tags":["a","b"],"ok":true}'
             % (i, rng.randrange(100000), rng.randrange(10000), rng.randrange(100)))
        out.append((v + b" " * VALUE_SIZE)[:VALUE_SIZE])
    return out


def _encode(values: list[bytes], codec: Compression, batch_records: int,
            ts0: int) -> list[bytes]:
    batches = []
    for start in range(0, len(values), batch_records):
        builder = BatchBuilder(compression=codec)
        append = builder.append
        ts = ts0
        for v in values[start:start + batch_records]:
            append(ts, None, v)
        batches.append(builder.build(producer_id=1000, producer_epoch=0, base_sequence=start))
    return batches


def _arrow_values(values: list[bytes]) -> Any:
    try:
        import pyarrow as pa
    except ImportError:  # the columnar row is then measured from the list
        return values
    return pa.array(values, pa.binary())


def _encode_columnar(source: Any, codec: Compression, batch_records: int,
                     ts0: int) -> list[bytes]:
    cols = columnar.build_columns(source, default_timestamp=ts0)
    n = len(cols)
    return [
        columnar.encode_batch(cols, range(start, min(start + batch_records, n)),
                              compression=codec, producer_id=1000, producer_epoch=0,
                              base_sequence=start)
        for start in range(0, n, batch_records)
    ]


def _median_time(fn: Any, repeats: int,
                 min_sample: float = 0.0) -> tuple[float, list[float], Any, float]:
    """Median wall seconds per call of ``fn`` over ``repeats`` samples, the samples,
    the last result and the median CPU seconds per call (this process: on a
    shared machine the CPU time is the steadier figure). A sample repeats the
    call until it lasts ``min_sample`` seconds (fast paths would otherwise be
    timed over a few milliseconds, where a shared machine's noise dominates)."""
    t0 = time.perf_counter()
    out = fn()
    calls = max(1, int(min_sample / max(time.perf_counter() - t0, 1e-9)))
    times, cpu = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn()
        times.append((time.perf_counter() - t0) / calls)
        cpu.append((time.process_time() - c0) / calls)
    return statistics.median(times), times, out, statistics.median(cpu)


def run(records: int = 100_000, repeats: int = 5, batch_records: int = 1000,
        codecs: tuple[Compression, ...] = tuple(Compression)) -> dict[str, Any]:
    """Measure and return {"meta": ..., "results": {codec: {...}}} (medians of ``repeats``)."""
    values = _values(records)
    arrow = _arrow_values(values)
    payload = records * VALUE_SIZE
    ts0 = 1_700_000_000_000
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for codec in codecs:
        _encode(values[:batch_records], codec, batch_records, ts0)  # warm-up
        # what is timed below must be the same bytes
        assert _encode_columnar(arrow, codec, batch_records, ts0) == \
            _encode_columnar(values, codec, batch_records, ts0) == \
            _encode(values, codec, batch_records, ts0), codec
        enc, enc_times, batches, enc_cpu = _median_time(
            lambda c=codec: _encode(values, c, batch_records, ts0), repeats)
        col, col_times, _, col_cpu = _median_time(
            lambda c=codec: _encode_columnar(arrow, c, batch_records, ts0), repeats, 0.2)
        lst, lst_times, _, _ = _median_time(
            lambda c=codec: _encode_columnar(values, c, batch_records, ts0), repeats, 0.2)
        data = b"".join(batches)
        dec, dec_times, decoded, _ = _median_time(
            lambda d=data: decode_record_batches(d), repeats)
        assert sum(len(b.records) for b in decoded) == records
        wire = sum(len(b) for b in batches)
        row: dict[str, Any] = {
            "encode_records_per_s": records / enc,
            "encode_records_per_cpu_s": records / enc_cpu,
            "encode_mb_per_s": payload / enc / 1e6,
            "columnar_records_per_s": records / col,
            "columnar_records_per_cpu_s": records / col_cpu,
            "columnar_mb_per_s": payload / col / 1e6,
            "columnar_from_lists_records_per_s": records / lst,
            "columnar_vs_builder": enc / col,
            "decode_records_per_s": records / dec,
            "decode_mb_per_s": payload / dec / 1e6,
            "wire_bytes": wire,
            "ratio": payload / wire,
            "encode_runs_s": enc_times,
            "columnar_runs_s": col_times,
            "columnar_from_lists_runs_s": lst_times,
            "decode_runs_s": dec_times,
        }
        if codec is Compression.NONE:
            saved = _columns._impl
            _columns._impl = _kernel_py
            try:
                py, py_times, _, _ = _median_time(
                    lambda c=codec: _encode_columnar(arrow, c, batch_records, ts0), repeats)
            finally:
                _columns._impl = saved
            row["columnar_python_kernel_records_per_s"] = records / py
            row["columnar_python_kernel_runs_s"] = py_times
        results[codec.name.lower()] = row
    return {
        "meta": {
            "records": records,
            "value_size": VALUE_SIZE,
            "batch_records": batch_records,
            "repeats": repeats,
            "statistic": "median",
            "kernel": columnar.KERNEL,
            "columnar_source": "list" if arrow is values else "arrow",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "results": results,
    }


COLUMNAR_TARGET = 5_000_000  # records/s, uncompressed


def format_table(report: dict[str, Any]) -> str:
    meta = report["meta"]
    load = meta.get("loadavg_before", (0.0,))[0], meta.get("loadavg_after", (0.0,))[0]
    lines = [
        f"RecordBatch v2 codec: {meta['records']} records x {meta['value_size']} B, "
        f"{meta['batch_records']} records/batch, median of {meta['repeats']} runs, "
        f"{meta.get('kernel', '?')} kernel, load avg {load[0]:.2f} -> {load[1]:.2f} "
        f"on {meta['cpus']} CPUs (records/s)",
        f"{'codec':<8} {'builder':>12} {'columnar':>12} {'col/builder':>11} "
        f"{'col per CPU s':>13} {'col (lists)':>12} {'decode':>12} {'ratio':>6}",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"{name:<8} {r['encode_records_per_s']:>12,.0f} {r['columnar_records_per_s']:>12,.0f} "
            f"{r['columnar_vs_builder']:>10.1f}x {r['columnar_records_per_cpu_s']:>13,.0f} "
            f"{r['columnar_from_lists_records_per_s']:>12,.0f} "
            f"{r['decode_records_per_s']:>12,.0f} {r['ratio']:>6.2f}"
        )
    none = report["results"].get("none")
    if none is not None:
        rate = none["columnar_records_per_s"]
        verdict = "PASS" if rate >= COLUMNAR_TARGET else "MISS"
        lines.append(f"target: columnar encode, none >= {COLUMNAR_TARGET:,} records/s: "
                     f"{rate:,.0f} {verdict} (per CPU second: "
                     f"{none['columnar_records_per_cpu_s']:,.0f}; wall-clock figures follow the "
                     f"machine's load)")
        if "columnar_python_kernel_records_per_s" in none:
            lines.append("columnar, python kernel (fallback), none: "
                         f"{none['columnar_python_kernel_records_per_s']:,.0f} records/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help=f"where to write the JSON report (default {DEFAULT_JSON})")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    report = run(records=args.records, repeats=args.repeats, batch_records=args.batch_records)
    print(format_table(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
