"""Per-broker statistics: what a client's connections to one broker did.

One :class:`BrokerStats` per node id lives in the :class:`~pipeline.cluster.brokers.BrokerPool`
for the client's whole life (a reconnect keeps counting into it). The connection to that
node counts into it per request and per response, never per record: a request written
(its API, its bytes), a response read (its round trip, the throttle time the broker
asked for, a top-level error code), bytes read off the socket, a request timeout, a
connection lost. The clients add what only they can read: the producer each partition's
error code in a Produce response, the consumer each partition's in a Fetch response
(:meth:`BrokerStats.error`).

:meth:`BrokerStats.snapshot` freezes it into a :class:`BrokerStatistics` (with the
requests in flight on the open connection now), which the producer's and the
consumer's statistics both carry under ``brokers``.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from pipeline.cluster.errors import ConfigError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import error_code
from pipeline.util.stats import Statistics, Summary, Window, counter, gauge, info, labelled, summary

__all__ = ["BrokerStatistics", "BrokerStats", "check_statistics_options", "report_statistics"]


@dataclass(frozen=True, slots=True)
class BrokerStatistics(Statistics):
    """One broker as this client saw it (a bootstrap address has a negative ``node_id``
    until the metadata names the brokers)."""

    METRIC_PREFIX: ClassVar[str] = "broker"

    node_id: int = info("the broker's node id (bootstrap addresses: -1, -2, ...)", default=-1)
    address: str = info('"host:port"', default="")
    state: str = info('"up" (a connection is open), "down" (none)', default="down")
    connects: int = counter("connections made (handshake completed)", "connections")
    connect_failures: int = counter("connection attempts that failed", "connections")
    disconnects: int = counter(
        "open connections lost (broker closed it, network error, request timeout)",
        "connections")
    in_flight_requests: int = gauge("requests written and not answered yet", "requests")
    requests: int = counter("requests written", "requests")
    requests_by_api: dict[str, int] = labelled(
        "counter", "api", "requests written, by API (Produce, Fetch, Metadata...)", "requests")
    sent_bytes: int = counter("bytes of requests written (frames, size prefix included)",
                              "bytes")
    responses: int = counter("responses read", "responses")
    received_bytes: int = counter("bytes read from the connection", "bytes")
    timeouts: int = counter("requests not answered within request_timeout", "requests")
    errors: dict[str, int] = labelled(
        "counter", "code",
        "error codes the broker answered, by name (top-level codes, and each partition's "
        "code in Produce and Fetch responses)", "errors")
    rtt: Summary = summary("round trip: request written to response read", "seconds")
    throttle: Summary = summary(
        "throttle time the broker asked for, per response that carries one (quotas)",
        "seconds")


class BrokerStats:
    """The running counts of one broker (see the module doc); a connection holds it."""

    __slots__ = ("address", "by_api", "connect_failures", "connects", "disconnects", "errors",
                 "node_id", "received_bytes", "requests", "responses", "rtt", "sent_bytes",
                 "throttle", "timeouts")

    def __init__(self, node_id: int, address: str = "") -> None:
        self.node_id = node_id
        self.address = address
        self.connects = 0
        self.connect_failures = 0
        self.disconnects = 0
        self.requests = 0
        self.by_api: Counter[int] = Counter()  # by API key (named in the snapshot)
        self.sent_bytes = 0
        self.responses = 0
        self.received_bytes = 0
        self.timeouts = 0
        self.errors: Counter[str] = Counter()
        self.rtt = Window()
        self.throttle = Window()

    def error(self, code: int, count: int = 1) -> None:
        """Count an error code the broker answered (0, NONE, is not an error)."""
        if code:
            self.errors[error_code(code).name] += count

    def snapshot(self, in_flight: int | None) -> BrokerStatistics:
        """Frozen now; ``in_flight``: the open connection's requests in flight, None
        when no connection is open."""
        return BrokerStatistics(
            node_id=self.node_id, address=self.address,
            state="down" if in_flight is None else "up",
            connects=self.connects, connect_failures=self.connect_failures,
            disconnects=self.disconnects, in_flight_requests=in_flight or 0,
            requests=self.requests, requests_by_api={_api_name(k): n for k, n in sorted(self.by_api.items())},
            sent_bytes=self.sent_bytes, responses=self.responses,
            received_bytes=self.received_bytes, timeouts=self.timeouts,
            errors=dict(self.errors), rtt=self.rtt.summary(), throttle=self.throttle.summary())


def _api_name(key: int) -> str:
    """Kafka's own spelling of an API's name: ``PRODUCE`` -> ``Produce``."""
    try:
        name = ApiKey(key).name
    except ValueError:
        return str(key)
    return "".join(part.capitalize() for part in name.split("_"))


# --------------------------------------------------------------------------- the callback


def check_statistics_options(interval: object, callback: object) -> None:
    """``statistics_interval`` / ``on_statistics``, as both clients' configs take them.

    Raises:
      ConfigError: an interval that is not a number of seconds >= 0, a callback that is
          not callable, or one given without the other.
    """
    if (not isinstance(interval, int | float) or isinstance(interval, bool)
            or not interval >= 0 or interval == math.inf):
        raise ConfigError(f"invalid statistics_interval={interval!r}: must be a number of "
                          "seconds >= 0 (0: no periodic statistics)")
    if callback is not None and not callable(callback):
        raise ConfigError(f"invalid on_statistics={callback!r}: must be a callable "
                          "on_statistics(stats), plain or async, or None")
    if interval and callback is None:
        raise ConfigError(f"statistics_interval={interval} needs on_statistics=callback "
                          "(called with each snapshot)")
    if callback is not None and not interval:
        raise ConfigError("on_statistics needs statistics_interval=seconds > 0 (how often "
                          "to call it)")


async def report_statistics(interval: float, take: Callable[[], Statistics],
                            callback: Callable[[Any], Any], logger: logging.Logger) -> None:
    """Call ``callback(take())`` every ``interval`` seconds, until cancelled.

    Calls are due at whole multiples of ``interval`` after the start (a slow callback
    does not shift the ones after it; a due time it ran past is skipped, never run
    twice in a row). An async callback is awaited before the next snapshot: calls never
    overlap. An exception from the callback is logged with its traceback, once per kind
    of error, and never stops the client or the next calls."""
    start = trio.current_time()
    due = 1
    reported: set[type[BaseException]] = set()
    while True:
        await trio.sleep_until(start + due * interval)
        try:
            result = callback(take())
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            level = logging.DEBUG if type(exc) in reported else logging.ERROR
            reported.add(type(exc))
            logger.log(level, "on_statistics callback %r raised", callback, exc_info=True)
        now = trio.current_time()
        due = max(due + 1, math.floor((now - start) / interval) + 1)
