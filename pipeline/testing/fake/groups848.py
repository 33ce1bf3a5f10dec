"""The fake cluster's KIP-848 group coordinator (``group.protocol=consumer``), on virtual time.

Kafka 4.1's ``GroupMetadataManager.consumerGroupHeartbeat`` / ``CurrentAssignmentBuilder``
/ ``ConsumerGroup`` rules, as its clients meet them (checked against Kafka 4.1 by
tests/testing/test_fake_vs_kafka_groups848.py):

* **Joining** (member epoch 0): the member id is the client's (KIP-1082; ConsumerGroupHeartbeat
  v1 refuses an empty one with INVALID_REQUEST); the request must carry the rebalance
  timeout, a subscription and an empty owned list (else INVALID_REQUEST). A new member, or
  a changed subscription, or a change of the subscribed topics' partitions, bumps the
  *group epoch*; a group epoch above the *assignment epoch* recomputes every member's
  *target* assignment.
* **Reconciling** (Kafka's ``CurrentAssignmentBuilder``): a member moves towards its target
  one step per heartbeat. Partitions it must give up are *revoked first*: it keeps its
  member epoch (state UNREVOKED_PARTITIONS) and is told only what it keeps, until a
  heartbeat's owned list no longer has the revoked ones; then it takes the target's epoch.
  A partition another member still holds (assigned or being revoked) is *unreleased*: it
  is left out of the member's assignment (state UNRELEASED_PARTITIONS) until released.
  A member that does not revoke within its rebalance timeout is removed.
* **Epoch checks**: a higher epoch than the coordinator's, or a lower one, is
  FENCED_MEMBER_EPOCH, except the member's previous epoch with an owned list inside its
  current assignment (the answer that raised its epoch was lost): that request is answered
  as the current one. So a join (epoch 0) re-sent after a lost answer is accepted while the
  member is at its first epoch, and fenced once it has moved on (Kafka 4.1.2; KAFKA-19233
  lets a fenced member rejoin with epoch 0 at once from later releases). An unknown member
  id with a non-zero epoch is UNKNOWN_MEMBER_ID; a group that does not exist,
  GROUP_ID_NOT_FOUND.
* **The answer** carries the member id, the member epoch, the heartbeat interval
  (``group.consumer.heartbeat.interval.ms``, ``heartbeat_interval``) and the assignment when
  the request joined, was a *full* request (rebalance timeout, subscription and owned
  partitions all set: what our member always sends), or the assignment changed.
* **Leaving**: epoch -1 removes the member (the group epoch goes up, so the others are
  reassigned); a static member's -2 keeps its place and partitions (epoch -2) until its
  session times out or the same instance id joins again with a new member id, which takes
  over its assignment without a rebalance (while the old member has not left:
  UNRELEASED_INSTANCE_ID; another member id for a known instance: FENCED_INSTANCE_ID).
* **Session timeout** (``group.consumer.session.timeout.ms``, ``session_timeout``, from each
  accepted heartbeat): an expired member is removed and the group epoch goes up.
* **Commits** (``ConsumerGroup.validateOffsetCommit``): epoch < 0 commits freely while the
  group has no members; otherwise the member must exist (UNKNOWN_MEMBER_ID), commit with
  OffsetCommit v9+ (UNSUPPORTED_VERSION) and with exactly its member epoch: *any* other
  epoch, lower or higher, is STALE_MEMBER_EPOCH in Kafka 4.1. OffsetFetch v9 with a member
  id is checked alike.
* **States** (ConsumerGroupDescribe, ListGroups): Empty (no members), Assigning (group epoch
  above the assignment epoch), Reconciling (a member not at the assignment epoch or not
  stable), Stable.

The assignor. Kafka's default, ``uniform``, is what this one does for a homogeneous group
(every member subscribed to the same topics): quotas of ``partitions // members``, the
first ``partitions % members`` members in order allowed one more (a member already above
the minimum keeps its extra one while extras remain); each member keeps, lowest first, the
partitions of its previous target up to its quota; the rest (new partitions, then the
ones taken away) fill the members below quota in order. Kafka orders members by a hash
map; the fake by join order, so *which* member gets an extra partition may differ from
Kafka's, never the sizes nor stickiness: the tests compare such assignments as
properties. A heterogeneous group (different subscriptions) keeps what each member still
subscribes to and gives every other partition to the eligible member with the fewest
(join order breaks ties): balanced and sticky, without Kafka's moves between members.

Not modelled: regular-expression subscriptions (INVALID_REQUEST saying so), server
assignor choice (``uniform`` and ``range`` are accepted, both assign as above), rack
awareness, group size limits, classic members joining a consumer group (KIP-848's
online upgrade and downgrade: a JoinGroup meets the classic coordinator only), and
group configs (``consumer.session.timeout.ms`` per group).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_describe as cgd
from pipeline.protocol.messages import consumer_group_heartbeat as cgh

from .state import FakeState

__all__ = ["ConsumerGroup", "ConsumerGroupCoordinator", "ConsumerMember"]

TP = tuple[uuid.UUID, int]  # (topic id, partition)
LEAVE, STATIC_LEAVE = -1, -2
STABLE, UNREVOKED, UNRELEASED = "STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS"
ASSIGNORS = ("uniform", "range")  # Kafka 4.1's group.consumer.assignors


class Refused(Exception):
    """A heartbeat refused with ``code`` (Kafka's ApiException)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = "/127.0.0.1"
    rebalance_timeout: float = 0.0
    subscribed: tuple[str, ...] = ()
    epoch: int = 0
    #: the epoch before the last update: a request with it is still accepted when its
    #: owned partitions are inside the assignment (the answer that moved it on was lost)
    previous_epoch: int = -1
    state: str = STABLE
    #: what the member owns or is being given (sent in each answer)
    assigned: frozenset[TP] = frozenset()
    #: what it must give up first; still counted as held, so nobody else gets it yet
    revoking: frozenset[TP] = frozenset()

    def move_to(self, epoch: int) -> None:
        self.previous_epoch, self.epoch = self.epoch, epoch

    def holds(self) -> frozenset[TP]:
        return self.assigned | self.revoking


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    epoch: int = 0  # the group epoch: bumped by every membership or subscription change
    assignment_epoch: int = 0  # the epoch the targets were computed at
    members: dict[str, ConsumerMember] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    targets: dict[str, frozenset[TP]] = field(default_factory=dict)
    #: the subscribed topics' (name, id, partitions) the targets were computed from
    metadata: tuple[tuple[str, uuid.UUID, int], ...] = ()
    session_deadlines: dict[str, float] = field(default_factory=dict)
    rebalance_deadlines: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.state != STABLE or m.epoch != self.assignment_epoch
               for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def held_by_others(self, member_id: str) -> frozenset[TP]:
        return frozenset().union(*(m.holds() for m in self.members.values()
                                   if m.member_id != member_id))


class ConsumerGroupCoordinator:
    """Every KIP-848 consumer group of the fake cluster (module doc)."""

    def __init__(self, state: FakeState, *, heartbeat_interval: float = 5.0,
                 session_timeout: float = 45.0) -> None:
        self.state = state
        self.groups: dict[str, ConsumerGroup] = {}
        #: Kafka's group.consumer.heartbeat.interval.ms (seconds)
        self.heartbeat_interval = heartbeat_interval
        #: Kafka's group.consumer.session.timeout.ms (seconds)
        self.session_timeout = session_timeout
        self._wake = trio.Event()

    def _changed(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    # ------------------------------------------------------------------ timers

    async def run(self) -> None:
        """Fire expired session and rebalance timeouts until cancelled."""
        while True:
            self.expire(trio.current_time())
            with trio.move_on_at(self._next_deadline()):
                await self._wake.wait()

    def _next_deadline(self) -> float:
        deadlines = [float("inf")]
        for g in self.groups.values():
            deadlines += g.session_deadlines.values()
            deadlines += [d for _, d in g.rebalance_deadlines.values()]
        return min(deadlines)

    def expire(self, now: float) -> None:
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.session_deadlines.items()):
                if deadline <= now and member_id in group.members:
                    self._remove(group, [member_id])
            for member_id, (epoch, deadline) in list(group.rebalance_deadlines.items()):
                m = group.members.get(member_id)
                if deadline <= now and m is not None and m.state == UNREVOKED \
                        and m.epoch == epoch:
                    self._remove(group, [member_id])

    # ------------------------------------------------------------------ membership

    def _remove(self, group: ConsumerGroup, member_ids: Iterable[str]) -> None:
        """Fence members out of the group (leave, session or rebalance timeout): the group
        epoch goes up, so the next heartbeat reassigns their partitions."""
        for member_id in member_ids:
            m = group.members.pop(member_id)
            group.targets.pop(member_id, None)
            if m.instance_id is not None and group.static.get(m.instance_id) == member_id:
                del group.static[m.instance_id]
            group.session_deadlines.pop(member_id, None)
            group.rebalance_deadlines.pop(member_id, None)
        group.epoch += 1
        self._changed()

    def _subscribed_metadata(self, members: Iterable[ConsumerMember]
                             ) -> tuple[tuple[str, uuid.UUID, int], ...]:
        names = sorted({t for m in members for t in m.subscribed})
        topics = self.state.topics
        return tuple((n, topics[n].topic_id, len(topics[n].partitions))
                     for n in names if n in topics)

    def heartbeat(self, request: cgh.ConsumerGroupHeartbeatRequest, version: int,
                  client_id: str, now: float) -> cgh.ConsumerGroupHeartbeatResponse:
        """A ConsumerGroupHeartbeat (join, heartbeat or leave), answered."""
        try:
            _validate(request, version)
            if request.member_epoch in (LEAVE, STATIC_LEAVE):
                return self._leave(request)
            return self._heartbeat(request, client_id, now)
        except Refused as refused:
            return cgh.ConsumerGroupHeartbeatResponse(error_code=int(refused.code),
                                                      error_message=str(refused))

    def _group(self, group_id: str) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is None:
            raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        return group

    def _leave(self, request: cgh.ConsumerGroupHeartbeatRequest
               ) -> cgh.ConsumerGroupHeartbeatResponse:
        group = self._group(request.group_id)
        mid, epoch = request.member_id, request.member_epoch
        if request.instance_id is None:
            if mid not in group.members:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                              f"Member {mid} is not a member of group {group.group_id}.")
            self._remove(group, [mid])
            return cgh.ConsumerGroupHeartbeatResponse(member_id=mid, member_epoch=epoch)
        member = self._static_member(group, request.instance_id, mid)
        if epoch == STATIC_LEAVE:
            # keeps its place and partitions until its session ends or its instance returns
            member.epoch = STATIC_LEAVE
            member.revoking = frozenset()
            group.rebalance_deadlines.pop(member.member_id, None)
            return cgh.ConsumerGroupHeartbeatResponse(member_id=member.member_id,
                                                      member_epoch=STATIC_LEAVE)
        self._remove(group, [member.member_id])
        return cgh.ConsumerGroupHeartbeatResponse(member_id=mid, member_epoch=epoch)

    @staticmethod
    def _static_member(group: ConsumerGroup, instance_id: str, member_id: str
                       ) -> ConsumerMember:
        known = group.static.get(instance_id)
        if known is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if known != member_id:
            raise Refused(ErrorCode.FENCED_INSTANCE_ID,
                          f"Static member {member_id} with instance id {instance_id} was "
                          f"fenced by member {known}.")
        return group.members[known]

    def _heartbeat(self, request: cgh.ConsumerGroupHeartbeatRequest, client_id: str,
                   now: float) -> cgh.ConsumerGroupHeartbeatResponse:
        joining = request.member_epoch == 0
        group = self.groups.get(request.group_id)
        if group is None:
            if not joining:
                self._group(request.group_id)  # raises GROUP_ID_NOT_FOUND
            group = ConsumerGroup(request.group_id)
        owned = None if request.topic_partitions is None else frozenset(
            (t.topic_id, p) for t in request.topic_partitions for p in t.partitions)
        member, replaced = self._member(group, request, owned)
        before_assigned, before_subscribed = member.assigned, member.subscribed

        # 1. the member's own fields; a changed subscription bumps the group epoch
        if request.instance_id is not None:
            member.instance_id = request.instance_id
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        if request.rebalance_timeout_ms != -1:
            member.rebalance_timeout = request.rebalance_timeout_ms / 1000
        if request.subscribed_topic_names is not None:
            member.subscribed = tuple(sorted(set(request.subscribed_topic_names)))
        member.client_id = client_id
        if replaced is not None:
            self._replace(group, replaced, member)
        bump = group.epoch == 0 or before_subscribed != member.subscribed
        members = [*(m for m in group.members.values() if m.member_id != member.member_id),
                   member]
        metadata = self._subscribed_metadata(members)
        if metadata != group.metadata:
            bump = True
        self.groups[group.group_id] = group
        if member.member_id not in group.members:
            group.members[member.member_id] = member
            if member.instance_id is not None:
                group.static[member.instance_id] = member.member_id
        if bump:
            group.epoch += 1
            group.metadata = metadata

        # 2. new targets for a new group epoch
        if group.epoch > group.assignment_epoch:
            group.targets = self._assign(group)
            group.assignment_epoch = group.epoch

        # 3. one reconciliation step
        was = (member.state, member.epoch)
        _reconcile(group, member, owned)
        if (member.state, member.epoch) != was or member.state != UNREVOKED:
            if member.state == UNREVOKED:
                group.rebalance_deadlines[member.member_id] = (
                    member.epoch, now + member.rebalance_timeout)
            else:
                group.rebalance_deadlines.pop(member.member_id, None)
        group.session_deadlines[member.member_id] = now + self.session_timeout
        self._changed()

        full = request.rebalance_timeout_ms != -1 and owned is not None and (
            request.subscribed_topic_names is not None
            or request.subscribed_topic_regex is not None)
        assignment = None
        if joining or full or member.assigned != before_assigned:
            by_topic: dict[uuid.UUID, list[int]] = {}
            for topic_id, p in sorted(member.assigned):
                by_topic.setdefault(topic_id, []).append(p)
            assignment = cgh.Assignment(topic_partitions=tuple(
                cgh.ResponseTopicPartitions(topic_id=t, partitions=tuple(ps))
                for t, ps in by_topic.items()))
        return cgh.ConsumerGroupHeartbeatResponse(
            member_id=member.member_id, member_epoch=member.epoch,
            heartbeat_interval_ms=int(self.heartbeat_interval * 1000), assignment=assignment)

    def _member(self, group: ConsumerGroup, request: cgh.ConsumerGroupHeartbeatRequest,
                owned: frozenset[TP] | None) -> tuple[ConsumerMember, ConsumerMember | None]:
        """The member the request speaks for (new when joining) and, for a static member
        taking over its instance's place, the member it replaces."""
        mid, epoch, instance = request.member_id, request.member_epoch, request.instance_id
        joining = epoch == 0
        if instance is None:
            member = group.members.get(mid)
            if member is None:
                if not joining:
                    raise Refused(ErrorCode.UNKNOWN_MEMBER_ID,
                                  f"Member {mid} is not a member of group {group.group_id}.")
                return ConsumerMember(mid), None
            _check_epoch(member, epoch, owned)
            return member, None
        if joining:
            known = group.static.get(instance)
            if known is None:
                return group.members.get(mid) or ConsumerMember(mid), None
            old = group.members[known]
            if old.epoch != STATIC_LEAVE:
                raise Refused(ErrorCode.UNRELEASED_INSTANCE_ID,
                              f"Static member {mid} with instance id {instance} cannot join "
                              f"the group because the instance id is owned by {known} member.")
            new = ConsumerMember(
                mid, instance_id=instance, rack_id=old.rack_id,
                rebalance_timeout=old.rebalance_timeout, subscribed=old.subscribed, epoch=0,
                previous_epoch=0, state=old.state, assigned=old.assigned, revoking=old.revoking)
            return new, old
        member = self._static_member(group, instance, mid)
        _check_epoch(member, epoch, owned)
        return member, None

    def _replace(self, group: ConsumerGroup, old: ConsumerMember, new: ConsumerMember) -> None:
        """A returning static member takes its instance's place: same target, no new epoch."""
        target = group.targets.pop(old.member_id, frozenset())
        del group.members[old.member_id]
        group.session_deadlines.pop(old.member_id, None)
        group.rebalance_deadlines.pop(old.member_id, None)
        group.members[new.member_id] = new
        group.targets[new.member_id] = target
        if new.instance_id is not None:
            group.static[new.instance_id] = new.member_id

    # ------------------------------------------------------------------ the assignor

    def _assign(self, group: ConsumerGroup) -> dict[str, frozenset[TP]]:
        """Every member's target (the module doc's assignor)."""
        topics = self.state.topics
        members = list(group.members.values())
        if not members:
            return {}
        parts: dict[str, list[TP]] = {
            n: [(topics[n].topic_id, p) for p in range(len(topics[n].partitions))]
            for n in sorted({t for m in members for t in m.subscribed}) if n in topics}
        eligible = {m.member_id: {tp for t in m.subscribed for tp in parts.get(t, ())}
                    for m in members}
        previous = {m.member_id: sorted(group.targets.get(m.member_id, frozenset())
                                        & eligible[m.member_id]) for m in members}
        if len({m.subscribed for m in members}) == 1:
            return _uniform(members, [tp for ps in parts.values() for tp in ps], previous)
        out = {mid: set(tps) for mid, tps in previous.items()}
        taken = {tp for tps in out.values() for tp in tps}
        for tp in (tp for ps in parts.values() for tp in ps if tp not in taken):
            choices = [m.member_id for m in members if tp in eligible[m.member_id]]
            if choices:
                out[min(choices, key=lambda mid: len(out[mid]))].add(tp)
        return {mid: frozenset(tps) for mid, tps in out.items()}

    # ------------------------------------------------------------------ offsets

    def validate_commit(self, group_id: str, member_id: str, epoch: int, version: int
                        ) -> ErrorCode:
        """Kafka 4.1's ConsumerGroup.validateOffsetCommit (the group exists)."""
        group = self.groups[group_id]
        if epoch < 0 and not group.members:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        return ErrorCode.NONE if epoch == member.epoch else ErrorCode.STALE_MEMBER_EPOCH

    def validate_fetch(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode:
        """Kafka 4.1's ConsumerGroup.validateOffsetFetch (OffsetFetch v9+)."""
        group = self.groups[group_id]
        if member_id is None and epoch < 0:
            return ErrorCode.NONE
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE if epoch == member.epoch else ErrorCode.STALE_MEMBER_EPOCH

    # ------------------------------------------------------------------ describing

    def describe(self, group_id: str) -> cgd.DescribedGroup:
        """ConsumerGroupDescribe of one group (GROUP_ID_NOT_FOUND if it is not one)."""
        group = self.groups.get(group_id)
        if group is None:
            return cgd.DescribedGroup(group_id=group_id,
                                      error_code=int(ErrorCode.GROUP_ID_NOT_FOUND),
                                      error_message=f"Group {group_id} not found.")
        names = {t.topic_id: t.name for t in self.state.topics.values()}

        def assignment(tps: frozenset[TP]) -> cgd.Assignment:
            by_topic: dict[uuid.UUID, list[int]] = {}
            for topic_id, p in sorted(tps):
                if topic_id in names:
                    by_topic.setdefault(topic_id, []).append(p)
            return cgd.Assignment(topic_partitions=tuple(
                cgd.TopicPartitions(topic_id=t, topic_name=names[t], partitions=tuple(ps))
                for t, ps in by_topic.items()))

        return cgd.DescribedGroup(
            group_id=group_id, group_state=group.state, group_epoch=group.epoch,
            assignment_epoch=group.assignment_epoch, assignor_name="uniform",
            members=tuple(cgd.Member(
                member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                member_epoch=m.epoch, client_id=m.client_id, client_host=m.client_host,
                subscribed_topic_names=m.subscribed, assignment=assignment(m.assigned),
                target_assignment=assignment(group.targets.get(m.member_id, frozenset())),
                member_type=1) for m in group.members.values()))


def _validate(request: cgh.ConsumerGroupHeartbeatRequest, version: int) -> None:
    """Kafka's GroupCoordinatorService checks, before the group is looked at."""
    def invalid(message: str) -> Refused:
        return Refused(ErrorCode.INVALID_REQUEST, message)

    epoch = request.member_epoch
    if (version >= 1 or epoch > 0 or epoch == LEAVE) and not request.member_id:
        raise invalid("MemberId can't be empty.")
    if not request.group_id:
        raise invalid("GroupId can't be empty.")
    if request.instance_id == "":
        raise invalid("InstanceId can't be empty.")
    if request.rack_id == "":
        raise invalid("RackId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.topic_partitions is None or request.topic_partitions:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be "
                          "non-null when (re-)joining.")
    elif epoch == STATIC_LEAVE:
        if request.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif epoch < STATIC_LEAVE:
        raise invalid("MemberEpoch is invalid.")
    if request.server_assignor is not None and request.server_assignor not in ASSIGNORS:
        raise Refused(ErrorCode.UNSUPPORTED_ASSIGNOR,
                      f"ServerAssignor {request.server_assignor} is not supported. Supported "
                      f"assignors: {', '.join(ASSIGNORS)}.")
    if request.subscribed_topic_regex is not None:
        raise invalid("the fake cluster does not serve regular-expression subscriptions "
                      "(SubscribedTopicRegex); subscribe by topic names")


def _check_epoch(member: ConsumerMember, epoch: int, owned: frozenset[TP] | None) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
    if epoch > member.epoch:
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH,
                      f"The consumer group member has a greater member epoch ({epoch}) than "
                      f"the one known by the group coordinator ({member.epoch}). The member "
                      "must abandon all its partitions and rejoin.")
    if epoch < member.epoch and (epoch != member.previous_epoch or owned is None
                                 or not owned <= member.assigned):
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH,
                      f"The consumer group member has a smaller member epoch ({epoch}) than "
                      f"the one known by the group coordinator ({member.epoch}). The member "
                      "must abandon all its partitions and rejoin.")


