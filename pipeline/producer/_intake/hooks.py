"""Serializers and interceptors: what the producer-flow seed runs before the partitioner.

The Java client's path for a record is: interceptors (``onSend``) -> serializers ->
partitioner -> accumulator -> sender -> ``onAcknowledgement``. ``SendHooks`` is the first
two steps and the last one, for the calls that take records as objects:

* ``key_serializer`` / ``value_serializer``: a callable ``(obj) -> bytes | None``, or a
  name: ``"bytes"`` (bytes or None as they are), ``"str"`` (UTF-8), ``"json"`` (UTF-8
  JSON). A serializer that raises refuses the record with ``SerializationError`` naming
  the field, the topic and the cause; nothing else of the producer changes.
* ``interceptors``: objects with ``on_send(message) -> message`` (called before
  serialization and partitioning, in order, each getting what the previous returned) and
  ``on_acknowledgement(metadata, error)`` (once per record when its outcome is known;
  ``error`` is None on success), both optional. An interceptor that raises is logged and
  counted (``interceptor_errors``), never fatal: the record goes on as it was.

Zero cost when none is set: the producer then uses the plain calls (``Producer.__init__``
asks ``SendHooks.of(config)``, which is None). With hooks, ``send`` is a Python wrapper
(the C send path is not used), ``send_many`` serializes each message in place before the
call's validation, and ``send_batch`` serializes a list column in one pass (Arrow and
numpy columns are bytes already: serializers do not apply); with interceptors,
``send_batch``'s rows become messages so each passes ``on_send``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from pipeline.producer._errors import SerializationError
from pipeline.producer._message import ProducerMessage, RecordMetadata

log = logging.getLogger("pipeline.producer")

__all__ = ["ProducerInterceptor", "SendHooks", "Serializer", "serializer"]

Serializer = Callable[[Any], "bytes | None"]


class ProducerInterceptor(Protocol):
    """What an interceptor may define (both optional)."""

    def on_send(self, message: ProducerMessage) -> ProducerMessage: ...

    def on_acknowledgement(self, metadata: RecordMetadata | None,
                           error: BaseException | None) -> None: ...


def _bytes(obj: Any) -> bytes | None:
    if obj is None or type(obj) is bytes:
        return obj
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    raise TypeError(f"expected bytes or None, got {type(obj).__name__}")


def _str(obj: Any) -> bytes | None:
    if obj is None or type(obj) is bytes:
        return obj
    if isinstance(obj, str):
        return obj.encode()
    raise TypeError(f"expected str, bytes or None, got {type(obj).__name__}")


def _json(obj: Any) -> bytes | None:
    return None if obj is None else json.dumps(obj, separators=(",", ":")).encode()


_NAMED: dict[str, Serializer] = {"bytes": _bytes, "str": _str, "json": _json}


def serializer(spec: Any, option: str) -> Serializer | None:
    """A serializer from an option's value: None, a name, or a callable."""
    if spec is None:
        return None
    if isinstance(spec, str):
        try:
            return _NAMED[spec]
        except KeyError:
            from pipeline.producer._errors import ConfigError
            raise ConfigError(f"invalid {option}={spec!r}: use one of {sorted(_NAMED)} or a "
                              "callable (obj) -> bytes | None") from None
    if callable(spec):
        return spec  # type: ignore[no-any-return]
    from pipeline.producer._errors import ConfigError
    raise ConfigError(f"invalid {option}={spec!r}: use one of {sorted(_NAMED)} or a callable")


