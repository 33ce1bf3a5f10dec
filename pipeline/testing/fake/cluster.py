"""`FakeCluster`: an in-process, Kafka-faithful cluster with fault injection.

Theory of operation
-------------------
Each broker is a node id plus an address. In memory mode (the default) the
address is `fake-<id>:9092` and `connector` hands out one end of a
`trio.testing.memory_stream_pair`, serving the other end in the fake's
nursery; nothing touches the network, so tests run on `autojump_clock`. With
`tcp=True` each broker listens on a random 127.0.0.1 port and Metadata
advertises those ports.

A connection is served as Kafka serves one: a request is read, handled, and
its response written before the next request is read (Kafka mutes a channel
while a request is in flight). Handling a request goes:

1. parse the header; an unknown API or version closes the connection, except
   ApiVersions above its max, answered UNSUPPORTED_VERSION in v0 format;
2. record it in `requests` (`RecordedRequest`);
3. run the `control()` hooks for that API, oldest first: the first one that
   returns something decides (a response object, `DROP`, `NO_RESPONSE`);
4. apply the scripted faults: `delay_responses(before_apply=True)`,
   `fail_next` (error codes instead of handling, nothing applied), then the
   normal handler (`produce.py`, `handlers.py`), then
   `drop_response_after_apply` (the write happened, the ack is lost) and
   `delay_responses`;
5. write the response (none for acks=0 Produce).

All randomness comes from `random.Random(seed)`, all time from trio.
"""

from __future__ import annotations

import inspect
import random
import socket
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import trio
import trio.testing

from pipeline.protocol.codec import decode_request, encode_response
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import REQUESTS
from pipeline.protocol.messages import api_versions as av
from pipeline.protocol.records import Record, RecordBatch, decode_record_batches

from . import handlers, produce
from .state import (
    BrokerState,
    ClusterConfig,
    FakeState,
    PartitionState,
    TopicState,
)

__all__ = [
    "DROP",
    "NO_RESPONSE",
    "SUPPORTED_VERSIONS",
    "ControlContext",
    "FakeCluster",
    "FaultHandle",
    "LogEntry",
    "RecordedRequest",
]

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID = 18, 19, 20, 22

#: The versions the fake serves (Kafka 3.x-like; Fetch from v4, Produce from
#: v3: RecordBatch v2 only).
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 11),
    FETCH: (4, 16),
    LIST_OFFSETS: (1, 8),
    METADATA: (1, 12),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (0, 7),
    DELETE_TOPICS: (0, 6),
    INIT_PRODUCER_ID: (0, 5),
}

MAX_FRAME = 100 * 1024 * 1024


class _Marker(Enum):
    DROP = "DROP"
    NO_RESPONSE = "NO_RESPONSE"


#: Returned by a `control()` hook: close the connection, request not applied.
DROP = _Marker.DROP
#: Returned by a `control()` hook: request not applied, nothing answered, the
#: connection stays open (a hung broker, for the client's request timeout).
NO_RESPONSE = _Marker.NO_RESPONSE


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it (`request` is None if it could not be decoded)."""

    time: float  # trio.current_time() on arrival
    node_id: int
    api_key: int
    api_version: int
    correlation_id: int
    request: Any
    client_id: str | None = None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One record of a partition log, for assertions."""

    offset: int
    record: Record
    batch: RecordBatch


@dataclass(frozen=True, slots=True)
class ControlContext:
    """What a `control()` hook sees."""

    cluster: FakeCluster
    node_id: int
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    request: Any
    time: float


ControlFn = Callable[[ControlContext], Any]


@dataclass(eq=False, slots=True)
class FaultHandle:
    """A scripted fault or hook; `remove()` uninstalls it. `remaining` is None when sticky."""

    kind: str
    api_key: int | None = None
    node_id: int | None = None
    topic: str | None = None
    partition: int | None = None
    remaining: int | None = 1
    error_code: int = 0
    seconds: float = 0.0
    before_apply: bool = False
    fn: ControlFn | None = None
    fired: int = 0
    _owner: list[FaultHandle] | None = None

    def remove(self) -> None:
        if self._owner is not None and self in self._owner:
            self._owner.remove(self)

    @property
    def active(self) -> bool:
        return self._owner is not None and self in self._owner


@dataclass(eq=False, slots=True)
class _Conn:
    node_id: int
    stream: trio.abc.Stream
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