def _reconcile(group: ConsumerGroup, m: ConsumerMember, owned: frozenset[TP] | None) -> None:
    """One step of Kafka's CurrentAssignmentBuilder towards the member's target."""
    if m.state == STABLE:
        if m.epoch != group.assignment_epoch:
            _next_step(group, m, m.epoch, owned)
    elif m.state == UNREVOKED:
        if owned is not None and not owned & m.revoking:
            _next_step(group, m, m.epoch + 1, owned)
    elif m.state == UNRELEASED:
        _next_step(group, m, m.epoch, owned)


def _next_step(group: ConsumerGroup, m: ConsumerMember, epoch: int,
               owned: frozenset[TP] | None) -> None:
    target = group.targets.get(m.member_id, frozenset())
    keep = m.assigned & target
    revoke = m.assigned - keep
    wanted = target - keep
    # a partition someone else still holds waits; this member's own revoking ones do not
    unreleased = wanted & (group.held_by_others(m.member_id) - m.revoking)
    wanted -= unreleased
    if revoke and (owned is None or owned & revoke):
        m.state, m.assigned, m.revoking = UNREVOKED, keep, revoke
        m.move_to(epoch)
        return
    m.state = UNRELEASED if unreleased else STABLE
    m.assigned, m.revoking = keep | wanted, frozenset()
    m.move_to(group.assignment_epoch)


