"""kcat habits: the default consume format, ``-D``/``-K``/``-Z``, binary-safe input (a byte
delimiter, length-prefixed frames), ``-o s@TS`` / ``e@TS``, ``-L`` (``-J``), the ``topics``
admin commands, and errors in the user's units.

What the CLI wrote is judged by confluent-kafka (librdkafka), an independent reader and
admin client. Runs on ``[tansu]`` and ``[kafka]``; timestamps and configs on Apache Kafka
only (tansu answers ListOffsets by time with 0 and ignores topic configs).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from pipeline.cli import main

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "pipeline", *argv], input=stdin,
                          capture_output=True, timeout=120, cwd=ROOT)


def _main_bytes(argv: list[str], capfdbinary: pytest.CaptureFixture[bytes]) -> bytes:
    assert main(argv) == 0
    return capfdbinary.readouterr().out


def read_back(bootstrap: str, topic: str, expected: int, partitions: int = 1) -> list[Any]:
    """The first ``expected`` records (confluent-kafka, assign mode), by (partition, offset)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"cli-kcat-{time.monotonic_ns()}",
        "enable.auto.commit": False, "enable.partition.eof": False, "check.crcs": True,
    })
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
        return sorted(got, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


# ------------------------------------------------------------------- produce input


def test_a_byte_delimiter_makes_binary_input_safe(kafka_bootstrap: str, new_topic: Any) -> None:
    """``-D '\\x00'`` splits at NUL only: newlines, CRs and every other byte are data;
    ``-K '\\x01'`` splits a key off; ``-Z`` sends empty ones as null."""
    topic = new_topic()
    payload = bytes(b for b in range(256) if b not in (0, 1))
    data = (b"k1\x01" + payload + b"\x00" + b"no key\r\n\x00" + b"k3\x01\x00"
            + b"\x01empty key\x00")
    proc = _run("produce", "-b", kafka_bootstrap, "-t", topic, "-D", "\\x00", "-K", "\\x01",
                "-Z", stdin=data)
    assert proc.returncode == 0, proc.stderr
    got = read_back(kafka_bootstrap, topic, 4)
    assert [(m.key(), m.value()) for m in got] == [
        (b"k1", payload), (None, b"no key\r\n"), (b"k3", None), (None, b"empty key")]


def test_length_prefixed_frames_round_trip_through_consume_percent_r(
    kafka_bootstrap: str, new_topic: Any, capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    """``produce --length-prefixed`` reads what ``consume -f '%R%s'`` writes: any bytes,
    and null values (length -1)."""
    source, copy = new_topic(), new_topic()
    values: list[bytes | None] = [bytes(range(256)), b"", None, b"\n" * 3, b"\x00"]
    frames = b"".join(
        (-1).to_bytes(4, "big", signed=True) if v is None
        else len(v).to_bytes(4, "big") + v for v in values)
    proc = _run("produce", "-b", kafka_bootstrap, "-t", source, "--length-prefixed",
                stdin=frames)
    assert proc.returncode == 0, proc.stderr
    assert [m.value() for m in read_back(kafka_bootstrap, source, 5)] == values
    out = _main_bytes(["consume", "-b", kafka_bootstrap, "-t", source, "-e", "-q",
                       "-f", "%R%s"], capfdbinary)
    assert out == frames
    proc = _run("produce", "-b", kafka_bootstrap, "-t", copy, "--length-prefixed", stdin=out)
    assert proc.returncode == 0, proc.stderr
    assert [m.value() for m in read_back(kafka_bootstrap, copy, 5)] == values


def test_a_cut_frame_is_one_error_line(kafka_bootstrap: str, new_topic: Any) -> None:
    proc = _run("produce", "-b", kafka_bootstrap, "-t", new_topic(), "--length-prefixed",
                stdin=b"\x00\x00\x00\x05abc")
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [
        "error: --length-prefixed input ends inside message 1 (3 of 5 bytes)"]


# ------------------------------------------------------------------ consume output


def test_consume_formats_are_kcats(kafka_bootstrap: str, new_topic: Any,
                                   capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    topic = new_topic()
    proc = _run("produce", "-b", kafka_bootstrap, "-t", topic, "-K", ":", "-Z",
                stdin=b"a:one\n:two\nb:\n\xff:\xfe\n")
    assert proc.returncode == 0, proc.stderr
    base = ["consume", "-b", kafka_bootstrap, "-t", topic, "-e", "-q"]
    # kcat's default: the value and a newline; raw bytes (binary-safe), null as nothing
    assert _main_bytes(base, capfdbinary) == b"one\ntwo\n\n\xfe\n"
    # -K: key, delimiter, value; -D: the record delimiter; -Z: NULL for null
    assert _main_bytes([*base, "-K", "\\t", "-D", "|", "-Z"], capfdbinary) == (
        b"a\tone|NULL\ttwo|b\tNULL|\xff\t\xfe|")
    assert _main_bytes([*base, "-f", "%k=%s (%K/%S) @%o\\n"], capfdbinary) == (
        b"a=one (1/3) @0\n=two (-1/3) @1\nb= (1/-1) @2\n\xff=\xfe (1/1) @3\n")
    lines = _main_bytes([*base, "-J"], capfdbinary).splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["key"], r["payload"]) for r in records] == [
        ("a", "one"), (None, "two"), ("b", None),
        ({"base64": "/w=="}, {"base64": "/g=="})]  # not UTF-8: base64 (kcat: raw bytes)
    assert all("headers" not in r for r in records)  # kcat: only when there are some


@pytest.mark.kafka
def test_timestamps_start_and_stop(kafka_single: Any, kafka_topic: Any,
                                   capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """``-o s@TS``: ListOffsets by time (per partition); ``-o e@TS``: each partition stops
    before its first record at or after TS. Apache Kafka only: tansu answers ListOffsets
    by time with offset 0."""
    from pipeline import open_producer

    bootstrap = kafka_single.bootstrap
    topic = kafka_topic("times")
    kafka_single.create_topic(topic, 2, replication_factor=1)
    base = 1_700_000_000_000

    async def produce() -> None:
        async with open_producer(bootstrap) as producer:
            for i in range(8):  # partition i % 2, timestamps base + 1000 * i
                await producer.send_and_wait(topic, b"v%d" % i, partition=i % 2,
                                             timestamp=base + 1000 * i)

    trio.run(produce)
    cmd = ["consume", "-b", bootstrap, "-t", topic, "-e", "-q", "-f", "%T %s\\n"]

    def values(*offsets: str) -> list[str]:
        argv = [*cmd, *(x for o in offsets for x in ("-o", o))]
        out = _main_bytes(argv, capfdbinary).decode()
        return sorted(line.split()[1] for line in out.splitlines())

    assert values(f"s@{base + 3000}") == ["v3", "v4", "v5", "v6", "v7"]
    assert values(f"s@{base + 2500}", f"e@{base + 6000}") == ["v3", "v4", "v5"]
    assert values(f"e@{base + 2000}") == ["v0", "v1"]
    assert values(f"s@{base + 99_000}") == []  # after the last record: from the end
    # confluent-kafka's offsets_for_times agrees with ours (the oracle for s@)
    from pipeline.consumer import offsets_for_times

    ours = trio.run(lambda: offsets_for_times(bootstrap, topic, base + 2500))
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": "cli-kcat-times"})
    try:
        theirs = consumer.offsets_for_times(
            [confluent_kafka.TopicPartition(topic, p, base + 2500) for p in (0, 1)], 10)
    finally:
        consumer.close()
    assert ours == {tp.partition: tp.offset for tp in theirs} == {0: 2, 1: 1}


# ------------------------------------------------------------ metadata and topics


def test_metadata_list_matches_librdkafkas(kafka_bootstrap: str, new_topic: Any,
                                           capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    topic = new_topic(partitions=3)
    listing = json.loads(_main_bytes(["-L", "-b", kafka_bootstrap, "-t", topic, "-J"],
                                     capfdbinary))
    assert list(listing) == ["originating_broker", "query", "controllerid", "brokers",
                             "topics"]
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_bootstrap})
    meta = admin.list_topics(topic, timeout=10)
    assert listing["query"] == {"topic": topic}
    assert {b["id"]: b["name"] for b in listing["brokers"]} == {
        b.id: f"{b.host}:{b.port}" for b in meta.brokers.values()}
    assert listing["originating_broker"]["id"] in meta.brokers
    [entry] = listing["topics"]
    theirs = meta.topics[topic].partitions
    assert entry["topic"] == topic
    assert [(p["partition"], p["leader"], [r["id"] for r in p["replicas"]],
             [r["id"] for r in p["isrs"]]) for p in entry["partitions"]] == [
        (p.id, p.leader, list(p.replicas), list(p.isrs))
        for p in sorted(theirs.values(), key=lambda p: p.id)]
    text = _main_bytes(["metadata", "-b", kafka_bootstrap, "-t", topic], capfdbinary).decode()
    lines = text.splitlines()
    assert lines[0].startswith(f"Metadata for {topic} (from broker ")
    assert f'  topic "{topic}" with 3 partitions:' in lines
    assert sum(line.startswith("    partition ") for line in lines) == 3


def test_topics_create_describe_list_delete(kafka_bootstrap: str, any_broker: Any,
                                            capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    name = f"cli-topics-{time.monotonic_ns()}"
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_bootstrap})
    b = ["-b", kafka_bootstrap]
    assert main(["topics", "create", *b, name, "-p", "3", "-r", "1"]) == 0
    assert admin.list_topics(name, timeout=10).topics[name].error is None
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 3
    assert name in json.loads(_main_bytes(["topics", "list", *b, "-J"], capfdbinary))
    assert name in _main_bytes(["topics", "list", *b], capfdbinary).decode().splitlines()
    described = json.loads(_main_bytes(["topics", "describe", *b, name, "-J"], capfdbinary))
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert main(["topics", "create", *b, name, "--if-not-exists"]) == 0
    capfdbinary.readouterr()
    assert main(["topics", "create", *b, name]) == 1
    assert capfdbinary.readouterr().err.decode().splitlines() == [
        f"error: topic {name!r} exists already (--if-not-exists: not an error)"]
    assert main(["topics", "delete", *b, name]) == 0
    deadline = time.monotonic() + 20
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert name not in admin.list_topics(timeout=10).topics
    capfdbinary.readouterr()
    assert main(["topics", "delete", *b, name, "--if-exists"]) == 0
    assert main(["topics", "describe", *b, name]) == 1
    assert capfdbinary.readouterr().err.decode().splitlines()[-1] == (
        f"error: unknown topic {name!r}")


