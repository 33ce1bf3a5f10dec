"""Smoke test of the producer benchmark harness (``bench/producer_bench.py``).

Every client of the benchmark runs once with N=2000 through the real path (a fresh
interpreter per run, the embedded broker, count verification); the numbers themselves
are not checked, only that the harness produces a valid, complete report.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

# ``bench`` is a top-level directory of the repository, not part of the installed package.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from bench import producer_bench  # noqa: E402
from bench.peers import CLIENTS, make_keys, make_values  # noqa: E402

N = 2000

_NEEDS = {"aiokafka": "aiokafka", "confluent": "confluent_kafka"}  # by ClientSpec.library


def _require(client: str) -> None:
    module = _NEEDS.get(CLIENTS[client].library)
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (pip install -e '.[bench]')")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_client_runs_and_lands_every_message(client: str) -> None:
    _require(client)
    lines: list[str] = []
    report = producer_bench.run(n=N, repeats=1, clients=[client], quiet_wait=0,
                                log=lines.append)
    json.dumps(report)  # what ``python -m bench`` writes must serialize
    row = report["results"][client]
    (rec,) = row["runs"]
    assert row["status"] in ("ok", "n/a"), (row.get("reason"), rec.get("traceback"))
    if row["status"] == "n/a":  # only for a requested feature the producer lacks (yet)
        assert CLIENTS[client].wants_idempotent, row
    assert rec["landed"] == N
    assert rec["high_watermarks"]
    assert len(rec["high_watermarks"]) == 6
    assert rec["elapsed_s"] > 0
    assert rec["cpu_s"] > 0
    assert rec["peak_rss_mb"] > 10
    assert row["msgs_per_s"] == pytest.approx(N / rec["elapsed_s"])
    if CLIENTS[client].library == "confluent":
        assert rec["idempotent_on_wire"] is True  # the producer-id check itself works
    if CLIENTS[client].library == "aiokafka":
        assert rec["idempotent_on_wire"] is False
    if CLIENTS[client].workload is not None:  # every record read back and checked
        assert rec["readback"]["ok"] and rec["readback"]["records"] == N, rec["readback"]
        assert row["readback"] == "ok"
        zstd = CLIENTS[client].workload == "headers-zstd"
        assert rec["compression_on_wire"] == ["zstd" if zstd else "none"]
    else:
        assert "readback" not in rec
    if CLIENTS[client].library == "pipeline":
        assert rec["buffer_memory"] == rec["extra"]["buffer_memory"] == 32 << 20
        assert rec["rss_over_buffer_mb"] == pytest.approx(
            rec["peak_rss_mb"] - rec["baseline_rss_mb"] - 32, abs=0.06)
    if client.startswith("pipeline-c-"):
        assert rec["extra"]["on_delivery"] == {"succeeded": N, "failed": 0}
    if client.startswith("pipeline-a-"):
        assert rec["extra"]["awaited_failed"] == 0
    assert any(client in line for line in lines)
    table = producer_bench.format_table(report)
    assert row["label"] in table
    assert "targets:" in table


@pytest.mark.integration
@pytest.mark.parametrize("client", ["pipeline-send-keyed", "confluent-keyed",
                                    "pipeline-send", "confluent"])
def test_keyed_clients_send_a_key_of_the_pool_with_each_message(
        client: str, kafka_bootstrap: str, new_topic: Any) -> None:
    """The keyed pair sends every message with a key of the shared pool (message i:
    ``keys[i % 1024]`` with ``values[i % 1024]``), every key of the pool used, each key
    on one partition; their keyless counterparts send no keys."""
    from pipeline.consumer import consume

    _require(client)
    topic, warmup = new_topic(6, prefix=client), new_topic(1, prefix=f"{client}-warmup")
    result = CLIENTS[client].run(kafka_bootstrap, topic, N, warmup_topic=warmup)
    assert result.elapsed_s > 0
    records = consume(kafka_bootstrap, topic, timeout=60)
    assert len(records) == N
    keys, values = make_keys(), make_values()
    assert len(set(keys)) == len(keys) == len(values) == 1024
    if not client.endswith("-keyed"):
        assert {r.key for r in records} == {None}
        return
    key_of = dict(zip(values, keys, strict=True))
    assert all(r.key == key_of[r.value] for r in records)
    assert {r.key for r in records} == set(keys)  # N > 1024: the whole pool cycled
    partitions: dict[bytes | None, set[int]] = {}
    for r in records:
        partitions.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions.values())
    assert len({r.partition for r in records}) > 1  # the keys spread over partitions


def _run(msgs_per_s: float, status: str = "ok", **kw: Any) -> dict[str, Any]:
    return {"status": status, "msgs_per_s": msgs_per_s, "mb_per_s": msgs_per_s / 1e4,
            "cpu_s": 1.0, "peak_rss_mb": 50.0, "elapsed_s": 1e6 / msgs_per_s,
            "idempotent_on_wire": kw.pop("idem", False), **kw}


def test_summary_medians_ratios_and_targets() -> None:
    results = {
        "pipeline-send": producer_bench._summarize(
            "p", "peers", [_run(300e3), _run(100e3), _run(200e3)], None),
        "aiokafka": producer_bench._summarize("a", "peers", [_run(90e3)], False),
        "confluent": producer_bench._summarize("c", "peers", [_run(500e3, idem=True)], True),
        "pipeline-await": producer_bench._summarize("w", "peers", [_run(150e3)], None),
        "pipeline-idem-mif5": producer_bench._summarize(
            "i5", "idempotence", [_run(100e3, idem=False)], True),
        "pipeline-nonidem": producer_bench._summarize(
            "n", "idempotence", [_run(100e3, "INVALID", invalid_reason="landed 5 of 6")],
            False),
    }
    assert results["pipeline-send"]["msgs_per_s"] == 200e3  # the median, not the mean
    assert results["pipeline-idem-mif5"]["status"] == "n/a"  # idempotent asked, pid -1 seen
    assert results["pipeline-nonidem"]["status"] == "INVALID"
    ratios, targets = producer_bench._ratios_and_targets(results)
    assert ratios["pipeline-send"]["vs_aiokafka"] == pytest.approx(200 / 90)
    verdicts = {t["target"]: t["verdict"] for t in targets}
    assert verdicts["per-message send() >= 2x aiokafka"] == "PASS"
    assert verdicts["per-message send() >= 0.6x confluent"] == "MISS"  # 200k / 500k = 0.4
    assert verdicts["send() + await each >= 0.8x send() + flush"] == "MISS"  # 0.75
    assert verdicts["send_batch(list) >= 1.5x confluent"] == "n/a"  # not run
    assert verdicts["idempotent mif=5 >= 0.9x non-idempotent"] == "n/a"
    assert verdicts["keyed send() >= 0.6x confluent-kafka keyed"] == "n/a"  # neither ran
    # The runs here carry no round: no per-round spread (only paired runs make one).
    assert all("per_round" not in t for t in targets)
    report = {"meta": {"n": 6, "value_size": 100, "partitions": 6, "repeats": 3,
                       "date": "d", "machine": "m"},
              "results": results, "ratios": ratios, "targets": targets}
    table = producer_bench.format_table(report)
    assert "INVALID: landed 5 of 6" in table
    assert "PASS" in table


def test_failed_runs_make_a_failed_or_na_row() -> None:
    failed = {"status": "failed", "error": "ConfigError: nope", "error_type": "ConfigError"}
    assert producer_bench._summarize("x", "g", [failed], True)["status"] == "n/a"
    crash = {"status": "failed", "error": "timed out after 9s"}
    assert producer_bench._summarize("x", "g", [crash], None)["status"] == "failed"
    mixed = producer_bench._summarize("x", "g", [_run(1e5), crash], None)
    assert mixed["status"] == "INVALID"
    assert mixed["msgs_per_s"] == 1e5


def test_keyed_target_compares_the_keyed_pair() -> None:
    """The target "keyed send() >= 0.6x confluent-kafka keyed" is pipeline-send-keyed over
    confluent-keyed (not the keyless clients), with the per-round ratios of that pair;
    a keyed client's "vs confl." column is against the keyed peer too."""
    title = "keyed send() >= 0.6x confluent-kafka keyed"
    assert (title, "pipeline-send-keyed", "confluent-keyed", 0.6) in producer_bench.TARGETS
    results = {
        "pipeline-send": producer_bench._summarize(
            "p", "peers", [_run(900e3, round=1), _run(900e3, round=2)], None),
        "confluent": producer_bench._summarize(
            "c", "peers", [_run(300e3, round=1, idem=True), _run(300e3, round=2, idem=True)],
            True),
        "pipeline-send-keyed": producer_bench._summarize(
            CLIENTS["pipeline-send-keyed"].label, "keyed",
            [_run(120e3, round=1), _run(180e3, round=2)], None),
        "confluent-keyed": producer_bench._summarize(
            "ck", "keyed", [_run(200e3, round=1, idem=True), _run(200e3, round=2, idem=True)],
            True),
    }
    ratios, targets = producer_bench._ratios_and_targets(results)
    t = next(t for t in targets if t["target"] == title)
    assert (t["numerator"], t["denominator"]) == ("pipeline-send-keyed", "confluent-keyed")
    assert t["ratio"] == pytest.approx(150 / 200)  # medians 150k / 200k
    assert t["verdict"] == "PASS"
    assert t["per_round"] == {"n": 2, "min": pytest.approx(0.6), "max": pytest.approx(0.9),
                              "median": pytest.approx(0.75)}
    assert ratios["pipeline-send-keyed"] == {"vs_confluent": pytest.approx(150 / 200)}
    assert ratios["pipeline-send"]["vs_confluent"] == pytest.approx(3.0)  # keyless pair
    report = {"meta": {"n": 6, "value_size": 100, "partitions": 6, "repeats": 2,
                       "date": "d", "machine": "m"},
              "results": results, "ratios": ratios, "targets": targets}
    table = producer_bench.format_table(report)
    line = next(x for x in table.splitlines() if title in x)
    assert line.split()[:1] == ["PASS"]
    assert "0.75x  (per round 0.60-0.90x, median 0.75x of 2)" in line
    assert "pipeline send(key=)" in table

    # only one of the pair ran (or the other failed): n/a, saying why
    del results["confluent-keyed"]
    _, targets = producer_bench._ratios_and_targets(results)
    t = next(t for t in targets if t["target"] == title)
    assert (t["verdict"], t["ratio"], t["reason"]) == ("n/a", None, "confluent-keyed: not run")
    results["confluent-keyed"] = producer_bench._summarize(
        "ck", "keyed", [{"status": "failed", "error": "timed out after 9s"}], True)
    _, targets = producer_bench._ratios_and_targets(results)
    t = next(t for t in targets if t["target"] == title)
    assert t["verdict"] == "n/a" and "confluent-keyed: failed" in t["reason"]


