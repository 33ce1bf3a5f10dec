"""The broker pool: one lazily made, reconnecting connection per broker.

# Strategy

Connections are made on first use, by the calling task, single-flight per
node: the first caller connects while later callers wait on its ``connecting``
event and then take its result. A failed connect makes the next attempt to that
node wait an exponentially growing, jittered backoff (``retry_backoff`` ..
``retry_backoff_max``); a successful one resets it. A connection whose broker
moved to another address (a new MetadataResponse says so) is closed and made
again.

Bootstrap addresses are pseudo-nodes with negative ids (-1, -2, ...). They are
used only while no known broker answers, and retired by the
:class:`~pipeline.cluster.pool.Cluster` once a MetadataResponse lists the
brokers. The very first connect (:meth:`BrokerPool.connect_bootstrap`) tries them
all, staggered, and gives up after ``connect_timeout`` with one
:class:`~pipeline.cluster.errors.BootstrapError` naming each address's cause.

A node's first failed connect of an outage is logged at WARNING, the retries at
DEBUG, the reconnect that ends it at INFO: an unreachable broker is one line, not
one per attempt.

A connect that fails authentication (TLS refused a certificate, SASL refused the
credentials: :class:`~pipeline.cluster.errors.AuthenticationError`) is not
retriable: it backs off like any failure, and until that backoff ends every
caller asking for that node gets the same error at once, without a new attempt
(KIP-152: no retry storm against a broker that refuses us, and the caller fails
fast with the real reason). After the backoff the next caller tries again.

The pool owns no task: the readers of its connections run in the nursery it is
given (the Cluster's). One SASL :class:`~pipeline.cluster.sasl.Authenticator`
serves all its connections (OAUTHBEARER tokens are shared).
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import (
    AuthenticationError,
    BootstrapError,
    BrokerConnectionError,
    BrokerProtocolError,
    KafkaError,
    UnsupportedApiError,
)
from pipeline.cluster.metadata import BrokerAddress
from pipeline.cluster.sasl import Authenticator
from pipeline.cluster.security import describe_broker, uses_sasl
from pipeline.cluster.stats import BrokerStatistics, BrokerStats
from pipeline.util.backoff import Backoff

__all__ = ["CONNECT_ERRORS", "BrokerPool"]

logger = logging.getLogger("pipeline.cluster")

#: What a failed connect raises; the pool backs off and the caller may try another broker.
CONNECT_ERRORS = (BrokerConnectionError, BrokerProtocolError, UnsupportedApiError)

# The smallest backoff the cluster client waits. retry_backoff=0 is a valid
# producer setting (retry at once), but a reconnect or metadata loop without any
# wait would spin, and on trio's autojump clock would never let time advance.
_MIN_BACKOFF = 0.001


def cluster_backoff(config: ClusterConfig, rng: random.Random) -> Backoff:
    """The reconnect / metadata-round backoff for ``config`` (never below 1 ms)."""
    return Backoff(
        max(config.retry_backoff, _MIN_BACKOFF),
        max(config.retry_backoff_max, _MIN_BACKOFF),
        jitter=config.retry_backoff_jitter,
        rng=rng,
    )


@dataclass(eq=False)
class _Node:
    """Pool entry for one broker (or bootstrap address, with a negative id)."""

    node_id: int
    conn: BrokerConnection | None = None
    connecting: trio.Event | None = None  # set while one task connects; others wait on it
    failures: int = 0  # consecutive failed connects; drives the reconnect backoff
    retry_at: float = -math.inf  # no connect attempt before this trio time
    # The last connect failed authentication: raised to callers until retry_at.
    refused: AuthenticationError | None = None
    outage_since: float = 0.0  # trio time of the first failure of the current outage
    last_reason: str = "unreachable"  # why the last connect failed (its error's reason)
    # What the node's connections did, over all of them (cluster/stats.py).
    stats: BrokerStats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = BrokerStats(self.node_id)


#: How long one bootstrap address gets before the next one is tried too.
_STAGGER = 0.25
#: Lets an attempt's own timeout (which names its phase) fire before the bootstrap's.
_MARGIN = 0.1


@dataclass(eq=False)
class _Bootstrap:
    """What :meth:`BrokerPool.connect_bootstrap`'s attempts report to it."""

    addresses: int
    failed: set[int] = field(default_factory=set)  # indexes that failed at least once
    winner: BrokerConnection | None = None
    refused: AuthenticationError | None = None
    changed: trio.Event = field(default_factory=trio.Event)  # set on any report
    failed_once: list[trio.Event] = field(default_factory=list)  # per index

    def __post_init__(self) -> None:
        self.failed_once = [trio.Event() for _ in range(self.addresses)]


