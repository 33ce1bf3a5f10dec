"""``python -m pipeline metadata`` (also ``python -m pipeline -L``): the brokers, topics
and partitions of a cluster, like ``kcat -L``; ``-J`` prints kcat's JSON.

Text output is kcat's::

    Metadata for all topics (from broker 1: 127.0.0.1:9092/1):
     1 brokers:
      broker 1 at 127.0.0.1:9092 (controller)
     1 topics:
      topic "orders" with 2 partitions:
        partition 0, leader 1, replicas: 1, isrs: 1
        partition 1, leader 1, replicas: 1, isrs: 1

``-J`` prints one JSON object with kcat's keys: ``originating_broker`` (``id``,
``name``), ``query`` (``topic``: the topic asked for, or ``*``), ``controllerid``,
``brokers`` (``id``, ``name``), ``topics`` (``topic``, ``error`` if any, ``partitions``:
``partition``, ``error`` if any, ``leader``, ``replicas`` and ``isrs`` as ``[{"id": n}]``).
The originating broker is the one whose connection answered (kcat's is librdkafka's).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.cli._common import (
    add_bootstrap,
    add_client_options,
    cluster_options,
    resolve_bootstrap,
    run_guarded,
    setup_logging,
)

HELP = "list the cluster's brokers, topics and partitions (like kcat -L; -J: JSON)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bootstrap(parser)
    parser.add_argument("-t", "--topic", default=None, help="only this topic")
    parser.add_argument("-J", "--json", action="store_true", help="kcat's JSON")
    add_client_options(parser, what="client")


def run(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import trio

    setup_logging(args.verbose)
    resolve_bootstrap(args)
    options = cluster_options(args)
    listing = trio.run(fetch_metadata, args.bootstrap, args.topic, args.timeout, options)
    sys.stdout.write(json.dumps(listing) + "\n" if args.json else format_metadata(listing))
    return 0


async def fetch_metadata(bootstrap: str, topic: str | None, timeout: float,  # noqa: ASYNC109
                         options: dict[str, Any]) -> dict[str, Any]:
    """The metadata as kcat's ``-J`` object (what :func:`format_metadata` prints)."""
    from pipeline.cluster.admin import Admin

    async with Admin.open(bootstrap, timeout=timeout, **options) as admin:
        cluster = await admin.describe_cluster()
        topics = await admin.describe_topics(None if topic is None else [topic])
        origin = next((c for c in admin.cluster.open_connections() if c.node_id >= 0), None)
    out: dict[str, Any] = {
        "originating_broker": {
            "id": origin.node_id if origin is not None else -1,
            "name": f"{origin.host}:{origin.port}/{origin.node_id}" if origin else bootstrap,
        },
        "query": {"topic": topic if topic is not None else "*"},
        "controllerid": cluster.controller_id,
        "brokers": [{"id": node, "name": f"{address.host}:{address.port}"}
                    for node, address in sorted(cluster.brokers.items())],
        "topics": [],
    }
    for name in sorted(topics):
        description = topics[name]
        entry: dict[str, Any] = {"topic": name}
        if description.error:
            entry["error"] = _error_text(description.error)
        partitions = []
        for p in description.partitions:
            part: dict[str, Any] = {"partition": p.partition}
            if p.error:
                part["error"] = _error_text(p.error)
            part["leader"] = p.leader
            part["replicas"] = [{"id": r} for r in p.replicas]
            part["isrs"] = [{"id": r} for r in p.isr]
            partitions.append(part)
        entry["partitions"] = partitions
        out["topics"].append(entry)
    return out


def _error_text(code: Any) -> str:
    return f"{code.name}: {code.description}"


def format_metadata(listing: dict[str, Any]) -> str:
    """kcat's text for a metadata listing (``-L`` without ``-J``)."""
    origin = listing["originating_broker"]
    topic = listing["query"]["topic"]
    lines = [f"Metadata for {'all topics' if topic == '*' else topic} "
             f"(from broker {origin['id']}: {origin['name']}):",
             f" {len(listing['brokers'])} brokers:"]
    for broker in listing["brokers"]:
        controller = " (controller)" if broker["id"] == listing["controllerid"] else ""
        lines.append(f"  broker {broker['id']} at {broker['name']}{controller}")
    lines.append(f" {len(listing['topics'])} topics:")
    for entry in listing["topics"]:
        error = f" {entry['error']}" if "error" in entry else ""
        lines.append(f"  topic \"{entry['topic']}\" with {len(entry['partitions'])} "
                     f"partitions:{error}")
        for p in entry["partitions"]:
            replicas = ",".join(str(r["id"]) for r in p["replicas"])
            isrs = ",".join(str(r["id"]) for r in p["isrs"])
            error = f", {p['error']}" if "error" in p else ""
            lines.append(f"    partition {p['partition']}, leader {p['leader']}, "
                         f"replicas: {replicas}, isrs: {isrs}{error}")
    return "\n".join(lines) + "\n"