def _uniform(members: list[ConsumerMember], partitions: list[TP],
             previous: dict[str, list[TP]]) -> dict[str, frozenset[TP]]:
    """The homogeneous case of Kafka's uniform assignor (module doc)."""
    if not partitions:
        return {m.member_id: frozenset() for m in members}
    assigned = {tp for tps in previous.values() for tp in tps}
    unassigned = [tp for tp in partitions if tp not in assigned]
    n = len(members)
    minimum, extras = divmod(len(partitions), n)
    out: dict[str, list[TP]] = {}
    unfilled: list[tuple[str, int]] = []
    for index, m in enumerate(members):
        quota, extra = minimum, False
        if extras > 0:
            quota, extra = quota + 1, True
        kept = previous[m.member_id][:quota]
        unassigned += previous[m.member_id][quota:]
        quota -= len(kept)
        if quota > 0 and extra and n - index > extras:
            quota, extra = quota - 1, False  # leave the extra one to a later member
        if quota > 0:
            unfilled.append((m.member_id, quota))
        if extra:
            extras -= 1
        out[m.member_id] = kept
    i = 0
    for member_id, quota in unfilled:
        out[member_id] = out[member_id] + unassigned[i:i + quota]
        i += quota
    return {mid: frozenset(tps) for mid, tps in out.items()}