class BrokerPool:
    """Connections by node id. Owned by a :class:`~pipeline.cluster.pool.Cluster`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        bootstrap: Sequence[BrokerAddress],
        config: ClusterConfig,
        *,
        backoff: Backoff,
        on_lost: Callable[[], None],
    ) -> None:
        self._nursery = nursery
        self.bootstrap = list(bootstrap)
        self._config = config
        self._connector = config.make_connector()
        self.authenticator = (
            Authenticator(config) if uses_sasl(config.security_protocol) else None
        )
        self._backoff = backoff
        # Called when a broker connection fails on its own or a connect to a
        # known broker fails: the metadata may be stale (the Cluster refreshes).
        self._on_lost = on_lost
        self._nodes: dict[int, _Node] = {}
        self._rotation = 0  # spreads connects over brokers
        self.closed = False
        self.connects = 0  # connections made (handshake done), for tests and statistics

    def address_of(
        self, node_id: int, brokers: Mapping[int, BrokerAddress]
    ) -> BrokerAddress | None:
        """The address of a broker (``brokers`` from the metadata) or bootstrap pseudo-node."""
        if node_id < 0:
            index = -node_id - 1
            return self.bootstrap[index] if index < len(self.bootstrap) else None
        return brokers.get(node_id)

    async def connect(
        self, node_id: int, address: BrokerAddress, *, wait_backoff: bool = True
    ) -> BrokerConnection:
        """The open connection to ``node_id`` at ``address``, connecting if needed.

        With ``wait_backoff=False`` a node in reconnect backoff (or whose
        concurrent connect just failed) raises at once instead of waiting.

        Raises:
          BrokerConnectionError, BrokerProtocolError, UnsupportedApiError: the connect failed.
          AuthenticationError: this connect, or the last one within its backoff, was
              refused by TLS or SASL.
        """
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id)
        node.stats.address = f"{address.host}:{address.port}"
        while True:
            conn = node.conn
            if conn is not None and not conn.closed:
                if (conn.host, conn.port) == address:
                    return conn
                logger.info("%s moved to %s:%d; reconnecting", conn, *address)
                await conn.aclose()
                node.conn = None
                continue
            if node.connecting is not None:
                await node.connecting.wait()
                if node.conn is None and node.refused is not None:
                    raise copy.copy(node.refused)
                if node.conn is None and not wait_backoff:
                    raise BrokerConnectionError(
                        f"{describe_broker(node_id, *address)}: {node.last_reason}",
                        reason=node.last_reason,
                    )
                continue
            delay = node.retry_at - trio.current_time()
            if delay > 0 and node.refused is not None:
                raise copy.copy(node.refused)
            if delay > 0:
                if not wait_backoff:
                    raise BrokerConnectionError(
                        f"{describe_broker(node_id, *address)}: {node.last_reason} (in "
                        "reconnect backoff)",
                        reason=node.last_reason,
                    )
                await trio.sleep(delay)
                continue
            break
        node.connecting = trio.Event()
        try:
            conn = await BrokerConnection.connect(
                self._nursery,
                self._connector,
                address.host,
                address.port,
                node_id=node_id,
                config=self._config,
                on_close=self._on_connection_closed,
                authenticator=self.authenticator,
                stats=node.stats,
            )
        except (*CONNECT_ERRORS, AuthenticationError) as exc:
            node.stats.connect_failures += 1
            node.retry_at = trio.current_time() + self._backoff.delay(node.failures + 1)
            node.failures += 1
            node.refused = exc if isinstance(exc, AuthenticationError) else None
            if node.failures == 1:
                node.outage_since = trio.current_time()
            # One WARNING per broker per outage (its first failed attempt); the
            # retries that follow are DEBUG, and the reconnect ends the outage.
            where = describe_broker(node_id, address.host, address.port)
            reason = node.last_reason = str(getattr(exc, "reason", exc))
            if node.failures == 1:
                logger.warning("cannot connect to %s: %s (retrying; further failures are "
                               "logged at DEBUG)", where, reason)
            else:
                logger.debug("cannot connect to %s: %s (attempt %d, next in %.3fs)",
                             where, reason, node.failures, node.retry_at - trio.current_time())
            if node_id >= 0 and not self.closed:
                self._on_lost()
            raise
        finally:
            event, node.connecting = node.connecting, None
            event.set()
        self.connects += 1
        node.stats.connects += 1
        if node.failures:
            logger.info(
                "connected to %s after %d failed attempt(s) over %.1fs",
                conn, node.failures, trio.current_time() - node.outage_since,
            )
        node.conn = conn
        node.failures = 0
        node.retry_at = -math.inf
        node.refused = None
        return conn

    async def connect_bootstrap(self, *, give_up_after: float, deadline: float
                                ) -> BrokerConnection:
        """A connection to one of the bootstrap addresses, while no broker is known.

        Every address is tried, concurrently but staggered (as happy eyeballs does):
        address ``i`` starts once address ``i - 1`` failed, or ``_STAGGER`` seconds
        later, and all have started after ``2 * _STAGGER``; each retries after its
        reconnect backoff. The first to connect wins and the others are cancelled.

        Raises:
          BootstrapError: every address failed at least once and ``give_up_after``
              seconds passed (``2 * _STAGGER`` more at most, for the last address's
              first attempt), or ``deadline`` (trio time) came; it names each address
              and why its last attempt failed.
          AuthenticationError: an address refused us (TLS or SASL): not retried.
        """
        started = trio.current_time()
        # Every address has started after 2 * _STAGGER, and a connector's attempt ends
        # by connect_timeout after its start: by then each address failed (with its own
        # reason) or a custom connector hangs, which cannot keep the caller waiting.
        deadline = min(deadline, started + give_up_after + 2 * _STAGGER + _MARGIN)
        state = _Bootstrap(len(self.bootstrap))
        async with trio.open_nursery() as nursery:
            for index, address in enumerate(self.bootstrap):
                nursery.start_soon(self._bootstrap_attempts, index, address, state)
            while state.winner is None and state.refused is None:
                everyone_failed = len(state.failed) == len(self.bootstrap)
                wake = min(deadline, started + give_up_after) if everyone_failed else deadline
                if trio.current_time() >= wake:
                    break
                state.changed = trio.Event()
                with trio.move_on_at(wake):
                    await state.changed.wait()
            nursery.cancel_scope.cancel()
        if state.winner is not None:
            return state.winner
        if state.refused is not None:
            raise state.refused
        raise self.bootstrap_error(trio.current_time() - started)

    def bootstrap_error(self, elapsed: float) -> BootstrapError:
        """The :class:`BootstrapError` for bootstrap addresses tried for ``elapsed``
        seconds: each address with the reason its last attempt failed."""
        causes: dict[str, str] = {}
        for index, address in enumerate(self.bootstrap):
            node = self._nodes.get(-index - 1)
            if node is not None and node.failures:
                why = node.last_reason
            else:
                why = f"timed out: no answer after {elapsed:.1f}s"
            causes[f"{address.host}:{address.port}"] = why
        return BootstrapError(
            f"cannot connect to any bootstrap broker (connect_timeout="
            f"{self._config.connect_timeout}s): "
            + "; ".join(f"{where}: {why}" for where, why in causes.items()),
            causes,
        )

    async def _bootstrap_attempts(self, index: int, address: BrokerAddress,
                                  state: _Bootstrap) -> None:
        if index:
            with trio.move_on_after(min(index, 2) * _STAGGER):
                await state.failed_once[index - 1].wait()
        while True:
            try:
                conn = await self.connect(-index - 1, address)
            except AuthenticationError as exc:
                state.refused = exc
            except CONNECT_ERRORS:
                state.failed.add(index)
                state.failed_once[index].set()
                state.changed.set()
                continue
            else:
                state.winner = conn
            state.changed.set()
            return

    async def pick(
        self, brokers: Mapping[int, BrokerAddress], *, include_bootstrap: bool
    ) -> BrokerConnection:
        """An open connection to a known broker (least loaded), else connect to the
        next candidate (brokers in rotation, then bootstrap addresses when asked or
        when no broker is known).

        Raises:
          BrokerConnectionError: no candidate could be reached.
          AuthenticationError: a candidate refused us (TLS or SASL): not worth trying
              the others with the same credentials.
        """
        open_conns = [
            n.conn
            for node_id, n in self._nodes.items()
            if node_id in brokers and n.conn is not None and not n.conn.closed
        ]
        if open_conns:
            return min(open_conns, key=lambda c: c.in_flight)
        ids = sorted(brokers)
        if ids:
            start = self._rotation % len(ids)
            self._rotation += 1
            ids = ids[start:] + ids[:start]
        candidates: list[tuple[int, BrokerAddress]] = [(i, brokers[i]) for i in ids]
        if include_bootstrap or not candidates:
            # A bootstrap address that is a known broker's is that broker: not twice.
            known = set(brokers.values())
            candidates += [(-i - 1, a) for i, a in enumerate(self.bootstrap) if a not in known]
        last: KafkaError | None = None
        for node_id, address in candidates:
            try:
                return await self.connect(node_id, address, wait_backoff=False)
            except CONNECT_ERRORS as exc:
                last = exc
        raise BrokerConnectionError(
            "no broker reachable (tried "
            + ", ".join(f"{a.host}:{a.port}" for _, a in candidates)
            + f"): {last}"
        ) from last

    def statistics(self) -> dict[int, BrokerStatistics]:
        """Each node's statistics now (bootstrap pseudo-nodes too), by node id."""
        out: dict[int, BrokerStatistics] = {}
        for node_id, node in sorted(self._nodes.items()):
            conn = node.conn
            out[node_id] = node.stats.snapshot(
                None if conn is None or conn.closed else conn.in_flight)
        return out

    def stats_of(self, node_id: int) -> BrokerStats:
        """The running counts of ``node_id`` (made on first use): where a client counts
        the error codes of the partitions in its responses."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id)
        return node.stats

    def open_connections(self) -> list[BrokerConnection]:
        """The connections that are open now."""
        return [n.conn for n in self._nodes.values() if n.conn is not None and not n.conn.closed]

    def retire_bootstrap(self) -> list[BrokerConnection]:
        """Detach the bootstrap pseudo-nodes' connections (the caller closes them)."""
        retired: list[BrokerConnection] = []
        for node_id, node in self._nodes.items():
            if node_id < 0 and node.conn is not None:
                retired.append(node.conn)
                node.conn = None
        return retired

    async def aclose(self) -> None:
        """Close every connection (shielded: runs to the end even when cancelled)."""
        self.closed = True
        with trio.CancelScope(shield=True):
            for node in list(self._nodes.values()):
                if node.conn is not None:
                    await node.conn.aclose()

    def _on_connection_closed(self, conn: BrokerConnection, error: KafkaError) -> None:
        if self.closed or conn.node_id < 0:
            return
        logger.info("%s lost (%s); refreshing metadata", conn, error)
        self._on_lost()
