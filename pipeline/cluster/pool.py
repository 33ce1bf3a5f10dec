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

Connections are made on first use, by the calling task, single-flight per
node. A failed connect makes the next attempt to that node wait an
exponentially growing backoff. Bootstrap addresses are pseudo-nodes with
negative ids, used by the refresher only while no known broker answers, and
closed once a MetadataResponse lists the brokers.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import (
    BrokerConnectionError,
    BrokerProtocolError,
    KafkaError,
    MetadataTimeoutError,
    TopicMetadataError,
    UnknownTopicError,
    UnsupportedApiError,
)
from pipeline.cluster.metadata import (
    BrokerAddress,
    ClusterMetadata,
    apply_metadata_response,
    backoff_delay,
)
from pipeline.cluster.transport import Connector, parse_address, tcp_connector
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic

__all__ = ["Cluster"]

logger = logging.getLogger("pipeline.cluster")

_CONNECT_ERRORS = (BrokerConnectionError, BrokerProtocolError, UnsupportedApiError)


@dataclass(eq=False)
class _Round:
    """One metadata refresh that any number of callers wait for."""

    topics: frozenset[str] = frozenset()  # set when the round starts
    done: trio.Event = field(default_factory=trio.Event)
    error: KafkaError | None = None


@dataclass(eq=False)
class _Node:
    """Pool entry for one broker (or bootstrap address, with a negative id)."""

    node_id: int
    conn: BrokerConnection | None = None
    connecting: trio.Event | None = None  # set while one task connects; others wait on it
    failures: int = 0  # consecutive failed connects; drives the reconnect backoff
    retry_at: float = -math.inf  # no connect attempt before this trio time


