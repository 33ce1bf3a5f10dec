"""Whole-frame encoding/decoding: header + body (+ the 4-byte size prefix on encode).

* ``encode_request`` / ``encode_response`` return **size-prefixed** frames,
  ready to write to a stream.
* ``decode_request`` / ``decode_response`` / ``peek_correlation_id`` take a
  frame **without** its size prefix (what :class:`~pipeline.protocol.framing.FrameBuffer`
  yields).
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar

from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.errors import DecodeError, ErrorCode, UnsupportedVersionError
from pipeline.protocol.header import (
    RequestHeader,
    ResponseHeader,
    request_header_version,
    response_header_version,
)
from pipeline.protocol.messages import REQUESTS, RESPONSES
from pipeline.protocol.primitives import Reader, Writer

__all__ = [
    "GATHER_MIN",
    "GatherWriter",
    "decode_request",
    "decode_response",
    "decode_response_as",
    "encode_request",
    "encode_request_parts",
    "encode_response",
    "peek_correlation_id",
]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

R = TypeVar("R", bound=Response)


#: Byte fields at least this long are kept by reference by :class:`GatherWriter`;
#: shorter ones are copied (a part costs a list entry and an iovec).
GATHER_MIN = 1024


class GatherWriter(Writer):
    """A :class:`Writer` that keeps long byte fields as references, not copies.

    ``parts()`` returns buffers whose concatenation is exactly what a
    :class:`Writer` would have built. A produce request is mostly its record
    batches; copying them into one frame (and again into ``bytes``) took fresh
    pages per request, which a gather write (``sendmsg``) does not need.
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        super().__init__()
        # Everything written before ``buf``, in order: closed bytearrays and the
        # long payloads between them (never an empty buffer).
        self._parts: list[bytes | bytearray | memoryview] = []

    def _payload(self, v: bytes | bytearray | memoryview) -> None:
        if len(v) < GATHER_MIN:
            self.buf += v
            return
        if self.buf:
            self._parts.append(self.buf)
            self.buf = bytearray()
        self._parts.append(v)

    def bytes_(self, v: bytes | bytearray | memoryview) -> None:
        self.buf += _I32.pack(len(v))
        self._payload(v)

    def compact_bytes(self, v: bytes | bytearray | memoryview) -> None:
        self.uvarint(len(v) + 1)
        self._payload(v)

    def __len__(self) -> int:
        return len(self.buf) + sum(len(p) for p in self._parts)

    def getvalue(self) -> bytes:
        return b"".join(self.parts())

    def parts(self) -> list[bytes | bytearray | memoryview]:
        """The buffers written so far, in order (a new list; none empty)."""
        return [*self._parts, self.buf] if self.buf else list(self._parts)


def _check_version(cls: Any, version: int) -> None:
    if not cls.MIN_VERSION <= version <= cls.MAX_VERSION:
        raise UnsupportedVersionError(
            f"{cls.__name__} version {version} is outside {cls.MIN_VERSION}-{cls.MAX_VERSION}"
        )


def _write_request(
    w: Writer, request: Request[Any], version: int, correlation_id: int, client_id: str | None
) -> None:
    cls = type(request)
    _check_version(cls, version)
    api_key: int = cls.API_KEY
    w.buf += b"\x00\x00\x00\x00"  # the size prefix, filled in by the caller
    RequestHeader(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )._write(w, request_header_version(api_key, version))
    request._write(w, version)


def encode_request(
    request: Request[Any], *, version: int, correlation_id: int, client_id: str | None
) -> bytes:
    """Header + body of ``request`` at ``version``, with the int32 size prefix."""
    w = Writer()
    _write_request(w, request, version, correlation_id, client_id)
    _I32.pack_into(w.buf, 0, len(w.buf) - 4)
    return bytes(w.buf)


def encode_request_parts(
    request: Request[Any], *, version: int, correlation_id: int, client_id: str | None
) -> list[bytes | bytearray | memoryview]:
    """:func:`encode_request` as buffers to write in order (a gather write).

    Their concatenation is byte for byte ``encode_request``'s frame, but byte
    fields of :data:`GATHER_MIN` bytes or more (a
    produce request's record batches) are the caller's objects, not copies. The
    first buffer starts with the size prefix.
    """
    w = GatherWriter()
    _write_request(w, request, version, correlation_id, client_id)
    parts = w.parts()
    first = parts[0]
    assert isinstance(first, bytearray)  # the header's buffer: never a payload
    _I32.pack_into(first, 0, sum(len(p) for p in parts) - 4)
    return parts


