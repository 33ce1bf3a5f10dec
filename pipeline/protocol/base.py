"""The typed wire boundary: what every generated request and response class is.

A request class names its response type: ``ProduceRequest`` is a
``Request[ProduceResponse]``, so ``await conn.request(ProduceRequest(...))`` is a
``ProduceResponse`` to mypy, and the connection decodes the answer with
``request.response_type()``: the static type and the class used at run time are
the same one. ``tests/typecheck/request_types.py`` (checked by ``make lint``)
pins this.

The generated classes (``tools/gen_messages.py``) are frozen, slotted
dataclasses deriving from these; the bases hold no state (``__slots__ = ()``)
and only declare what the generated code defines. What every generated class
promises:

* ``@dataclass(frozen=True, slots=True, kw_only=True)``; names are the spec's
  (``ProduceRequest``, nested structs by their spec struct name, e.g.
  ``TopicProduceData``; a response struct whose name clashes with a request struct
  in the same module is prefixed ``Response``); fields are the spec's names in
  snake_case;
* every field has a default (the spec's, else 0 / "" / None for nullable / an empty
  tuple), so ``ProduceRequest(acks=-1, timeout_ms=30000, topic_data=(...))`` works;
  arrays are tuples; ``records`` fields are raw ``bytes | None`` (decode them with
  ``records.decode_record_batches``);
* ``encode(version) -> bytes`` (the body only) and the classmethod
  ``decode(data, version)``; a field absent at a version is skipped on encode and
  left at its default on decode;
* ClassVars ``API_KEY``, ``MIN_VERSION``, ``MAX_VERSION``, ``FLEXIBLE_VERSION`` (the
  first flexible version, or None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Generic, Self, TypeVar

if TYPE_CHECKING:
    from pipeline.protocol.primitives import Reader, Writer

__all__ = ["Request", "Response", "ResponseT"]


class _Wire:
    """Shared declarations of requests and responses."""

    __slots__ = ()

    API_KEY: ClassVar[int]
    MIN_VERSION: ClassVar[int]
    MAX_VERSION: ClassVar[int]
    FLEXIBLE_VERSION: ClassVar[int | None]  # first flexible version, None if none is

    if TYPE_CHECKING:

        def encode(self, version: int) -> bytes:
            """The body (no header, no size prefix) at ``version``."""

        @classmethod
        def decode(cls, data: bytes | bytearray | memoryview, version: int) -> Self:
            """Decode a body (no header, no size prefix) encoded at ``version``."""

        def _write(self, w: Writer, version: int) -> None: ...

        @classmethod
        def _read(cls, r: Reader, version: int) -> Self: ...


class Response(_Wire):
    """Base of every generated response class."""

    __slots__ = ()


ResponseT = TypeVar("ResponseT", bound=Response, covariant=True)


class Request(_Wire, Generic[ResponseT]):
    """Base of every generated request class; ``ResponseT`` is its response class."""

    __slots__ = ()

    if TYPE_CHECKING:

        def response_type(self) -> type[ResponseT]:
            """The response class the broker answers this request with."""
