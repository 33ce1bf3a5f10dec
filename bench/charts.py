"""PNG charts of the benchmark results, drawn with matplotlib.

    python -m bench.charts [--results bench/results] [--out DIR]

``make bench`` draws them after the runs, next to the JSON reports: ``producer.png``
(throughput per client, median with min/max whiskers), ``export.png`` (the Spark export
writers per row shape), ``latency.png`` (send-to-ack percentiles per client, and the
whole percentile curve) and ``workloads.png`` / ``workloads-kafka.png`` (the producer
report's workloads group, what users send: each client per workload, per broker). A chart whose report is missing is skipped. ``--out docs/bench``
refreshes the copies the README shows (``bench/results/`` is not committed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

_COLORS = {"pipeline": "#1f77b4", "confluent": "#ff7f0e", "aiokafka": "#2ca02c",
           "pipeline_eos": "#9467bd", "foreach": "#ff7f0e", "spark_kafka": "#d62728",
           "noop_arrow": "#7f7f7f",
           "pipeline-callback": "#17becf", "confluent-keyed": "#ff7f0e"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _conditions(meta: dict[str, Any], extra: str = "") -> str:
    """Date, machine and load average (the machine may be shared: say so), then ``extra``
    (the broker) on its own line."""
    load = meta.get("loadavg_before")
    load_text = f", load average {load[0]:.1f}" if load else ""
    date = str(meta.get("date", "?")).replace("+00:00", "Z")
    return (f"{date}, {meta.get('machine', '?')}{load_text}" + (f"\n{extra}" if extra else ""))


def _rate_label(value: float, _pos: object = None) -> str:
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value / 1e3:g}k" if value >= 1e3 else f"{value:g}"


def _whiskers(median: float, low: float, high: float) -> tuple[float, float]:
    return max(0.0, median - low), max(0.0, high - median)


def producer_chart(report: dict[str, Any], out: Path) -> Path:
    """Throughput per client: median msgs/s, whiskers from the slowest to the fastest run."""
    plt = _plt()
    rows = [(name, row) for name, row in report["results"].items()
            if row.get("msgs_per_s") is not None]
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 2.0))
    labels, medians, errs, colors = [], [], [[], []], []
    for name, row in reversed(rows):
        runs = row.get("runs_msgs_per_s") or [row["msgs_per_s"]]
        low, high = _whiskers(row["msgs_per_s"], min(runs), max(runs))
        ratio = report.get("ratios", {}).get(name, {}).get("vs_confluent")
        labels.append(row["label"] + ("" if row.get("status") == "ok" else f" [{row['status']}]")
                      + ("" if ratio is None else f"\n({ratio:.2f}x confluent-kafka)"))
        medians.append(row["msgs_per_s"] / 1000)
        errs[0].append(low / 1000)
        errs[1].append(high / 1000)
        lib = next((lib for lib in ("pipeline", "confluent", "aiokafka") if name.startswith(lib)),
                   name)
        colors.append(_COLORS.get(lib, "#9467bd"))
    y = range(len(labels))
    ax.barh(y, medians, xerr=errs, color=colors, capsize=4, alpha=0.9)
    for i, (m, e) in enumerate(zip(medians, errs[1], strict=True)):
        ax.text(m + e, i, f" {m:,.0f}k", va="center", ha="left", fontsize=8)
    ax.set_yticks(list(y), labels, fontsize=9)
    ax.set_xlabel("thousand messages per second (median; whiskers: min and max run)")
    meta = report["meta"]
    ax.set_title(f"Producer throughput: {meta['n']:,} x {meta['value_size']} B, acks=all, "
                 f"linger 5 ms, {meta.get('repeats', '?')} runs each\n"
                 + _conditions(meta, meta.get("broker", "")), fontsize=9)
    ax.set_xlim(0, max(m + e for m, e in zip(medians, errs[1], strict=True)) * 1.18 or 1)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def export_chart(report: dict[str, Any], out: Path) -> Path:
    """Spark export: rows/s per writer, one panel per row shape, on a linear scale fitted
    to the producing writers; the no-op ceiling, usually far beyond, is drawn to the edge
    with its value written out ("off scale")."""
    plt = _plt()
    shapes = list(report["results"])
    fig, axes = plt.subplots(len(shapes), 1, figsize=(10, 2.3 * len(shapes) + 1.6),
                             squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes, strict=True):
        rows = list(reversed(report["results"][shape].items()))
        ratios = report.get("ratios", {}).get(shape, {})
        scale = max([r["max"] for w, r in rows if w != "noop_arrow" and r.get("rows_per_s")]
                    + [1.0]) * 1.3
        labels = []
        for i, (writer, row) in enumerate(rows):
            note = "" if row.get("status") == "ok" else f" [{row.get('status')}]"
            ratio = ratios.get(f"vs_{writer}", {}).get("median")
            if ratio is not None:
                note += f"\n(ours / it: {ratio:.2f}x)"
            labels.append(row["label"] + note)
            color = _COLORS.get(writer, "#1f77b4")
            median = row.get("rows_per_s")
            if median is None:
                ax.text(0, i, "  n/a: " + str(row.get("reason", ""))[:70], va="center",
                        fontsize=7)
            elif row["max"] > scale:  # the ceiling, far beyond the writers
                ax.barh(i, min(median, scale), color=color, alpha=0.5, hatch="//")
                ax.text(scale * 0.99, i, f"median {median:,.0f} rows/s [{row['min']:,.0f} - "
                        f"{row['max']:,.0f}] (off scale)",
                        va="center", ha="right", fontsize=8,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            else:
                low, high = _whiskers(median, row["min"], row["max"])
                ax.barh(i, median, xerr=[[low], [high]], color=color, capsize=4, alpha=0.9)
                ax.text(median + high, i, f" {median:,.0f}", va="center", fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_xlim(0, scale)
        ax.xaxis.set_major_formatter(_rate_label)
        ax.set_title(shape, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("rows per second (median; whiskers: min and max round)")
    meta = report["meta"]
    fig.suptitle(f"Spark export: {meta['rows']:,} rows, {meta['spark_partitions']} Spark -> "
                 f"{meta['topic_partitions']} topic partitions, {meta['spark_master']}, "
                 f"{meta['rounds']} rounds\n" + _conditions(meta, meta.get("broker", "")),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def latency_chart(report: dict[str, Any], out: Path) -> Path:
    """Left: p50..p99.9 per client (median of rounds, min/max whiskers) and the target;
    right: the whole percentile curve (medians of rounds), tails stretched (logit)."""
    plt = _plt()
    meta = report["meta"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.3))
    points = ["p50", "p90", "p95", "p99", "p99.9"]
    clients = [(n, r) for n, r in report["results"].items() if "latency_ms" in r]
    width = 0.8 / max(1, len(clients))
    for k, (name, row) in enumerate(clients):
        lat = row["latency_ms"]
        xs = [i + (k - (len(clients) - 1) / 2) * width for i in range(len(points))]
        med = [lat[p]["median"] for p in points]
        err = [[lat[p]["median"] - lat[p]["min"] for p in points],
               [lat[p]["max"] - lat[p]["median"] for p in points]]
        rate = row["achieved_rate"]["median"]
        left.bar(xs, med, width, yerr=err, capsize=3, color=_COLORS.get(name),
                 label=f"{row['label']} ({rate:,.0f} msg/s achieved)")
        for x, m, e in zip(xs, med, err[1], strict=True):
            left.text(x, m + e, f"{m:.1f}", ha="center", va="bottom", fontsize=7)
        curve = row.get("latency_curve_ms")
        if curve:
            pct = [p / 100 for p in (*range(1, 100), 99.5, 99.9)]
            right.plot(pct, curve, color=_COLORS.get(name), label=row["label"])
    target = meta["linger_ms"] + 5
    for ax in (left, right):
        ax.axhline(target, color="black", linestyle="--", linewidth=1,
                   label=f"target: p99 <= linger + 5 ms = {target} ms" if ax is left else None)
    left.set_xticks(range(len(points)), points)
    left.set_ylabel("send -> ack, ms")
    left.set_title("median of rounds; whiskers: min and max round", fontsize=9)
    right.set_xscale("logit")
    ticks = [0.1, 0.5, 0.9, 0.99, 0.999]
    right.set_xticks(ticks, [f"p{t * 100:g}" for t in ticks])
    right.minorticks_off()
    right.set_yscale("log")
    right.yaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    right.set_ylabel("send -> ack, ms (log scale)")
    right.set_title("percentile curve (median of rounds)", fontsize=9)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(f"Latency at a paced {meta['rate']:,.0f} msg/s, linger {meta['linger_ms']} ms, "
                 f"acks=all, {meta['rounds']} rounds of {meta['seconds']:g} s\n"
                 + _conditions(meta, meta.get("broker", "")), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# The workloads group's clients per workload: the producer bench names them
# "<prefix>-<workload>" (bench/peers.py, WORKLOADS), in this order on the chart.
_WORKLOAD_CLIENTS = [("pipeline-w", "pipeline send() + flush", "#1f77b4"),
                     ("pipeline-a", "pipeline send(), await each", "#6baed6"),
                     ("pipeline-c", "pipeline send(on_delivery=)", "#17becf"),
                     ("pipeline-m", "pipeline send_many()", "#9467bd"),
                     ("confluent-w", "confluent-kafka produce()", "#ff7f0e"),
                     ("aiokafka-w", "aiokafka send()", "#2ca02c")]
_WORKLOAD_NAMES = {"nokey": "no key", "keyed": "keyed (1,024 keys)",
                   "headers": "keyed + 2 headers", "headers-zstd": "keyed + 2 headers + zstd"}


def workloads_chart(report: dict[str, Any], out: Path) -> Path | None:
    """The workloads group of a producer report (what users send): per workload, each
    client's median msgs/s with min/max whiskers and its ratio to confluent-kafka. None when
    the report has no workload run."""
    results = report["results"]
    workloads = [w for w in _WORKLOAD_NAMES
                 if any(f"{prefix}-{w}" in results for prefix, _, _ in _WORKLOAD_CLIENTS)]
    if not workloads:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 1.35 * len(workloads) * len(_WORKLOAD_CLIENTS) / 4 + 2))
    height = 0.8 / len(_WORKLOAD_CLIENTS)
    right = 0.0
    for g, workload in enumerate(workloads):
        confluent = results.get(f"confluent-w-{workload}", {}).get("msgs_per_s")
        for k, (prefix, label, color) in enumerate(_WORKLOAD_CLIENTS):
            row = results.get(f"{prefix}-{workload}")
            if not row or row.get("msgs_per_s") is None:
                continue
            y = g + (k - (len(_WORKLOAD_CLIENTS) - 1) / 2) * height
            median = row["msgs_per_s"] / 1000
            runs = row.get("runs_msgs_per_s") or [row["msgs_per_s"]]
            low, high = _whiskers(row["msgs_per_s"], min(runs), max(runs))
            ax.barh(y, median, height * 0.9, xerr=[[low / 1000], [high / 1000]],
                    color=color, capsize=2, alpha=0.9, label=label if g == 0 else None)
            note = f" {median:,.0f}k"
            if confluent and not prefix.startswith("confluent"):
                note += f" ({row['msgs_per_s'] / confluent:.2f}x)"
            if row.get("status") != "ok":
                note += f" [{row.get('status')}]"
            ax.text(median + high / 1000, y, note, va="center", fontsize=7)
            right = max(right, median + high / 1000)
    ax.set_yticks(range(len(workloads)), [_WORKLOAD_NAMES[w] for w in workloads], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, right * 1.25 or 1)
    ax.set_xlabel("thousand messages per second (median; whiskers: min and max round; "
                  "in brackets: / confluent-kafka)")
    ax.legend(fontsize=8, loc="lower right")
    meta = report["meta"]
    ax.set_title(f"What users send: {meta['n']:,} distinct ~100 B events per run, acks=all, "
                 f"idempotent, linger 5 ms, {meta.get('repeats', '?')} interleaved rounds\n"
                 + _conditions(meta, meta.get("broker", "")), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


CHARTS: dict[str, Callable[[dict[str, Any], Path], Path]] = {
    "producer": producer_chart, "export": export_chart, "latency": latency_chart}


def draw_all(results_dir: Path = RESULTS_DIR, out_dir: Path | None = None) -> list[Path]:
    """Draw every chart whose ``<name>.json`` exists in ``results_dir`` into ``out_dir``
    (default: beside the JSON); returns the PNGs written."""
    out_dir = out_dir or results_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in CHARTS.items():
        source = results_dir / f"{name}.json"
        if not source.is_file():
            continue
        written.append(draw(json.loads(source.read_text()), out_dir / f"{name}.png"))
    for suffix in ("", "-kafka"):  # the workloads of each broker's producer report
        source = results_dir / f"producer{suffix}.json"
        if source.is_file():
            chart = workloads_chart(json.loads(source.read_text()),
                                    out_dir / f"workloads{suffix}.png")
            if chart is not None:
                written.append(chart)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.charts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=None, help="default: the results dir")
    args = parser.parse_args(argv)
    for path in draw_all(args.results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
