"""Request and response headers (RequestHeader v0-v2, ResponseHeader v0-v1).

``request_header_version`` / ``response_header_version`` give the header version an
API version uses (flexible versions use v2 / v1). An ApiVersions response always
has a v0 header, whatever version was asked, so a client can read the answer of a
broker that does not speak its version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import UnsupportedVersionError
from pipeline.protocol.messages import REQUESTS
from pipeline.protocol.primitives import Reader, Writer

__all__ = [
    "RequestHeader",
    "ResponseHeader",
    "request_header_version",
    "response_header_version",
]

# ControlledShutdown (key 7; an inter-broker API, not in ApiKey) v0 is the only
# request ever sent with header v0.
_CONTROLLED_SHUTDOWN_KEY = 7


def _is_flexible(api_key: int, api_version: int) -> bool:
    cls = REQUESTS.get(int(api_key))
    if cls is None:
        raise UnsupportedVersionError(f"unknown API key {api_key}")
    flex: int | None = cls.FLEXIBLE_VERSION
    return flex is not None and api_version >= flex


def request_header_version(api_key: int, api_version: int) -> int:
    """2 for flexible request versions, else 1 (0 only for ControlledShutdown v0)."""
    if api_key == _CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 2 if _is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """1 for flexible response versions, else 0; ApiVersions responses always use v0."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if _is_flexible(api_key, api_version) else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestHeader:
    request_api_key: int = 0
    request_api_version: int = 0
    correlation_id: int = 0
    #: Always written with an int16 length (never compact), even in v2.
    client_id: str | None = None

    def encode(self, version: int) -> bytes:
        w = Writer()
        self._write(w, version)
        return bytes(w.buf)

    def _write(self, w: Writer, version: int) -> None:
        if not 0 <= version <= 2:
            raise UnsupportedVersionError(f"RequestHeader version {version} is outside 0-2")
        w.int16(self.request_api_key)
        w.int16(self.request_api_version)
        w.int32(self.correlation_id)
        if version >= 1:
            w.nullable_string(self.client_id)
        if version >= 2:
            w.uvarint(0)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, version: int) -> Self:
        return cls._read(Reader(data), version)

    @classmethod
    def _read(cls, r: Reader, version: int) -> Self:
        if not 0 <= version <= 2:
            raise UnsupportedVersionError(f"RequestHeader version {version} is outside 0-2")
        api_key = r.int16()
        api_version = r.int16()
        correlation_id = r.int32()
        client_id = r.nullable_string() if version >= 1 else None
        if version >= 2:
            r.skip_tagged_fields()
        return cls(
            request_api_key=api_key,
            request_api_version=api_version,
            correlation_id=correlation_id,
            client_id=client_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseHeader:
    correlation_id: int = 0

    def encode(self, version: int) -> bytes:
        w = Writer()
        self._write(w, version)
        return bytes(w.buf)

    def _write(self, w: Writer, version: int) -> None:
        if not 0 <= version <= 1:
            raise UnsupportedVersionError(f"ResponseHeader version {version} is outside 0-1")
        w.int32(self.correlation_id)
        if version >= 1:
            w.uvarint(0)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, version: int) -> Self:
        return cls._read(Reader(data), version)

    @classmethod
    def _read(cls, r: Reader, version: int) -> Self:
        if not 0 <= version <= 1:
            raise UnsupportedVersionError(f"ResponseHeader version {version} is outside 0-1")
        correlation_id = r.int32()
        if version >= 1:
            r.skip_tagged_fields()
        return cls(correlation_id=correlation_id)
