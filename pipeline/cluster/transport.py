"""The transport seam: a connector returns any :class:`trio.abc.Stream`.

A :data:`Connector` is ``async (host, port) -> trio.abc.Stream``. Two are
provided:

* :func:`tcp_connector` — trio TCP, optionally wrapped in TLS
  (:class:`trio.SSLStream` with the given :class:`ssl.SSLContext`);
* :class:`MemoryNetwork` — in-memory stream pairs
  (:func:`trio.testing.memory_stream_pair`) addressed by ``host:port``, for
  deterministic tests under ``autojump_clock``.

Connectors raise :class:`OSError` (``ConnectionRefusedError``,
``TimeoutError``...) when the peer cannot be reached; the connection layer maps
that, and any :class:`trio.BrokenResourceError`, to
:class:`~pipeline.cluster.errors.BrokerConnectionError`, whose ``reason``
(:func:`connect_failure_reason`) says in a few words why: "connection refused",
"name not resolved (...)", "timed out: ...".
"""

from __future__ import annotations

import errno
import importlib
import math
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any

import trio

__all__ = [
    "ConnectTimeoutError", "Connector", "FrameWriter", "MemoryNetwork", "WriteLock",
    "connect_failure_reason", "parse_address", "send_parts", "tcp_connector",
]

Connector = Callable[[str, int], Awaitable[trio.abc.Stream]]


def parse_address(address: str, *, default_port: int = 9092) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6 literals); the port defaults to 9092."""
    address = address.strip()
    if not address:
        raise ValueError("empty broker address")
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        if not sep:
            raise ValueError(f"bad broker address {address!r}")
        port = rest[1:] if rest.startswith(":") else ""
    elif address.count(":") == 1:
        host, port = address.split(":")
    else:
        host, port = address, ""
    if not host:
        raise ValueError(f"bad broker address {address!r}")
    try:
        return host, int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad port in broker address {address!r}") from None


class ConnectTimeoutError(TimeoutError):
    """A connector gave up after its timeout; the message names the phase (TCP
    connect, TLS handshake) so the user knows where it stalled."""


#: What the TLS phase of a connect that gets no answer most likely means.
PLAINTEXT_HINT = ("if the listener is not TLS, use security_protocol PLAINTEXT or "
                  "SASL_PLAINTEXT")


def tcp_connector(
    *, ssl_context: ssl.SSLContext | None = None, connect_timeout: float = 5.0
) -> Connector:
    """Return a connector opening trio TCP streams, TLS-wrapped when ``ssl_context`` is given.

    Args:
      ssl_context: when set, the TCP stream is wrapped in :class:`trio.SSLStream`
          (``server_hostname=host``) and the handshake completes inside the timeout.
      connect_timeout: seconds allowed for TCP connect plus TLS handshake.

    Raises (from the connector):
      OSError: refused, unreachable, a name that does not resolve
          (:class:`socket.gaierror`), or :class:`ConnectTimeoutError` naming the phase
          that ran out of time.
    """

    async def connect(host: str, port: int) -> trio.abc.Stream:
        deadline = trio.current_time() + connect_timeout
        tcp: trio.SocketStream | None = None
        with trio.move_on_at(deadline):
            tcp = await trio.open_tcp_stream(host, port)
        if tcp is None:
            raise ConnectTimeoutError(
                errno.ETIMEDOUT, f"timed out: no TCP connection within {connect_timeout}s")
        if ssl_context is None:
            return tcp
        tls = trio.SSLStream(tcp, ssl_context, server_hostname=host)
        try:
            with trio.move_on_at(deadline) as scope:
                await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(tls)
            raise
        if scope.cancelled_caught:
            await trio.aclose_forcefully(tls)
            raise ConnectTimeoutError(
                errno.ETIMEDOUT, f"TLS handshake failed: no answer within {connect_timeout}s "
                f"(timed out); {PLAINTEXT_HINT}")
        return tls

    return connect


def _os_errors(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of any exception group among
    them (trio's ``open_tcp_stream`` raises ``OSError("all attempts ... failed")`` from
    a group of the per-address errors), each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)


def connect_failure_reason(exc: BaseException) -> str:
    """Why a connector failed, in a few words: "connection refused", "name not
    resolved (Name or service not known)", a :class:`ConnectTimeoutError`'s own text,
    else the OS's description."""
    errors = list(_os_errors(exc))
    for error in errors:
        if isinstance(error, ConnectTimeoutError):
            return error.strerror or str(error)
    for error in errors:
        if isinstance(error, ConnectionRefusedError):
            detail = error.strerror or str(error)
            return "connection refused" + (
                "" if detail.lower().endswith("connection refused") else f" ({detail})")
    for error in errors:
        if isinstance(error, socket.gaierror):
            return f"name not resolved ({error.strerror or error})"
    for error in errors:
        if isinstance(error, TimeoutError):
            return f"timed out ({error.strerror or error})"
    for error in errors:
        if isinstance(error, OSError) and error.strerror:
            return error.strerror[:1].lower() + error.strerror[1:]
    return next((str(e) for e in errors if isinstance(e, OSError) and str(e)), repr(exc))


