"""The fake cluster's fault script: scripted faults and `control()` hooks.

A fault or hook is a `FaultHandle` in a `FaultScript`, oldest first. The
server (`server.py`) asks the script, for every request, which hooks and
faults apply (`take`); `FakeCluster`'s fault methods (`fail_next`,
`delay_responses`, `control`...) only build handles and add them. A handle
with `remaining=None` is sticky; otherwise it leaves the script when it has
fired that many times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pipeline.protocol.api import ApiKey

__all__ = [
    "DROP",
    "NO_RESPONSE",
    "ControlContext",
    "ControlFn",
    "FaultHandle",
    "FaultScript",
    "touched",
]


class _Marker(Enum):
    DROP = "DROP"
    NO_RESPONSE = "NO_RESPONSE"


#: Returned by a `control()` hook: close the connection, request not applied.
DROP = _Marker.DROP
#: Returned by a `control()` hook: request not applied, nothing answered, the
#: connection stays open (a hung broker, for the client's request timeout).
NO_RESPONSE = _Marker.NO_RESPONSE


@dataclass(frozen=True, slots=True)
class ControlContext:
    """What a `control()` hook sees."""

    # The FakeCluster (typed Any: this module sits below cluster.py, which imports it).
    cluster: Any
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
    # stale_metadata: the cluster view (a FakeState) this broker keeps answering with
    snapshot: Any = None
    _owner: list[FaultHandle] | None = None

    def remove(self) -> None:
        if self._owner is not None and self in self._owner:
            self._owner.remove(self)

    @property
    def active(self) -> bool:
        return self._owner is not None and self in self._owner


def touched(api_key: int, request: Any) -> list[tuple[str | None, int | None]]:
    """The (topic, partition) pairs a request touches, for topic-filtered faults."""
    if request is None:
        return []
    if api_key == ApiKey.PRODUCE:
        return [(t.name, p.index) for t in request.topic_data for p in t.partition_data]
    if api_key == ApiKey.FETCH:
        return [(t.topic, p.partition) for t in request.topics for p in t.partitions]
    if api_key == ApiKey.LIST_OFFSETS:
        return [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    if api_key == ApiKey.METADATA:
        return [(t.name, None) for t in request.topics or ()]
    if api_key == ApiKey.CREATE_TOPICS:
        return [(t.name, None) for t in request.topics]
    if api_key == ApiKey.DELETE_TOPICS:
        return [(n, None) for n in request.topic_names] + [(t.name, None) for t in request.topics]
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        return [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    if api_key == ApiKey.TXN_OFFSET_COMMIT:
        return [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    return []


class FaultScript:
    """Installed faults and hooks, oldest first."""

    def __init__(self) -> None:
        self.faults: list[FaultHandle] = []
        self.controls: list[FaultHandle] = []

    def add(self, handle: FaultHandle) -> FaultHandle:
        handle._owner = self.faults
        self.faults.append(handle)
        return handle

    def add_control(self, handle: FaultHandle) -> FaultHandle:
        handle._owner = self.controls
        self.controls.append(handle)
        return handle

    def clear(self) -> None:
        self.faults.clear()
        self.controls.clear()

    def hooks_for(self, api_key: int, node_id: int) -> list[FaultHandle]:
        """The control hooks that may handle this request, oldest first (a copy)."""
        return [
            h for h in self.controls
            if h.api_key == api_key and (h.node_id is None or h.node_id == node_id)
        ]

    def take(self, kind: str, api_key: int, node_id: int, request: Any) -> FaultHandle | None:
        """The oldest fault of ``kind`` matching this request, counted as fired."""
        for h in self.faults:
            if h.kind != kind or (h.api_key is not None and h.api_key != api_key):
                continue
            if h.node_id is not None and h.node_id != node_id:
                continue
            if h.topic is not None and not any(
                t == h.topic and (h.partition is None or p is None or p == h.partition)
                for t, p in touched(api_key, request)
            ):
                continue
            h.fired += 1
            if h.remaining is not None:
                h.remaining -= 1
                if h.remaining <= 0:
                    self.faults.remove(h)
            return h
        return None
