"""The fake cluster's classic group coordinator: Kafka's state machine, on virtual time.

Kafka's ``GroupMetadataManager`` / ``ClassicGroup`` rules (4.x), as its tests and
clients rely on them:

* **States** Empty -> PreparingRebalance -> CompletingRebalance -> Stable (and back to
  PreparingRebalance on any membership or metadata change).
* **JoinGroup** v4+ from an unknown dynamic member: MEMBER_ID_REQUIRED with a new
  member id (``client_id-uuid``), held as *pending* for the session timeout; the member
  joins again with it. A known member's JoinGroup waits until the join phase
  completes: when every member has rejoined, or the rebalance timeout (the members'
  largest) passes, removing dynamic members that did not rejoin. The first join of an
  Empty group waits ``initial_rebalance_delay`` (Kafka's group.initial.rebalance.delay.ms,
  extended while members keep arriving, up to the rebalance timeout). Completing bumps
  the generation, picks the protocol every member supports with the most first-choice
  votes, and answers every member; the leader (the first member to join, kept while it
  rejoins) gets every member's metadata.
* **SyncGroup** from the leader stores every member's assignment (empty for members it
  left out) and answers the waiting followers; the group becomes Stable. A member that
  does not SyncGroup within the rebalance timeout is removed (a new rebalance).
* **Heartbeat** validates member (UNKNOWN_MEMBER_ID; FENCED_INSTANCE_ID for an old
  member id of a static member) and generation (ILLEGAL_GENERATION); answers
  REBALANCE_IN_PROGRESS while preparing a rebalance; resets the session timer.
* **Session timeout**: a member neither heartbeating nor waiting in a join or sync for
  ``session_timeout`` is removed (a new member: 5 minutes to complete its first join).
* **Static members** (KIP-345): an unknown member id with a known group.instance.id
  replaces the old member id; in a Stable group with an unchanged protocol there is no
  rebalance: the member gets the current generation (the leader with
  ``skip_assignment``, KIP-814, from JoinGroup v9).
* **LeaveGroup** removes members (by member id, or by instance id alone).

Sans-I/O apart from waiting: handlers await a :class:`Reply` the state machine fills;
:meth:`GroupCoordinator.run` fires the timers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import trio

from pipeline.protocol.errors import ErrorCode

from .group_state import ClassicGroup, GroupMember, Reply

__all__ = ["GroupCoordinator"]

NEW_MEMBER_JOIN_TIMEOUT = 300.0  # Kafka's group.classic.new.member.join.timeout.ms


class GroupCoordinator:
    """Every classic group of the fake cluster (the broker answering is checked by the
    caller: see ``FakeCluster.group_coordinator``)."""

    def __init__(self, *, initial_rebalance_delay: float = 0.0,
                 min_session_timeout: float = 6.0, max_session_timeout: float = 1800.0,
                 seed: int = 0) -> None:
        self.groups: dict[str, ClassicGroup] = {}
        self.initial_rebalance_delay = initial_rebalance_delay
        self.min_session_timeout = min_session_timeout
        self.max_session_timeout = max_session_timeout
        self._ids = 0
        self._seed = seed
        self._wake = trio.Event()

    def _new_member_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{uuid.UUID(int=(self._seed << 64) | self._ids)}"

    def _changed(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    # ------------------------------------------------------------------ timers

    async def run(self) -> None:
        """Fire expired timers (session, join, sync) until cancelled."""
        while True:
            now = trio.current_time()
            self.expire(now)
            with trio.move_on_at(self._next_deadline()):
                await self._wake.wait()

    def _next_deadline(self) -> float:
        deadlines = [float("inf")]
        for g in self.groups.values():
            deadlines += [d for d in (g.join_deadline, g.sync_deadline) if d is not None]
            deadlines += list(g.pending.values())
            deadlines += [m.heartbeat_deadline for m in g.members.values()]
        return min(deadlines)

    def expire(self, now: float) -> None:
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending.items()):
                if deadline <= now:
                    del group.pending[member_id]
                    if group.state == "PreparingRebalance" and group.all_joined():
                        self._complete_join(group, now)
            for member in list(group.members.values()):
                if member.heartbeat_deadline <= now and member.member_id in group.members:
                    member.heartbeat_deadline = float("inf")
                    if not member.satisfied():
                        self._remove(group, member, now)
            if group.join_deadline is not None and group.join_deadline <= now:
                group.join_deadline = None
                if group.state == "PreparingRebalance":
                    if group.previous_state == "Empty" and group.new_member_added and \
                            group.initial_remaining > 0:
                        group.new_member_added = False
                        step = min(self.initial_rebalance_delay, group.initial_remaining)
                        group.initial_remaining = max(0.0, group.initial_remaining - step)
                        group.join_deadline = now + step
                    else:
                        self._complete_join(group, now)
            if group.sync_deadline is not None and group.sync_deadline <= now:
                group.sync_deadline = None
                if group.state in ("CompletingRebalance", "Stable") and group.pending_sync:
                    for member_id in list(group.pending_sync):
                        self._drop(group, member_id)
                    self._prepare_rebalance(group, now)

    def _reschedule(self, member: GroupMember, now: float, timeout: float | None = None) -> None:
        member.heartbeat_deadline = now + (member.session_timeout if timeout is None else timeout)
        self._changed()

    # ------------------------------------------------------------------ transitions

    def _prepare_rebalance(self, group: ClassicGroup, now: float) -> None:
        if group.state == "CompletingRebalance":
            for m in group.members.values():
                m.assignment = b""
                if m.sync is not None:
                    m.sync.answer((ErrorCode.REBALANCE_IN_PROGRESS, b""))
                    m.sync = None
                    self._reschedule(m, now)
        group.pending_sync.clear()
        group.sync_deadline = None
        initial = group.state == "Empty"
        group.transition("PreparingRebalance")
        if initial:
            delay = self.initial_rebalance_delay
            group.initial_remaining = max(0.0, group.rebalance_timeout() - delay)
            group.join_deadline = now + delay
        elif group.all_joined():
            self._complete_join(group, now)
        else:
            group.join_deadline = now + group.rebalance_timeout()
        self._changed()

    def _maybe_rebalance(self, group: ClassicGroup, now: float) -> None:
        if group.state in ("Empty", "Stable", "CompletingRebalance"):
            self._prepare_rebalance(group, now)
        elif group.state == "PreparingRebalance" and group.previous_state != "Empty" \
                and group.all_joined():
            self._complete_join(group, now)

    def _complete_join(self, group: ClassicGroup, now: float) -> None:
        group.join_deadline = None
        for m in [m for m in group.members.values() if m.join is None and m.group_instance_id is None]:
            self._drop(group, m.member_id)
        if group.members and group.leader_id is not None and \
                group.members[group.leader_id].join is None:
            rejoined = [m for m in group.members.values() if m.join is not None]
            if not rejoined:
                group.join_deadline = now + group.rebalance_timeout()
                return
            group.leader_id = rejoined[0].member_id
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.transition("Empty")
            self._changed()
            return
        group.protocol_name = group.select_protocol()
        group.transition("CompletingRebalance")
        for m in group.members.values():
            reply = m.join
            m.join = None
            m.is_new = False
            self._reschedule(m, now)
            group.pending_sync.add(m.member_id)
            if reply is not None:
                reply.answer(self._join_answer(group, m))
        group.sync_deadline = now + group.rebalance_timeout()
        self._changed()

    def _join_answer(self, group: ClassicGroup, m: GroupMember, *, skip: bool = False,
                     members: bool | None = None, leader_id: str | None = None
                     ) -> dict[str, Any]:
        leader = group.leader_id == m.member_id
        return dict(
            error_code=0, generation_id=group.generation, protocol_type=group.protocol_type,
            protocol_name=group.protocol_name, leader=leader_id or group.leader_id or "",
            member_id=m.member_id, skip_assignment=skip,
            members=tuple((x.member_id, x.group_instance_id, x.metadata(group.protocol_name))
                          for x in group.members.values())
            if (leader if members is None else members) else (),
        )

    def _drop(self, group: ClassicGroup, member_id: str) -> None:
        """Take a member out (no state transition)."""
        m = group.members.pop(member_id, None)
        group.pending.pop(member_id, None)
        group.pending_sync.discard(member_id)
        if m is None:
            return
        if m.group_instance_id is not None and group.static.get(m.group_instance_id) == member_id:
            del group.static[m.group_instance_id]
        if m.join is not None:
            m.join.answer(dict(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), member_id=""))
        if m.sync is not None:
            m.sync.answer((ErrorCode.UNKNOWN_MEMBER_ID, b""))
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)

    def _remove(self, group: ClassicGroup, member: GroupMember, now: float) -> None:
        self._drop(group, member.member_id)
        if group.state in ("Stable", "CompletingRebalance"):
            self._maybe_rebalance(group, now)
        elif group.state == "PreparingRebalance" and group.all_joined():
            self._complete_join(group, now)

    def _add(self, group: ClassicGroup, member: GroupMember, now: float) -> Reply:
        if member.group_instance_id is not None:
            group.static[member.group_instance_id] = member.member_id
        if not group.members:
            group.protocol_type = member.protocol_type
        if group.leader_id is None:
            group.leader_id = member.member_id
        if group.state == "PreparingRebalance" and group.previous_state == "Empty":
            group.new_member_added = True
        group.members[member.member_id] = member
        reply = member.join = Reply()
        self._reschedule(member, now, NEW_MEMBER_JOIN_TIMEOUT)
        self._maybe_rebalance(group, now)
        return reply

    # ------------------------------------------------------------------ requests

    def join(self, *, group_id: str, member_id: str, instance_id: str | None, client_id: str,
             session_timeout: float, rebalance_timeout: float, protocol_type: str,
             protocols: Iterable[tuple[str, bytes]], version: int, now: float
             ) -> Reply:
        """A JoinGroup; the reply's value is the answer's fields (a dict)."""
        protocols = list(protocols)
        names = {n for n, _ in protocols}
        done = Reply()
        if not group_id:
            done.answer(dict(error_code=int(ErrorCode.INVALID_GROUP_ID), member_id=member_id))
            return done
        if not self.min_session_timeout <= session_timeout <= self.max_session_timeout:
            done.answer(dict(error_code=int(ErrorCode.INVALID_SESSION_TIMEOUT), member_id=member_id))
            return done
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                done.answer(dict(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), member_id=member_id))
                return done
            group = self.groups[group_id] = ClassicGroup(group_id)
        if not group.supports(protocol_type, names):
            done.answer(dict(error_code=int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
                             member_id=member_id))
            return done

        def new_member(mid: str) -> GroupMember:
            return GroupMember(mid, instance_id, client_id, session_timeout, rebalance_timeout,
                               protocol_type, protocols)

        if not member_id:
            new_id = self._new_member_id(instance_id or client_id)
            if instance_id is not None:
                old = group.static.get(instance_id)
                if old is not None:
                    return self._replace_static(group, old, new_id, new_member(new_id), version, now)
                return self._add(group, new_member(new_id), now)
            if version >= 4:
                group.pending[new_id] = now + session_timeout
                self._changed()
                done.answer(dict(error_code=int(ErrorCode.MEMBER_ID_REQUIRED), member_id=new_id))
                return done
            return self._add(group, new_member(new_id), now)
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add(group, new_member(member_id), now)
        code = group.validate(member_id, instance_id)
        if code != ErrorCode.NONE:
            done.answer(dict(error_code=int(code), member_id=member_id))
            return done
        member = group.members[member_id]
        same = [n for n, _ in member.protocols] == [n for n, _ in protocols] and \
            dict(member.protocols) == dict(protocols)
        if group.state == "CompletingRebalance" and same:
            done.answer(self._join_answer(group, member))
            return done
        if group.state == "Stable" and same and group.leader_id != member_id:
            done.answer(self._join_answer(group, member, members=False))
            return done
        member.protocols = protocols
        member.session_timeout, member.rebalance_timeout = session_timeout, rebalance_timeout
        reply = member.join = Reply()
        self._maybe_rebalance(group, now)
        return reply

    def _replace_static(self, group: ClassicGroup, old_id: str, new_id: str,
                        fresh: GroupMember, version: int, now: float) -> Reply:
        current_leader = group.leader_id
        old = group.members.pop(old_id)
        for reply in (old.join, old.sync):
            if reply is not None:
                reply.answer(dict(error_code=int(ErrorCode.FENCED_INSTANCE_ID), member_id=old_id)
                             if reply is old.join else (ErrorCode.FENCED_INSTANCE_ID, b""))
        fresh.assignment, fresh.is_new = old.assignment, False
        group.members[new_id] = fresh
        group.static[fresh.group_instance_id or ""] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        group.pending_sync.discard(old_id)
        self._reschedule(fresh, now)
        done = Reply()
        if group.state == "Stable":
            if group.protocol_name == group.select_protocol():
                # No rebalance. From v9 a returning leader gets the members and
                # skip_assignment; before, the answer names the leader by its old id, so
                # the member does not assign again (Kafka's behaviour, KIP-814).
                leader = group.leader_id == new_id
                if version >= 9:
                    done.answer(self._join_answer(group, fresh, skip=leader, members=leader))
                else:
                    done.answer(self._join_answer(group, fresh, members=False,
                                                  leader_id=current_leader))
                return done
            fresh.join = done
            self._maybe_rebalance(group, now)
            return done
        fresh.join = done
        if group.state == "CompletingRebalance":
            self._prepare_rebalance(group, now)
        elif group.state == "PreparingRebalance" and group.all_joined():
            self._complete_join(group, now)
        return done

    def sync(self, *, group_id: str, member_id: str, instance_id: str | None, generation: int,
             protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes], now: float) -> Reply:
        """A SyncGroup; the reply's value is ``(error, assignment)``."""
        done = Reply()
        group = self.groups.get(group_id)
        if group is None or not group.members:
            done.answer((ErrorCode.UNKNOWN_MEMBER_ID, b""))
            return done
        code = group.validate(member_id, instance_id)
        if code == ErrorCode.NONE and generation != group.generation:
            code = ErrorCode.ILLEGAL_GENERATION
        if code == ErrorCode.NONE and (
            (protocol_type is not None and protocol_type != group.protocol_type)
            or (protocol_name is not None and protocol_name != group.protocol_name)
        ):
            code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if code == ErrorCode.NONE and group.state == "PreparingRebalance":
            code = ErrorCode.REBALANCE_IN_PROGRESS
        if code != ErrorCode.NONE:
            done.answer((code, b""))
            return done
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline = None
        if group.state == "Stable":
            done.answer((ErrorCode.NONE, member.assignment))
            return done
        member.sync = done
        if group.leader_id == member_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.transition("Stable")
            for m in group.members.values():
                if m.sync is not None:
                    m.sync.answer((ErrorCode.NONE, m.assignment))
                    m.sync = None
                    self._reschedule(m, now)
        self._changed()
        return done

    def heartbeat(self, *, group_id: str, member_id: str, instance_id: str | None,
                  generation: int, now: float) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        code = group.validate(member_id, instance_id)
        if code == ErrorCode.NONE and generation != group.generation:
            code = ErrorCode.ILLEGAL_GENERATION
        if code != ErrorCode.NONE:
            return code
        if group.state == "Empty":
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._reschedule(group.members[member_id], now)
        if group.state == "PreparingRebalance":
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, *, group_id: str, members: Iterable[tuple[str, str | None]], now: float
              ) -> list[tuple[str, str | None, ErrorCode]]:
        """LeaveGroup for ``(member_id, instance_id)`` pairs: each one's error."""
        group = self.groups.get(group_id)
        out: list[tuple[str, str | None, ErrorCode]] = []
        left = False
        for member_id, instance_id in members:
            if group is None:
                out.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            if not member_id:
                known = group.static.get(instance_id or "") if instance_id else None
                if known is None:
                    out.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                    continue
                member_id = known
            elif member_id in group.pending:
                del group.pending[member_id]
                out.append((member_id, instance_id, ErrorCode.NONE))
                continue
            code = group.validate(member_id, instance_id)
            if code == ErrorCode.NONE:
                self._drop(group, member_id)
                left = True
            out.append((member_id, instance_id, code))
        if group is not None and left:
            if group.state in ("Stable", "CompletingRebalance"):
                self._maybe_rebalance(group, now)
            elif group.state == "PreparingRebalance" and group.previous_state != "Empty" \
                    and group.all_joined():
                self._complete_join(group, now)
        self._changed()
        return out

    def simple_group(self, group_id: str) -> ClassicGroup:
        """The group, created Empty if it does not exist (a commit without membership)."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = ClassicGroup(group_id)
        return group

    def validate_commit(self, group_id: str, member_id: str, instance_id: str | None,
                        generation: int, *, transactional: bool = False) -> ErrorCode:
        """Kafka's ClassicGroup.validateOffsetCommit. ``transactional`` (TxnOffsetCommit
        v3+, KIP-447): a non-member may commit without generation, and the group's state
        is not enforced."""
        group = self.groups.get(group_id)
        if group is None or (generation < 0 and group.state == "Empty"):
            if group is None and (generation >= 0 or member_id):
                return ErrorCode.ILLEGAL_GENERATION
            return ErrorCode.NONE
        if generation >= 0 or member_id or instance_id is not None:
            code = group.validate(member_id, instance_id)
            if code != ErrorCode.NONE:
                return code
            if generation != group.generation:
                return ErrorCode.ILLEGAL_GENERATION
        elif not transactional and group.state != "Empty":
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not transactional and group.state == "CompletingRebalance":
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE
