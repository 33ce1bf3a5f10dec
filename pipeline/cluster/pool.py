"""The Cluster: a lazily connected broker pool plus the metadata cache.

# Strategy

:meth:`Cluster.open` owns a nursery. In it run the reader task of every
:class:`BrokerConnection` and one *refresher* task, the only task that sends
MetadataRequests.

Refreshes are single-flight. A refresh is a :class:`_Round`: callers of
:meth:`Cluster.refresh` join the round in flight when it already covers their
topics (unless ``force``), otherwise the one *next* round, which the refresher
starts as soon as refresh spacing allows. So any number of concurrent callers
cost one MetadataRequest. A round always asks for every topic in use, and
completes with the first successful MetadataResponse; it retries other brokers,
then backs off (exponential, jittered with the injected ``random.Random``)
until ``metadata_timeout``, after which its waiters get
:class:`MetadataTimeoutError`. Rounds run in the refresher task, not in a
caller's, so a cancelled caller never cancels a refresh others wait for.

Rounds are spaced by ``retry_backoff`` (Java's refresh backoff), growing
exponentially while rounds fail or leave requested topics incomplete (being
created, leaderless). Without requests, the refresher refreshes every
``metadata_max_age``.

Connections come from the :class:`~pipeline.cluster.brokers.BrokerPool`
(lazy, single-flight per node, reconnect backoff); bootstrap addresses are
used by the refresher only while no known broker answers, and closed once a
MetadataResponse lists the brokers. All options come from one
:class:`~pipeline.cluster.config.ClusterConfig`.

The first round fails fast: when every bootstrap address failed for
``connect_timeout`` it raises a :class:`~pipeline.cluster.errors.BootstrapError`
naming each address and why (refused, name not resolved, TLS handshake failed,
timed out). Later outages are waited out until ``metadata_timeout``. Logging is
one WARNING per broker per outage; retries are DEBUG.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, BrokerPool, cluster_backoff
from pipeline.cluster.config import ClusterConfig, cluster_config
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import (
    AuthenticationError,
    BootstrapError,
    BrokerConnectionError,
    KafkaError,
    MetadataTimeoutError,
    TopicMetadataError,
    UnknownTopicError,
)
from pipeline.cluster.metadata import BrokerAddress, ClusterMetadata, apply_metadata_response
from pipeline.cluster.stats import BrokerStatistics, BrokerStats
from pipeline.cluster.transport import parse_address
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.metadata import (
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)

__all__ = ["Cluster"]

logger = logging.getLogger("pipeline.cluster")


@dataclass(eq=False)
class _Round:
    """One metadata refresh that any number of callers wait for."""

    topics: frozenset[str] = frozenset()  # set when the round starts
    done: trio.Event = field(default_factory=trio.Event)
    error: KafkaError | None = None

    async def wait(self) -> None:
        """Until the round completed; raises its error if it failed."""
        await self.done.wait()
        if self.error is not None:
            raise self.error


#: What ``Cluster.queue_refresh`` returns: one round, to ``await rnd.wait()``.
RefreshRound = _Round


class Cluster:
    """Broker pool and metadata cache. Create with :meth:`open`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        bootstrap: Sequence[tuple[str, int]],
        config: ClusterConfig,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is required")
        self._nursery = nursery
        self.config = config
        rng = config.rng if config.rng is not None else random.Random()
        self._backoff = cluster_backoff(config, rng)
        self._pool = BrokerPool(
            nursery,
            [BrokerAddress(h, p) for h, p in bootstrap],
            config,
            backoff=self._backoff,
            on_lost=self.request_refresh,
        )
        self.metadata = ClusterMetadata()  # replaced whole by each refresh
        self.metadata_requests = 0  # MetadataRequests sent (for tests and stats)
        # Topics in use: every refresh asks for all of them.
        self._topics: set[str] = set()
        # {topic: error} from the latest response that mentioned the topic with an error.
        self._topic_errors: dict[str, ErrorCode] = {}
        self._current_round: _Round | None = None  # the refresh in flight
        self._next_round: _Round | None = None  # the refresh callers queue for
        self._wake = trio.Event()  # set when _next_round is created
        self._refresh_failures = 0  # consecutive failed/incomplete rounds: refresh backoff
        self._next_refresh_at = -math.inf  # refresh spacing: no round starts before this
        self._incomplete: frozenset[str] = frozenset()  # topics the last response left unusable
        #: the last failure of a metadata round (what timeouts report as the likely cause)
        self.last_error: KafkaError | None = None
        self._outage = False  # a round timed out since the last successful one
        self._opened_at = trio.current_time()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        bootstrap: str | Sequence[str],
        config: ClusterConfig | None = None,
        **options: Any,
    ) -> AsyncIterator[Cluster]:
        """Open a cluster client; connections and metadata are fetched lazily.

        Args:
          bootstrap: ``"host:port,host:port"`` or a sequence of ``host:port``.
          config: a :class:`~pipeline.cluster.config.ClusterConfig` (a
              ``ProducerConfig`` works too: its cluster part is used); keyword
              ``options`` (its field names: ``request_timeout``,
              ``metadata_timeout``, ``allow_auto_topic_creation``, ``connector``,
              ``rng``...) override its fields.

        Raises:
          ConfigError: an unknown or invalid option, before anything connects.
        """
        cfg = cluster_config(config, options)
        if isinstance(bootstrap, str):
            bootstrap = [a for a in bootstrap.split(",") if a.strip()]
        addresses = [parse_address(a) for a in bootstrap]
        async with trio.open_nursery() as nursery:
            cluster = cls(nursery, addresses, cfg)
            await nursery.start(cluster._refresher)
            try:
                yield cluster
            finally:
                await cluster.aclose()

    async def aclose(self) -> None:
        """Close every connection and stop background tasks; waiters fail."""
        if self._closed:
            return
        self._closed = True
        error = BrokerConnectionError("cluster client closed")
        for rnd in (self._current_round, self._next_round):
            if rnd is not None and not rnd.done.is_set():
                rnd.error = error
                rnd.done.set()
        await self._pool.aclose()
        self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------ metadata API

    def partition_count_nowait(self, topic: str) -> int | None:
        """The cached partition count, or None if the topic is not cached."""
        info = self.metadata.topics.get(topic)
        return info.partition_count if info is not None and info.partitions else None

    async def partitions_for(self, topic: str) -> int:
        """The topic's partition count, fetching metadata if needed.

        Raises:
          UnknownTopicError: the topic does not exist (and auto-creation is off).
          TopicMetadataError: a non-retriable topic error (authorization, invalid name).
          MetadataTimeoutError: no usable answer within ``metadata_timeout``.
        """
        count = self.partition_count_nowait(topic)
        if count is not None:
            return count
        with trio.move_on_after(self.config.metadata_timeout):
            await self.refresh([topic])
            while True:
                count = self.partition_count_nowait(topic)
                if count is not None:
                    return count
                self._raise_for_topic_error(topic)
                await self.refresh([topic], force=True)
        if (unreachable := self.bootstrap_error()) is not None:
            raise unreachable
        if self._topic_errors.get(topic) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise UnknownTopicError(
                topic,
                f"topic {topic!r} does not exist and the broker did not create it within "
                f"{self.config.metadata_timeout}s although allow_auto_topic_creation=True; create it "
                "first or enable auto.create.topics.enable on the broker",
            )
        raise MetadataTimeoutError(
            f"no metadata for topic {topic!r} within {self.config.metadata_timeout}s"
        )

    async def leader_for(self, topic: str, partition: int) -> int:
        """The node id of the partition's leader, waiting for one if it has none.

        Raises:
          UnknownTopicError, TopicMetadataError: as :meth:`partitions_for`.
          ValueError: ``partition`` is out of range.
          MetadataTimeoutError: no leader within ``metadata_timeout``.
        """
        leader = self.metadata.leader_for(topic, partition)
        if leader is not None and leader >= 0:
            return leader
        with trio.move_on_after(self.config.metadata_timeout):
            while True:
                count = await self.partitions_for(topic)
                if not 0 <= partition < count:
                    raise ValueError(
                        f"topic {topic!r} has {count} partitions; no partition {partition}"
                    )
                leader = self.metadata.leader_for(topic, partition)
                if leader is not None and leader >= 0:
                    return leader
                await self.refresh([topic], force=True)
        if (unreachable := self.bootstrap_error()) is not None:
            raise unreachable
        raise MetadataTimeoutError(
            f"no leader for {topic}-{partition} within {self.config.metadata_timeout}s"
        )

    async def refresh(self, topics: Iterable[str] | None = None, *, force: bool = False) -> None:
        """Refresh metadata for ``topics`` (and every topic in use); single-flight.

        Without ``force``, returns at once if all ``topics`` are cached and
        younger than ``metadata_max_age``, and joins a refresh in flight that
        covers them. With ``force``, waits for a refresh that starts after this
        call (shared with every other caller waiting for the same one).

        Raises:
          MetadataTimeoutError: no broker answered within ``metadata_timeout``.
          AuthenticationError: a broker refused us (TLS or SASL); not retried.
          BrokerConnectionError: the cluster client was closed.
        """
        names = self._use(topics)
        if not force and self._is_fresh(names):
            await trio.lowlevel.checkpoint()
            return
        current = self._current_round
        if not force and current is not None and names <= current.topics:
            rnd = current
        else:
            rnd = self._queue_round()
        await rnd.done.wait()
        if rnd.error is not None:
            raise rnd.error

    def queue_refresh(self, topics: Iterable[str] | None = None) -> RefreshRound:
        """The refresh round that starts next, queued now if none is: ``await
        rnd.wait()`` returns once metadata fetched after this call is in. As
        ``refresh(force=True)``, except that the round is chosen when this is
        called, not when a task gets round to awaiting it (the producer's
        partition producers re-attach on metadata fresher than a failure).

        Raises:
          BrokerConnectionError: the cluster client was closed.
        """
        self._use(topics)
        return self._queue_round()

    def request_refresh(self, topics: Iterable[str] | None = None) -> None:
        """Ask for a refresh without waiting (after NOT_LEADER_OR_FOLLOWER,
        UNKNOWN_TOPIC_OR_PARTITION or a connection error)."""
        if self._closed:
            return
        self._use(topics)
        self._queue_round()

    # ----------------------------------------------------------- broker pool

    async def connection(self, node_id: int) -> BrokerConnection:
        """The connection to broker ``node_id``, connecting (with backoff) if needed.

        Raises:
          BrokerConnectionError: the connect failed, or the node is not in the metadata.
        """
        address = self._pool.address_of(node_id, self.metadata.brokers)
        if address is None:
            await self.refresh(force=True)
            address = self._pool.address_of(node_id, self.metadata.brokers)
            if address is None:
                raise BrokerConnectionError(f"broker {node_id} is not in the cluster metadata")
        return await self._pool.connect(node_id, address)

    def broker_statistics(self) -> dict[int, BrokerStatistics]:
        """Each broker's statistics now, by node id (cluster/stats.py)."""
        return self._pool.statistics()

    def broker_stats(self, node_id: int) -> BrokerStats:
        """The running counts of ``node_id``, for a client to add its partitions' error codes."""
        return self._pool.stats_of(node_id)

    def open_connections(self) -> list[BrokerConnection]:
        """The broker connections open now (their ``reauthentications``, ``in_flight``...)."""
        return self._pool.open_connections()

    @property
    def connects(self) -> int:
        """Connections made so far (a reconnect counts again)."""
        return self._pool.connects

    async def any_connection(self) -> BrokerConnection:
        """A connection to some known broker: an open one if any, else the first that connects.

        Raises:
          BrokerConnectionError: no broker could be reached.
          MetadataTimeoutError: no metadata could be fetched.
        """
        if not self.metadata.brokers:
            await self.refresh(force=True)
        return await self._pool.pick(self.metadata.brokers, include_bootstrap=False)

    def bootstrap_error(self) -> BootstrapError | None:
        """While no broker was ever reached (no connection made): the
        :class:`BootstrapError` naming each bootstrap address and why its last connect
        failed (what a caller's own timeout should report instead of "no answer");
        None otherwise."""
        if self.metadata.brokers or self._pool.connects:
            return None  # a broker was reached: what failed came after connecting
        return self._pool.bootstrap_error(trio.current_time() - self._opened_at)

    # ---------------------------------------------------------------- private

    def _use(self, topics: Iterable[str] | None) -> frozenset[str]:
        if self._closed:
            raise BrokerConnectionError("cluster client closed")
        if topics is None:
            return frozenset()
        if isinstance(topics, str):
            raise TypeError("topics must be an iterable of names, not a string")
        names = frozenset(topics)
        self._topics |= names
        return names

    def _is_fresh(self, names: frozenset[str]) -> bool:
        md = self.metadata
        if trio.current_time() - md.fetched_at >= self.config.metadata_max_age:
            return False
        return all(n in md.topics for n in names)

    def _queue_round(self) -> _Round:
        if self._closed:
            raise BrokerConnectionError("cluster client closed")
        if self._next_round is None:
            self._next_round = _Round()
            self._wake.set()
        return self._next_round

    def _raise_for_topic_error(self, topic: str) -> None:
        code = self._topic_errors.get(topic)
        if code is None:
            return
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            if not self.config.allow_auto_topic_creation:
                raise UnknownTopicError(topic)
        elif not code.retriable and code != ErrorCode.LEADER_NOT_AVAILABLE:
            raise TopicMetadataError(topic, code, f"{code.name}: {code.description}")

    # --------------------------------------------------------------- refresher

    async def _refresher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            if self._next_round is None:
                # Periodic refresh once metadata was fetched at all; else only on demand.
                fetched = self.metadata.fetched_at
                due = fetched + self.config.metadata_max_age if fetched > -math.inf else math.inf
                with trio.move_on_at(due):
                    await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep_until(self._next_refresh_at)
            rnd, self._next_round = self._next_round or _Round(), None
            rnd.topics = frozenset(self._topics)
            self._current_round = rnd
            try:
                complete = await self._run_round(rnd)
            finally:
                self._current_round = None
                rnd.done.set()
            if complete:
                self._refresh_failures = 0
            else:
                self._refresh_failures += 1
            self._next_refresh_at = trio.current_time() + self._backoff.delay(
                self._refresh_failures + 1
            )

    async def _run_round(self, rnd: _Round) -> bool:
        """Fetch metadata for ``rnd.topics``; True if every topic is usable. While no
        broker is known, :meth:`BrokerPool.connect_bootstrap` connects (its
        :class:`BootstrapError` fails the round after ``connect_timeout``)."""
        started = trio.current_time()
        deadline = started + self.config.metadata_timeout
        conn: BrokerConnection | None = None
        if not self.metadata.brokers:
            try:
                conn = await self._pool.connect_bootstrap(
                    give_up_after=self.config.connect_timeout, deadline=deadline)
            except (BootstrapError, AuthenticationError) as exc:
                # Raised to the round's waiters, who report it: DEBUG here.
                rnd.error = self.last_error = exc
                logger.debug("metadata refresh failed: %s", exc)
                return False
        attempt = 1
        with trio.move_on_at(deadline) as scope:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await self._pool.pick(self.metadata.brokers,
                                                     include_bootstrap=True)
                    version = conn.version_for(ApiKey.METADATA)
                    request = MetadataRequest(
                        topics=tuple(MetadataRequestTopic(name=t) for t in sorted(rnd.topics)),
                        allow_auto_topic_creation=self.config.allow_auto_topic_creation,
                    )
                    self.metadata_requests += 1
                    response = await conn.request(request, version=version)
                except AuthenticationError as exc:
                    # Not retriable (KIP-152): the round fails now with the reason, not
                    # with a timeout after metadata_timeout. The next round (spaced by
                    # the refresh backoff) tries again.
                    rnd.error = self.last_error = exc
                    logger.warning("metadata refresh failed: %s", exc)
                    return False
                except CONNECT_ERRORS as exc:
                    conn = None
                    self.last_error = exc
                    delay = self._backoff.delay(attempt)
                    attempt += 1
                    # The pool warns once per broker per outage; retries are DEBUG.
                    logger.debug("metadata refresh failed (retry in %.3fs): %s", delay, exc)
                    await trio.sleep(delay)
                    continue
                for retired in self._apply(response, rnd.topics):
                    await retired.aclose()
                self._outage = False
                return not self._incomplete
        assert scope.cancelled_caught
        rnd.error = MetadataTimeoutError(
            f"no broker answered a metadata request within {self.config.metadata_timeout}s "
            f"(bootstrap {', '.join(f'{h}:{p}' for h, p in self._pool.bootstrap)})"
            + (f"; last error: {self.last_error}" if self.last_error is not None else "")
        )
        # Once per outage: rounds keep failing every metadata_timeout while it lasts.
        logger.log(logging.DEBUG if self._outage else logging.WARNING, "%s", rnd.error)
        self._outage = True
        return False

    def _apply(
        self, response: MetadataResponse, requested: frozenset[str]
    ) -> list[BrokerConnection]:
        """Install the new snapshot; returns bootstrap connections that are no longer needed."""
        update = apply_metadata_response(
            self.metadata,
            response,
            requested=requested,
            now=trio.current_time(),
            allow_auto_topic_creation=self.config.allow_auto_topic_creation,
        )
        self.metadata = update.metadata
        for name in requested:
            self._topic_errors.pop(name, None)
        self._topic_errors.update(update.topic_errors)
        self._incomplete = update.incomplete
        if not self.config.allow_auto_topic_creation:
            # Stop asking for topics that do not exist until a caller asks again.
            for name, code in update.topic_errors.items():
                if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    self._topics.discard(name)
        logger.debug(
            "metadata: %d brokers, topics %s, errors %s",
            len(self.metadata.brokers),
            sorted(update.metadata.topics),
            dict(update.topic_errors),
        )
        return self._pool.retire_bootstrap() if self.metadata.brokers else []