def _touched(api_key: int, request: Any) -> list[tuple[str | None, int | None]]:
    """The (topic, partition) pairs a request touches, for topic-filtered faults."""
    if request is None:
        return []
    if api_key == PRODUCE:
        return [(t.name, p.index) for t in request.topic_data for p in t.partition_data]
    if api_key == FETCH:
        return [(t.topic, p.partition) for t in request.topics for p in t.partitions]
    if api_key == LIST_OFFSETS:
        return [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    if api_key == METADATA:
        return [(t.name, None) for t in request.topics or ()]
    if api_key == CREATE_TOPICS:
        return [(t.name, None) for t in request.topics]
    if api_key == DELETE_TOPICS:
        return [(n, None) for n in request.topic_names] + [(t.name, None) for t in request.topics]
    return []


class FakeCluster:
    """A Kafka-faithful in-process cluster. Start it with `await nursery.start(fake.run)`.

    Args:
        brokers: number of brokers, node ids 0..brokers-1.
        seed: seeds the `random.Random` behind leader placement, topic ids and
            random leader moves.
        max_message_bytes: the broker-wide max.message.bytes (a topic config
            `max.message.bytes` overrides it); a bigger batch gets MESSAGE_TOO_LARGE.
        tcp: serve real sockets on 127.0.0.1 instead of in-memory streams.
        auto_create_topics: Kafka's auto.create.topics.enable (Metadata only).
        auto_create_partitions: Kafka's num.partitions, for auto-created topics
            and CreateTopics with num_partitions=-1.
        strict_unknown_producer: answer UNKNOWN_PRODUCER_ID to a non-zero
            first sequence from a producer a partition has no state for
            (Kafka < 2.5). Off: accept it, as Kafka 3.x does.
        kip360_bump: InitProducerId v3+ with the current pid/epoch bumps the
            epoch (see `produce.handle_init_producer_id`).
        api_versions: override the served version ranges {api_key: (min, max)}.
    """

    def __init__(
        self,
        *,
        brokers: int = 3,
        seed: int = 0,
        max_message_bytes: int = 1048588,
        tcp: bool = False,
        auto_create_topics: bool = True,
        auto_create_partitions: int = 1,
        strict_unknown_producer: bool = False,
        kip360_bump: bool = True,
        api_versions: dict[int, tuple[int, int]] | None = None,
        cluster_id: str = "fake-cluster",
    ) -> None:
        if brokers < 1:
            raise ValueError("need at least one broker")
        self.rng = random.Random(seed)
        self.tcp = tcp
        self.state = FakeState(
            config=ClusterConfig(
                max_message_bytes=max_message_bytes,
                auto_create_topics=auto_create_topics,
                auto_create_partitions=auto_create_partitions,
                default_replication_factor=min(3, brokers),
                strict_unknown_producer=strict_unknown_producer,
                kip360_bump=kip360_bump,
                cluster_id=cluster_id,
            ),
            brokers={n: BrokerState(n, f"fake-{n}", 9092) for n in range(brokers)},
        )
        self.supported: dict[int, tuple[int, int]] = dict(api_versions or SUPPORTED_VERSIONS)
        #: every request received, in arrival order
        self.requests: list[RecordedRequest] = []
        self._controls: list[FaultHandle] = []
        self._faults: list[FaultHandle] = []
        self._conns: set[_Conn] = set()
        self._nursery: trio.Nursery | None = None
        self._listeners: dict[int, trio.CancelScope] = {}
        self._data_event = trio.Event()
        self._request_event = trio.Event()
        self._stopped_leaders: dict[int, list[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap(self) -> str:
        """`fake-0:9092,fake-1:9092,...`, or the real 127.0.0.1 ports with tcp=True (after run)."""
        return ",".join(f"{b.host}:{b.port}" for b in self.state.brokers.values())

    async def run(
        self, *, task_status: trio.TaskStatus[FakeCluster] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.tcp:
                for b in self.state.brokers.values():
                    self._listen(b, port=0)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    @classmethod
    @asynccontextmanager
    async def serve(cls, **kwargs: Any) -> AsyncIterator[FakeCluster]:
        """`async with FakeCluster.serve(brokers=3) as fake:` runs it for the block."""
        fake = cls(**kwargs)
        async with trio.open_nursery() as nursery:
            await nursery.start(fake.run)
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        """The transport seam: `async (host, port) -> trio.abc.Stream`.

        Raises ConnectionRefusedError for a stopped broker, OSError for an unknown address.
        """
        if self.tcp:
            return await trio.open_tcp_stream(host, port)
        await trio.lowlevel.checkpoint()
        if self._nursery is None:
            raise RuntimeError("FakeCluster is not running: await nursery.start(fake.run) first")
        broker = next(
            (b for b in self.state.brokers.values() if b.host == host and b.port == port), None
        )
        if broker is None:
            raise OSError(f"fake cluster: no broker at {host}:{port}")
        if not broker.alive:
            raise ConnectionRefusedError(f"fake cluster: broker {broker.node_id} is stopped")
        client, server = trio.testing.memory_stream_pair()
        self._spawn(broker.node_id, server)
        return client

    def _spawn(self, node_id: int, stream: trio.abc.Stream) -> None:
        assert self._nursery is not None
        conn = _Conn(node_id, stream)
        self._conns.add(conn)
        self._nursery.start_soon(self._serve_connection, conn)

    def _listen(self, broker: BrokerState, *, port: int) -> None:
        assert self._nursery is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        broker.host, broker.port = "127.0.0.1", sock.getsockname()[1]
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        scope = trio.CancelScope()
        self._listeners[broker.node_id] = scope
        self._nursery.start_soon(self._accept_loop, broker.node_id, listener, scope)

    async def _accept_loop(
        self, node_id: int, listener: trio.SocketListener, scope: trio.CancelScope
    ) -> None:
        with scope:
            try:
                while True:
                    stream = await listener.accept()
                    self._spawn(node_id, stream)
            finally:
                await trio.aclose_forcefully(listener)

    # ------------------------------------------------------------------ topics and state

    def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        leaders: Sequence[int] | None = None,
        configs: dict[str, str] | None = None,
        replication_factor: int | None = None,
    ) -> None:
        """Create a topic; `leaders[p]` pins partition p's leader, else leaders are spread
        round-robin from a seeded random broker. Raises ValueError if it exists."""
        if name in self.state.topics:
            raise ValueError(f"topic {name!r} already exists")
        if leaders is not None and len(leaders) != partitions:
            raise ValueError("need one leader per partition")
        self._create(
            name,
            partitions,
            replication_factor or self.state.config.default_replication_factor,
            leaders,
            configs or {},
        )

    def _create(
        self,
        name: str,
        partitions: int,
        rf: int,
        leaders: Sequence[int] | None,
        configs: dict[str, str],
    ) -> TopicState:
        return handlers.new_topic(
            self.state,
            name,
            partitions,
            topic_id=handlers.random_uuid(self.rng.getrandbits(128) | 1),
            start=self.rng.randrange(len(self.state.brokers)),
            replication_factor=rf,
            leaders=leaders,
            configs=configs,
        )

    def delete_topic(self, name: str) -> None:
        del self.state.topics[name]

    def partition(self, topic: str, partition: int) -> PartitionState:
        part = self.state.partition(topic, partition)
        if part is None:
            raise KeyError(f"{topic}-{partition}")
        return part

    def leader(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).leader

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).high_watermark

    def producer_state(self, topic: str, partition: int) -> dict[int, tuple[int, int]]:
        """{producer_id: (epoch, last sequence)} as the partition knows it."""
        return {
            pid: (e.epoch, e.last_seq)
            for pid, e in self.partition(topic, partition).producers.items()
        }

    def reset_producer_state(self, topic: str | None = None, partition: int | None = None) -> None:
        """Forget producer state (all partitions, one topic, or one partition)."""
        for t in self.state.topics.values():
            if topic is not None and t.name != topic:
                continue
            for p in t.partitions:
                if partition is None or p.index == partition:
                    produce.reset_producer_state(p)

    def log(self, topic: str, partition: int) -> list[LogEntry]:
        """Every record of a partition, decoded from the stored batches."""
        out: list[LogEntry] = []
        for stored in self.partition(topic, partition).batches:
            if stored.decoded is None:
                stored.decoded = decode_record_batches(stored.data)[0]
            batch: RecordBatch = stored.decoded
            out.extend(
                LogEntry(batch.base_offset + r.offset_delta, r, batch) for r in batch.records
            )
        return out

    def requests_of(self, api_key: int, *, node_id: int | None = None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if r.api_key == api_key and (node_id is None or r.node_id == node_id)
        ]

    async def wait_for_requests(
        self, api_key: int, count: int, *, node_id: int | None = None
    ) -> None:
        """Wait until at least `count` requests of an API have arrived."""
        while len(self.requests_of(api_key, node_id=node_id)) < count:
            await self._request_event.wait()

    # ------------------------------------------------------------------ faults

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> int:
        """Move a partition's leadership (to `to`, else a seeded random other alive
        broker); the leader epoch is bumped. Returns the new leader."""
        part = self.partition(topic, partition)
        if to is None:
            choices = [b.node_id for b in self.state.alive_brokers() if b.node_id != part.leader]
            if not choices:
                raise ValueError("no other alive broker to move the leadership to")
            to = self.rng.choice(choices)
        if to not in self.state.brokers:
            raise ValueError(f"no broker {to}")
        if to not in part.replicas:
            part.replicas = (to, *part.replicas[:-1]) if len(part.replicas) > 1 else (to,)
        part.leader = to
        part.leader_epoch += 1
        return to

    def stop_broker(self, node_id: int, *, elect: bool = True) -> None:
        """Stop a broker: its connections close, new ones are refused, it leaves Metadata.
        With `elect`, each partition it led moves to another alive replica (epoch bump);
        else those partitions are offline (leader -1) until it restarts."""
        broker = self.state.brokers[node_id]
        broker.alive = False
        scope = self._listeners.pop(node_id, None)
        if scope is not None:
            scope.cancel()
        self.drop_connections(node_id)
        led = [
            (t.name, p.index)
            for t in self.state.topics.values()
            for p in t.partitions
            if p.leader == node_id
        ]
        self._stopped_leaders[node_id] = led
        alive = [b.node_id for b in self.state.alive_brokers()]
        for topic, index in led:
            part = self.partition(topic, index)
            candidates = [r for r in part.replicas if r in alive] or (alive if elect else [])
            if elect and candidates:
                part.leader = candidates[0]
            else:
                part.leader = -1
            part.leader_epoch += 1

    def restart_broker(self, node_id: int, *, lose_producer_state: bool = False) -> None:
        """Bring a stopped broker back (same address). Offline partitions it led get it
        back as leader (epoch bump). With `lose_producer_state`, the partitions it led
        when stopped forget all producer state (their next idempotent batch is from an
        unknown producer)."""
        broker = self.state.brokers[node_id]
        if broker.alive:
            return
        broker.alive = True
        if self.tcp and self._nursery is not None:
            self._listen(broker, port=broker.port)
        for topic, index in self._stopped_leaders.pop(node_id, []):
            part = self.state.partition(topic, index)
            if part is None:
                continue
            if part.leader == -1:
                part.leader = node_id
                part.leader_epoch += 1
            if lose_producer_state:
                produce.reset_producer_state(part)

    def drop_connections(self, node_id: int | None = None) -> int:
        """Close every open connection (to one broker, or all) now. Returns how many."""
        n = 0
        for conn in list(self._conns):
            if node_id is None or conn.node_id == node_id:
                conn.scope.cancel()
                self._conns.discard(conn)
                n += 1
        return n

    def _add_fault(self, handle: FaultHandle) -> FaultHandle:
        handle._owner = self._faults
        self._faults.append(handle)
        return handle

    def fail_next(
        self,
        api_key: int,
        error_code: int,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Answer the next `count` requests of an API (None: all) with `error_code`,
        without applying them. With `topic`/`partition`, only requests touching them
        count, and only those partitions (or topics) get the error; the rest of the
        request is handled normally. Partition-less APIs get a top-level error."""
        return self._add_fault(
            FaultHandle(
                "error",
                api_key,
                node_id,
                topic,
                partition,
                remaining=count,
                error_code=int(error_code),
            )
        )

    def drop_response_after_apply(
        self,
        api_key: int = PRODUCE,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Apply the next matching request, then close the connection instead of
        answering (the write succeeded, the ack is lost)."""
        return self._add_fault(
            FaultHandle("drop_after_apply", api_key, node_id, topic, partition, remaining=count)
        )

    def drop_next_request(
        self,
        api_key: int = PRODUCE,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Close the connection when the next matching request arrives, before applying it."""
        return self._add_fault(
            FaultHandle("drop_before_apply", api_key, node_id, topic, partition, remaining=count)
        )

    def delay_responses(
        self,
        seconds: float,
        *,
        api_key: int | None = None,
        count: int | None = None,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
        before_apply: bool = False,
    ) -> FaultHandle:
        """Delay matching responses by `seconds` (count None: until removed). With
        `before_apply` the request is only applied after the delay. The connection is
        busy meanwhile, as a Kafka connection is while a request is in flight."""
        return self._add_fault(
            FaultHandle(
                "delay",
                api_key,
                node_id,
                topic,
                partition,
                remaining=count,
                seconds=seconds,
                before_apply=before_apply,
            )
        )

    def control(
        self, api_key: int, fn: ControlFn, sticky: bool = False, *, node_id: int | None = None
    ) -> FaultHandle:
        """Install a hook for an API. `fn(ctx)` (sync or async) returns a response object
        to send, None to fall through (to the next hook, then normal handling), `DROP` or
        `NO_RESPONSE`. A one-shot hook is removed the first time it returns non-None."""
        handle = FaultHandle("control", api_key, node_id, remaining=None if sticky else 1, fn=fn)
        handle._owner = self._controls
        self._controls.append(handle)
        return handle

    def clear_faults(self) -> None:
        """Remove every scripted fault and hook."""
        self._faults.clear()
        self._controls.clear()

    # ------------------------------------------------------------------ serving

    async def _serve_connection(self, conn: _Conn) -> None:
        try:
            with conn.scope:
                buf = bytearray()
                while True:
                    frame = await self._read_frame(conn.stream, buf)
                    if frame is None or not await self._handle_frame(conn, frame):
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._conns.discard(conn)
            await trio.aclose_forcefully(conn.stream)

    @staticmethod
    async def _read_frame(stream: trio.abc.Stream, buf: bytearray) -> bytes | None:
        while True:
            if len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf)
                if size < 0 or size > MAX_FRAME:
                    return None
                if len(buf) >= 4 + size:
                    frame = bytes(buf[4 : 4 + size])
                    del buf[: 4 + size]
                    return frame
            data = await stream.receive_some(65536)
            if not data:
                return None
            buf += data

    def _record(self, rec: RecordedRequest) -> None:
        self.requests.append(rec)
        self._request_event.set()
        self._request_event = trio.Event()

    def _take(self, kind: str, api_key: int, node_id: int, request: Any) -> FaultHandle | None:
        for h in self._faults:
            if h.kind != kind or (h.api_key is not None and h.api_key != api_key):
                continue
            if h.node_id is not None and h.node_id != node_id:
                continue
            if h.topic is not None and not any(
                t == h.topic and (h.partition is None or p is None or p == h.partition)
                for t, p in _touched(api_key, request)
            ):
                continue
            h.fired += 1
            if h.remaining is not None:
                h.remaining -= 1
                if h.remaining <= 0:
                    self._faults.remove(h)
            return h
        return None

    async def _handle_frame(self, conn: _Conn, frame: bytes) -> bool:
        """Handle one request; False closes the connection."""
        node_id = conn.node_id
        if len(frame) < 8 or not self.state.brokers[node_id].alive:
            return False
        api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
        now = trio.current_time()
        served = self.supported.get(api_key)
        cls = REQUESTS.get(api_key)
        if served is None or cls is None or not served[0] <= version <= served[1]:
            self._record(RecordedRequest(now, node_id, api_key, version, correlation_id, None))
            if api_key == API_VERSIONS and served is not None and version > served[1]:
                # Kafka answers in v0 format so any client can read it and retry lower
                response = av.ApiVersionsResponse(
                    error_code=ErrorCode.UNSUPPORTED_VERSION,
                    api_keys=(
                        av.ApiVersion(
                            api_key=API_VERSIONS, min_version=served[0], max_version=served[1]
                        ),
                    ),
                )
                await self._send(conn, response, API_VERSIONS, 0, correlation_id)
                return True
            return False
        try:
            header, request = decode_request(frame)
        except Exception:
            self._record(RecordedRequest(now, node_id, api_key, version, correlation_id, None))
            return False
        client_id = header.client_id
        self._record(
            RecordedRequest(now, node_id, api_key, version, correlation_id, request, client_id)
        )

        # 1. control hooks
        ctx = ControlContext(
            self, node_id, api_key, version, correlation_id, client_id, request, now
        )
        for hook in list(self._controls):
            if hook.api_key != api_key or (hook.node_id is not None and hook.node_id != node_id):
                continue
            assert hook.fn is not None
            result = hook.fn(ctx)
            if inspect.isawaitable(result):
                result = await result
            if result is None:
                continue
            hook.fired += 1
            if hook.remaining is not None:
                hook.remove()
            if result is DROP:
                return False
            if result is NO_RESPONSE:
                return True
            await self._send(conn, result, api_key, version, correlation_id)
            return True

        # 2. scripted faults
        if self._take("drop_before_apply", api_key, node_id, request) is not None:
            return False
        delay = self._take("delay", api_key, node_id, request)
        if delay is not None and delay.before_apply:
            await trio.sleep(delay.seconds)
            if not self.state.brokers[node_id].alive:
                return False
        error = self._take("error", api_key, node_id, request)
        drop_after = self._take("drop_after_apply", api_key, node_id, request)

        def inject(topic: str | None, partition: int | None) -> int | None:
            if error is None:
                return None
            if error.topic is None or topic is None:
                return error.error_code
            if topic == error.topic and (
                error.partition is None or partition is None or partition == error.partition
            ):
                return error.error_code
            return None

        response, close = await self._dispatch(node_id, api_key, version, request, inject)
        if close or drop_after is not None or not self.state.brokers[node_id].alive:
            return False
        if response is None:
            return True
        if delay is not None and not delay.before_apply:
            await trio.sleep(delay.seconds)
            if not self.state.brokers[node_id].alive:
                return False
        await self._send(conn, response, api_key, version, correlation_id)
        return True

    async def _send(
        self, conn: _Conn, response: Any, api_key: int, version: int, correlation_id: int
    ) -> None:
        await conn.stream.send_all(
            encode_response(
                response, api_key=api_key, version=version, correlation_id=correlation_id
            )
        )

    async def _dispatch(
        self,
        node_id: int,
        api_key: int,
        version: int,
        request: Any,
        inject: Callable[[str | None, int | None], int | None],
    ) -> tuple[Any, bool]:
        state = self.state
        if api_key == PRODUCE:
            hw_before = self._total_hw()
            outcome = produce.handle_produce(state, node_id, version, request, inject)
            if self._total_hw() != hw_before:
                self._data_event.set()
                self._data_event = trio.Event()
            return outcome.response, outcome.close
        if api_key == API_VERSIONS:
            return handlers.handle_api_versions(self.supported, inject(None, None)), False
        if api_key == METADATA:
            return (
                handlers.handle_metadata(
                    state,
                    version,
                    request,
                    inject,
                    lambda name: self._create(
                        name,
                        state.config.auto_create_partitions,
                        state.config.default_replication_factor,
                        None,
                        {},
                    ),
                ),
                False,
            )
        if api_key == INIT_PRODUCER_ID:
            return produce.handle_init_producer_id(
                state, version, request, inject(None, None)
            ), False
        if api_key == CREATE_TOPICS:
            return handlers.handle_create_topics(
                state, version, request, inject, self._create
            ), False
        if api_key == DELETE_TOPICS:
            return handlers.handle_delete_topics(state, version, request, inject), False
        if api_key == LIST_OFFSETS:
            return handlers.handle_list_offsets(
                state, node_id, version, request, inject, self._offset_for_time
            ), False
        if api_key == FETCH:
            return await handlers.handle_fetch(
                state, node_id, version, request, inject, self._wait_for_data
            ), False
        raise AssertionError(f"unhandled api {api_key}")  # pragma: no cover

    def _total_hw(self) -> int:
        return sum(p.high_watermark for t in self.state.topics.values() for p in t.partitions)

    async def _wait_for_data(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await self._data_event.wait()

    def _offset_for_time(self, part: PartitionState, timestamp: int) -> tuple[int, int]:
        best: tuple[int, int] = (-1, -1)
        for stored in part.batches:
            if timestamp >= 0 and stored.max_timestamp < timestamp:
                continue
            if stored.decoded is None:
                stored.decoded = decode_record_batches(stored.data)[0]
            batch: RecordBatch = stored.decoded
            for r in batch.records:
                ts = batch.base_timestamp + r.timestamp_delta
                offset = batch.base_offset + r.offset_delta
                if timestamp == -3:
                    if ts > best[0]:
                        best = (ts, offset)
                elif ts >= timestamp:
                    return ts, offset
        return best
