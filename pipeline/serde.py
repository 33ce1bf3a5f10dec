"""Avro serializers, plain or in the Confluent wire format with a schema registry.

For the producer's ``key_serializer`` / ``value_serializer`` and the consumer's
``key_deserializer`` / ``value_deserializer`` (the ``avro`` extra: fastavro)::

    schema = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    registry = HttpSchemaRegistry("http://127.0.0.1:8081")
    ser = avro_serializer(schema, registry=registry, subject="orders-value")
    de = avro_deserializer(registry=registry)
    async with open_producer(bootstrap, value_serializer=ser) as producer: ...
    async with open_consumer(bootstrap, ..., value_deserializer=de) as consumer: ...

Without a registry the payload is the bare Avro binary of the one schema given. With
one it is Confluent's wire format: a 0 byte, the schema id (4 bytes, big-endian), the
Avro binary; ``avro_serializer`` registers its schema when it is made (so sending never
waits for the registry), and ``avro_deserializer`` reads each schema id from the
registry once (the first record of a schema waits for that answer, a blocking HTTP
request: ``prefetch`` the ids a consumer will meet to avoid it).

``SchemaRegistry`` is the two calls the wire format needs; ``HttpSchemaRegistry`` speaks
the Confluent REST API (Confluent's registry, Apicurio's Confluent-compatible API,
Karapace). Secrets in the URL or headers never reach reprs or errors.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = [
    "HttpSchemaRegistry",
    "SchemaRegistry",
    "SchemaRegistryError",
    "avro_deserializer",
    "avro_serializer",
]

_MAGIC = 0
_HEADER = struct.Struct(">bI")  # magic byte, schema id


class SchemaRegistryError(Exception):
    """The schema registry refused or could not be reached; the message says which call."""


class SchemaRegistry(Protocol):
    def register(self, subject: str, schema: str) -> int:
        """The id of ``schema`` (Avro JSON text) under ``subject``, registering it if new."""

    def schema(self, schema_id: int) -> str:
        """The Avro JSON text of schema ``schema_id``."""


class HttpSchemaRegistry:
    """The Confluent schema-registry REST API over HTTP(S), with a schema cache."""

    def __init__(self, url: str, *, timeout: float = 10.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self._url = url.rstrip("/")
        self._timeout = timeout
        self._headers = {"Content-Type": "application/vnd.schemaregistry.v1+json",
                         **(headers or {})}
        self._by_id: dict[int, str] = {}

    def __repr__(self) -> str:
        parts = urllib.parse.urlsplit(self._url)
        host = parts.hostname or "?"
        return f"HttpSchemaRegistry({parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''})"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._url + path, data=data, method=method,
                                         headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode("utf-8", "replace")
            raise SchemaRegistryError(f"{self!r}: {method} {path.split('?')[0]} answered "
                                      f"{exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SchemaRegistryError(f"{self!r}: {method} {path.split('?')[0]} failed: "
                                      f"{getattr(exc, 'reason', exc)}") from None

    def register(self, subject: str, schema: str) -> int:
        quoted = urllib.parse.quote(subject, safe="")
        answer = self._call("POST", f"/subjects/{quoted}/versions", {"schema": schema})
        schema_id = int(answer["id"])
        self._by_id[schema_id] = schema
        return schema_id

    def schema(self, schema_id: int) -> str:
        found = self._by_id.get(schema_id)
        if found is None:
            found = self._by_id[schema_id] = str(self._call("GET", f"/schemas/ids/{schema_id}")["schema"])
        return found


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError:
        raise ImportError("Avro needs fastavro: pip install 'trio-kafka-pipeline[avro]'") from None
    return fastavro


def avro_serializer(schema: Mapping[str, Any] | str, *, registry: SchemaRegistry | None = None,
                    subject: str | None = None) -> Callable[[Any], bytes | None]:
    """A serializer writing ``schema``'s Avro binary (Confluent's wire format with a
    ``registry``: the schema is registered under ``subject`` now, not while sending)."""
    fastavro = _fastavro()
    text = schema if isinstance(schema, str) else json.dumps(schema)
    parsed = fastavro.parse_schema(json.loads(text))
    prefix = b""
    if registry is not None:
        if not subject:
            raise ValueError("avro_serializer with a registry needs a subject "
                             "(Confluent's convention: '<topic>-value' / '<topic>-key')")
        prefix = _HEADER.pack(_MAGIC, registry.register(subject, text))

    def serialize(obj: Any) -> bytes | None:
        if obj is None:
            return None
        out = io.BytesIO()
        out.write(prefix)
        fastavro.schemaless_writer(out, parsed, obj)
        return out.getvalue()

    return serialize


def avro_deserializer(schema: Mapping[str, Any] | str | None = None, *,
                      registry: SchemaRegistry | None = None) -> Callable[[bytes | None], Any]:
    """A deserializer reading bare Avro binary of ``schema``, or (with a ``registry``)
    Confluent's wire format, each schema id read from the registry once."""
    fastavro = _fastavro()
    if (schema is None) == (registry is None):
        raise ValueError("avro_deserializer takes a schema (bare Avro) or a registry "
                         "(Confluent's wire format), not both")
    if schema is not None:
        parsed = fastavro.parse_schema(json.loads(schema) if isinstance(schema, str) else schema)

        def plain(data: bytes | None) -> Any:
            return None if data is None else fastavro.schemaless_reader(io.BytesIO(data), parsed)

        return plain
    assert registry is not None
    return _WireDeserializer(registry, fastavro)


class _WireDeserializer:
    """Confluent's wire format, each schema read from the registry once."""

    def __init__(self, registry: SchemaRegistry, fastavro: Any) -> None:
        self._registry = registry
        self._fastavro = fastavro
        self._schemas: dict[int, Any] = {}

    def prefetch(self, schema_ids: Any) -> None:
        """Read these schemas now (so no record waits for the registry)."""
        for schema_id in schema_ids:
            self._parsed(schema_id)

    def _parsed(self, schema_id: int) -> Any:
        found = self._schemas.get(schema_id)
        if found is None:
            found = self._schemas[schema_id] = self._fastavro.parse_schema(
                json.loads(self._registry.schema(schema_id)))
        return found

    def __call__(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if len(data) < _HEADER.size or data[0] != _MAGIC:
            raise ValueError("not Confluent's wire format (no 0 magic byte and schema id)")
        _, schema_id = _HEADER.unpack_from(data)
        return self._fastavro.schemaless_reader(io.BytesIO(data[_HEADER.size:]),
                                                self._parsed(schema_id))
