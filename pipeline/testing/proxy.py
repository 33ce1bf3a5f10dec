"""`FaultProxy`: a trio TCP proxy that breaks the path to a real broker on purpose.

Put it between a client and any broker (the embedded tansu broker, a Kafka
container). The broker must advertise the proxy's address, or clients bypass
it after bootstrap: start tansu with `advertised_port=proxy.port`::

    proxy = FaultProxy("127.0.0.1", broker_port, listen_port=proxy_port, seed=7)
    await nursery.start(proxy.run)
    with EmbeddedBroker(port=broker_port, advertised_port=proxy.port): ...

Faults:

* `kill_all()` / `kill_one()`: close connections on command (`kill_one` picks
  with the seeded rng); `kill_randomly(min_lifetime, max_lifetime)`: every
  connection dies after a seeded random lifetime;
* `cut_mid_frame(direction)`: forward only part of the next frame (size
  prefix included), then close: the peer sees a truncated frame;
* `blackhole(seconds)`: accept, but forward nothing (and open no upstream
  connection) for a while; held data flows again afterwards, or as soon as
  `clear_faults()` is called;
* `set_delay(seconds)`: latency added before each forwarded frame;
* `lose_responses(count, api_key=None)`: when the broker's response to a
  request starts arriving, close both sides instead of forwarding it: the
  request was applied, its ack is lost (`stop_losing_responses()` disarms the
  rules that have not fired).

The proxy splits Kafka frames in both directions with the codec's
`FrameBuffer` (request header api_key/version/correlation_id; response
correlation id) and forwards whole frames. It listens on 127.0.0.1 only; connections and
frame sizes are bounded.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Literal

import trio

from pipeline.protocol.errors import ProtocolError
from pipeline.protocol.framing import NEED_DATA, FrameBuffer

__all__ = ["FaultProxy", "ProxyEvent", "ProxyStats"]

Direction = Literal["request", "response"]
MAX_FRAME = 100 * 1024 * 1024
_I32 = struct.Struct(">i")
_REQUEST_HEAD = struct.Struct(">hhi")  # api key, version, correlation id


@dataclass(slots=True)
class ProxyStats:
    accepted: int = 0
    rejected: int = 0  # over max_connections or upstream refused
    killed: int = 0  # closed by a fault
    requests: int = 0  # frames forwarded client -> broker
    responses: int = 0  # frames forwarded broker -> client
    responses_lost: int = 0
    cuts: int = 0


@dataclass(frozen=True, slots=True)
class ProxyEvent:
    time: float
    kind: str  # "accept", "kill", "cut", "lose_response", "close"
    conn_id: int
    detail: str = ""


@dataclass(eq=False, slots=True)
class _Conn:
    conn_id: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    pending: dict[int, int] = field(default_factory=dict)  # {correlation_id: api_key}
    killed: bool = False


@dataclass(slots=True)
class _LoseRule:
    remaining: int
    api_key: int | None


class FaultProxy:
    """A bounded, seeded fault-injecting TCP proxy on 127.0.0.1.

    Args:
        upstream_host, upstream_port: the broker.
        listen_port: 0 picks a free port (read `port` after `run` started).
        seed: seeds every random choice (kill lifetimes, cut points, kill_one).
        max_connections: further connections are closed at once.
        max_frame: a frame announcing more is treated as garbage: connection killed.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_port: int = 0,
        seed: int = 0,
        max_connections: int = 64,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listen_port = listen_port
        self.port = listen_port
        self.rng = random.Random(seed)
        self.max_connections = max_connections
        self.max_frame = max_frame
        self.stats = ProxyStats()
        self.events: list[ProxyEvent] = []
        self._conns: dict[int, _Conn] = {}
        self._next_id = 0
        self._kill_range: tuple[float, float] | None = None
        self._cuts: dict[str, int] = {"request": 0, "response": 0}
        self._lose: list[_LoseRule] = []
        self._delay = 0.0
        self._blackhole_until = -1.0
        self._blackhole_cleared = trio.Event()  # wakes the held connections early
        self._opened = trio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def run(
        self, *, task_status: trio.TaskStatus[FaultProxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and proxy until cancelled."""
        listeners = await trio.open_tcp_listeners(self._listen_port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            try:
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                task_status.started(self)
                await trio.sleep_forever()
            finally:
                nursery.cancel_scope.cancel()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._handle, stream)

    # ------------------------------------------------------------------ faults

    def kill_all(self) -> int:
        """Close every proxied connection now. Returns how many."""
        conns = [c for c in self._conns.values() if not c.killed]
        for conn in conns:
            self._kill(conn, "kill_all")
        return len(conns)

    def kill_one(self) -> int | None:
        """Close one connection, picked with the seeded rng. Returns its id."""
        alive = sorted(i for i, c in self._conns.items() if not c.killed)
        if not alive:
            return None
        conn = self._conns[self.rng.choice(alive)]
        self._kill(conn, "kill_one")
        return conn.conn_id

    def kill_randomly(self, min_lifetime: float, max_lifetime: float) -> None:
        """From now on every connection (open or new) dies after uniform(min, max) seconds."""
        if not 0 < min_lifetime <= max_lifetime:
            raise ValueError("need 0 < min_lifetime <= max_lifetime")
        self._kill_range = (min_lifetime, max_lifetime)
        for conn in self._conns.values():
            self._arm(conn)

    def stop_random_kills(self) -> None:
        self._kill_range = None
        for conn in self._conns.values():
            conn.scope.deadline = float("inf")

    def cut_mid_frame(self, direction: Direction = "response", count: int = 1) -> None:
        """The next `count` frames in `direction` are forwarded only in part, then the
        connection is closed."""
        self._cuts[direction] += count

    def blackhole(self, seconds: float) -> None:
        """Forward nothing (and connect nothing upstream) for `seconds` from now."""
        self._blackhole_until = max(self._blackhole_until, trio.current_time() + seconds)

    def set_delay(self, seconds: float) -> None:
        """Add `seconds` of latency before each forwarded frame (0 to turn off)."""
        self._delay = seconds

    def lose_responses(self, count: int = 1, *, api_key: int | None = None) -> None:
        """Kill the connection when the response to the next `count` requests (of
        `api_key`, or any) starts arriving, instead of forwarding it."""
        self._lose.append(_LoseRule(count, api_key))

    def stop_losing_responses(self) -> int:
        """Disarm the `lose_responses` rules that have not fired yet (other faults stay).
        Returns how many more responses they would have lost."""
        left = sum(rule.remaining for rule in self._lose)
        self._lose.clear()
        return left

    def clear_faults(self) -> None:
        self._kill_range = None
        self._cuts = {"request": 0, "response": 0}
        self._lose.clear()
        self._delay = 0.0
        self._blackhole_until = -1.0
        self._blackhole_cleared.set()
        self._blackhole_cleared = trio.Event()

    # ------------------------------------------------------------------ plumbing

    def _event(self, kind: str, conn_id: int, detail: str = "") -> None:
        self.events.append(ProxyEvent(trio.current_time(), kind, conn_id, detail))

    def _kill(self, conn: _Conn, why: str) -> None:
        if not conn.killed:
            conn.killed = True
            self.stats.killed += 1
            self._event("kill", conn.conn_id, why)
            conn.scope.cancel()

    def _arm(self, conn: _Conn) -> None:
        if self._kill_range is not None:
            conn.scope.deadline = trio.current_time() + self.rng.uniform(*self._kill_range)

    async def _wait_blackhole(self) -> None:
        while True:  # the blackhole may be extended while we sleep
            wait = self._blackhole_until - trio.current_time()
            if wait <= 0:
                return
            with trio.move_on_after(wait):
                await self._blackhole_cleared.wait()

    async def _gate(self) -> None:
        await self._wait_blackhole()
        if self._delay > 0:
            await trio.sleep(self._delay)

    async def _handle(self, client: trio.SocketStream) -> None:
        if len(self._conns) >= self.max_connections:
            self.stats.rejected += 1
            await trio.aclose_forcefully(client)
            return
        self._next_id += 1
        conn = _Conn(self._next_id)
        self._conns[conn.conn_id] = conn
        self.stats.accepted += 1
        self._event("accept", conn.conn_id)
        self._arm(conn)
        upstream: trio.SocketStream | None = None
        try:
            with conn.scope:
                await self._wait_blackhole()
                try:
                    upstream = await trio.open_tcp_stream(*self.upstream)
                except OSError:
                    self.stats.rejected += 1
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        self._pump, conn, client, upstream, "request", nursery.cancel_scope
                    )
                    nursery.start_soon(
                        self._pump, conn, upstream, client, "response", nursery.cancel_scope
                    )
        finally:
            if conn.scope.cancelled_caught and not conn.killed:
                self._kill(conn, "random lifetime")
            self._conns.pop(conn.conn_id, None)
            self._event("close", conn.conn_id)
            await trio.aclose_forcefully(client)
            if upstream is not None:
                await trio.aclose_forcefully(upstream)

    def _should_lose(self, conn: _Conn, correlation_id: int) -> bool:
        api_key = conn.pending.get(correlation_id)
        for rule in self._lose:
            if rule.api_key is None or rule.api_key == api_key:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    self._lose.remove(rule)
                return True
        return False

    async def _pump(
        self,
        conn: _Conn,
        src: trio.abc.Stream,
        dst: trio.abc.Stream,
        direction: Direction,
        done: trio.CancelScope,
    ) -> None:
        """Forward whole frames from src to dst; returning closes the connection."""
        frames = FrameBuffer(max_frame_size=self.max_frame)
        checked_head = False  # lose_responses looked at the frame at the head of `frames`
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    return
                frames.receive_data(data)
                while True:
                    try:
                        if direction == "response" and not checked_head:
                            # Decide on the correlation id as soon as it arrives,
                            # before the rest of the response does.
                            head = frames.peek(4)
                            if head is not None and len(head) == 4:
                                checked_head = True
                                (corr,) = _I32.unpack(head)
                                if self._lose and self._should_lose(conn, corr):
                                    self.stats.responses_lost += 1
                                    self._event(
                                        "lose_response", conn.conn_id, f"correlation_id={corr}"
                                    )
                                    self._kill(conn, "lose_response")
                                    return
                        payload = frames.next_frame()
                    except ProtocolError as exc:
                        self._kill(conn, f"bad frame: {exc}")
                        return
                    if payload is NEED_DATA:
                        break
                    if len(payload) < 4:
                        self._kill(conn, f"bad frame size {len(payload)}")
                        return
                    checked_head = False
                    frame = _I32.pack(len(payload)) + payload
                    if direction == "request" and len(payload) >= 8:
                        api_key, _version, corr = _REQUEST_HEAD.unpack_from(payload)
                        conn.pending[corr] = api_key
                    elif direction == "response":
                        conn.pending.pop(_I32.unpack_from(payload)[0], None)
                    await self._gate()
                    if self._cuts[direction] > 0:
                        self._cuts[direction] -= 1
                        cut = self.rng.randint(1, len(frame) - 1)
                        await dst.send_all(frame[:cut])
                        self.stats.cuts += 1
                        self._event("cut", conn.conn_id, f"{direction} {cut}/{len(frame)} bytes")
                        self._kill(conn, "cut_mid_frame")
                        return
                    if direction == "request":
                        self.stats.requests += 1
                    else:
                        self.stats.responses += 1
                    await dst.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            done.cancel()
