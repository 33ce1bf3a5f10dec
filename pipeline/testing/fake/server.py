"""How the fake cluster serves a connection: frames in, hooks and faults, answers out.

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
   normal handler (`produce.py`, `handlers.py`, `group_handlers.py`; Metadata from a
   `stale_metadata` snapshot), then `fail_after_apply` (the write happened,
   the answer is an error), `drop_response_after_apply` (the write happened,
   the ack is lost) and `delay_responses`;
5. write the response (none for acks=0 Produce).

Frames are split by the codec's `FrameBuffer`, as the client splits them.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Response
from pipeline.protocol.codec import decode_request, encode_response
from pipeline.protocol.errors import ProtocolError
from pipeline.protocol.framing import NEED_DATA, FrameBuffer
from pipeline.protocol.messages import REQUESTS
from pipeline.protocol.records import RecordBatch, decode_record_batches
from pipeline.protocol.versions import unsupported_api_versions_response

from . import handlers, produce, reads
from .coordinators import Coordinators, handle_find_coordinator
from .faults import DROP, NO_RESPONSE, ControlContext, FaultScript
from .group_handlers import GROUP_APIS, GroupApis
from .sasl import ConnAuth, FakeSasl
from .state import FakeState, PartitionState, TopicState
from .txn import TransactionCoordinator
from .txn_views import describe_transactions, list_transactions

__all__ = ["MAX_FRAME", "Conn", "FakeServer", "RecordedRequest"]

MAX_FRAME = 100 * 1024 * 1024

_HEADER_START = struct.Struct(">hhi")  # api key, api version, correlation id

#: create(name, partitions, replication factor, leaders, configs) -> the new topic
CreateTopic = Callable[[str, int, int, Any, dict[str, str]], TopicState]


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


@dataclass(eq=False, slots=True)
class Conn:
    """One served connection; cancelling `scope` closes it."""

    node_id: int
    stream: trio.abc.Stream
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    auth: ConnAuth = field(default_factory=ConnAuth)  # SASL state (with FakeSasl)


class FakeServer:
    """Serves connections to the fake's brokers. Owned by `FakeCluster`."""

    def __init__(
        self,
        owner: Any,
        state: FakeState,
        supported: dict[int, tuple[int, int]],
        script: FaultScript,
        create: CreateTopic,
        sasl: FakeSasl | None = None,
        *,
        coordinators: Coordinators,
        txn: TransactionCoordinator,
        groups: GroupApis,
    ) -> None:
        self._owner = owner  # the FakeCluster, for ControlContext.cluster
        self.sasl = sasl  # SASL_PLAINTEXT listeners (Kafka's rules), or none
        self.state = state
        self.supported = supported  # {api_key: (min, max)} served
        self.script = script
        self._create = create
        self.coordinators = coordinators  # who coordinates which group / transactional id
        self.txn = txn  # the transaction coordinator (every broker's share of it)
        self.groups = groups  # the classic group coordinator's APIs
        #: every request received, in arrival order
        self.requests: list[RecordedRequest] = []
        #: every answer written, (api key, when, request, response), in writing order
        self.answers: list[tuple[int, float, Any, Any]] = []
        self.conns: set[Conn] = set()
        self._data_event = trio.Event()  # set when a Produce grows any log (Fetch waits)
        self._request_event = trio.Event()  # set when a request is recorded

    def spawn(self, nursery: trio.Nursery, node_id: int, stream: trio.abc.Stream) -> None:
        conn = Conn(node_id, stream)
        self.conns.add(conn)
        nursery.start_soon(self._serve_connection, conn)

    def drop_connections(self, node_id: int | None = None) -> int:
        """Close every open connection (to one broker, or all) now. Returns how many."""
        n = 0
        for conn in list(self.conns):
            if node_id is None or conn.node_id == node_id:
                conn.scope.cancel()
                self.conns.discard(conn)
                n += 1
        return n

    async def wait_for_requests(self, api_key: int, count: int, node_id: int | None) -> None:
        while len(self.requests_of(api_key, node_id)) < count:
            await self._request_event.wait()

    def requests_of(self, api_key: int, node_id: int | None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if r.api_key == api_key and (node_id is None or r.node_id == node_id)
        ]

    # ------------------------------------------------------------------ serving

    async def _serve_connection(self, conn: Conn) -> None:
        frames = FrameBuffer(max_frame_size=MAX_FRAME)
        try:
            with conn.scope:
                while True:
                    try:
                        frame = frames.next_frame()
                    except ProtocolError:
                        return  # a negative or oversized frame: close, as Kafka does
                    if frame is NEED_DATA:
                        data = await conn.stream.receive_some(65536)
                        if not data:
                            return
                        frames.receive_data(data)
                    elif not await self._handle_frame(conn, frame):
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.conns.discard(conn)
            await trio.aclose_forcefully(conn.stream)

    def _record(self, rec: RecordedRequest) -> None:
        self.requests.append(rec)
        self._request_event.set()
        self._request_event = trio.Event()

    async def _handle_frame(self, conn: Conn, frame: bytes) -> bool:
        """Handle one request; False closes the connection."""
        node_id = conn.node_id
        if len(frame) < 8 or not self.state.brokers[node_id].alive:
            return False
        api_key, version, correlation_id = _HEADER_START.unpack_from(frame)
        now = trio.current_time()
        served = self.supported.get(api_key)
        cls = REQUESTS.get(api_key)
        if served is None or cls is None or not served[0] <= version <= served[1]:
            self._record(RecordedRequest(now, node_id, api_key, version, correlation_id, None))
            if api_key == ApiKey.API_VERSIONS and served is not None and version > served[1]:
                # Kafka answers in v0 format so any client can read it and retry lower
                response = unsupported_api_versions_response(*served)
                await self._send(conn, response, ApiKey.API_VERSIONS, 0, correlation_id)
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
        if self.sasl is not None:
            verdict = self.sasl.handle(conn.auth, node_id, api_key, version, request, now)
            if verdict.response is not None:
                await self._send(conn, verdict.response, api_key, version, correlation_id)
            if verdict.close:
                return False
            if not verdict.serve:
                return True

        # 1. control hooks
        ctx = ControlContext(
            self._owner, node_id, api_key, version, correlation_id, client_id, request, now
        )
        for hook in self.script.hooks_for(api_key, node_id):
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
        take = self.script.take
        if take("drop_before_apply", api_key, node_id, request) is not None:
            return False
        delay = take("delay", api_key, node_id, request)
        if delay is not None and delay.before_apply:
            await trio.sleep(delay.seconds)
            if not self.state.brokers[node_id].alive:
                return False
        error = take("error", api_key, node_id, request)
        error_after = take("error_after_apply", api_key, node_id, request)
        omit = take("omit_after_apply", api_key, node_id, request)
        stale = take("stale_metadata", api_key, node_id, request)
        drop_after = take("drop_after_apply", api_key, node_id, request)

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

        answer, close = await self._dispatch(
            node_id, api_key, version, request, inject,
            stale.snapshot if stale is not None else None, client_id,
        )
        if error_after is not None and answer is not None:
            answer = produce.errors_after_apply(
                answer, error_after.error_code, error_after.topic, error_after.partition
            )
        if omit is not None and answer is not None:
            answer = produce.omit_after_apply(answer, omit.topic, omit.partition)
        if close or drop_after is not None or not self.state.brokers[node_id].alive:
            return False
        if answer is None:
            return True
        if delay is not None and not delay.before_apply:
            await trio.sleep(delay.seconds)
            if not self.state.brokers[node_id].alive:
                return False
        await self._send(conn, answer, api_key, version, correlation_id)
        self.answers.append((api_key, trio.current_time(), request, answer))
        return True

    async def _send(
        self, conn: Conn, response: Response, api_key: int, version: int, correlation_id: int
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
        metadata_view: FakeState | None = None,
        client_id: str | None = None,
    ) -> tuple[Any, bool]:
        state = self.state
        if api_key in GROUP_APIS:
            return await self.groups.handle(node_id, api_key, version, request, client_id,
                                            inject), False
        if api_key == ApiKey.PRODUCE:
            hw_before = self._total_hw()
            outcome = produce.handle_produce(state, node_id, version, request, inject, self.txn)
            if self._total_hw() != hw_before:
                self.data_arrived()
            return outcome.response, outcome.close
        if api_key == ApiKey.API_VERSIONS:
            return handlers.handle_api_versions(
                self.supported, inject(None, None), state.config.features
            ), False
        if api_key == ApiKey.METADATA:
            return (
                handlers.handle_metadata(
                    metadata_view or state,
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
        if api_key == ApiKey.INIT_PRODUCER_ID:
            return produce.handle_init_producer_id(
                state, version, request, inject(None, None), self.txn, node_id
            ), False
        txn = self._transactions(node_id, api_key, version, request, inject)
        if txn is not None:
            return txn, False
        if api_key == ApiKey.CREATE_TOPICS:
            return handlers.handle_create_topics(
                state, version, request, inject, self._create
            ), False
        if api_key == ApiKey.DELETE_TOPICS:
            return handlers.handle_delete_topics(state, version, request, inject), False
        if api_key == ApiKey.LIST_OFFSETS:
            return reads.handle_list_offsets(
                state, node_id, version, request, inject, _offset_for_time
            ), False
        if api_key == ApiKey.FETCH:
            return await reads.handle_fetch(
                state, node_id, version, request, inject, self._wait_for_data
            ), False
        raise AssertionError(f"unhandled api {api_key}")  # pragma: no cover

    def _transactions(
        self,
        node_id: int,
        api_key: int,
        version: int,
        request: Any,
        inject: Callable[[str | None, int | None], int | None],
    ) -> Response | None:
        """FindCoordinator and the transaction APIs (`coordinators.py`, `txn.py`)."""
        txn = self.txn
        if api_key == ApiKey.FIND_COORDINATOR:
            return handle_find_coordinator(self.coordinators, self.state, version, request, inject)
        if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            return txn.add_partitions(node_id, version, request, inject)
        if api_key == ApiKey.ADD_OFFSETS_TO_TXN:
            return txn.add_offsets(node_id, version, request, inject(None, None))
        if api_key == ApiKey.END_TXN:
            return txn.end_txn(node_id, version, request, inject(None, None),
                               self.state.pids.allocate)
        if api_key == ApiKey.TXN_OFFSET_COMMIT:
            return txn.txn_offset_commit(node_id, version, request, inject)
        if api_key == ApiKey.DESCRIBE_TRANSACTIONS:
            return describe_transactions(txn, node_id, request, inject(None, None))
        if api_key == ApiKey.LIST_TRANSACTIONS:
            return list_transactions(txn, node_id, version, request, inject(None, None))
        return None

    def data_arrived(self) -> None:
        """A log grew (a produce, a transaction marker): wake the waiting fetches."""
        self._data_event.set()
        self._data_event = trio.Event()

    def _total_hw(self) -> int:
        return sum(p.high_watermark for t in self.state.topics.values() for p in t.partitions)

    async def _wait_for_data(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await self._data_event.wait()


def _offset_for_time(part: PartitionState, timestamp: int) -> tuple[int, int]:
    """ListOffsets by time: (timestamp, offset) of the first record at or after
    ``timestamp``, or of the latest timestamp for -3 (max timestamp)."""
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
