"""The hand-off of assignment changes from the group coordinator to the application.

The Java consumer runs rebalance callbacks inside ``poll()``, between two records the
application processes; so when ``onPartitionsRevoked`` commits "what was consumed",
that is exactly what was processed. The same here: the coordinator task *posts* each
change (revoke, assign, lose) and waits; the application's next iteration (or
``close()``) *runs* it: the callbacks (which may be async), the commit on revoke,
and the change to the :class:`Assignment`. A change is never applied concurrently
with the processing of a record.

While a change waits, the member keeps heartbeating (the heartbeat is its own task);
if the application does not come back within ``max_poll_interval`` the coordinator
gives up on it (the member leaves the group) and its pending changes are abandoned.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

from pipeline.consumer._state import Assignment
from pipeline.consumer._types import TopicPartition

__all__ = ["Callback", "Change", "Handoff"]

logger = logging.getLogger("pipeline.consumer")

#: ``callback(consumer, partitions)``, plain or async.
Callback = Callable[[Any, frozenset[TopicPartition]], Awaitable[None] | None]
Kind = Literal["revoke", "assign", "lose"]


@dataclass(eq=False)
class Change:
    kind: Kind
    partitions: frozenset[TopicPartition]
    done: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None  # a callback raised it; the application sees it


class Handoff:
    """Changes posted by the coordinator, run by the application (module doc)."""

    def __init__(
        self,
        assignment: Assignment,
        *,
        owner: Any,
        on_assigned: Callback | None,
        on_revoked: Callback | None,
        on_lost: Callback | None,
        commit_before_revoke: Callable[[frozenset[TopicPartition]], Awaitable[None]] | None,
    ) -> None:
        self._assignment = assignment
        self._owner = owner  # the Consumer, passed to callbacks
        self._callbacks: dict[Kind, Callback | None] = {
            "assign": on_assigned, "revoke": on_revoked, "lose": on_lost,
        }
        self._commit_before_revoke = commit_before_revoke
        self._queue: deque[Change] = deque()
        self.running = False  # a change is being run by the application now

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    async def post(self, kind: Kind, partitions: frozenset[TopicPartition]) -> None:
        """Queue a change and wait until the application ran it (coordinator side).
        A callback's error is raised to the application, not here."""
        change = Change(kind, partitions)
        self._queue.append(change)
        self._assignment.changed()
        await change.done.wait()

    def post_nowait(self, kind: Kind, partitions: frozenset[TopicPartition]) -> None:
        """Queue a change without waiting for it (the poster cannot wait: the member
        left the group and the application is not iterating)."""
        if partitions:
            self._queue.append(Change(kind, partitions))
            self._assignment.changed()

    async def run_now(self, kind: Kind, partitions: frozenset[TopicPartition]) -> None:
        """Run a change in the caller's task (the application's, closing)."""
        await self._run(Change(kind, partitions))

    def abandon(self) -> list[Change]:
        """Drop the queued changes (the member left the group); their waiters return."""
        dropped = list(self._queue)
        self._queue.clear()
        for change in dropped:
            change.done.set()
        return dropped

    async def run_pending(self) -> None:
        """Run every queued change in order (application side). A callback that raises
        stops here: the change still takes effect, and the error propagates."""
        while self._queue:
            change = self._queue[0]
            self.running = True
            try:
                await self._run(change)
            finally:
                self.running = False
                if self._queue and self._queue[0] is change:
                    self._queue.popleft()
                change.done.set()

    async def _run(self, change: Change) -> None:
        parts = change.partitions
        if change.kind == "assign":
            self._assignment.add(parts)
            await self._call("assign", parts)
            return
        try:
            if change.kind == "revoke" and self._commit_before_revoke is not None:
                await self._commit_before_revoke(parts)
            await self._call(change.kind, parts)
        finally:
            self._assignment.remove(parts)

    async def _call(self, kind: Kind, parts: frozenset[TopicPartition]) -> None:
        callback = self._callbacks[kind]
        if callback is None or (not parts and kind != "assign"):
            return
        result = callback(self._owner, parts)
        if inspect.isawaitable(result):
            await result
