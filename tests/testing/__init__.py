"""Tests of pipeline.testing: the fake cluster, its faults and the fault proxy.

`RawClient` speaks raw protocol over any trio stream with the project's codec
(no producer exists at this layer), so tests see exactly what the fake answers.
"""

from __future__ import annotations

from typing import Any

import trio

from pipeline.protocol.codec import decode_response, encode_request
from pipeline.protocol.framing import NEED_DATA, FrameBuffer
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import BatchBuilder

__all__ = ["RawClient", "batch", "produce_request"]


class RawClient:
    """Send requests, read responses, one frame at a time, over a trio stream."""

    def __init__(self, stream: trio.abc.Stream, *, client_id: str = "tests") -> None:
        self.stream = stream
        self.client_id = client_id
        self._frames = FrameBuffer()
        self._next = 0

    async def send(self, request: Any, version: int) -> int:
        self._next += 1
        frame = encode_request(
            request, version=version, correlation_id=self._next, client_id=self.client_id
        )
        await self.stream.send_all(frame)
        return self._next

    @property
    def buffered(self) -> int:
        """Bytes received that do not (yet) make a whole frame."""
        return len(self._frames)

    async def read_frame(self) -> bytes | None:
        """The next frame (no size prefix), or None at EOF."""
        while (frame := self._frames.next_frame()) is NEED_DATA:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            self._frames.receive_data(data)
        return frame

    async def recv(self, api_key: int, version: int) -> tuple[int, Any]:
        frame = await self.read_frame()
        assert frame is not None, "connection closed before a response arrived"
        return decode_response(frame, api_key=api_key, version=version)

    async def request(self, request: Any, version: int) -> Any:
        corr = await self.send(request, version)
        got, response = await self.recv(type(request).API_KEY, version)
        assert got == corr
        return response

    async def closed(self) -> bool:
        """True if the peer closed the connection without sending anything more."""
        return await self.read_frame() is None

    async def aclose(self) -> None:
        await self.stream.aclose()


def batch(
    *values: bytes,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp: int = 1_700_000_000_000,
) -> bytes:
    """An encoded RecordBatch v2 holding `values` (keys b"k0", b"k1", ...)."""
    builder = BatchBuilder()
    for i, value in enumerate(values):
        builder.append(timestamp + i, b"k%d" % i, value)
    return builder.build(
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence
    )


def produce_request(
    topic: str, partition: int, records: bytes | None, *, acks: int = -1, timeout_ms: int = 5000
) -> pm.ProduceRequest:
    return pm.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=(
            pm.TopicProduceData(
                name=topic,
                partition_data=(pm.PartitionProduceData(index=partition, records=records),),
            ),
        ),
    )


def partition_response(response: pm.ProduceResponse) -> pm.PartitionProduceResponse:
    """The only partition response of a one-partition ProduceResponse."""
    (topic,) = response.responses
    (part,) = topic.partition_responses
    return part
