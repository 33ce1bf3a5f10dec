"""How the admin client sends a request: which connection, one deadline, retries.

:class:`AdminSender` is :class:`~pipeline.cluster.admin.Admin`'s transport: it picks a
connection (a given node, else any broker of the :class:`~pipeline.cluster.pool.Cluster`, or
only the bootstrap address with :class:`DirectConnection`), negotiates the version, and
retries connection failures and retriable whole-request errors with jittered exponential
backoff until the call's deadline. Per-resource errors are the caller's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from pipeline.cluster.admin_types import AdminError
from pipeline.cluster.config import ClusterConfig, cluster_config
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import (
    BootstrapError,
    BrokerConnectionError,
    BrokerProtocolError,
    KafkaError,
    MetadataTimeoutError,
)
from pipeline.cluster.pool import Cluster
from pipeline.cluster.transport import parse_address
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.util.backoff import Backoff

__all__ = [
    "RETRY_ERRORS",
    "AdminSender",
    "DirectConnection",
    "admin_cluster_config",
    "error_or_none",
    "unique_names",
]

logger = logging.getLogger("pipeline.cluster.admin")

#: Worth another try on another connection (RequestTimedOutError is a BrokerConnectionError).
RETRY_ERRORS = (BrokerConnectionError, BrokerProtocolError, MetadataTimeoutError)


def admin_cluster_config(config: ClusterConfig | None, options: dict[str, Any],
                         timeout: float) -> ClusterConfig:
    """The cluster settings of an admin client whose calls take up to ``timeout`` seconds:
    ``config`` with ``options`` over it; without a ``config``, an admin client's defaults
    under ``options`` (its client id, a request timeout longer than a call, a metadata
    timeout shorter than one, short reconnect backoff)."""
    if config is not None:
        return cluster_config(config, options)
    defaults: dict[str, Any] = {
        "client_id": "pipeline-admin",
        "request_timeout": timeout + 5.0,
        "metadata_timeout": 0.8 * timeout,
        "retry_backoff": 0.05,
        "retry_backoff_max": 1.0,
    }
    return cluster_config(None, {**defaults, **options})


class AdminSender:
    """Sends one admin request per :meth:`call`, within ``timeout`` seconds."""

    def __init__(self, cluster: Cluster, *, timeout: float,
                 direct: DirectConnection | None) -> None:
        self.cluster = cluster
        self.timeout = timeout
        cfg = cluster.config
        self._backoff = Backoff(cfg.retry_backoff, cfg.retry_backoff_max,
                                jitter=cfg.retry_backoff_jitter,
                                rng=cfg.rng if cfg.rng is not None else random.Random())
        self._direct = direct

    async def call(
        self,
        api: ApiKey,
        build: Callable[[int, int], Any],
        *,
        node: int | None = None,
        top_error: bool = False,
    ) -> Any:
        """Send ``build(version, timeout_ms)`` to ``node`` (else any broker) and return the
        response, retrying connection failures and retriable whole-request errors (when
        ``top_error``: the response's ``error_code``) until the call's deadline. A
        :class:`BootstrapError` (no broker reached at all) is raised at once."""
        deadline = trio.current_time() + self.timeout
        attempt = 0
        last: KafkaError | None = None
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise AdminError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{api.name} did not complete within {self.timeout}s "
                    f"({f'last error: {last}' if last is not None else 'no answer'})",
                ) from last
            try:
                with trio.move_on_at(deadline):
                    conn = await self.connection(node)
                    version = conn.version_for(api)
                    request = build(version, max(1, int(remaining * 1000)))
                    response = await conn.request(request, version=version)
                    code = error_code(response.error_code) if top_error else ErrorCode.NONE
                    if code == ErrorCode.NONE:
                        return response
                    error = AdminError(code, getattr(response, "error_message", None),
                                       resource=api.name)
                    if not code.retriable:
                        raise error
                    last = error
                    self.cluster.request_refresh()
            except BootstrapError:
                raise  # no bootstrap address answered for connect_timeout: say so now
            except RETRY_ERRORS as exc:
                last = exc
            delay = self._backoff.delay(attempt + 1)
            await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
            attempt += 1
            logger.info("%s: retrying (attempt %d) after %s", api.name, attempt, last)

    async def connection(self, node: int | None) -> BrokerConnection:
        if self._direct is not None:
            if node is not None:
                raise ValueError("an Admin opened with direct=True cannot address a node")
            return await self._direct.connection()
        if node is not None:
            return await self.cluster.connection(node)
        return await self.cluster.any_connection()



class DirectConnection:
    """Connections to the bootstrap addresses themselves (``Admin.open(direct=True)``)."""

    def __init__(self, nursery: trio.Nursery, cluster: Cluster,
                 bootstrap: str | Sequence[str]) -> None:
        items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        self._addresses = [parse_address(a) for a in items if a.strip()]
        self._nursery = nursery
        self._config = cluster.config
        self._connector = cluster.config.make_connector()
        self._conn: BrokerConnection | None = None

    async def connection(self) -> BrokerConnection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        last: KafkaError | None = None
        for host, port in self._addresses:
            try:
                self._conn = await BrokerConnection.connect(
                    self._nursery, self._connector, host, port, config=self._config
                )
                return self._conn
            except RETRY_ERRORS as exc:
                last = exc
        raise BrokerConnectionError(f"no bootstrap broker reachable: {last}") from last

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()


def unique_names(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in order (a lone string is refused: it is iterable too)."""
    if isinstance(items, str):
        raise TypeError(f"expected an iterable of names, not the string {items!r}")
    return list(dict.fromkeys(items))


def error_or_none(code: int, message: str | None, resource: Any) -> AdminError | None:
    """None for NONE, else the :class:`AdminError` for ``resource``."""
    ec = error_code(code)
    return None if ec == ErrorCode.NONE else AdminError(ec, message, resource=resource)
