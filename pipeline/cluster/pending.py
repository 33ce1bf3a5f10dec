"""PendingResponse: the answer to one request already on the wire.

The connection's reader resolves it (:meth:`PendingResponse.set_response` or
:meth:`PendingResponse.set_error`, once); any number of tasks :meth:`wait` for it
without a task of its own. Cancelling a waiter does not affect the request: the
reader still consumes its response, so correlation bookkeeping never drifts.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Response

__all__ = ["PendingResponse"]

T_co = TypeVar("T_co", covariant=True)


class PendingResponse(Generic[T_co]):
    """The response to one request already written to the wire.

    Resolved by the connection's reader task; any number of tasks may
    :meth:`wait`. Cancelling a waiter does not affect the request. ``T_co`` is
    the request's response class (``None`` for a request sent with
    ``expect_response=False``).
    """

    __slots__ = (
        "_error",
        "_event",
        "_response",
        "api_key",
        "correlation_id",
        "deadline",
        "response_type",
        "sent_at",
        "version",
    )

    def __init__(
        self,
        api_key: ApiKey,
        version: int,
        correlation_id: int,
        deadline: float,
        response_type: type[Response],
        sent_at: float = 0.0,
    ) -> None:
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id
        self.deadline = deadline  # trio time after which the connection is declared dead
        self.response_type = response_type  # what the reader decodes the answer as
        self.sent_at = sent_at  # trio time it was written (the round trip's start)
        self._event = trio.Event()
        self._response: Any = None
        self._error: KafkaError | None = None

    @property
    def done(self) -> bool:
        """True once the response arrived or the request failed."""
        return self._event.is_set()

    async def wait(self) -> T_co:
        """Wait for and return the decoded response.

        Raises:
          BrokerConnectionError: the connection failed (``RequestTimedOutError``
              on timeout); the request may or may not have been applied.
          BrokerProtocolError: the broker sent a malformed frame.
        """
        await self._event.wait()
        if self._error is not None:
            raise self._error
        response: T_co = self._response
        return response

    # -- the connection's side: each is called once, by the connection only.

    def set_response(self, response: Response | None) -> None:
        self._response = response
        self._event.set()

    def set_error(self, error: KafkaError) -> None:
        self._error = error
        self._event.set()

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        return f"<PendingResponse {self.api_key.name} v{self.version} cid={self.correlation_id} {state}>"