@pytest.mark.kafka
def test_topics_alter_config(kafka_single: Any, kafka_topic: Any,
                             capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """Apache Kafka only: tansu ignores topic configs."""
    bootstrap = kafka_single.bootstrap
    name = kafka_topic("alter")
    b = ["-b", bootstrap]
    assert main(["topics", "create", *b, name, "--set", "retention.ms=3600000"]) == 0
    assert main(["topics", "alter-config", *b, name, "--set", "max.message.bytes=12345",
                 "--delete", "retention.ms"]) == 0
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    resource = confluent_kafka.admin.ConfigResource("TOPIC", name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["max.message.bytes"].value == "12345"
    topic_level = confluent_kafka.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].source != topic_level  # deleted: back to the broker's
    described = json.loads(_main_bytes(["topics", "describe", *b, name, "-J"], capfdbinary))
    assert described["configs"] == {"max.message.bytes": "12345"}
    assert main(["topics", "alter-config", *b, name, "--set", "cleanup.policy=sideways"]) == 1
    [line] = capfdbinary.readouterr().err.decode().splitlines()
    assert line.startswith("error: ") and "INVALID_CONFIG" in line


# ------------------------------------------------------------------- user's units


@pytest.mark.parametrize(("option", "line"), [
    ("linger.ms=-5", "error: invalid linger.ms='-5': must be a number of milliseconds >= 0"),
    ("delivery.timeout.ms=100", "error: invalid delivery.timeout.ms='100': must be >= "
     "linger.ms + request.timeout.ms (5 + 10000), as in the Java client, or every slow "
     "request would time out its messages"),
    ("socket.connection.setup.timeout.ms=0", "error: invalid socket.connection.setup."
     "timeout.ms='0': must be a number of milliseconds > 0"),
    ("linger=-5", "error: invalid linger=-5: must be a number of seconds >= 0"),
])
def test_option_errors_speak_the_users_units(
    option: str, line: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    assert main(["produce", "-b", "127.0.0.1:1", "-t", "x", "-X", option]) == 1
    assert capsys.readouterr().err.splitlines() == [line]
