"""One connection to one broker: handshake, pipelining, timeouts.

# Strategy

A :class:`BrokerConnection` owns a stream and exactly one reader task, started
in a nursery the caller passes in (the :class:`~pipeline.cluster.pool.Cluster`'s
nursery in production, a test's ``nursery`` fixture in tests).

Writing happens in the caller's task, under ``_write_lock`` (trio streams
forbid concurrent ``send_all``). Before a request's bytes are written the caller
takes an in-flight *slot*; ``max_in_flight`` slots exist, so there is never one
more request on the wire than allowed. The slot belongs to the pending entry
from the moment it is registered, and is given back when that entry leaves
``_pending`` (its response arrived, or the connection failed). Slots are handed
directly to the next parked waiter, FIFO, so a newcomer cannot overtake a task
that has been waiting (same hand-off as :class:`trio.Semaphore`).

A request's frame goes to the kernel at once; on a plain TCP connection, what the
kernel does not take then is written by the connection's writer thread
(:class:`~pipeline.cluster.transport.FrameWriter`), in order, while the event loop
runs on: a request expecting a response is sent once it is queued (its response
says it was written), one without (acks=0) once it is all in the kernel. So the
broker reads the next request as soon as it answered one, however long the
caller's code runs between two awaits. The writer stops in ``_fail``, before the
stream is closed.

The reader pulls frames out of a sans-I/O :class:`FrameBuffer`, peeks the
correlation id, pops the matching :class:`PendingResponse`, decodes, and wakes
its waiter through a :class:`trio.Event`: no task per request. A response whose
correlation id matches nothing (tansu answers acks=0 Produce requests) is
logged and dropped.

Request timeouts cost no task either: the reader's ``receive_some`` runs under a
cancel scope whose deadline is the oldest pending request's deadline (deadlines
are monotonic in send order, so the oldest is the earliest). When it fires, the
connection is closed and every pending request fails with
:class:`RequestTimedOutError`.

Invariants:

* Once ``send()`` has started writing a request, that request is treated as
  written. If the writer is cancelled mid-write the stream is in an unknown
  state, so the connection is closed (every pending request fails); the
  cancelled caller sees ``Cancelled``.
* A caller cancelled while waiting for a response only stops waiting: the
  entry stays in ``_pending`` and the reader consumes (and discards) the
  response when it arrives, so correlation bookkeeping never drifts.
* Every failure path goes through ``_fail()``, which runs once: it marks the
  connection closed, fails all pending entries with one typed error, wakes
  slot waiters and cancels the reader, whose ``finally`` closes the stream.

# Re-authentication (KIP-368)

A SASL session with a lifetime is renewed on the same connection by
:mod:`pipeline.cluster.reauth`, which closes ``_gate`` while it runs: ``send``
waits for the gate (and checks it again under the write lock, after waiting for
a slot), so nothing is written between the re-authentication's requests, while
requests already on the wire are answered as always.
"""

from __future__ import annotations

import collections
import copy
import logging
import math
import struct
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import trio

from pipeline.cluster.config import ClusterConfig, cluster_config
from pipeline.cluster.errors import (
    AuthenticationError,
    BrokerConnectionError,
    BrokerProtocolError,
    KafkaError,
    RequestTimedOutError,
    UnsupportedApiError,
)
from pipeline.cluster.handshake import Handshake, handshake
from pipeline.cluster.pending import PendingResponse
from pipeline.cluster.reauth import reauthenticate
from pipeline.cluster.sasl import Authenticator
from pipeline.cluster.security import (
    describe_broker,
    early_close_hint,
    stream_error,
    tls_answer_error,
)
from pipeline.cluster.stats import BrokerStats
from pipeline.cluster.transport import Connector, FrameWriter, WriteLock
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.codec import decode_response_as, encode_request_parts, peek_correlation_id
from pipeline.protocol.errors import ProtocolError
from pipeline.protocol.framing import NEED_DATA, FrameBuffer

__all__ = ["BrokerConnection", "PendingResponse"]

logger = logging.getLogger("pipeline.cluster")

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_FRAME_SIZE = struct.Struct(">i")  # a frame's size prefix (the bytes after it)
_DEFAULT_CONFIG = ClusterConfig()

R = TypeVar("R", bound=Response)

OnClose = Callable[["BrokerConnection", KafkaError], None]


