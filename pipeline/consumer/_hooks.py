"""Deserializers and interceptors: the consumer's side of the producer-flow seed.

* ``key_deserializer`` / ``value_deserializer``: a callable ``(bytes | None) -> obj``,
  or a name: ``"bytes"`` (as they are), ``"str"`` (UTF-8), ``"json"``. A deserializer
  that raises fails that record with ``DeserializationError`` (its topic, partition,
  offset and the deserializer's error; the position is past it, so the iteration goes on
  with the next record); the records before it are handed out first.
* ``interceptors``: objects with ``on_consume(records) -> records`` (the deserialized
  records each iteration hands out, as a list; what it returns is handed out) and / or
  ``on_commit(offsets)`` (after each successful commit, manual or automatic). An
  interceptor that raises is logged and counted, never fatal.

Zero cost when none is set: ``open_consumer`` then makes the plain ``Consumer``; with
hooks it makes a ``HookedConsumer`` (``_open.py``), whose iteration runs them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.consumer._errors import ConsumerError
from pipeline.consumer._types import ConsumedRecord, OffsetAndMetadata, TopicPartition

logger = logging.getLogger("pipeline.consumer")

__all__ = ["ConsumeHooks", "DeserializationError", "deserializer"]

Deserializer = Callable[[bytes | None], Any]


class DeserializationError(ConsumerError):
    """A ``key_deserializer`` or ``value_deserializer`` failed for one record;
    ``record`` is that record with its raw bytes. The position is past it."""

    def __init__(self, message: str, record: ConsumedRecord) -> None:
        super().__init__(message)
        self.record = record


def _str(data: bytes | None) -> Any:
    return None if data is None else data.decode()


def _json(data: bytes | None) -> Any:
    return None if data is None else json.loads(data)


_NAMED: dict[str, Deserializer] = {"bytes": lambda d: d, "str": _str, "json": _json}


def deserializer(spec: Any) -> Deserializer | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return _NAMED[spec]
    return spec  # type: ignore[no-any-return]


class ConsumeHooks:
    """A consumer's deserializers and interceptors (``of``: None when it has none)."""

    def __init__(self, key: Deserializer | None, value: Deserializer | None,
                 interceptors: Sequence[Any]) -> None:
        self._key, self._value = key, value
        self._on_consume = [i.on_consume for i in interceptors if hasattr(i, "on_consume")]
        self._on_commit = [i.on_commit for i in interceptors if hasattr(i, "on_commit")]
        self.errors = 0  # interceptor calls that raised (each logged)

    @classmethod
    def of(cls, config: Any) -> ConsumeHooks | None:
        key = deserializer(config.key_deserializer)
        value = deserializer(config.value_deserializer)
        if key is None and value is None and not config.interceptors:
            return None
        return cls(key, value, config.interceptors)

    def records(self, records: list[ConsumedRecord]) -> tuple[list[ConsumedRecord],
                                                               DeserializationError | None]:
        """``records`` deserialized, then through ``on_consume``; a record that fails to
        deserialize ends the list, and its error is returned beside what came before."""
        out: list[ConsumedRecord] = []
        failed: DeserializationError | None = None
        key, value = self._key, self._value
        for rec in records:
            try:
                out.append(rec._replace(
                    key=rec.key if key is None else key(rec.key),
                    value=rec.value if value is None else value(rec.value)))
            except Exception as exc:
                failed = DeserializationError(
                    f"deserializing {rec.topic}[{rec.partition}] at offset {rec.offset} "
                    f"failed: {type(exc).__name__}: {exc}; the record is skipped (its raw "
                    "bytes are this error's .record)", rec)
                failed.__cause__ = exc
                break
        for on_consume in self._on_consume:
            try:
                result = on_consume(out)
            except Exception:
                self.errors += 1
                logger.exception("interceptor %r raised in on_consume; the records go on "
                                 "unchanged", on_consume)
                continue
            if isinstance(result, list):
                out = result
            else:
                self.errors += 1
                logger.error("interceptor %r returned %r from on_consume, not a list",
                             on_consume, type(result).__name__)
        return out, failed

    def committed(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        for on_commit in self._on_commit:
            try:
                on_commit(dict(offsets))
            except Exception:
                self.errors += 1
                logger.exception("interceptor %r raised in on_commit", on_commit)
