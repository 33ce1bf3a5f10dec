"""Trace context through Kafka: W3C ``traceparent`` in each record's headers.

:class:`TracingInterceptor` is both a producer interceptor and a consumer interceptor
(``interceptors=[TracingInterceptor()]`` on either client):

* ``on_send(message)`` writes the trace context into the message's headers with the
  propagator (by default the global one: W3C ``traceparent`` / ``tracestate``, and
  ``baggage``). The context is the caller's current span's when there is one (the
  record joins the trace the application is in); else, with ``send_spans`` (the
  default), a new ``send <topic>`` span (kind PRODUCER) is started, written into the
  headers and ended at once, as OpenTelemetry's messaging conventions' "create" span: it
  gives the record a trace of its own (without ``send_spans`` the record is left as it
  is: no span, no header). Headers of the same names the record already had are replaced (a record
  forwarded from another topic carries the context it is sent in now, not the old one).
* ``on_consume(records)`` reads each record's context back: with ``consumer_spans``
  (the default) it starts and ends a ``receive <topic>`` span (kind CONSUMER) per
  record whose parent is the producer's context, so one trace goes from the producing
  application through Kafka to the consumer. :func:`context_of` gives a record's
  context to start the application's own processing span under it.

Spans carry the messaging attributes (``messaging.system`` "kafka",
``messaging.destination.name``, the partition and offset where known). The
acknowledgement is not a span: the outcome of each record is in the producer's
statistics, and ``on_acknowledgement`` does not name the record it reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter, TextMapPropagator

if TYPE_CHECKING:
    from pipeline.consumer import ConsumedRecord
    from pipeline.producer import ProducerMessage

__all__ = ["TracingInterceptor", "context_of"]

_TRACER = "pipeline.otel"

Headers = Sequence[tuple[str, "bytes | None"]]


class _HeaderGetter(Getter[Headers]):
    """Reads a record's headers (a sequence of ``(name, bytes | None)``) as text."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [v.decode("utf-8", "replace") for k, v in carrier
                 if v is not None and k.lower() == key]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


class _DictSetter(Setter[dict[str, str]]):
    def set(self, carrier: dict[str, str], key: str, value: str) -> None:
        carrier[key] = value


_GETTER = _HeaderGetter()
_SETTER = _DictSetter()


def context_of(record: ConsumedRecord, propagator: TextMapPropagator | None = None) -> Context:
    """The trace context a record's headers carry (an empty context when none): start
    the processing span of ``record`` under it with ``tracer.start_as_current_span(name,
    context=context_of(record))``."""
    prop = propagator if propagator is not None else propagate.get_global_textmap()
    return prop.extract(record.headers or (), context=Context(), getter=_GETTER)


class TracingInterceptor:
    """Producer and consumer interceptor carrying trace context in record headers.

    Args:
        tracer_provider: where the spans go (default: the global one).
        propagator: how the context is written and read (default: the global one).
        send_spans: give a record sent outside any span a ``send <topic>`` span of its
            own (False: only records sent in a span carry a context).
        consumer_spans: start a ``receive <topic>`` span per consumed record (a child of
            the producer's context). False: the consumer side does nothing (the
            application reads contexts with :func:`context_of`).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 propagator: TextMapPropagator | None = None, *,
                 send_spans: bool = True, consumer_spans: bool = True) -> None:
        self._tracer = trace.get_tracer(_TRACER, tracer_provider=tracer_provider)
        self._propagator = propagator
        self._send_spans = send_spans
        # The headers written for the context records were last sent in, with it: every
        # record sent in one span carries the same headers, made once (the propagator's
        # output depends on the context alone, and contexts are immutable).
        self._last: tuple[Context | None, list[tuple[str, bytes | None]]] = (None, [])
        self._last_prop: TextMapPropagator | None = None
        self._consumer_spans = consumer_spans

    def _prop(self) -> TextMapPropagator:
        return self._propagator if self._propagator is not None else \
            propagate.get_global_textmap()

    # -- producer -----------------------------------------------------------------------
    def on_send(self, message: ProducerMessage) -> ProducerMessage:
        current = otel_context.get_current()
        last_context, headers = self._last
        if current is not last_context or self._prop() is not self._last_prop:
            if trace.get_current_span(current).get_span_context().is_valid:
                headers = self._inject(current)
                self._last, self._last_prop = (current, headers), self._prop()
            elif not self._send_spans:
                return message
            else:
                span = self._tracer.start_span(
                    f"send {message.topic}", kind=trace.SpanKind.PRODUCER,
                    attributes=_attributes(message.topic, message.partition, None, "send",
                                           "send"))
                try:
                    headers = self._inject(trace.set_span_in_context(span))
                finally:
                    span.end()
        if headers:
            names = {k.lower() for k, _ in headers}
            kept = [(k, v) for k, v in message.headers or () if k.lower() not in names]
            message.headers = kept + headers
        return message

    def _inject(self, context: Context) -> list[tuple[str, bytes | None]]:
        carrier: dict[str, str] = {}
        self._prop().inject(carrier, context=context, setter=_SETTER)
        return [(k, v.encode()) for k, v in carrier.items()]

    # -- consumer -----------------------------------------------------------------------
    def on_consume(self, records: list[ConsumedRecord]) -> list[ConsumedRecord]:
        if self._consumer_spans:
            prop = self._prop()
            for record in records:
                parent = prop.extract(record.headers or (), context=Context(), getter=_GETTER)
                self._tracer.start_span(
                    f"receive {record.topic}", context=parent, kind=trace.SpanKind.CONSUMER,
                    attributes=_attributes(record.topic, record.partition, record.offset,
                                           "receive", "receive")).end()
        return records


def _attributes(topic: str, partition: int | None, offset: int | None, operation: str,
                kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.destination.name": topic,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
    }
    if partition is not None and partition >= 0:
        out["messaging.destination.partition.id"] = str(partition)
    if offset is not None:
        out["messaging.kafka.offset"] = offset
    return out
