"""The read-back check of the producer bench's "workloads" runs (bench/readback.py): what
a run wrote, as a consumer sees it, against what each client was given to send."""

from __future__ import annotations

from typing import Any

import pytest

from bench.peers import make_event_values, make_keys, workload_record
from bench.producer_bench import _readback_summary
from bench.readback import check_records

N = 3000
PARTITIONS = 3


def written(workload: str, n: int = N) -> list[list[Any]]:
    """The records of a correct run, as (partition, offset, key, value, headers) in
    per-partition offset order: keyed by key (every record of a key in one partition),
    keyless ones round-robin."""
    events, keys = make_event_values(), make_keys()
    logs: list[list[list[Any]]] = [[] for _ in range(PARTITIONS)]
    for i in range(n):
        key, value, headers = workload_record(workload, i, events, keys)
        p = (i if key is None else int(key[4:])) % PARTITIONS
        logs[p].append([p, len(logs[p]), key, value, headers])
    return [record for log in logs for record in log]


@pytest.mark.parametrize("workload", ["nokey", "keyed", "headers", "headers-zstd"])
def test_a_correct_run_passes(workload: str) -> None:
    assert check_records(workload, N, written(workload)) == {
        "ok": True, "records": N, "expected": N}


def test_a_record_without_headers_reads_as_none_or_an_empty_list() -> None:
    records = written("keyed")
    records[5][4] = []
    assert check_records("keyed", N, records)["ok"]


def test_a_missing_id_fails() -> None:
    records = written("keyed")
    del records[100]
    verdict = check_records("keyed", N, records)
    assert not verdict["ok"]
    assert (verdict["records"], verdict["missing"]) == (N - 1, 1)
    assert "mismatches" not in verdict


def test_a_duplicate_fails_even_when_the_count_is_right() -> None:
    records = written("headers")
    lost = records.pop(7)  # one id lost, another written twice: n records all the same
    records.append(list(records[-1]))
    records[-1][1] += 1
    verdict = check_records("headers", N, records)
    assert not verdict["ok"]
    assert verdict["records"] == N
    assert verdict["missing"] == 1 and verdict["first_missing"] == [int(lost[3][6:16])]
    assert verdict["mismatches"] == {"duplicate": 1, "order": 1}


def test_a_wrong_header_fails() -> None:
    records = written("headers-zstd")
    p, o, _key, _value, headers = records[42]
    records[42][4] = [headers[0], ("source", b"checkouT")]
    verdict = check_records("headers-zstd", N, records)
    assert not verdict["ok"] and verdict["mismatches"] == {"headers": 1}
    assert verdict["first_mismatches"][0].startswith(f"headers: partition {p} offset {o}:")
    # headers where the workload sends none, and none where it sends two
    assert check_records("keyed", N, written("headers"))["mismatches"] == {"headers": N}
    assert check_records("headers", N, written("keyed"))["mismatches"] == {"headers": N}


def test_a_wrong_key_or_value_byte_fails() -> None:
    records = written("keyed")
    records[10][2] = b"key-999999"
    value = bytearray(records[11][3])
    value[-1] ^= 1
    records[11][3] = bytes(value)
    verdict = check_records("keyed", N, records)
    assert not verdict["ok"] and verdict["mismatches"]["key"] == 1
    assert verdict["mismatches"]["value"] == 1
    # a key where none is sent
    assert check_records("nokey", N, written("keyed"))["mismatches"] == {"key": N}


def test_a_per_key_reorder_fails() -> None:
    records = written("keyed")
    # two records of one key in one partition, their offsets swapped
    first = records[0]
    second = next(r for r in records[1:] if r[2] == first[2])
    first[3], second[3] = second[3], first[3]
    verdict = check_records("keyed", N, records)
    assert not verdict["ok"] and verdict["mismatches"] == {"order": 1}
    assert verdict["records"] == N and "missing" not in verdict


def test_records_of_different_keys_may_interleave_in_any_order() -> None:
    records = written("keyed")
    a = records[0]
    b = next(r for r in records[1:] if r[0] == a[0] and r[2] != a[2])
    a[1:], b[1:] = [b[1], *a[2:]], [a[1], *b[2:]]  # swap their offsets
    records.sort(key=lambda r: (r[0], r[1]))
    assert check_records("keyed", N, records)["ok"]


