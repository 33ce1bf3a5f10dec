"""Smoke test of the codec benchmark (``bench/codec_bench.py``): a tiny run through the
real code, which first checks the columnar batches equal BatchBuilder's for every codec.
The numbers are not checked, only that the report is complete and serializable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench import codec_bench  # noqa: E402


def test_codec_bench_reports_every_codec_on_both_paths() -> None:
    report = codec_bench.run(records=3000, repeats=1, batch_records=700)
    json.dumps(report)
    assert set(report["results"]) == {"none", "gzip", "snappy", "lz4", "zstd"}
    for row in report["results"].values():
        for key in ("encode_records_per_s", "columnar_records_per_s",
                    "columnar_from_lists_records_per_s", "columnar_records_per_cpu_s",
                    "decode_records_per_s"):
            assert row[key] > 0
    assert report["results"]["none"]["columnar_python_kernel_records_per_s"] > 0
    table = codec_bench.format_table(report)
    assert "target: columnar encode, none >= 5,000,000 records/s" in table
