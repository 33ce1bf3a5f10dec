"""The group coordinator: found with FindCoordinator, talked to on its own connection.

Why a connection of its own (as the Java client's, which names the coordinator node
``Integer.MAX_VALUE - id`` to get one): a broker answers one request of a connection
at a time, in order, so a JoinGroup that waits up to the rebalance timeout, or a
Fetch that waits ``fetch_max_wait``, would hold back every request behind it.

That connection's request timeout is the rebalance timeout plus 5 s (a JoinGroup
legitimately waits that long, as Java's ``rebalance.timeout.ms + 5000``); every other
request waits at most ``request_timeout`` (:meth:`Coordinator.request`): when that
passes, the connection is closed and the coordinator forgotten, as Java marks the
coordinator unknown on a timeout.

NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE answers make the caller call
:meth:`Coordinator.forget`; the next request finds it again.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import BrokerConnectionError, KafkaError, RequestTimedOutError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._errors import ConsumerClosedError, GroupError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.find_coordinator import FindCoordinatorRequest

__all__ = ["COORDINATOR_GONE", "Coordinator", "open_coordinator"]

logger = logging.getLogger("pipeline.consumer")

R = TypeVar("R", bound=Response)

#: Answers that mean "ask someone else": forget the coordinator and find it again.
COORDINATOR_GONE = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})


class Coordinator:
    """The coordinator of one group, its connection opened on demand."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, nursery: trio.Nursery) -> None:
        assert config.group_id is not None
        self._cluster = cluster
        self._config = config
        self._group_id = config.group_id
        self._nursery = nursery  # where the connection's reader runs
        self._conn_config = dataclasses.replace(
            config.cluster,
            request_timeout=max(config.request_timeout, config.max_poll_interval + 5.0),
        )
        self._backoff = cluster_backoff(config.cluster, config.cluster.rng or random.Random())
        self._conn: BrokerConnection | None = None
        self._lock = trio.Lock()  # one lookup at a time
        self.node_id: int | None = None
        self.moves = 0  # coordinator lookups that found a different node (statistics)
        # The nursery its connections' readers run in has ended, so no connection can
        # start: a request fails at once instead of retrying until its timeout
        # (test_a_member_task_that_crashes_fails_the_consumer_instead_of_hanging_its_close).
        self._ended = False

    def end(self) -> None:
        """The nursery given at construction has ended: requests from now on raise
        :class:`ConsumerClosedError` (a close's commit and LeaveGroup log it and go on)."""
        self._ended = True

    def forget(self) -> None:
        """The coordinator moved or is gone: close its connection, look it up next time."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            self._nursery.start_soon(conn.aclose)

    async def connection(self) -> BrokerConnection:
        """The open connection to the coordinator, finding and connecting (with
        backoff, until cancelled) as needed.

        Raises:
          GroupError: the lookup was refused (group authorization, an invalid group id).
          ConsumerClosedError: :meth:`end` was called.
        """
        async with self._lock:
            if self._ended:
                raise ConsumerClosedError(
                    f"group {self._group_id!r}: the consumer's group tasks have ended (the "
                    "error that ended them is raised by open_consumer); the coordinator "
                    "cannot be reached")
            attempt = 0
            while self._conn is None or self._conn.closed:
                try:
                    self._conn = await self._find_and_connect()
                except (*CONNECT_ERRORS, KafkaError) as exc:
                    if isinstance(exc, GroupError):
                        raise
                    attempt += 1
                    delay = self._backoff.delay(attempt)
                    logger.info("group %r: no coordinator yet (%s); retry in %.3fs",
                                self._group_id, exc, delay)
                    await trio.sleep(delay)
            return self._conn

    async def _find_and_connect(self) -> BrokerConnection:
        conn = await self._cluster.any_connection()
        version = conn.version_for(ApiKey.FIND_COORDINATOR)
        request = (
            FindCoordinatorRequest(coordinator_keys=(self._group_id,))
            if version >= 4 else FindCoordinatorRequest(key=self._group_id)
        )
        with trio.fail_after(self._config.request_timeout):
            response = await conn.request(request, version=version)
        if version >= 4:
            (found,) = response.coordinators
            code, node, host, port, message = (
                found.error_code, found.node_id, found.host, found.port, found.error_message)
        else:
            code, node, host, port, message = (
                response.error_code, response.node_id, response.host, response.port,
                response.error_message)
        err = error_code(code)
        if err != ErrorCode.NONE:
            if err.retriable:
                raise BrokerConnectionError(f"FindCoordinator: {err.name}")
            raise GroupError(
                f"group {self._group_id!r}: FindCoordinator refused: {err.name} "
                f"({message or err.description})", code)
        if node != self.node_id:
            if self.node_id is not None:
                self.moves += 1
            logger.info("group %r: coordinator is broker %d (%s:%d)", self._group_id, node, host, port)
        self.node_id = node
        return await BrokerConnection.connect(
            self._nursery,
            self._conn_config.make_connector(),
            host,
            port,
            node_id=node,
            config=self._conn_config,
        )

    async def request(
        self, api_key: ApiKey, make: Callable[[int], Request[R]], *, long: bool = False
    ) -> R:
        """Send ``make(version)`` (``version`` negotiated for ``api_key``) to the coordinator
        and wait for the answer: at most ``request_timeout`` unless ``long`` (JoinGroup,
        SyncGroup: the connection's own, longer timeout).

        Raises:
          BrokerConnectionError: the connection failed or timed out (the coordinator
              is forgotten: the caller retries after finding it again).
          ConsumerClosedError: :meth:`end` was called (not to be retried).
        """
        conn = await self.connection()
        version = conn.version_for(api_key)
        request = make(version)
        try:
            if long:
                return await conn.request(request, version=version)
            with trio.move_on_after(self._config.request_timeout) as scope:
                return await conn.request(request, version=version)
        except BrokerConnectionError:
            self.forget()
            raise
        assert scope.cancelled_caught
        self.forget()
        raise RequestTimedOutError(
            f"group coordinator {conn}: no answer to {type(request).__name__} within "
            f"request_timeout={self._config.request_timeout}s"
        )

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()


@asynccontextmanager
async def open_coordinator(cluster: Cluster, config: ConsumerConfig) -> AsyncIterator[Coordinator]:
    """A group member's coordinator, its connections served by a nursery of their own
    for as long as the block runs; once the block ends no connection can start, and the
    coordinator is ended (:meth:`Coordinator.end`)."""
    async with trio.open_nursery() as connections:
        coordinator = Coordinator(cluster, config, connections)
        try:
            yield coordinator
        finally:
            coordinator.end()