class SendHooks:
    """A producer's serializers and interceptors (``of`` gives None when it has none)."""

    def __init__(self, key: Serializer | None, value: Serializer | None,
                 interceptors: Sequence[Any]) -> None:
        self._key = key
        self._value = value
        self._on_send = [i.on_send for i in interceptors if hasattr(i, "on_send")]
        self._on_ack = [i.on_acknowledgement for i in interceptors
                        if hasattr(i, "on_acknowledgement")]
        #: interceptor calls that raised (each logged)
        self.errors = 0

    @classmethod
    def of(cls, config: Any) -> SendHooks | None:
        key = serializer(config.key_serializer, "key_serializer")
        value = serializer(config.value_serializer, "value_serializer")
        if key is None and value is None and not config.interceptors:
            return None
        return cls(key, value, config.interceptors)

    @property
    def acknowledges(self) -> bool:
        return bool(self._on_ack)

    @property
    def intercepts(self) -> bool:
        return bool(self._on_send)

    # -- the steps ----------------------------------------------------------------------
    def intercept(self, msg: ProducerMessage) -> ProducerMessage:
        for on_send in self._on_send:
            try:
                out = on_send(msg)
            except Exception:
                self.errors += 1
                log.exception("interceptor %r raised in on_send; the record goes on unchanged",
                              on_send)
                continue
            if isinstance(out, ProducerMessage):
                msg = out
            else:
                self.errors += 1
                log.error("interceptor %r returned %r from on_send, not a ProducerMessage; "
                          "the record goes on unchanged", on_send, type(out).__name__)
        return msg

    def serialize(self, msg: ProducerMessage) -> None:
        """Serialize ``msg``'s key and value in place (``SerializationError`` if one fails)."""
        if self._value is not None:
            msg.value = self._run(self._value, msg.value, "value", msg.topic)
        if self._key is not None:
            msg.key = self._run(self._key, msg.key, "key", msg.topic)

    @staticmethod
    def _run(ser: Serializer, obj: Any, field: str, topic: str) -> bytes | None:
        try:
            out = ser(obj)
        except Exception as exc:
            raise SerializationError(
                f"{field}_serializer failed for a record to {topic!r}: "
                f"{type(exc).__name__}: {exc}") from exc
        if out is not None and not isinstance(out, bytes):
            raise SerializationError(
                f"{field}_serializer returned {type(out).__name__} for a record to {topic!r}; "
                "it must return bytes or None")
        return out

    def acknowledge(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        for on_ack in self._on_ack:
            try:
                on_ack(metadata, error)
            except Exception:
                self.errors += 1
                log.exception("interceptor %r raised in on_acknowledgement", on_ack)

    async def acknowledge_group(self, group: Any, msgs: list[ProducerMessage]) -> None:
        """The acknowledgements of a ``send_many`` call's messages, each once, when the
        call's group has every outcome (a task of the producer)."""
        await group._event.wait()
        for msg in msgs:
            if msg.done():
                if msg._outcome is None:
                    self.acknowledge(msg.record_metadata(), None)
                else:
                    self.acknowledge(None, msg._outcome)

    # -- the calls ------------------------------------------------------------------------
    def prepare(self, topic: str, value: Any, kwargs: dict[str, Any]) -> ProducerMessage:
        """``send``'s arguments through the interceptors and the serializers, as a message."""
        msg = ProducerMessage(topic, value, kwargs.get("key"), kwargs.get("headers"),
                              kwargs.get("partition"), kwargs.get("timestamp"),
                              kwargs.get("metadata"))
        msg = self.intercept(msg)
        self.serialize(msg)
        return msg

    def callback(self, user: Callable[[Any, Any], object] | None,
                 ) -> Callable[[Any, Any], object] | None:
        """The ``on_delivery`` that runs the acknowledgements, then the caller's own."""
        if not self._on_ack:
            return user

        def on_delivery(metadata: Any, error: Any) -> None:
            self.acknowledge(metadata, None if error is None else error.cause)
            if user is not None:
                user(metadata, error)

        return on_delivery

    def wrap_send(self, send: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def send_with_hooks(topic: str, value: Any, **kwargs: Any) -> Any:
            msg = self.prepare(topic, value, kwargs)
            return await send(msg.topic, msg.value, key=msg.key, headers=msg.headers or None,
                              partition=msg.partition, timestamp=msg.timestamp,
                              metadata=msg.metadata,
                              on_delivery=self.callback(kwargs.get("on_delivery")))

        return send_with_hooks

    def wrap_send_nowait(self, send_nowait: Callable[..., Any]) -> Callable[..., Any]:
        def send_nowait_with_hooks(topic: str, value: Any, **kwargs: Any) -> Any:
            msg = self.prepare(topic, value, kwargs)
            return send_nowait(msg.topic, msg.value, key=msg.key, headers=msg.headers or None,
                               partition=msg.partition, timestamp=msg.timestamp,
                               metadata=msg.metadata,
                               on_delivery=self.callback(kwargs.get("on_delivery")))

        return send_nowait_with_hooks

    def messages(self, messages: Iterable[ProducerMessage]) -> list[ProducerMessage]:
        """``send_many``'s messages through the interceptors and serializers (in place)."""
        out = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, ProducerMessage):
                out.append(msg)  # (the call's own check names it)
                continue
            msg = self.intercept(msg)
            try:
                self.serialize(msg)
            except SerializationError as exc:
                raise SerializationError(f"message {i}: {exc}") from exc.__cause__
            out.append(msg)
        return out

    def column(self, values: Any, field: str, topic: str) -> Any:
        """A ``send_batch`` column serialized in one pass, when it is a Python list."""
        ser = self._value if field == "values" else self._key
        if ser is None or not isinstance(values, list):
            return values
        return [self._run(ser, v, field.rstrip("s"), topic) for v in values]


def rows_as_messages(topic: str, values: Any, keys: Any, headers: Any, partitions: Any,
                     timestamps: Any) -> list[ProducerMessage]:
    """``send_batch``'s rows as messages (each must pass the interceptors' on_send)."""
    vals = list(values.to_pylist() if hasattr(values, "to_pylist") else values)
    n = len(vals)

    def col(c: Any) -> list[Any]:
        if c is None:
            return [None] * n
        out = list(c.to_pylist() if hasattr(c, "to_pylist") else c)
        if len(out) != n:
            raise ValueError(f"send_batch: a column has {len(out)} rows, values has {n}")
        return out

    ks, hs, ps, ts = col(keys), col(headers), col(partitions), col(timestamps)
    return [ProducerMessage(topic, vals[i], ks[i], _headers(hs[i]), ps[i], ts[i])
            for i in range(n)]


def _headers(h: Any) -> Any:
    if h is None:
        return None
    return [(kv["key"], kv["value"]) if isinstance(kv, dict) else tuple(kv) for kv in h]
