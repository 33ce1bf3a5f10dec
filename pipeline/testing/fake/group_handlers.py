"""The group APIs of the fake cluster: requests in, versioned answers out.

JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups,
DescribeGroups, ConsumerGroupHeartbeat and ConsumerGroupDescribe, each answered by the group's coordinator only (``coordinators.py``:
where a group's ``__consumer_offsets`` partition lives, or where
``FakeCluster.move_coordinator`` put it); another broker answers NOT_COORDINATOR, as
Kafka's do. The group's state survives a move, as Kafka's reloads from its log.
Committed offsets live in the cluster's :class:`OffsetStore` (shared with the
transaction coordinator): OffsetFetch with ``require_stable`` answers
UNSTABLE_OFFSET_COMMIT for a partition an open transaction committed.

The rules themselves are in ``groups.py`` (classic groups) and ``groups848.py`` (KIP-848
consumer groups: OffsetCommit and OffsetFetch to one are checked by its member epochs);
this module only reads requests and writes each version's answer (fields a version lacks
are left at their defaults). A group id names one kind of group: a heartbeat for a
classic group that has members is GROUP_ID_NOT_FOUND ("not a consumer group"; Kafka's
online upgrade is not modelled), an empty classic group is replaced, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_describe as cgd
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.protocol.messages import describe_groups as dsg
from pipeline.protocol.messages import heartbeat as hb
from pipeline.protocol.messages import join_group as jg
from pipeline.protocol.messages import leave_group as lg
from pipeline.protocol.messages import list_groups as lsg
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import sync_group as sg

from .coordinators import GROUP, Coordinators
from .group_state import ClassicGroup
from .groups import GroupCoordinator
from .groups848 import ConsumerGroup, ConsumerGroupCoordinator
from .offsets import CommittedOffset, OffsetStore
from .state import FakeState

__all__ = ["GROUP_APIS", "GROUP_VERSIONS", "GroupApis", "GroupQueries"]

GROUP_APIS = frozenset({
    ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS,
    ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE,
})
#: The versions the fake serves: the client's, which are what Kafka 4.1 serves.
GROUP_VERSIONS: dict[int, tuple[int, int]] = {k: CLIENT_VERSIONS[k] for k in sorted(GROUP_APIS)}


class GroupQueries:
    """The group state tests read (mixed into ``FakeCluster``, which sets these two)."""

    group_coordinator: GroupCoordinator
    consumer_groups: ConsumerGroupCoordinator
    offsets: OffsetStore

    def group(self, group_id: str) -> ClassicGroup:
        """A classic group's state (KeyError if it does not exist)."""
        return self.group_coordinator.groups[group_id]

    def consumer_group(self, group_id: str) -> ConsumerGroup:
        """A KIP-848 consumer group's state (KeyError if it does not exist)."""
        return self.consumer_groups.groups[group_id]

    def committed(self, group_id: str, topic: str, partition: int) -> int | None:
        """The group's visible committed offset for a partition, None if none."""
        found = self.offsets.fetch(group_id, (topic, partition))
        return None if found is None else found.offset