def test_client_selection() -> None:
    assert producer_bench._resolve_clients(None) == list(CLIENTS)
    assert {"pipeline-send-keyed", "confluent-keyed"} <= set(CLIENTS)  # in the default set
    assert producer_bench._resolve_clients("keyed") == ["pipeline-send-keyed",
                                                        "confluent-keyed"]
    assert CLIENTS["pipeline-send-keyed"].library == "pipeline"
    assert CLIENTS["confluent-keyed"].wants_idempotent is True
    assert producer_bench._resolve_clients("aiokafka,peers")[0] == "aiokafka"
    assert "pipeline-idem-mif1" in producer_bench._resolve_clients(["idempotence"])
    with pytest.raises(ValueError, match="unknown client"):
        producer_bench._resolve_clients("kafka-go")


def test_per_round_ratios_pair_runs_of_one_round() -> None:
    """Each round's runs are paired (a failed run drops its round); the verdict stays
    the ratio of medians, and the table prints the per-round spread."""
    send = [_run(200e3, round=1), _run(100e3, round=2), _run(300e3, round=3)]
    wait = [_run(170e3, round=1), _run(90e3, round=2),
            {"status": "failed", "error": "x", "round": 3}]
    results = {
        "pipeline-send": producer_bench._summarize("p", "peers", send, None),
        "pipeline-await": producer_bench._summarize("w", "peers", wait, None),
    }
    results["pipeline-await"]["status"] = "ok"  # (a failed run makes it INVALID)
    _, targets = producer_bench._ratios_and_targets(results)
    t = next(t for t in targets if t["numerator"] == "pipeline-await")
    assert t["ratio"] == pytest.approx(130 / 200)  # medians: 130k of (170, 90), 200k
    assert t["per_round"] == {"n": 2, "min": pytest.approx(0.85), "max": pytest.approx(0.9),
                              "median": pytest.approx(0.875)}
    report = {"meta": {"n": 6, "value_size": 100, "partitions": 6, "repeats": 3,
                       "date": "d", "machine": "m"},
              "results": results, "ratios": {}, "targets": targets}
    assert "(per round 0.85-0.90x, median 0.88x of 2)" in producer_bench.format_table(report)