class BrokerConnection:
    """A pipelined connection to one broker. Create with :meth:`connect`."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        host: str,
        port: int,
        *,
        node_id: int = -1,
        config: ClusterConfig = _DEFAULT_CONFIG,
        on_close: OnClose | None = None,
        stats: BrokerStats | None = None,
    ) -> None:
        self.node_id = node_id
        #: What this connection did, counted per request and response (cluster/stats.py);
        #: the pool's per-node one, so it outlives the connection.
        self.stats = stats if stats is not None else BrokerStats(node_id, f"{host}:{port}")
        self.host = host
        self.port = port
        self.api_versions: dict[ApiKey, int] = {}  # negotiated at connect
        self.handshake = Handshake({})  # what connect established (finalized features...)
        self.config = config
        self.unmatched_responses = 0  # responses whose correlation id matched nothing
        self._stream = stream
        # Writes the frames (under _write_lock): trio's write, or past what the kernel
        # takes at once a thread of its own (transport.FrameWriter); closed by _fail,
        # before the stream is.
        self._writer = FrameWriter(stream)
        self._frames = FrameBuffer(max_frame_size=config.max_frame_size)
        self._on_close = on_close
        # {correlation_id: entry}, in send order. Protects response matching: an
        # entry leaves only when its response is read or the connection fails,
        # and the in-flight slot leaves with it.
        self._pending: collections.OrderedDict[int, PendingResponse[Any]] = (
            collections.OrderedDict()
        )
        # Slots not owned by a pending entry or handed to a parked waiter.
        self._free_slots = config.max_in_flight
        self._slot_lot = trio.lowlevel.ParkingLot()
        # Serialises writes: frames go out whole, in correlation-id order.
        self._write_lock = WriteLock()
        self._next_correlation_id = 0
        self._closed_error: KafkaError | None = None
        self._reader_scope = trio.CancelScope()
        self._read_scope: trio.CancelScope | None = None  # the reader's receive, while in it
        self._reader_done = trio.Event()
        # Set as the reader task takes its first step: from then on its finally sets
        # _reader_done. A reader that never ran (its nursery refused it) sets nothing,
        # so aclose must not wait for it.
        self._reader_ran = False
        # KIP-368: set while a re-authentication runs; senders wait for it (module doc).
        self._gate: trio.Event | None = None
        self._reauth_scope = trio.CancelScope()  # the re-authentication timer task
        self.session_lifetime = 0.0  # seconds the broker granted the current session (0: none)
        # Responses read, and how many the handshake took (early_close_hint).
        self._responses = 0
        self._handshake_responses: int | None = None
        self.reauthentications = 0  # completed re-authentications (tests, statistics)
        self._connecting = False  # in connect()'s set-up: failures are raised and logged there

    # ------------------------------------------------------------------ connect

    @classmethod
    async def connect(
        cls,
        nursery: trio.Nursery,
        connector: Connector,
        host: str,
        port: int,
        *,
        node_id: int = -1,
        config: ClusterConfig | None = None,
        on_close: OnClose | None = None,
        authenticator: Authenticator | None = None,
        stats: BrokerStats | None = None,
        **options: Any,
    ) -> BrokerConnection:
        """Open a stream, start the reader task in ``nursery`` and run the handshake.

        Args:
          nursery: where the reader task runs; it lives until the connection closes.
          connector: opens the stream (:func:`~pipeline.cluster.transport.tcp_connector`,
              :meth:`MemoryNetwork.connect <pipeline.cluster.transport.MemoryNetwork.connect>`).
          config: ``client_id``, ``request_timeout``, ``max_in_flight``,
              ``max_frame_size`` (and the handshake's options); keyword
              ``options`` override its fields.
          on_close: called once (synchronously) when the connection fails on its own,
              not when :meth:`aclose` is called.
          authenticator: the cluster client's SASL authenticator (shared tokens);
              without one a SASL config gets its own.
          stats: where to count requests, bytes and round trips (the pool's, per
              node); without one the connection counts into its own.

        Raises:
          ConfigError: an unknown or invalid option.
          BrokerConnectionError: the broker is unreachable or dropped the handshake.
          BrokerProtocolError: the handshake response is malformed.
          UnsupportedApiError: no ApiVersions version in common.
          AuthenticationError: TLS refused a certificate, or SASL failed (not retriable).
        """
        cfg = cluster_config(config, options) if options or config is not None else _DEFAULT_CONFIG
        # connect_timeout bounds the connector's TCP + TLS (it times itself) and the handshake.
        deadline = trio.current_time() + cfg.connect_timeout
        try:
            stream = await connector(host, port)
        except (OSError, trio.BrokenResourceError) as exc:
            raise stream_error(exc, describe_broker(node_id, host, port), "connect") from exc
        conn = cls(stream, host, port, node_id=node_id, config=cfg, stats=stats)
        conn._connecting = True
        try:
            await nursery.start(conn._run_reader)
            result = await handshake(conn, cfg, authenticator, deadline=deadline)
        except BaseException:
            await conn.aclose()
            raise
        conn.api_versions, conn.handshake = result.versions, result
        conn.session_lifetime = result.session_lifetime
        if result.session_lifetime > 0:
            auth = authenticator if authenticator is not None else Authenticator(cfg)
            nursery.start_soon(reauthenticate, conn, auth)
        conn._on_close = on_close
        conn._handshake_responses = conn._responses
        conn._connecting = False
        logger.debug("connected to %s; versions %s", conn, conn.api_versions)
        return conn

    # --------------------------------------------------------------- properties

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed; it never reopens."""
        return self._closed_error is not None

    @property
    def in_flight(self) -> int:
        """Requests written (or being written) whose response has not been read."""
        return len(self._pending)

    def __str__(self) -> str:
        return describe_broker(self.node_id, self.host, self.port)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"in_flight={self.in_flight}"
        return f"<BrokerConnection node_id={self.node_id} {self.host}:{self.port} {state}>"

    # -------------------------------------------------------------------- send

    def version_for(self, api_key: ApiKey) -> int:
        """The negotiated version for ``api_key``.

        Raises:
          UnsupportedApiError: the broker does not support the API (or no common version).
        """
        try:
            return self.api_versions[api_key]
        except KeyError:
            raise UnsupportedApiError(
                f"{self} supports no version of {api_key.name} that this client speaks"
            ) from None

    @overload
    async def send(
        self,
        request: Request[R],
        *,
        version: int | None = None,
        expect_response: Literal[True] = True,
    ) -> PendingResponse[R]: ...

    @overload
    async def send(
        self, request: Request[R], *, version: int | None = None, expect_response: bool
    ) -> PendingResponse[R | None]: ...

    async def send(
        self, request: Request[R], *, version: int | None = None, expect_response: bool = True
    ) -> PendingResponse[R | None]:
        """Write ``request`` and return its :class:`PendingResponse`.

        Waits for an in-flight slot (when a response is expected) and for the
        write lock, then writes the frame. Once this returns, the request is on
        the wire and will never be treated as unsent. With
        ``expect_response=False`` (acks=0 Produce) no slot is taken and the
        returned entry is already resolved with ``None``. While a KIP-368
        re-authentication runs, it waits for that first.

        Raises:
          BrokerConnectionError: the connection is (or became) closed.
          AuthenticationError: it was closed by a failed re-authentication.
          UnsupportedApiError: no version negotiated for the request's API.
        """
        pending = await self._send(request, version, expect_response, gated=True)
        assert pending is not None  # (no deadline to wait until)
        return pending

    async def send_before(
        self, request: Request[R], wait: trio.CancelScope, *, version: int | None = None,
        expect_response: bool = True,
    ) -> PendingResponse[R | None] | None:
        """:meth:`send`, unless the wait for a request slot (or a re-authentication)
        lasts until ``wait``'s deadline, which the caller may move while it waits: then
        None, and nothing of it was written. Once the write begins it is never cut short
        (that would close the connection). ``wait`` scopes the first wait only (a scope
        is entered once): one resumed after a re-authentication ends at the deadline
        ``wait`` had then."""
        return await self._send(request, version, expect_response, gated=True, wait=wait)

    async def _send(
        self, request: Request[R], version: int | None, expect_response: bool, *, gated: bool,
        wait: trio.CancelScope | None = None,
    ) -> PendingResponse[R | None] | None:
        api_key = ApiKey(request.API_KEY)
        if version is None:
            version = self.version_for(api_key)
        while True:
            # (a scope is entered once: a second wait, after a re-authentication, gets a
            # fresh one with the deadline the first had then)
            waiting = wait if wait is not None else trio.CancelScope()
            wait = None
            with waiting:
                if gated and self._gate is not None:
                    await self._gate.wait()
                if expect_response:
                    await self._acquire_slot()  # (cancelled while parked: no slot taken)
            if waiting.cancelled_caught:
                return None
            if waiting.deadline != math.inf:
                wait = trio.CancelScope(deadline=waiting.deadline)
            slot_held = expect_response  # until the pending entry owns it
            try:
                async with self._write_lock:
                    self._raise_if_closed()
                    if gated and self._gate is not None:
                        # A re-authentication began while we waited for the slot or
                        # the lock: nothing may be written between its requests.
                        continue
                    # Deliver a cancellation that is already pending now, while
                    # nothing is written: past this point cancelling closes the
                    # connection.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    correlation_id = self._next_correlation_id
                    frame = encode_request_parts(request, version=version,
                                                 correlation_id=correlation_id,
                                                 client_id=self.config.client_id)
                    self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
                    now = trio.current_time()
                    pending: PendingResponse[R | None] = PendingResponse(
                        api_key, version, correlation_id,
                        now + self.config.request_timeout, request.response_type(), now)
                    stats = self.stats  # (per request: never per record)
                    stats.requests += 1
                    stats.sent_bytes += _FRAME_SIZE.unpack_from(frame[0])[0] + 4
                    stats.by_api[request.API_KEY] += 1
                    if expect_response:
                        self._register(pending)
                        slot_held = False
                    try:
                        await self._writer.write(frame, until_written=not expect_response)
                    except trio.Cancelled:
                        self._fail(
                            BrokerConnectionError(
                                f"{self}: closed because a {api_key.name} request was cancelled "
                                "while being written (the stream is in an unknown state)"
                            )
                        )
                        raise
                    except _STREAM_ERRORS as exc:
                        self._fail(stream_error(exc, str(self), "write"))
                        raise self._closed_error_or_default() from exc
                    break
            finally:
                if slot_held:
                    self._release_slot()
        if not expect_response:
            pending.set_response(None)
        return pending

    async def request(self, request: Request[R], *, version: int | None = None) -> R:
        """Send ``request`` and wait for its decoded response (see :meth:`send`)."""
        pending = await self.send(request, version=version)
        return await pending.wait()

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with :class:`BrokerConnectionError`."""
        self._fail(BrokerConnectionError(f"{self}: connection closed by the client"), notify=False)
        if not self._reader_ran:
            self._reader_done.set()
            await trio.aclose_forcefully(self._stream)
            return
        with trio.CancelScope(shield=True):
            await self._reader_done.wait()

    # ------------------------------------------------------------------- slots

    async def _acquire_slot(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._raise_if_closed()
        if self._free_slots > 0:
            self._free_slots -= 1  # (no schedule point: see transport.WriteLock)
            return
        # Parked until a slot is handed to us (or the connection fails). If we
        # are cancelled while parked, nothing was handed to us.
        await self._slot_lot.park()
        self._raise_if_closed()

    def _release_slot(self) -> None:
        if self.closed:
            return
        if self._slot_lot:
            self._slot_lot.unpark()  # hand the slot over directly
        else:
            self._free_slots += 1

    # ------------------------------------------------------------ bookkeeping

    def _register(self, pending: PendingResponse[Any]) -> None:
        was_idle = not self._pending
        self._pending[pending.correlation_id] = pending
        if was_idle and self._read_scope is not None:
            self._read_scope.deadline = pending.deadline

    def _raise_if_closed(self) -> None:
        if self._closed_error is not None:
            raise self._closed_error_or_default()

    def _closed_error_or_default(self) -> KafkaError:
        error = self._closed_error
        if isinstance(error, BrokerConnectionError | AuthenticationError):
            return copy.copy(error)  # a fresh exception: no shared traceback
        return BrokerConnectionError(f"{self}: connection closed ({error})")

    def _fail(self, error: KafkaError, *, notify: bool = True) -> None:
        """Close the connection: runs once; fails every pending entry with ``error``."""
        if self._closed_error is not None:
            return
        self._closed_error = error
        self._writer.close()  # (its thread stops before the stream's socket closes)
        if notify and not self._connecting:
            self.stats.disconnects += 1  # (an open connection lost on its own)
        pending = list(self._pending.values())
        self._pending.clear()
        if self._connecting:  # raised from connect(); the pool logs it once per outage
            logger.debug("%s", error)
        elif pending or notify:
            logger.warning("%s; failing %d pending request(s)", error, len(pending))
        for entry in pending:
            entry.set_error(error)
        self._slot_lot.unpark_all()  # parked senders wake and see the connection closed
        if self._gate is not None:
            self._gate.set()  # senders waiting for a re-authentication wake and see it too
        self._reauth_scope.cancel()
        self._reader_scope.cancel()
        if notify and self._on_close is not None:
            self._on_close(self, error)

    # ------------------------------------------------------------------ reader

    async def _run_reader(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._reader_ran = True
        try:
            with self._reader_scope:
                task_status.started()
                try:
                    await self._read_loop()
                except _STREAM_ERRORS as exc:
                    self._fail(stream_error(exc, str(self), "read"))
                except BrokerProtocolError as exc:
                    self._fail(exc)
                except KafkaError as exc:
                    self._fail(exc)
        finally:
            # Cancelled from outside (the nursery is shutting down) or ended above.
            try:
                self._fail(BrokerConnectionError(f"{self}: connection closed"), notify=False)
                await trio.aclose_forcefully(self._stream)  # raises Cancelled when cancelled
            finally:
                # Whoever waits for the reader (aclose, a failed connect) must be
                # released even then, or it waits forever inside its shield.
                self._reader_done.set()

    async def _read_loop(self) -> None:
        frames = self._frames
        while True:
            try:
                frame = frames.next_frame()
            except ProtocolError as exc:
                raise BrokerProtocolError(f"{self}: bad frame: {exc}") from exc
            if frame is not NEED_DATA:
                self._dispatch(frame)
                continue
            deadline = self._oldest_deadline()
            with trio.CancelScope(deadline=deadline) as scope:
                self._read_scope = scope
                data = await self._stream.receive_some()
            self._read_scope = None
            if scope.cancelled_caught:
                self._check_timeout()
                continue
            self.stats.received_bytes += len(data)
            if not data:
                reason = "connection closed by the broker" + early_close_hint(
                    self.config.security_protocol, self._responses, self._handshake_responses)
                raise BrokerConnectionError(f"{self}: {reason}", reason=reason)
            if self._responses == 0:
                tls = tls_answer_error(data, str(self), self.config.security_protocol)
                if tls is not None:
                    raise tls
            frames.receive_data(data)

    def _oldest_deadline(self) -> float:
        return next(iter(self._pending.values())).deadline if self._pending else math.inf

    def _check_timeout(self) -> None:
        for entry in self._pending.values():
            if entry.deadline <= trio.current_time():
                self.stats.timeouts += 1
                raise RequestTimedOutError(
                    f"{self}: no response to {entry.api_key.name} v{entry.version} "
                    f"(correlation id {entry.correlation_id}) within {self.config.request_timeout}s; "
                    "closing the connection"
                )
            return

    def _dispatch(self, frame: bytes) -> None:
        try:
            correlation_id = peek_correlation_id(frame)
        except ProtocolError as exc:
            raise BrokerProtocolError(f"{self}: frame too short for a response header") from exc
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            # tansu answers acks=0 Produce requests; an unknown id is harmless.
            self.unmatched_responses += 1
            log = logger.warning if self.unmatched_responses == 1 else logger.debug
            log("%s: dropping response with unknown correlation id %d", self, correlation_id)
            return
        self._release_slot()
        if self._pending and next(iter(self._pending)) < correlation_id:
            logger.warning(
                "%s: response for correlation id %d overtook earlier requests", self, correlation_id
            )
        try:
            _, response = decode_response_as(frame, entry.response_type, version=entry.version)
        except Exception as exc:  # any decoder failure means a malformed frame
            error = BrokerProtocolError(
                f"{self}: malformed {entry.api_key.name} v{entry.version} response "
                f"(correlation id {correlation_id}): {exc!r}"
            )
            error.__cause__ = exc
            entry.set_error(error)
            raise error from exc
        self._responses += 1
        stats = self.stats
        stats.responses += 1
        stats.rtt.add(trio.current_time() - entry.sent_at)
        throttle_ms = getattr(response, "throttle_time_ms", None)
        if throttle_ms is not None:
            stats.throttle.add(throttle_ms / 1000)
        code = getattr(response, "error_code", 0)
        if code:
            stats.error(code)
        entry.set_response(response)