class GroupApis:
    """Answers the group APIs for a :class:`FakeState` (owned by the fake's server)."""

    def __init__(self, state: FakeState, coordinator: GroupCoordinator,
                 coordinators: Coordinators, offsets: OffsetStore,
                 consumer_groups: ConsumerGroupCoordinator) -> None:
        self.state = state
        self.groups = coordinator
        self.consumer_groups = consumer_groups
        self.coordinators = coordinators
        self.offsets = offsets

    def coordinator_for(self, group_id: str) -> int:
        """The node id coordinating ``group_id``; -1 if no broker runs."""
        return self.coordinators.node_for(GROUP, group_id)

    async def handle(self, node_id: int, api_key: int, version: int, request: Any,
                     client_id: str | None, inject: Callable[[str | None, int | None], int | None]
                     ) -> Any:
        injected = inject(None, None)
        if api_key == ApiKey.LIST_GROUPS:
            return self._list(version, request, injected)
        if api_key == ApiKey.DESCRIBE_GROUPS:
            return self._describe(node_id, version, request)
        if api_key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            return self._describe848(node_id, request, injected)
        group_id = request.group_id
        if api_key == ApiKey.OFFSET_FETCH and version >= 8:
            group_id = request.groups[0].group_id
        if injected is None and self.coordinator_for(group_id) != node_id:
            injected = int(ErrorCode.NOT_COORDINATOR)
        now = trio.current_time()
        if api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            return self._heartbeat848(version, request, client_id or "", injected, now)
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

    # ------------------------------------------------------------------ KIP-848

    def _heartbeat848(self, version: int, request: cgh.ConsumerGroupHeartbeatRequest,
                      client_id: str, injected: int | None, now: float
                      ) -> cgh.ConsumerGroupHeartbeatResponse:
        if injected is not None:
            return cgh.ConsumerGroupHeartbeatResponse(error_code=injected,
                                                      error_message=ErrorCode(injected).name)
        classic = self.groups.groups.get(request.group_id)
        if classic is not None:
            if request.member_epoch == 0 and classic.state == "Empty" and not classic.members:
                del self.groups.groups[request.group_id]  # Kafka converts an empty one
            else:
                return cgh.ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.GROUP_ID_NOT_FOUND),
                    error_message=f"Group {request.group_id} is not a consumer group.")
        return self.consumer_groups.heartbeat(request, version, client_id, now)

    def _describe848(self, node_id: int, request: cgd.ConsumerGroupDescribeRequest,
                     injected: int | None) -> cgd.ConsumerGroupDescribeResponse:
        out = []
        for group_id in request.group_ids:
            code = injected
            if code is None and self.coordinator_for(group_id) != node_id:
                code = int(ErrorCode.NOT_COORDINATOR)
            if code is not None:
                out.append(cgd.DescribedGroup(group_id=group_id, error_code=code,
                                              error_message=ErrorCode(code).name))
            elif group_id in self.groups.groups:
                out.append(cgd.DescribedGroup(
                    group_id=group_id, error_code=int(ErrorCode.GROUP_ID_NOT_FOUND),
                    error_message=f"Group {group_id} is not a consumer group."))
            else:
                out.append(self.consumer_groups.describe(group_id))
        return cgd.ConsumerGroupDescribeResponse(groups=tuple(out))

    # ------------------------------------------------------------------ offsets

    def _commit(self, version: int, request: oc.OffsetCommitRequest, injected: int | None
                ) -> oc.OffsetCommitResponse:
        group_id = request.group_id
        generation = request.generation_id_or_member_epoch
        code = injected
        consumer = group_id in self.consumer_groups.groups
        if code is None:
            if group_id not in self.groups.groups and not consumer and generation >= 0:
                code = int(ErrorCode.GROUP_ID_NOT_FOUND if version >= 9
                           else ErrorCode.ILLEGAL_GENERATION)
            elif consumer:
                code = int(self.consumer_groups.validate_commit(
                    group_id, request.member_id, generation, version))
            else:
                code = int(self.groups.validate_commit(
                    group_id, request.member_id,
                    request.group_instance_id if version >= 7 else None, generation))
        if code == 0:
            if not consumer:
                self.groups.simple_group(group_id)
            self.offsets.commit(group_id, {
                (t.name, p.partition_index): CommittedOffset(
                    p.committed_offset, p.committed_leader_epoch if version >= 6 else -1,
                    p.committed_metadata or "")
                for t in request.topics for p in t.partitions})
        return oc.OffsetCommitResponse(topics=tuple(
            oc.OffsetCommitResponseTopic(name=t.name, partitions=tuple(
                oc.OffsetCommitResponsePartition(partition_index=p.partition_index,
                                                 error_code=code)
                for p in t.partitions))
            for t in request.topics))

    def _fetch(self, version: int, request: of.OffsetFetchRequest, group_id: str,
               injected: int | None) -> of.OffsetFetchResponse:
        if version >= 8:
            wanted = [(t.name, tuple(t.partition_indexes))
                      for t in (request.groups[0].topics or ())]
        else:
            wanted = [(t.name, tuple(t.partition_indexes)) for t in (request.topics or ())]

        stable = request.require_stable if version >= 7 else False
        if injected is None and version >= 9 and group_id in self.consumer_groups.groups:
            asked = request.groups[0]
            code = self.consumer_groups.validate_fetch(group_id, asked.member_id,
                                                       asked.member_epoch)
            injected = int(code) if code != ErrorCode.NONE else None

        def row(topic: str, p: int) -> tuple[int, str, int, int]:
            """(offset, metadata, leader epoch, error) of one partition."""
            if stable and self.offsets.is_pending(group_id, (topic, p)):
                return -1, "", -1, int(ErrorCode.UNSTABLE_OFFSET_COMMIT)
            found = self.offsets.fetch(group_id, (topic, p))
            if found is None:
                return -1, "", -1, 0
            return found.offset, found.metadata or "", found.leader_epoch, 0

        if version >= 8:
            return of.OffsetFetchResponse(groups=(of.OffsetFetchResponseGroup(
                group_id=group_id, error_code=injected or 0,
                topics=() if injected else tuple(of.OffsetFetchResponseTopics(name=t, partitions=tuple(
                    of.OffsetFetchResponsePartitions(
                        partition_index=p, committed_offset=row(t, p)[0],
                        committed_leader_epoch=row(t, p)[2], metadata=row(t, p)[1],
                        error_code=row(t, p)[3])
                    for p in ps)) for t, ps in wanted)),))
        return of.OffsetFetchResponse(
            error_code=injected or 0 if version >= 2 else 0,
            topics=tuple(of.OffsetFetchResponseTopic(name=t, partitions=tuple(
                of.OffsetFetchResponsePartition(
                    partition_index=p, committed_offset=row(t, p)[0],
                    committed_leader_epoch=row(t, p)[2] if version >= 5 else -1,
                    metadata=row(t, p)[1],
                    error_code=(injected or 0) if version < 2 else row(t, p)[3])
                for p in ps)) for t, ps in wanted))

    # ------------------------------------------------------------------ listing

    def _list(self, version: int, request: lsg.ListGroupsRequest, injected: int | None
              ) -> lsg.ListGroupsResponse:
        if injected is not None:
            return lsg.ListGroupsResponse(error_code=injected)
        states = {s.lower() for s in request.states_filter} if version >= 4 else set()
        types = {t.lower() for t in request.types_filter} if version >= 5 else set()
        listed = [(g.group_id, g.protocol_type or "", g.state, "classic")
                  for g in self.groups.groups.values()]
        listed += [(g.group_id, "consumer", g.state, "consumer")
                   for g in self.consumer_groups.groups.values()]
        out = []
        for group_id, protocol_type, state, kind in sorted(listed):
            if (states and state.lower() not in states) or (types and kind not in types):
                continue
            out.append(lsg.ListedGroup(
                group_id=group_id, protocol_type=protocol_type,
                group_state=state if version >= 4 else "",
                group_type=kind if version >= 5 else ""))
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