# Buffers per sendmsg call: Linux's IOV_MAX (the POSIX minimum is 16; every
# platform trio runs on allows 1024).
_IOV_MAX = 1024
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})


def _broken(exc: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    """What a failed write is to the connection, as ``send_all`` raises it."""
    if exc.errno in _CLOSED_ERRNOS:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


async def send_parts(stream: trio.abc.Stream, parts: list[bytes | bytearray | memoryview]) -> None:
    """Write ``parts`` to ``stream`` in order, as ``send_all(b"".join(parts))`` would.

    A plain TCP stream gets one gather write (``sendmsg``) per round, so the
    parts are never copied into one frame; any other stream (TLS, memory, a
    test's proxy) gets the joined frame. Errors are those of ``send_all``:
    :class:`trio.ClosedResourceError` after a close, :class:`trio.BrokenResourceError`
    when the socket fails. Like ``send_all`` it is a checkpoint, and a
    cancellation may leave part of the frame written.
    """
    if type(stream) is not trio.SocketStream or len(parts) == 1:
        await stream.send_all(parts[0] if len(parts) == 1 else b"".join(parts))
        return
    sock = stream.socket
    views = [memoryview(p) for p in parts]
    i = 0
    try:
        while i < len(views):
            sent = await sock.sendmsg(views[i:i + _IOV_MAX])
            # Skip what was written: whole buffers, then the start of the next.
            while i < len(views) and sent >= views[i].nbytes:
                sent -= views[i].nbytes
                i += 1
            if sent:
                views[i] = views[i][sent:]
    except OSError as exc:
        raise _broken(exc) from exc


def _load_writer() -> ModuleType | None:
    """``_writer.c``, or None when it is not built or ``PIPELINE_PURE_PYTHON`` asks for
    the twins: every frame is then trio's write (``send_parts``)."""
    if os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("pipeline.cluster._writer")
    except ImportError:  # not built (no compiler at install time)
        return None


_writer_c = _load_writer()


class FrameWriter:
    """A connection's writes: each frame whole and in order (the connection holds its
    write lock around :meth:`write`).

    On a plain TCP stream, with ``_writer.c`` built, a frame goes to the kernel at once
    when nothing is queued before it, and what the kernel does not take then is written
    by a thread of the writer's own, without the GIL (``_writer.c`` says why: a broker
    reads the rest of a request while the event loop runs other tasks). Anywhere else
    (TLS, memory streams, ``PIPELINE_PURE_PYTHON=1``, no compiler) trio writes it:
    :func:`send_parts`, the twin, puts the same bytes on the wire in the same order.

    A frame's buffers must not change once :meth:`write` returned, since a queued frame
    is read by the thread later: the codec makes a request's buffers fresh, and a
    batch's encoded bytes are never changed (a re-stamp makes new ones). Like trio
    itself, a writer does not survive ``fork()``: the child has no thread.
    """

    __slots__ = ("_native", "_plain", "_stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._plain = type(stream) is trio.SocketStream and _writer_c is not None
        # The native writer, made at the first write (two pipes; a thread only once a
        # frame has to wait for the kernel).
        self._native: Any = None

    @property
    def threaded(self) -> bool:
        """True once the writer thread exists (a frame had to wait for the kernel)."""
        return self._native is not None and bool(self._native.started)

    async def write(self, parts: list[bytes | bytearray | memoryview], *,
                    until_written: bool) -> None:
        """Write ``parts`` as one frame after every frame before it. ``until_written``:
        return only once all of it is in the kernel (a request no response will
        confirm); else once it is queued. A checkpoint, as ``send_all``; cancelled while
        it waits for the write, part of the frame may be written. Raises
        :class:`trio.BrokenResourceError` when a write failed (this frame's or one
        queued before it) and :class:`trio.ClosedResourceError` after :meth:`close`."""
        native = self._native
        if native is None:
            if not self._plain:
                await send_parts(self._stream, parts)
                return
            assert _writer_c is not None
            socket_ = self._stream.socket  # type: ignore[attr-defined]
            native = self._native = _writer_c.Writer(socket_.fileno())
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            native.reap()
            queued = native.write(parts)
        except OSError as exc:
            raise _broken(exc) from exc
        if queued and until_written:
            await self._until_written(queued)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _until_written(self, frame: int) -> None:
        native = self._native
        while native.completed < frame:
            await trio.lowlevel.wait_readable(native.done_fd)
            try:
                native.reap()
            except OSError as exc:
                raise _broken(exc) from exc

    def close(self) -> None:
        """Stop the writer thread (what it had not written is dropped: the connection
        is closing) before the stream's socket is closed: the thread must never write
        to a file descriptor number a later socket may reuse. A task waiting in
        :meth:`write` gets :class:`trio.ClosedResourceError`, and so do later writes."""
        native = self._native
        if native is None:
            self._native = native = _CLOSED
        if not native.closed:
            trio.lowlevel.notify_closing(native.done_fd)
            native.close()


class _Closed:
    """A closed writer's stand-in: every write fails as one to a closed socket."""

    closed = True
    started = False

    def reap(self) -> None:
        raise OSError(errno.EBADF, "the connection's writer is closed")


_CLOSED = _Closed()


class MemoryNetwork:
    """An in-memory network of listeners addressed by ``(host, port)``.

    ``listen`` returns a channel of accepted server-side streams; ``connect`` is
    a :data:`Connector` creating a :func:`trio.testing.memory_stream_pair` and
    handing one end to the listener. Connecting to an address nobody listens on
    raises :class:`ConnectionRefusedError`, like TCP.
    """

    def __init__(self) -> None:
        # {(host, port): channel of accepted server streams}
        self._listeners: dict[tuple[str, int], trio.MemorySendChannel[trio.abc.Stream]] = {}
        self.connects: list[tuple[float, str, int]] = []  # (time, host, port) of every attempt

    def listen(self, host: str, port: int) -> trio.MemoryReceiveChannel[trio.abc.Stream]:
        """Start listening on ``host:port``; returns the channel of accepted streams."""
        if (host, port) in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{host}:{port} already in use")
        send, receive = trio.open_memory_channel[trio.abc.Stream](math.inf)
        self._listeners[(host, port)] = send
        return receive

    def unlisten(self, host: str, port: int) -> None:
        """Stop listening: later connects are refused (accepted streams are untouched)."""
        send = self._listeners.pop((host, port), None)
        if send is not None:
            send.close()

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The :data:`Connector`: return the client end of a fresh stream pair."""
        self.connects.append((trio.current_time(), host, port))
        await trio.lowlevel.checkpoint()
        listener = self._listeners.get((host, port))
        if listener is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"{host}:{port} refused")
        # Imported here, not at module level: trio.testing imports pytest (and
        # pygments), which a producer's users must not pay for in start-up time
        # or in objects every full GC pass walks (tests/test_imports.py).
        from trio.testing import memory_stream_pair

        client, server = memory_stream_pair()
        try:
            listener.send_nowait(server)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"{host}:{port} refused") from None
        return client


class WriteLock:
    """A stream's write lock (``async with``) that is no schedule point when
    it is free: a ``trio.Lock`` yields even then, and a pass of every other
    runnable task between sealing a request and writing it only delays the
    request (measured at a paced 20k msg/s: 0.7 ms from seal to write at the
    median, two such passes). The write under it has its own schedule point
    (the stream's send), so a request's write stays a checkpoint. A lock that
    is held is waited for as a ``trio.Lock`` is (FIFO)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        if self._lock.locked():
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
