"""Placeholder demo (``make demo``) until the real pipeline demo replaces it.

Starts the embedded tansu broker, creates ``demo-orders`` (6 partitions) with our own
CreateTopics codec, prints how to reach it, produces a handful of records with
confluent-kafka, reads them back (assign(), no consumer group), and stops the broker.

``--keep-running`` leaves the broker up until Ctrl-C (then use the printed address).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.testing.broker import EmbeddedBroker, create_topics

TOPIC = "demo-orders"
PARTITIONS = 6
COUNT = 12


def produce(bootstrap: str) -> list[tuple[int, int, bytes]]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    delivered: list[tuple[int, int, bytes]] = []
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

    for i in range(COUNT):
        customer = f"c-{i % 4}"
        order = {"order_id": f"o-{i:04d}", "customer": customer, "amount_cents": 100 * (i + 1)}
        producer.produce(
            TOPIC,
            key=customer.encode(),
            value=json.dumps(order).encode(),
            headers=[("source", b"demo/placeholder")],
            on_delivery=on_delivery,
        )
    if producer.flush(15) or errors:
        raise SystemExit(f"produce failed: {errors or 'timeout'}")
    return sorted(delivered)


def read_back(bootstrap: str, expected: int) -> list[tuple[int, int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "demo-placeholder",  # required by librdkafka; never joined
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 15
        while len(got) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=expected, timeout=0.5):
                if msg.error():
                    raise SystemExit(f"consume error: {msg.error()}")
                got.append((msg.partition(), msg.offset(), msg.value()))
        return sorted(got)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-running", action="store_true")
    args = parser.parse_args(argv)

    with EmbeddedBroker() as broker:
        print(f"embedded tansu broker up at {broker.bootstrap}")
        codes = create_topics(broker.bootstrap, {TOPIC: PARTITIONS})
        state = "created" if codes[TOPIC] == 0 else "already existed"
        print(f"topic {TOPIC} ({PARTITIONS} partitions) {state}")
        print(f"reach it with: bootstrap.servers={broker.bootstrap}  topic={TOPIC}")

        sent = produce(broker.bootstrap)
        print(f"produced {len(sent)} records with confluent-kafka (idempotent, zstd)")
        received = read_back(broker.bootstrap, len(sent))
        for partition, offset, value in received:
            print(f"  p{partition} @{offset}: {value.decode()}")
        if received != sent:
            print(f"MISMATCH: sent {len(sent)}, read back {len(received)}", file=sys.stderr)
            return 1
        print(f"read back all {len(received)} records: OK")
        crc = broker.crc_errors_in_log()
        if crc:
            print("broker logged CRC errors:\n" + "\n".join(crc), file=sys.stderr)
            return 1
        if args.keep_running:
            print("broker running; Ctrl-C to stop")
            try:
                while broker.running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    print("broker stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
