"""``python -m pipeline.testing.kafka``: fetch the Kafka jars into the cache (``make kafka``)."""

from __future__ import annotations

import sys

from pipeline.testing.kafka.dist import KAFKA_VERSION, KafkaSetupError, cache_dir, ensure_kafka


def main() -> int:
    print(f"Apache Kafka {KAFKA_VERSION}: {cache_dir()}", flush=True)
    try:
        libs = ensure_kafka()
    except KafkaSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    jars = sorted(libs.glob("*.jar"))
    size = sum(j.stat().st_size for j in jars) / 1e6
    print(f"{len(jars)} jars, {size:.0f} MB in {libs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