def test_a_key_split_across_partitions_fails() -> None:
    records = written("keyed")
    last_of_key = max((r for r in records if r[2] == records[0][2]), key=lambda r: r[1])
    last_of_key[0] = (last_of_key[0] + 1) % PARTITIONS
    assert check_records("keyed", N, records)["mismatches"] == {"key partition": 1}


def test_a_value_without_an_id_fails_and_the_summary_names_it() -> None:
    records = written("nokey")
    records[3][3] = b"garbage"
    verdict = check_records("nokey", N, records)
    assert verdict["mismatches"] == {"no id": 1} and verdict["missing"] == 1
    summary = _readback_summary(verdict)
    assert summary.startswith(f"{N} of {N} records read; 1 ids missing")
    assert "1 no id; first: no id: partition" in summary


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'keyd'"):
        check_records("keyd", 1, [])


def _run(**kw: Any) -> dict[str, Any]:
    return {"status": "ok", "msgs_per_s": 1e5, "mb_per_s": 10.0, "cpu_s": 1.0,
            "peak_rss_mb": 80.0, "elapsed_s": 1.0, "idempotent_on_wire": True, "round": 1,
            **kw}


def test_a_run_that_fails_its_read_back_is_invalid_and_loud_in_the_table() -> None:
    from bench import producer_bench

    bad = check_records("headers", N, written("keyed"))
    reason = "READ-BACK FAILED: " + _readback_summary(bad)
    results = {
        "pipeline-w-headers": producer_bench._summarize("p", "workloads", [_run(
            status="INVALID", invalid_reason=reason, readback=bad)], True),
        "confluent-w-headers": producer_bench._summarize("c", "workloads", [_run(
            readback={"ok": True, "records": N, "expected": N, "seconds": 0.5})], True),
    }
    assert results["pipeline-w-headers"]["status"] == "INVALID"
    assert results["pipeline-w-headers"]["readback"] == "FAILED"
    assert results["confluent-w-headers"]["readback"] == "ok"
    ratios, targets = producer_bench._ratios_and_targets(results)
    assert "pipeline-w-headers" not in ratios  # out of every ratio
    report = {"meta": {"n": N, "value_size": 100, "partitions": 3, "repeats": 1,
                       "date": "d", "machine": "m"},
              "results": results, "ratios": ratios, "targets": targets}
    table = producer_bench.format_table(report)
    assert "!!! READ-BACK FAILED" in table
    assert f"pipeline-w-headers round 1: READ-BACK FAILED: {N} of {N} records read; " \
           f"{N} headers; first: headers: partition 0 offset 0: id 0 headers None" in table
    row = next(line for line in table.splitlines() if line.startswith("c "))
    assert " ok  100k" in row


def test_rss_over_buffer_and_the_clients_own_outcome_counts() -> None:
    from bench import producer_bench

    record: dict[str, Any] = {"peak_rss_mb": 120.0, "baseline_rss_mb": 10.5,
                              "extra": {"buffer_memory": 64 << 20}}
    producer_bench._add_rss_over_buffer(record)
    assert (record["buffer_memory"], record["rss_over_buffer_mb"]) == (64 << 20, 45.5)
    peer: dict[str, Any] = {"peak_rss_mb": 120.0, "baseline_rss_mb": 10.5, "extra": {}}
    producer_bench._add_rss_over_buffer(peer)  # (no buffer_memory: not ours)
    assert "rss_over_buffer_mb" not in peer
    problems = producer_bench._outcome_problems
    assert problems({"on_delivery": {"succeeded": 5, "failed": 0}}, 5) == []
    assert problems({"on_delivery": {"succeeded": 4, "failed": 0}}, 5) == [
        "on_delivery saw 4 succeeded, 0 failed of 5"]
    assert problems({"on_delivery": {"succeeded": 5, "failed": 1}}, 5) != []
    assert problems({"awaited_failed": 0}, 5) == []
    assert problems({"awaited_failed": 2}, 5) == ["2 awaited deliveries failed"]