def decode_request(
    frame: bytes | bytearray | memoryview,
) -> tuple[RequestHeader, Request[Any]]:
    """Decode a request frame (no size prefix) into ``(header, request)``.

    Raises :class:`UnsupportedVersionError` (with ``.header`` set to a v1-decoded
    header, so a server can still answer) for unknown API keys or versions.
    """
    r = Reader(frame)
    if r.remaining < 8:
        raise DecodeError(f"request frame too short for a header: {r.remaining} bytes")
    api_key = _I16.unpack_from(frame, 0)[0]
    version = _I16.unpack_from(frame, 2)[0]
    cls = REQUESTS.get(api_key)
    if cls is None or not cls.MIN_VERSION <= version <= cls.MAX_VERSION:
        header = RequestHeader._read(r, 1)
        what = "unknown API key" if cls is None else f"{cls.__name__} version {version} unsupported"
        raise UnsupportedVersionError(
            f"{what} (api_key={api_key}, version={version}, correlation_id={header.correlation_id})",
            header=header,
        )
    header = RequestHeader._read(r, request_header_version(api_key, version))
    body = cls._read(r, version)
    return header, body


def encode_response(
    response: Response, *, api_key: int, version: int, correlation_id: int
) -> bytes:
    """Header + body of ``response`` at ``version``, with the int32 size prefix."""
    cls = type(response)
    if cls.API_KEY != api_key:
        raise ValueError(f"{cls.__name__} is not a response for API key {api_key}")
    _check_version(cls, version)
    w = Writer()
    w.buf += b"\x00\x00\x00\x00"
    ResponseHeader(correlation_id=correlation_id)._write(w, response_header_version(api_key, version))
    response._write(w, version)
    _I32.pack_into(w.buf, 0, len(w.buf) - 4)
    return bytes(w.buf)


def decode_response(
    frame: bytes | bytearray | memoryview, *, api_key: int, version: int
) -> tuple[int, Any]:
    """Decode a response frame (no size prefix) of API ``api_key`` into
    ``(correlation_id, response)``; see :func:`decode_response_as`."""
    cls = RESPONSES.get(int(api_key))
    if cls is None:
        raise UnsupportedVersionError(f"unknown API key {api_key}")
    return decode_response_as(frame, cls, version=version)


def decode_response_as(
    frame: bytes | bytearray | memoryview, response_type: type[R], *, version: int
) -> tuple[int, R]:
    """Decode a response frame (no size prefix) into ``(correlation_id, response)``.

    ApiVersions is the one response that may come in another version than asked
    for: a broker that does not support our request version answers
    UNSUPPORTED_VERSION with a v0 body (KIP-511; its header is always v0). So a
    v1+ ApiVersions body is read as v0 when its error code says
    UNSUPPORTED_VERSION, and, like the Java client, when reading it at
    ``version`` fails. This is the only place that rule lives.
    """
    _check_version(response_type, version)
    r = Reader(frame)
    api_key = response_type.API_KEY
    header = ResponseHeader._read(r, response_header_version(api_key, version))
    if api_key == ApiKey.API_VERSIONS and version > 0:
        start = r.pos
        if len(frame) >= start + 2 and _I16.unpack_from(frame, start)[0] == (
            ErrorCode.UNSUPPORTED_VERSION
        ):
            return header.correlation_id, response_type._read(r, 0)
        try:
            return header.correlation_id, response_type._read(r, version)
        except DecodeError:
            r.pos = start
            return header.correlation_id, response_type._read(r, 0)
    return header.correlation_id, response_type._read(r, version)


def peek_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    """The correlation id of a response frame (no size prefix): its first int32."""
    if len(frame) < 4:
        raise DecodeError(f"frame too short for a correlation id: {len(frame)} bytes")
    cid: int = _I32.unpack_from(frame, 0)[0]
    return cid
