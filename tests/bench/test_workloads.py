"""The producer bench's ``workloads`` group: what each message is, and whom it is
compared with."""

from __future__ import annotations

from typing import Any

from bench.peers import CLIENTS, WORKLOADS, distinct_value, make_event_values
from bench.producer_bench import _ratios_and_targets


def test_every_message_has_its_own_value_of_the_same_size() -> None:
    events = make_event_values()
    assert len(set(events)) == len(events) == 1024
    values = [distinct_value(i, events[i & 1023]) for i in range(5000)]
    assert len(set(values)) == 5000
    assert {len(v) for v in values} == {100}
    # only the id field changes: the rest is the event's own text
    assert values[7][:6] == b'{"id":' and values[7][6:16] == b"0000000007"
    assert values[7][16:] == events[7][16:]


def test_each_workload_has_both_clients_and_is_compared_with_its_own_peer() -> None:
    for w in WORKLOADS:
        assert CLIENTS[f"pipeline-w-{w}"].group == CLIENTS[f"confluent-w-{w}"].group == (
            "workloads")

    def row(rate: float) -> dict[str, Any]:
        return {"status": "ok", "msgs_per_s": rate, "runs": []}

    results = {"pipeline-w-headers": row(300.0), "confluent-w-headers": row(100.0),
               "confluent-w-keyed": row(50.0), "confluent": row(1.0)}
    ratios, targets = _ratios_and_targets(results)
    assert ratios["pipeline-w-headers"] == {"vs_confluent": 3.0}
    [headers] = [t for t in targets if t["numerator"] == "pipeline-w-headers"]
    assert (headers["denominator"], headers["ratio"], headers["verdict"]) == (
        "confluent-w-headers", 3.0, "PASS")
