"""A tiny scripted broker for connection tests (sarama's MockBroker idea).

It serves in-memory streams from a :class:`MemoryNetwork` listener with our own
codec. ApiVersions is answered automatically (optionally rejecting versions
above a limit the way Kafka does: UNSUPPORTED_VERSION in v0 format). Every
other request lands in :attr:`ScriptedBroker.inbox`; the test answers it with
:meth:`reply` (in any order it likes), or writes raw bytes with
:meth:`send_raw`. ``outstanding`` / ``max_outstanding`` count requests that
arrived and were not answered: what is really "on the wire".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.codec import decode_request, encode_response
from pipeline.protocol.framing import NEED_DATA, FrameBuffer
from pipeline.protocol.header import RequestHeader
from pipeline.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from pipeline.protocol.versions import unsupported_api_versions_response

DEFAULT_VERSIONS: Mapping[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 11),
    ApiKey.METADATA: (1, 12),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
}


@dataclass(frozen=True, slots=True)
class Received:
    time: float
    header: RequestHeader
    request: Any
    stream: trio.abc.Stream

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id

    @property
    def api_key(self) -> int:
        return self.header.request_api_key

    @property
    def version(self) -> int:
        return self.header.request_api_version


class ScriptedBroker:
    def __init__(
        self,
        *,
        api_versions: Mapping[int, tuple[int, int]] = DEFAULT_VERSIONS,
        max_api_versions_version: int | None = None,
        answer_api_versions: bool = True,
        expect_no_response: frozenset[int] = frozenset(),
    ) -> None:
        self.api_versions = dict(api_versions)
        # Reject ApiVersions requests above this version (Kafka's v0-format answer).
        self.max_api_versions_version = max_api_versions_version
        self.answer_api_versions = answer_api_versions
        # correlation ids the client sends with acks=0: not counted as outstanding
        self.expect_no_response = set(expect_no_response)
        self.received: list[Received] = []
        self.connections = 0
        self.outstanding = 0
        self.max_outstanding = 0
        self._inbox_send, self.inbox = trio.open_memory_channel[Received](math.inf)
        self._write_lock = trio.Lock()

    async def serve(
        self,
        listener: trio.MemoryReceiveChannel[trio.abc.Stream],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept streams from ``listener`` and serve each until it closes."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for stream in listener:
                self.connections += 1
                nursery.start_soon(self._serve_stream, stream)

    async def _serve_stream(self, stream: trio.abc.Stream) -> None:
        frames = FrameBuffer()
        try:
            while True:
                frame = frames.next_frame()
                if frame is NEED_DATA:
                    data = await stream.receive_some()
                    if not data:
                        return
                    frames.receive_data(data)
                    continue
                header, request = decode_request(frame)
                received = Received(trio.current_time(), header, request, stream)
                self.received.append(received)
                if header.request_api_key == ApiKey.API_VERSIONS and self.answer_api_versions:
                    await self._answer_api_versions(received)
                    continue
                if header.correlation_id not in self.expect_no_response:
                    self.outstanding += 1
                    self.max_outstanding = max(self.max_outstanding, self.outstanding)
                self._inbox_send.send_nowait(received)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer_api_versions(self, received: Received) -> None:
        limit = self.max_api_versions_version
        keys = tuple(
            ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(self.api_versions.items())
        )
        if limit is not None and received.version > limit:
            # Kafka: UNSUPPORTED_VERSION, v0 body, listing only ApiVersions.
            own = self.api_versions[ApiKey.API_VERSIONS]
            response = unsupported_api_versions_response(own[0], limit)
            await self.reply(received, response, version=0, count=False)
            return
        await self.reply(received, ApiVersionsResponse(api_keys=keys), count=False)

    async def next_request(self) -> Received:
        return await self.inbox.receive()

    async def reply(
        self,
        received: Received,
        response: Any,
        *,
        version: int | None = None,
        correlation_id: int | None = None,
        count: bool = True,
    ) -> None:
        """Answer ``received`` (at its version unless told otherwise)."""
        frame = encode_response(
            response,
            api_key=received.api_key,
            version=received.version if version is None else version,
            correlation_id=received.correlation_id if correlation_id is None else correlation_id,
        )
        if count:
            self.outstanding -= 1
        await self.send_raw(received.stream, frame)

    async def send_raw(self, stream: trio.abc.Stream, data: bytes) -> None:
        async with self._write_lock:
            await stream.send_all(data)
