"""The group APIs of the fake cluster: requests in, versioned answers out.

FindCoordinator (any broker answers), then JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and DescribeGroups, each answered
by the group's coordinator only: another broker answers NOT_COORDINATOR, as Kafka's
do. A group's coordinator is its *home* broker (a hash of the group id over the
brokers, as Kafka hashes it over ``__consumer_offsets`` partitions), or the next
running broker while it is stopped, or wherever ``FakeCluster.move_group_coordinator``
put it; the group's state survives a move, as Kafka's reloads from its log.

The rules themselves are in ``groups.py``; this module only reads requests and
writes each version's answer (fields a version lacks are left at their defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import describe_groups as dsg
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import heartbeat as hb
from pipeline.protocol.messages import join_group as jg
from pipeline.protocol.messages import leave_group as lg
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import sync_group as sg

from .groups import GroupCoordinator
from .state import FakeState

__all__ = ["GROUP_APIS", "GroupApis", "java_hash"]

GROUP_APIS = frozenset({
    ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LIST_GROUPS,
    ApiKey.DESCRIBE_GROUPS,
})


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (what Kafka hashes a group id with)."""
    h = 0
    for ch in text.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


class GroupApis:
    """Answers the group APIs for a :class:`FakeState` (owned by the fake's server)."""

    def __init__(self, state: FakeState, coordinator: GroupCoordinator) -> None:
        self.state = state
        self.groups = coordinator
        self.moved: dict[str, int] = {}  # group id -> node id (move_group_coordinator)
        # (group, topic, partition) -> (offset, metadata, leader epoch)
        self.offsets: dict[tuple[str, str, int], tuple[int, str, int]] = {}

    def coordinator_for(self, key: str) -> int:
        """The node id coordinating ``key``; -1 if no broker runs."""
        alive = sorted(b.node_id for b in self.state.alive_brokers())
        if not alive:
            return -1
        moved = self.moved.get(key)
        if moved is not None and moved in alive:
            return moved
        every = sorted(self.state.brokers)
        home = every[abs(java_hash(key)) % len(every)]
        return next((n for n in every[every.index(home):] + every if n in alive), alive[0])

    async def handle(self, node_id: int, api_key: int, version: int, request: Any,
                     client_id: str | None, inject: Callable[[str | None, int | None], int | None]
                     ) -> Any:
        injected = inject(None, None)
        if api_key == ApiKey.FIND_COORDINATOR:
            return self._find(version, request, injected)
        if api_key == ApiKey.LIST_GROUPS:
            return self._list(version, request, injected)
        if api_key == ApiKey.DESCRIBE_GROUPS:
            return self._describe(node_id, version, request)
        group_id = request.group_id
        if api_key == ApiKey.OFFSET_FETCH and version >= 8:
            group_id = request.groups[0].group_id
        if injected is None and self.coordinator_for(group_id) != node_id:
            injected = int(ErrorCode.NOT_COORDINATOR)
        now = trio.current_time()
        if api_key == ApiKey.JOIN_GROUP:
            return await self._join(version, request, client_id or "", injected, now)
        if api_key == ApiKey.SYNC_GROUP:
            return await self._sync(version, request, injected, now)
        if api_key == ApiKey.HEARTBEAT:
            code = injected if injected is not None else self.groups.heartbeat(
                group_id=group_id, member_id=request.member_id,
                instance_id=request.group_instance_id if version >= 3 else None,
                generation=request.generation_id, now=now)
            return hb.HeartbeatResponse(error_code=int(code))
        if api_key == ApiKey.LEAVE_GROUP:
            return self._leave(version, request, injected, now)
        if api_key == ApiKey.OFFSET_COMMIT:
            return self._commit(version, request, injected)
        if api_key == ApiKey.OFFSET_FETCH:
            return self._fetch(version, request, group_id, injected)
        raise AssertionError(f"not a group API: {api_key}")  # pragma: no cover

    # ------------------------------------------------------------------ lookup

    def _find(self, version: int, request: fc.FindCoordinatorRequest, injected: int | None
              ) -> fc.FindCoordinatorResponse:
        keys = request.coordinator_keys if version >= 4 else (request.key,)
        found = []
        for key in keys:
            node = self.coordinator_for(key)
            code = injected if injected is not None else (
                0 if node >= 0 else int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            broker = self.state.brokers.get(node) if code == 0 else None
            found.append(fc.Coordinator(
                key=key, node_id=broker.node_id if broker else -1,
                host=broker.host if broker else "", port=broker.port if broker else -1,
                error_code=code, error_message=None if code == 0 else ErrorCode(code).description,
            ))
        if version >= 4:
            return fc.FindCoordinatorResponse(coordinators=tuple(found))
        (one,) = found
        return fc.FindCoordinatorResponse(
            error_code=one.error_code, error_message=one.error_message if version >= 1 else None,
            node_id=one.node_id, host=one.host, port=one.port)

    # ------------------------------------------------------------------ membership

    async def _join(self, version: int, request: jg.JoinGroupRequest, client_id: str,
                    injected: int | None, now: float) -> jg.JoinGroupResponse:
        if injected is not None:
            return _join_response(version, dict(error_code=injected, member_id=request.member_id))
        rebalance = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        reply = self.groups.join(
            group_id=request.group_id, member_id=request.member_id,
            instance_id=request.group_instance_id if version >= 5 else None,
            client_id=client_id, session_timeout=request.session_timeout_ms / 1000,
            rebalance_timeout=rebalance / 1000, protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
            version=version, now=now)
        await reply.done.wait()
        return _join_response(version, reply.value)

    async def _sync(self, version: int, request: sg.SyncGroupRequest, injected: int | None,
                    now: float) -> sg.SyncGroupResponse:
        if injected is not None:
            return sg.SyncGroupResponse(error_code=injected)
        reply = self.groups.sync(
            group_id=request.group_id, member_id=request.member_id,
            instance_id=request.group_instance_id if version >= 3 else None,
            generation=request.generation_id,
            protocol_type=request.protocol_type if version >= 5 else None,
            protocol_name=request.protocol_name if version >= 5 else None,
            assignments={a.member_id: a.assignment for a in request.assignments}, now=now)
        await reply.done.wait()
        code, assignment = reply.value
        group = self.groups.groups.get(request.group_id)
        ok = code == ErrorCode.NONE and group is not None
        return sg.SyncGroupResponse(
            error_code=int(code), assignment=assignment,
            protocol_type=group.protocol_type if ok and version >= 5 and group else None,
            protocol_name=group.protocol_name if ok and version >= 5 and group else None)

    def _leave(self, version: int, request: lg.LeaveGroupRequest, injected: int | None,
               now: float) -> lg.LeaveGroupResponse:
        if injected is not None:
            return lg.LeaveGroupResponse(error_code=injected)
        if version >= 3:
            who = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            who = [(request.member_id, None)]
        results = self.groups.leave(group_id=request.group_id, members=who, now=now)
        if version >= 3:
            return lg.LeaveGroupResponse(members=tuple(
                lg.MemberResponse(member_id=m, group_instance_id=i, error_code=int(c))
                for m, i, c in results))
        return lg.LeaveGroupResponse(error_code=int(results[0][2]))

    # ------------------------------------------------------------------ offsets

    def _commit(self, version: int, request: oc.OffsetCommitRequest, injected: int | None
                ) -> oc.OffsetCommitResponse:
        group_id = request.group_id
        generation = request.generation_id_or_member_epoch
        code = injected
        if code is None:
            if group_id not in self.groups.groups and generation >= 0:
                code = int(ErrorCode.GROUP_ID_NOT_FOUND if version >= 9
                           else ErrorCode.ILLEGAL_GENERATION)
            else:
                code = int(self.groups.validate_commit(
                    group_id, request.member_id,
                    request.group_instance_id if version >= 7 else None, generation))
        if code == 0:
            self.groups.simple_group(group_id)
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                if code == 0:
                    self.offsets[(group_id, t.name, p.partition_index)] = (
                        p.committed_offset, p.committed_metadata or "",
                        p.committed_leader_epoch if version >= 6 else -1)
                parts.append(oc.OffsetCommitResponsePartition(
                    partition_index=p.partition_index, error_code=code))
            topics.append(oc.OffsetCommitResponseTopic(name=t.name, partitions=tuple(parts)))
        return oc.OffsetCommitResponse(topics=tuple(topics))

    def _fetch(self, version: int, request: of.OffsetFetchRequest, group_id: str,
               injected: int | None) -> of.OffsetFetchResponse:
        if version >= 8:
            wanted = [(t.name, tuple(t.partition_indexes))
                      for t in (request.groups[0].topics or ())]
        else:
            wanted = [(t.name, tuple(t.partition_indexes)) for t in (request.topics or ())]

        def row(topic: str, p: int) -> tuple[int, str, int]:
            offset, metadata, epoch = self.offsets.get((group_id, topic, p), (-1, "", -1))
            return offset, metadata, epoch

        if version >= 8:
            return of.OffsetFetchResponse(groups=(of.OffsetFetchResponseGroup(
                group_id=group_id, error_code=injected or 0,
                topics=() if injected else tuple(of.OffsetFetchResponseTopics(name=t, partitions=tuple(
                    of.OffsetFetchResponsePartitions(
                        partition_index=p, committed_offset=row(t, p)[0],
                        committed_leader_epoch=row(t, p)[2], metadata=row(t, p)[1])
                    for p in ps)) for t, ps in wanted)),))
        return of.OffsetFetchResponse(
            error_code=injected or 0 if version >= 2 else 0,
            topics=tuple(of.OffsetFetchResponseTopic(name=t, partitions=tuple(
                of.OffsetFetchResponsePartition(
                    partition_index=p, committed_offset=row(t, p)[0],
                    committed_leader_epoch=row(t, p)[2] if version >= 5 else -1,
                    metadata=row(t, p)[1], error_code=injected or 0 if version < 2 else 0)
                for p in ps)) for t, ps in wanted))

    # ------------------------------------------------------------------ listing

    def _list(self, version: int, request: lsg.ListGroupsRequest, injected: int | None
              ) -> lsg.ListGroupsResponse:
        if injected is not None:
            return lsg.ListGroupsResponse(error_code=injected)
        states = {s.lower() for s in request.states_filter} if version >= 4 else set()
        types = {t.lower() for t in request.types_filter} if version >= 5 else set()
        out = []
        for g in sorted(self.groups.groups.values(), key=lambda g: g.group_id):
            if (states and g.state.lower() not in states) or (types and "classic" not in types):
                continue
            out.append(lsg.ListedGroup(
                group_id=g.group_id, protocol_type=g.protocol_type or "",
                group_state=g.state if version >= 4 else "",
                group_type="classic" if version >= 5 else ""))
        return lsg.ListGroupsResponse(groups=tuple(out))

    def _describe(self, node_id: int, version: int, request: dsg.DescribeGroupsRequest
                  ) -> dsg.DescribeGroupsResponse:
        out = []
        for group_id in request.groups:
            g = self.groups.groups.get(group_id)
            if self.coordinator_for(group_id) != node_id:
                out.append(dsg.DescribedGroup(group_id=group_id,
                                              error_code=int(ErrorCode.NOT_COORDINATOR)))
            elif g is None:
                out.append(dsg.DescribedGroup(
                    group_id=group_id, group_state="Dead",
                    error_code=int(ErrorCode.GROUP_ID_NOT_FOUND) if version >= 6 else 0,
                    error_message=f"Group {group_id} not found." if version >= 6 else None))
            else:
                stable = g.state == "Stable"
                out.append(dsg.DescribedGroup(
                    group_id=group_id, group_state=g.state, protocol_type=g.protocol_type or "",
                    protocol_data=(g.protocol_name or "") if stable else "",
                    members=tuple(dsg.DescribedGroupMember(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id if version >= 4 else None,
                        client_id=m.client_id, client_host="/127.0.0.1",
                        member_metadata=m.metadata(g.protocol_name) if stable else b"",
                        member_assignment=m.assignment) for m in g.members.values())))
        return dsg.DescribeGroupsResponse(groups=tuple(out))


def _join_response(version: int, fields: dict[str, Any]) -> jg.JoinGroupResponse:
    members = tuple(
        jg.JoinGroupResponseMember(member_id=m, group_instance_id=i if version >= 5 else None,
                                   metadata=md)
        for m, i, md in fields.get("members", ()))
    name = fields.get("protocol_name")
    return jg.JoinGroupResponse(
        error_code=fields["error_code"],
        generation_id=fields.get("generation_id", -1),
        protocol_type=fields.get("protocol_type") if version >= 7 else None,
        protocol_name=name if version >= 7 else (name or ""),
        leader=fields.get("leader", ""),
        skip_assignment=fields.get("skip_assignment", False) if version >= 9 else False,
        member_id=fields.get("member_id", ""),
        members=members,
    )
