"""Avro serializers and the schema-registry client (``pipeline/serde.py``).

The registry here is an in-process double of the Confluent REST API (the two calls the
wire format needs, on 127.0.0.1): Confluent's registry does not run without Docker here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trio

from pipeline.serde import (
    HttpSchemaRegistry,
    SchemaRegistryError,
    avro_deserializer,
    avro_serializer,
)

pytest.importorskip("fastavro")

ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "total", "type": ["null", "double"], "default": None}]}


class Registry:
    """Subjects and schemas in memory, and every request seen."""

    def __init__(self) -> None:
        self.schemas: list[str] = []
        self.requests: list[str] = []


@pytest.fixture
def registry() -> Iterator[tuple[str, Registry]]:
    state = Registry()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # /subjects/{subject}/versions
            state.requests.append(f"POST {self.path}")
            length = int(self.headers["Content-Length"])
            schema = json.loads(self.rfile.read(length))["schema"]
            if schema not in state.schemas:
                state.schemas.append(schema)
            self._answer(200, {"id": state.schemas.index(schema) + 1})

        def do_GET(self) -> None:  # /schemas/ids/{id}
            state.requests.append(f"GET {self.path}")
            schema_id = int(self.path.rsplit("/", 1)[1])
            if not 1 <= schema_id <= len(state.schemas):
                self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                return
            self._answer(200, {"schema": state.schemas[schema_id - 1]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_bare_avro_round_trips() -> None:
    ser, de = avro_serializer(ORDER), avro_deserializer(ORDER)
    order = {"id": 7, "customer": "c1", "total": 9.5}
    data = ser(order)
    assert isinstance(data, bytes) and data[:1] != b"\x00"
    assert de(data) == order
    assert ser(None) is None and de(None) is None


def test_the_wire_format_names_the_registered_schema(registry: tuple[str, Registry]) -> None:
    url, state = registry
    client = HttpSchemaRegistry(url)
    ser = avro_serializer(ORDER, registry=client, subject="orders-value")
    assert state.requests == ["POST /subjects/orders-value/versions"]  # at creation
    data = ser({"id": 1, "customer": "c", "total": None})
    assert data is not None and data[:5] == b"\x00\x00\x00\x00\x01"
    de = avro_deserializer(registry=HttpSchemaRegistry(url))  # another client: must ask
    assert de(data) == {"id": 1, "customer": "c", "total": None}
    de(data)
    assert state.requests[1:] == ["GET /schemas/ids/1"]  # each schema read once
    with pytest.raises(ValueError, match="wire format"):
        de(b"\x07junk")


def test_registry_errors_say_which_call_and_hide_credentials() -> None:
    client = HttpSchemaRegistry("http://user:secret@127.0.0.1:1", timeout=2)
    with pytest.raises(SchemaRegistryError) as caught:
        avro_serializer(ORDER, registry=client, subject="s")
    assert "POST /subjects/" in str(caught.value) and "secret" not in str(caught.value)
    assert "secret" not in repr(client) and "user" not in repr(client)
    with pytest.raises(ValueError, match="subject"):
        avro_serializer(ORDER, registry=client)


async def test_a_producer_and_a_consumer_share_avro_through_the_registry(
        registry: tuple[str, Registry], autojump_clock: Any) -> None:
    from pipeline import open_consumer, open_producer
    from pipeline.testing.fake_cluster import FakeCluster

    url, _ = registry
    ser = avro_serializer(ORDER, registry=HttpSchemaRegistry(url), subject="orders-value")
    de = avro_deserializer(registry=HttpSchemaRegistry(url))
    orders = [{"id": i, "customer": f"c{i % 3}", "total": i * 1.5} for i in range(20)]
    async with FakeCluster.serve(brokers=1, auto_create_topics=False) as fake:
        fake.create_topic("orders", 2)
        async with open_producer(fake.bootstrap, connector=fake.connector,
                                 value_serializer=ser, key_serializer="str") as producer:
            for o in orders:
                await producer.send("orders", o, key=o["customer"])
        got = []
        async with open_consumer(fake.bootstrap, connector=fake.connector, group_id="g",
                                 topics=["orders"], auto_offset_reset="earliest",
                                 value_deserializer=de, key_deserializer="str") as consumer:
            with trio.fail_after(60):
                async for record in consumer:
                    got.append((record.key, record.value))
                    if len(got) == len(orders):
                        break
    assert sorted(got, key=lambda kv: kv[1]["id"]) == [(o["customer"], o) for o in orders]