def test_kafka_rounds_get_a_warmed_broker_each_and_rotate_the_first_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On Kafka each round opens a fresh broker and warms it (untimed, not in the
    report) before its first run; each round starts one client later than the last."""
    import contextlib

    from bench import brokers

    opened: list[str] = []
    calls: list[tuple[str, int, str]] = []

    @contextlib.contextmanager
    def fake_open(kind: str = "tansu") -> Any:
        opened.append(kind)
        yield brokers.BenchBroker(kind, f"b{len(opened)}", None, "fake", lambda t: None)

    def fake_run(client: str, bootstrap: str, n: int, **kw: Any) -> dict[str, Any]:
        calls.append((client, n, bootstrap))
        return _run(1e5, client=client, n=n)

    monkeypatch.setattr(brokers, "open_broker", fake_open)
    monkeypatch.setattr(producer_bench, "run_client_once", fake_run)
    report = producer_bench.run(n=10**6, repeats=3, broker="kafka",
                                clients="pipeline-send,pipeline-await,confluent",
                                log=lambda msg: None)
    assert opened == ["kafka"] * 3 and report["meta"]["broker_scope"] == "round"
    warm = ("pipeline-send", producer_bench.KAFKA_WARMUP_N)
    assert calls == [
        (*warm, "b1"), ("pipeline-send", 10**6, "b1"), ("pipeline-await", 10**6, "b1"),
        ("confluent", 10**6, "b1"),
        (*warm, "b2"), ("pipeline-await", 10**6, "b2"), ("confluent", 10**6, "b2"),
        ("pipeline-send", 10**6, "b2"),
        (*warm, "b3"), ("confluent", 10**6, "b3"), ("pipeline-send", 10**6, "b3"),
        ("pipeline-await", 10**6, "b3"),
    ]
    assert [r["round"] for r in report["results"]["confluent"]["runs"]] == [1, 2, 3]


def test_ab_pairs_each_rounds_runs_and_flags_a_regression(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench/ab.py: the sides alternate first, each round's runs are paired, and a median
    CPU ratio (before / after) below the threshold is a regression, whatever the rate."""
    from bench import ab

    calls: list[str] = []
    runs = {"before": [(100.0, 1.0)] * 3, "after": [(90.0, 1.1), (120.0, 1.25), (99.0, 1.0)]}

    def fake_side(checkout: Path, clients: str, n: int, scratch: Path, tag: str,
                  ) -> dict[str, Any]:
        side = tag.split("-")[0]
        calls.append(side)
        return {"pipeline-send": runs[side].pop(0), "pipeline-send_many": (50.0, 2.0)}

    monkeypatch.setattr(ab, "_run_side", fake_side)
    monkeypatch.setattr(ab, "_commit", lambda checkout: str(checkout))
    report = ab.run(tmp_path / "b", tmp_path / "a", "x", rounds=3, n=10, threshold=0.95)
    assert calls == ["before", "after", "after", "before", "before", "after"]
    send = report["clients"]["pipeline-send"]
    assert send["rate_ratios"] == [0.9, 1.2, 0.99] and send["median_rate_ratio"] == 0.99
    assert send["cpu_ratios"] == [0.909, 0.8, 1.0] and send["median_cpu_ratio"] == 0.909
    assert send["verdict"] == "regression"
    assert report["clients"]["pipeline-send_many"]["verdict"] == "no regression"
    assert "regression" in ab.format_table(report)