class Cluster:
    """Broker pool and metadata cache. Create with :meth:`open`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        bootstrap: Sequence[tuple[str, int]],
        *,
        connector: Connector,
        client_id: str = "pipeline",
        request_timeout: float = 30.0,
        metadata_max_age: float = 300.0,
        metadata_timeout: float = 60.0,
        allow_auto_topic_creation: bool = False,
        retry_backoff: float = 0.1,
        retry_backoff_max: float = 1.0,
        max_in_flight: int = 5,
        rng: random.Random | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is required")
        self._nursery = nursery
        self._bootstrap = [BrokerAddress(h, p) for h, p in bootstrap]
        self._connector = connector
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.metadata_max_age = metadata_max_age
        self.metadata_timeout = metadata_timeout
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        self.max_in_flight = max_in_flight
        self._rng = rng if rng is not None else random.Random()
        self.metadata = ClusterMetadata()  # replaced whole by each refresh
        self.metadata_requests = 0  # MetadataRequests sent (for tests and stats)
        # Topics in use: every refresh asks for all of them.
        self._topics: set[str] = set()
        # {topic: error} from the latest response that mentioned the topic with an error.
        self._topic_errors: dict[str, ErrorCode] = {}
        self._nodes: dict[int, _Node] = {}
        self._current_round: _Round | None = None  # the refresh in flight
        self._next_round: _Round | None = None  # the refresh callers queue for
        self._wake = trio.Event()  # set when _next_round is created
        self._refresh_failures = 0  # consecutive failed/incomplete rounds: refresh backoff
        self._next_refresh_at = -math.inf  # refresh spacing: no round starts before this
        self._rotation = 0  # spreads metadata requests over brokers
        self._incomplete: frozenset[str] = frozenset()  # topics the last response left unusable
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        bootstrap: str | Sequence[str],
        *,
        connector: Connector | None = None,
        client_id: str = "pipeline",
        request_timeout: float = 30.0,
        metadata_max_age: float = 300.0,
        metadata_timeout: float = 60.0,
        allow_auto_topic_creation: bool = False,
        retry_backoff: float = 0.1,
        retry_backoff_max: float = 1.0,
        max_in_flight: int = 5,
        rng: random.Random | None = None,
    ) -> AsyncIterator[Cluster]:
        """Open a cluster client; connections and metadata are fetched lazily.

        Args:
          bootstrap: ``"host:port,host:port"`` or a sequence of ``host:port``.
          connector: how to open streams; defaults to plain TCP.
          metadata_max_age: refresh metadata at least this often (seconds).
          metadata_timeout: how long a refresh (or a wait for a leader) may take
              before :class:`MetadataTimeoutError`.
          allow_auto_topic_creation: ask brokers to create unknown topics; off by
              default, and unknown topics raise :class:`UnknownTopicError`.
          retry_backoff, retry_backoff_max: exponential backoff bounds for
              reconnects and metadata retries.
          rng: jitter source (inject a seeded one for reproducible tests).
        """
        if isinstance(bootstrap, str):
            bootstrap = [a for a in bootstrap.split(",") if a.strip()]
        addresses = [parse_address(a) for a in bootstrap]
        async with trio.open_nursery() as nursery:
            cluster = cls(
                nursery,
                addresses,
                connector=connector if connector is not None else tcp_connector(),
                client_id=client_id,
                request_timeout=request_timeout,
                metadata_max_age=metadata_max_age,
                metadata_timeout=metadata_timeout,
                allow_auto_topic_creation=allow_auto_topic_creation,
                retry_backoff=retry_backoff,
                retry_backoff_max=retry_backoff_max,
                max_in_flight=max_in_flight,
                rng=rng,
            )
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
        with trio.CancelScope(shield=True):
            for node in list(self._nodes.values()):
                if node.conn is not None:
                    await node.conn.aclose()
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
        with trio.move_on_after(self.metadata_timeout):
            await self.refresh([topic])
            while True:
                count = self.partition_count_nowait(topic)
                if count is not None:
                    return count
                self._raise_for_topic_error(topic)
                await self.refresh([topic], force=True)
        if self._topic_errors.get(topic) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise UnknownTopicError(
                topic,
                f"topic {topic!r} does not exist and the broker did not create it within "
                f"{self.metadata_timeout}s although allow_auto_topic_creation=True; create it "
                "first or enable auto.create.topics.enable on the broker",
            )
        raise MetadataTimeoutError(
            f"no metadata for topic {topic!r} within {self.metadata_timeout}s"
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
        with trio.move_on_after(self.metadata_timeout):
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
        raise MetadataTimeoutError(
            f"no leader for {topic}-{partition} within {self.metadata_timeout}s"
        )

    async def refresh(self, topics: Iterable[str] | None = None, *, force: bool = False) -> None:
        """Refresh metadata for ``topics`` (and every topic in use); single-flight.

        Without ``force``, returns at once if all ``topics`` are cached and
        younger than ``metadata_max_age``, and joins a refresh in flight that
        covers them. With ``force``, waits for a refresh that starts after this
        call (shared with every other caller waiting for the same one).

        Raises:
          MetadataTimeoutError: no broker answered within ``metadata_timeout``.
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
        address = self._address_of(node_id)
        if address is None:
            await self.refresh(force=True)
            address = self._address_of(node_id)
            if address is None:
                raise BrokerConnectionError(f"broker {node_id} is not in the cluster metadata")
        return await self._connect_node(node_id, address)

    async def any_connection(self) -> BrokerConnection:
        """A connection to some known broker: an open one if any, else the first that connects.

        Raises:
          BrokerConnectionError: no broker could be reached.
          MetadataTimeoutError: no metadata could be fetched.
        """
        if not self.metadata.brokers:
            await self.refresh(force=True)
        return await self._pick_connection(include_bootstrap=False)

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
        if trio.current_time() - md.fetched_at >= self.metadata_max_age:
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
            if not self.allow_auto_topic_creation:
                raise UnknownTopicError(topic)
        elif not code.retriable and code != ErrorCode.LEADER_NOT_AVAILABLE:
            raise TopicMetadataError(topic, code, f"{code.name}: {code.description}")

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(
            attempt, base=self.retry_backoff, maximum=self.retry_backoff_max, rng=self._rng
        )

    def _address_of(self, node_id: int) -> BrokerAddress | None:
        if node_id < 0:
            index = -node_id - 1
            return self._bootstrap[index] if index < len(self._bootstrap) else None
        return self.metadata.brokers.get(node_id)

    async def _connect_node(
        self, node_id: int, address: BrokerAddress, *, wait_backoff: bool = True
    ) -> BrokerConnection:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id)
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
                if node.conn is None and not wait_backoff:
                    raise BrokerConnectionError(
                        f"broker {node_id} at {address[0]}:{address[1]} unreachable"
                    )
                continue
            delay = node.retry_at - trio.current_time()
            if delay > 0:
                if not wait_backoff:
                    raise BrokerConnectionError(
                        f"broker {node_id} at {address[0]}:{address[1]} in reconnect backoff"
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
                client_id=self.client_id,
                max_in_flight=self.max_in_flight,
                request_timeout=self.request_timeout,
                on_close=self._on_connection_closed,
            )
        except _CONNECT_ERRORS as exc:
            node.retry_at = trio.current_time() + self._backoff(node.failures)
            node.failures += 1
            logger.warning(
                "cannot connect to broker %d at %s:%d (attempt %d, next in %.3fs): %s",
                node_id,
                address.host,
                address.port,
                node.failures,
                node.retry_at - trio.current_time(),
                exc,
            )
            if node_id >= 0:
                self.request_refresh()
            raise
        finally:
            event, node.connecting = node.connecting, None
            event.set()
        node.conn = conn
        node.failures = 0
        node.retry_at = -math.inf
        return conn

    def _on_connection_closed(self, conn: BrokerConnection, error: KafkaError) -> None:
        if self._closed or conn.node_id < 0:
            return
        logger.info("%s lost (%s); refreshing metadata", conn, error)
        self.request_refresh()

    async def _pick_connection(self, *, include_bootstrap: bool) -> BrokerConnection:
        """An open connection to a known broker (least loaded), else connect to the next candidate."""
        brokers = self.metadata.brokers
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
            candidates += [(-i - 1, a) for i, a in enumerate(self._bootstrap)]
        last: KafkaError | None = None
        for node_id, address in candidates:
            try:
                return await self._connect_node(node_id, address, wait_backoff=False)
            except _CONNECT_ERRORS as exc:
                last = exc
        raise BrokerConnectionError(
            "no broker reachable (tried "
            + ", ".join(f"{a.host}:{a.port}" for _, a in candidates)
            + f"): {last}"
        ) from last

    # --------------------------------------------------------------- refresher

    async def _refresher(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            if self._next_round is None:
                # Periodic refresh once metadata was fetched at all; else only on demand.
                fetched = self.metadata.fetched_at
                due = fetched + self.metadata_max_age if fetched > -math.inf else math.inf
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
            self._next_refresh_at = trio.current_time() + self._backoff(
                max(0, self._refresh_failures)
            )

    async def _run_round(self, rnd: _Round) -> bool:
        """Fetch metadata for ``rnd.topics``; True if every topic is usable."""
        attempt = 0
        with trio.move_on_after(self.metadata_timeout) as scope:
            while True:
                try:
                    conn = await self._pick_connection(include_bootstrap=True)
                    version = conn.version_for(ApiKey.METADATA)
                    request = MetadataRequest(
                        topics=tuple(MetadataRequestTopic(name=t) for t in sorted(rnd.topics)),
                        allow_auto_topic_creation=self.allow_auto_topic_creation,
                    )
                    self.metadata_requests += 1
                    response = await conn.request(request, version=version)
                except _CONNECT_ERRORS as exc:
                    delay = self._backoff(attempt)
                    attempt += 1
                    logger.warning("metadata refresh failed (retry in %.3fs): %s", delay, exc)
                    await trio.sleep(delay)
                    continue
                for retired in self._apply(response, rnd.topics):
                    await retired.aclose()
                return not self._incomplete
        assert scope.cancelled_caught
        rnd.error = MetadataTimeoutError(
            f"no broker answered a metadata request within {self.metadata_timeout}s "
            f"(bootstrap {', '.join(f'{h}:{p}' for h, p in self._bootstrap)})"
        )
        logger.warning("%s", rnd.error)
        return False

    def _apply(self, response: object, requested: frozenset[str]) -> list[BrokerConnection]:
        """Install the new snapshot; returns bootstrap connections that are no longer needed."""
        update = apply_metadata_response(
            self.metadata,
            response,
            requested=requested,
            now=trio.current_time(),
            allow_auto_topic_creation=self.allow_auto_topic_creation,
        )
        self.metadata = update.metadata
        for name in requested:
            self._topic_errors.pop(name, None)
        self._topic_errors.update(update.topic_errors)
        self._incomplete = update.incomplete
        if not self.allow_auto_topic_creation:
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
        retired: list[BrokerConnection] = []
        if self.metadata.brokers:
            for node_id, node in self._nodes.items():
                if node_id < 0 and node.conn is not None:
                    retired.append(node.conn)
                    node.conn = None
        return retired
