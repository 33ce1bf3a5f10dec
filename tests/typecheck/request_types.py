"""Static typing of the wire boundary, checked by mypy --strict (``make lint``).

Not a pytest module (pytest collects nothing here): mypy proves that a request
names its response type all the way through the connection. Each
``assert_type`` fails the lint if the inferred type drifts (to ``Any`` or to
another class); each ``# type: ignore[...]`` line is a misuse mypy must
reject, and with ``warn_unused_ignores`` (part of --strict) an ignore that
stops being needed, because the call became ``Any``-typed, fails the lint too.
"""

from __future__ import annotations

from typing import Any, assert_type

from pipeline.cluster.connection import BrokerConnection, PendingResponse
from pipeline.protocol.base import Request, Response
from pipeline.protocol.codec import decode_response_as, encode_request
from pipeline.protocol.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from pipeline.protocol.messages.fetch import FetchRequest, FetchResponse
from pipeline.protocol.messages.init_producer_id import (
    InitProducerIdRequest,
    InitProducerIdResponse,
)
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataResponse
from pipeline.protocol.messages.produce import ProduceRequest, ProduceResponse


async def request_returns_the_response_type(conn: BrokerConnection) -> None:
    assert_type(await conn.request(ProduceRequest(acks=-1)), ProduceResponse)
    assert_type(await conn.request(MetadataRequest()), MetadataResponse)
    assert_type(await conn.request(FetchRequest(), version=12), FetchResponse)
    assert_type(await conn.request(InitProducerIdRequest()), InitProducerIdResponse)
    assert_type(await conn.request(ApiVersionsRequest(), version=0), ApiVersionsResponse)


async def send_returns_a_typed_pending_response(conn: BrokerConnection) -> None:
    pending = await conn.send(ProduceRequest(acks=-1))
    assert_type(pending, PendingResponse[ProduceResponse])
    assert_type(await pending.wait(), ProduceResponse)
    # acks=0: no response may come, so the entry resolves to None as well.
    maybe = await conn.send(ProduceRequest(acks=0), expect_response=False)
    assert_type(await maybe.wait(), ProduceResponse | None)


async def fields_are_typed(conn: BrokerConnection) -> int:
    response = await conn.request(ProduceRequest(acks=-1))
    # A typo in a response field is a type error, not an AttributeError at run time.
    response.responsez  # type: ignore[attr-defined]  # noqa: B018
    return response.responses[0].partition_responses[0].error_code


async def a_response_is_not_another(conn: BrokerConnection) -> MetadataResponse:
    # mypy infers the response type from the return context, so it reports the
    # mismatch at the argument: a ProduceRequest is not a Request[MetadataResponse].
    return await conn.request(ProduceRequest(acks=-1))  # type: ignore[arg-type]


async def only_requests_can_be_sent(conn: BrokerConnection, response: ProduceResponse) -> None:
    await conn.request(response)  # type: ignore[arg-type]


def the_codec_is_typed(request: Request[Any], frame: bytes) -> None:
    assert_type(encode_request(request, version=3, correlation_id=1, client_id="c"), bytes)
    assert_type(decode_response_as(frame, ProduceResponse, version=9), tuple[int, ProduceResponse])
    assert_type(ProduceRequest().response_type(), type[ProduceResponse])
    encode_request(ProduceResponse(), version=3, correlation_id=1, client_id="c")  # type: ignore[arg-type]


def every_message_has_a_wire_base() -> tuple[type[Request[Any]], type[Response]]:
    return ProduceRequest, ProduceResponse
