"""The classic group's state (``groups.py`` has the rules that change it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.protocol.errors import ErrorCode

__all__ = ["ClassicGroup", "GroupMember", "Reply"]


@dataclass(eq=False)
class Reply:
    """A parked JoinGroup / SyncGroup, answered by the state machine."""

    value: Any = None
    done: trio.Event = field(default_factory=trio.Event)

    def answer(self, value: Any) -> None:
        if not self.done.is_set():
            self.value = value
            self.done.set()


@dataclass(eq=False)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's preference order
    join: Reply | None = None  # set while awaiting its JoinGroup answer
    sync: Reply | None = None  # set while awaiting its SyncGroup answer
    assignment: bytes = b""
    is_new: bool = True
    heartbeat_deadline: float = float("inf")

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def vote(self, candidates: set[str]) -> str:
        return next(n for n, _ in self.protocols if n in candidates)

    def satisfied(self) -> bool:
        """Kafka's hasSatisfiedHeartbeat: a waiting (not new) member is alive."""
        return not self.is_new and (self.join is not None or self.sync is not None)


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    state: str = "Empty"
    previous_state: str = "Empty"
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, GroupMember] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # member id -> expiry
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_sync: set[str] = field(default_factory=set)
    join_deadline: float | None = None
    sync_deadline: float | None = None
    initial_remaining: float = 0.0  # initial rebalance: time left to extend into
    new_member_added: bool = False

    def transition(self, state: str) -> None:
        self.previous_state, self.state = self.state, state

    def rebalance_timeout(self) -> float:
        return max((m.rebalance_timeout for m in self.members.values()), default=0.0)

    def all_joined(self) -> bool:
        return all(m.join is not None for m in self.members.values()) and not self.pending

    def supports(self, protocol_type: str, names: set[str]) -> bool:
        if self.state == "Empty":
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            all(n in {p for p, _ in m.protocols} for m in self.members.values()) for n in names
        )

    def select_protocol(self) -> str:
        candidates = set.intersection(
            *({n for n, _ in m.protocols} for m in self.members.values()))
        votes: dict[str, int] = {}
        for m in self.members.values():
            name = m.vote(candidates)
            votes[name] = votes.get(name, 0) + 1
        return max(votes, key=lambda n: votes[n])

    def validate(self, member_id: str, instance_id: str | None) -> ErrorCode:
        if instance_id is not None:
            known = self.static.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        return ErrorCode.NONE if member_id in self.members else ErrorCode.UNKNOWN_MEMBER_ID
