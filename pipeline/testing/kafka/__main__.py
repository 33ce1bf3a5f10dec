"""``python -m pipeline.testing.kafka [--if-tools]``: fetch the Kafka jars into the cache.

``make kafka`` runs it; ``make test`` runs it with ``--if-tools``, which says why and exits 0
when java or mvn is missing (the kafka tests then skip with the same reason).
"""

from __future__ import annotations

import argparse
import sys

from pipeline.testing.kafka.dist import (
    KAFKA_VERSION,
    KafkaSetupError,
    cache_dir,
    ensure_kafka,
    missing_tools_reason,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.testing.kafka",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--if-tools", action="store_true",
                        help="only if java and mvn are there (else say why and exit 0)")
    args = parser.parse_args(argv)
    if args.if_tools:
        reason = missing_tools_reason()
        if reason is not None:
            print(f"Apache Kafka tests will be skipped: {reason}", flush=True)
            return 0
    print(f"Apache Kafka {KAFKA_VERSION}: {cache_dir()}", flush=True)
    try:
        libs = ensure_kafka()
    except KafkaSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    jars = sorted(libs.glob("*.jar"))
    size = sum(j.stat().st_size for j in jars) / 1e6
    print(f"{len(jars)} jars, {size:.0f} MB in {libs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
