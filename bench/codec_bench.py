"""RecordBatch v2 encode/decode throughput, uncompressed and per codec.

    python -m bench.codec_bench [--json PATH] [--records N] [--batch-records M] [--repeats R]

Each run encodes N records of 100-byte values (no key, no headers) with
``BatchBuilder`` into batches of M records (append + build, the producer's hot
path), then decodes those bytes with ``decode_record_batches``. Numbers are the
median of R runs. MB/s counts value payload bytes (N * 100) per second.
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


def run(records: int = 100_000, repeats: int = 5, batch_records: int = 1000,
        codecs: tuple[Compression, ...] = tuple(Compression)) -> dict[str, Any]:
    """Measure and return {"meta": ..., "results": {codec: {...}}} (medians of ``repeats``)."""
    values = _values(records)
    payload = records * VALUE_SIZE
    ts0 = 1_700_000_000_000
    results: dict[str, Any] = {}
    for codec in codecs:
        _encode(values[:batch_records], codec, batch_records, ts0)  # warm-up
        enc_times, dec_times = [], []
        batches: list[bytes] = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            batches = _encode(values, codec, batch_records, ts0)
            enc_times.append(time.perf_counter() - t0)
            data = b"".join(batches)
            t0 = time.perf_counter()
            decoded = decode_record_batches(data)
            dec_times.append(time.perf_counter() - t0)
            assert sum(len(b.records) for b in decoded) == records
        wire = sum(len(b) for b in batches)
        enc, dec = statistics.median(enc_times), statistics.median(dec_times)
        results[codec.name.lower()] = {
            "encode_records_per_s": records / enc,
            "encode_mb_per_s": payload / enc / 1e6,
            "decode_records_per_s": records / dec,
            "decode_mb_per_s": payload / dec / 1e6,
            "wire_bytes": wire,
            "ratio": payload / wire,
            "encode_runs_s": enc_times,
            "decode_runs_s": dec_times,
        }
    return {
        "meta": {
            "records": records,
            "value_size": VALUE_SIZE,
            "batch_records": batch_records,
            "repeats": repeats,
            "statistic": "median",
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "results": results,
    }


def format_table(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"RecordBatch v2 codec: {meta['records']} records x {meta['value_size']} B, "
        f"{meta['batch_records']} records/batch, median of {meta['repeats']} runs",
        f"{'codec':<8} {'encode rec/s':>14} {'encode MB/s':>12} "
        f"{'decode rec/s':>14} {'decode MB/s':>12} {'ratio':>7}",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"{name:<8} {r['encode_records_per_s']:>14,.0f} {r['encode_mb_per_s']:>12.1f} "
            f"{r['decode_records_per_s']:>14,.0f} {r['decode_mb_per_s']:>12.1f} {r['ratio']:>7.2f}"
        )
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
