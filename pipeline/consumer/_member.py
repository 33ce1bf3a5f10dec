"""The classic group protocol's member: join, sync, heartbeat, commit, leave.

The Java ``ConsumerCoordinator`` / ``AbstractCoordinator`` as trio tasks of one member:

* the **membership loop** runs a join round whenever one is requested: prepare
  (eager: revoke everything, committing first with auto-commit; after the member was
  reset: its partitions are *lost*), JoinGroup (MEMBER_ID_REQUIRED answered by
  joining again with the given id, KIP-394), the leader's assignment
  (``_assignors.py``, Kafka's subscription bytes), SyncGroup, then the new assignment
  through the :class:`Handoff` (cooperative: revoke what moves away, rejoin, assign
  what is new, KIP-429);
* the **heartbeat** task, while the member is stable, so a slow application does not
  drop the member: REBALANCE_IN_PROGRESS requests a rejoin; UNKNOWN_MEMBER_ID /
  ILLEGAL_GENERATION reset the member (its partitions are lost) and rejoin;
* the **poll watchdog**: when the application has taken nothing for
  ``max_poll_interval`` (and is not waiting for records), the member leaves the group
  (a static member just stops: its partitions wait for it until the session timeout)
  and the next iteration raises :class:`MaxPollIntervalExceededError`;
* **auto-commit** every ``auto_commit_interval``.

Commits carry the generation and member id; the coordinator refuses them from a
member that is not in the current generation (CommitFailedError), and while the
group completes a rebalance (RebalanceInProgressError). Commits wait while a
JoinGroup / SyncGroup of this member is in flight (that never depends on the
application, so it cannot deadlock).

``epoch`` counts resets and departures: a join round notices after each await that
the member it was joining for is gone, and stops.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.errors import KafkaError, UnknownTopicError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._assignors import Assignor, Member, member_from_subscription
from pipeline.consumer._commits import commit_errors, commit_request, fetch_request, fetch_result
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._coordinator import COORDINATOR_GONE, Coordinator
from pipeline.consumer._errors import (
    CommitFailedError,
    ConsumerError,
    GroupError,
    MaxPollIntervalExceededError,
    RebalanceInProgressError,
)
from pipeline.consumer._handoff import Handoff, Kind
from pipeline.consumer._state import Assignment
from pipeline.consumer._types import (
    ConsumerGroupMetadata,
    ConsumerState,
    OffsetAndMetadata,
    TopicPartition,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    group_partitions,
)
from pipeline.protocol.errors import DecodeError, ErrorCode, error_code
from pipeline.protocol.messages.heartbeat import HeartbeatRequest
from pipeline.protocol.messages.join_group import (
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
)
from pipeline.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity
from pipeline.protocol.messages.offset_commit import OffsetCommitRequest
from pipeline.protocol.messages.offset_fetch import OffsetFetchRequest
from pipeline.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment

__all__ = ["GroupMember"]

logger = logging.getLogger("pipeline.consumer")

R = TypeVar("R", bound=Response)

_RETRY_COMMIT = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT})
_FATAL_JOIN = {
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
        "the group's members offer no assignor in common with partition_assignment_strategy="
        "{strategy} (or are not consumers)",
    ErrorCode.INVALID_SESSION_TIMEOUT:
        "session_timeout={session}s is outside the broker's group.min.session.timeout.ms .. "
        "group.max.session.timeout.ms",
    ErrorCode.FENCED_INSTANCE_ID:
        "another consumer uses group_instance_id={instance!r}: each static member needs its own",
    ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has group.max.size members already",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "not authorized to use group {group!r}",
    ErrorCode.INVALID_GROUP_ID: "group id {group!r} is invalid",
}


def _commit_request(group_id: str, generation: int, member_id: str, instance: str | None,
                    offsets: Mapping[TopicPartition, OffsetAndMetadata],
                    version: int) -> OffsetCommitRequest:
    return commit_request(version, group_id, generation, member_id, instance, offsets)


def _fetch_request(group_id: str, tps: frozenset[TopicPartition], version: int) -> OffsetFetchRequest:
    return fetch_request(version, group_id, tps)


class _Rejoin(Exception):
    """This join attempt cannot complete; start over (member id kept or reset)."""


class GroupMember:
    """One consumer's membership of its group (module doc)."""

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        topics: tuple[str, ...],
        assignment: Assignment,
        handoff: Handoff,
        report: Any,
        consumer: Any,
    ) -> None:
        assert config.group_id is not None
        self._cluster = cluster
        self._config = config
        self.group_id: str = config.group_id
        self._topics = topics
        self._assignment = assignment
        self._handoff = handoff
        self._report = report
        self._consumer = consumer  # polls / waiting, read by the watchdog
        self._assignors: dict[str, Assignor] = {a.name: a for a in config.assignors()}
        self._protocol = config.rebalance_protocol
        self._backoff = cluster_backoff(config.cluster, config.cluster.rng or random.Random())
        self.member_id = ""
        self.generation = -1
        self.protocol_name: str | None = None
        self.leader_id = ""
        self.state: ConsumerState = "unjoined"
        self.epoch = 0
        self.rebalances = 0
        self.last_heartbeat: float | None = None  # trio time of the last answered heartbeat
        self._owned_generation = -1  # the generation the owned partitions came from
        self._lost: frozenset[TopicPartition] = frozenset()  # to hand over as lost first
        self._assigned_counts: dict[str, int] = {}  # what the leader assigned from
        self._rejoin_needed = trio.Event()
        self._joining = False  # a JoinGroup / SyncGroup is in flight
        self._settled = trio.Event()  # set when joining ends
        self._poll_timeout = False
        self._coordinator: Coordinator | None = None
        self._tasks: trio.CancelScope | None = None
        self._round: trio.CancelScope | None = None

    # ------------------------------------------------------------ public face

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(
            self.group_id, self.generation, self.member_id, self._config.group_instance_id)

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time()
        return {
            "member_id": self.member_id,
            "generation": self.generation,
            "leader": self.leader_id == self.member_id and bool(self.member_id),
            "rebalances": self.rebalances,
            "coordinator": self._coordinator.node_id if self._coordinator else None,
            "coordinator_moves": self._coordinator.moves if self._coordinator else 0,
            "since_last_heartbeat":
                None if self.last_heartbeat is None else now - self.last_heartbeat,
        }

    def check_poll(self) -> None:
        """The application is iterating: report a poll timeout once, then rejoin."""
        if self._poll_timeout:
            self._poll_timeout = False
            self.request_rejoin("the application iterates again after a poll timeout")
            raise MaxPollIntervalExceededError(
                f"more than max_poll_interval={self._config.max_poll_interval}s passed "
                "between two iterations, so this member left group "
                f"{self.group_id!r} and its partitions went to other members; raise "
                "max_poll_interval, or process less per iteration (batches(max_records=...)). "
                "Iterating again rejoins the group."
            )

    def request_rejoin(self, reason: str) -> None:
        if not self._rejoin_needed.is_set():
            logger.info("group %r: rejoining (%s)", self.group_id, reason)
            self._rejoin_needed.set()

    # ------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as connections:
            self._coordinator = Coordinator(self._cluster, self._config, connections)
            with trio.CancelScope() as self._tasks:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(self._heartbeats)
                    tasks.start_soon(self._watchdog)
                    if self._config.enable_auto_commit:
                        tasks.start_soon(self._auto_commits)
                    task_status.started()
                    self.request_rejoin("first join")
                    await self._membership()
            await trio.sleep_forever()  # the connections serve close() until cancelled

    async def _membership(self) -> None:
        while True:
            await self._rejoin_needed.wait()
            self._rejoin_needed = trio.Event()
            with trio.CancelScope() as self._round:
                try:
                    await self._join_round()
                except ConsumerError as exc:
                    self.state = "unjoined"
                    self._report(exc)
                    return

    def _reset(self, reason: str, *, keep_member_id: bool = False, rejoin: bool = True) -> None:
        """The coordinator no longer knows us in this generation: what we own is lost."""
        logger.info("group %r: member %s reset (%s)", self.group_id, self.member_id, reason)
        self.epoch += 1
        self.generation = -1
        if not keep_member_id:
            self.member_id = ""
        self.state = "unjoined"
        self._lost |= frozenset(self._assignment.partitions)
        if rejoin:
            self.request_rejoin(reason)

    # ------------------------------------------------------------ join rounds

    async def _join_round(self) -> None:
        epoch = self.epoch
        if self._lost:
            lost, self._lost = self._lost, frozenset()
            await self._handoff.post("lose", lost & frozenset(self._assignment.partitions))
        elif self._protocol == "eager" and len(self._assignment):
            await self._handoff.post("revoke", frozenset(self._assignment.partitions))
        if self.epoch != epoch:
            return
        self.state = "rebalancing"
        self._joining = True
        try:
            while True:
                try:
                    join = await self._join_group()
                    data = await self._sync_group(join)
                    break
                except _Rejoin:
                    continue
        finally:
            self._joining = False
            self._settled.set()
            self._settled = trio.Event()
        self.state = "stable"
        self.rebalances += 1
        self.last_heartbeat = trio.current_time()
        epoch = self.epoch
        try:
            assigned = ConsumerProtocolAssignment.decode(data)
        except DecodeError as exc:
            raise GroupError(f"group {self.group_id!r}: the leader sent an assignment that "
                             f"does not decode ({exc})") from exc
        new = frozenset(TopicPartition(t, p) for t, p in assigned.partitions)
        owned = frozenset(self._assignment.partitions)
        self._owned_generation = self.generation
        logger.info("group %r generation %d: member %s assigned %s", self.group_id,
                    self.generation, self.member_id, sorted(new))
        revoked = owned - new
        if revoked:
            await self._handoff.post("revoke", revoked)
            if self.epoch == epoch:
                self.request_rejoin("partitions were revoked for other members")
        if self.epoch == epoch:
            await self._handoff.post("assign", new - owned)

    def _subscription(self, assignor: Assignor) -> bytes:
        owned = frozenset(self._assignment.partitions) if self._protocol == "cooperative" else frozenset()
        return ConsumerProtocolSubscription(
            topics=tuple(sorted(self._topics)),
            user_data=assignor.user_data(self._owned_generation),
            owned_partitions=group_partitions(owned),
            generation_id=self._owned_generation,
            rack_id=self._config.client_rack,
        ).encode()

    async def _join_group(self) -> JoinGroupResponse:
        cfg = self._config
        assert self._coordinator is not None
        protocols = tuple(JoinGroupRequestProtocol(name=name, metadata=self._subscription(a))
                          for name, a in self._assignors.items())

        def make(version: int) -> JoinGroupRequest:
            return JoinGroupRequest(
                group_id=self.group_id,
                session_timeout_ms=int(cfg.session_timeout * 1000),
                rebalance_timeout_ms=int(cfg.max_poll_interval * 1000),
                member_id=self.member_id,
                group_instance_id=cfg.group_instance_id,
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocols=protocols,
            )

        response = await self._ask(ApiKey.JOIN_GROUP, make, long=True)
        code = error_code(response.error_code)
        if code == ErrorCode.NONE:
            self.member_id = response.member_id
            self.generation = response.generation_id
            self.protocol_name = response.protocol_name
            self.leader_id = response.leader
            return response
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            raise _Rejoin
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            raise _Rejoin
        await self._retriable(code, "JoinGroup")
        raise _Rejoin

    async def _sync_group(self, join: JoinGroupResponse) -> bytes:
        assignments: dict[str, bytes] = {}
        if join.leader == join.member_id and not join.skip_assignment:
            assignments = await self._assign(join)

        def make(version: int) -> SyncGroupRequest:
            return SyncGroupRequest(
                group_id=self.group_id,
                generation_id=join.generation_id,
                member_id=join.member_id,
                group_instance_id=self._config.group_instance_id,
                protocol_type=CONSUMER_PROTOCOL_TYPE if version >= 5 else None,
                protocol_name=join.protocol_name if version >= 5 else None,
                assignments=tuple(SyncGroupRequestAssignment(member_id=m, assignment=a)
                                  for m, a in assignments.items()),
            )

        response = await self._ask(ApiKey.SYNC_GROUP, make, long=True)
        code = error_code(response.error_code)
        if code == ErrorCode.NONE:
            return response.assignment
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id, self.generation = "", -1
            raise _Rejoin
        if code == ErrorCode.ILLEGAL_GENERATION:
            self.generation = -1
            raise _Rejoin
        await self._retriable(code, "SyncGroup")
        raise _Rejoin

    async def _ask(
        self, api_key: ApiKey, make: Callable[[int], Request[R]], *, long: bool = False
    ) -> R:
        """A coordinator request; a lost connection means: back off and start over."""
        assert self._coordinator is not None
        try:
            return await self._coordinator.request(api_key, make, long=long)
        except (*CONNECT_ERRORS, KafkaError) as exc:
            if isinstance(exc, ConsumerError):
                raise
            logger.info("group %r: %s failed: %s", self.group_id, api_key.name, exc)
            await trio.sleep(self._backoff.delay(1))
            raise _Rejoin from exc

    async def _retriable(self, code: ErrorCode, what: str) -> None:
        """Back off for a retriable join / sync error; raise GroupError for the others."""
        assert self._coordinator is not None
        if code in COORDINATOR_GONE:
            self._coordinator.forget()
        elif code not in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.REBALANCE_IN_PROGRESS):
            template = _FATAL_JOIN.get(code, "{code}: {description}")
            raise GroupError(f"group {self.group_id!r}: {what} failed: " + template.format(
                strategy=",".join(self._config.partition_assignment_strategy),
                session=self._config.session_timeout, instance=self._config.group_instance_id,
                group=self.group_id, code=code.name, description=code.description,
            ), int(code))
        logger.info("group %r: %s answered %s; retrying", self.group_id, what, code.name)
        await trio.sleep(self._backoff.delay(1))

    async def _assign(self, join: JoinGroupResponse) -> dict[str, bytes]:
        """The leader's part: every member's subscription in, every member's bytes out."""
        assignor = self._assignors.get(join.protocol_name or "")
        if assignor is None:
            raise GroupError(f"group {self.group_id!r} chose assignor {join.protocol_name!r}, "
                             "which this member did not offer")
        members: dict[str, Member] = {}
        for m in join.members:
            try:
                sub = ConsumerProtocolSubscription.decode(m.metadata)
            except DecodeError as exc:
                logger.warning("group %r: member %s sent a subscription that does not decode "
                               "(%s); it gets nothing", self.group_id, m.member_id, exc)
                sub = ConsumerProtocolSubscription(topics=())
            members[m.member_id] = member_from_subscription(m.member_id, m.group_instance_id, sub)
        counts: dict[str, int] = {}
        for topic in sorted({t for m in members.values() for t in m.topics}):
            try:
                counts[topic] = await self._cluster.partitions_for(topic)
            except UnknownTopicError:
                logger.info("group %r: subscribed topic %r does not exist", self.group_id, topic)
        self._assigned_counts = counts
        result = assignor.assign(counts, members)
        logger.info("group %r generation %d: leader %s assigned %s", self.group_id,
                    join.generation_id, join.member_id,
                    {m: sorted(p) for m, p in result.items()})
        return {m: ConsumerProtocolAssignment.of(parts).encode() for m, parts in result.items()}

    # ------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        cfg = self._config
        assert self._coordinator is not None
        next_at = trio.current_time()
        while True:
            if self.state != "stable" or self._joining:
                await self._assignment.wait_changed()
                next_at = trio.current_time() + cfg.heartbeat_interval
                continue
            await trio.sleep_until(next_at)
            if self.state != "stable" or self._joining:
                continue
            next_at = trio.current_time() + cfg.heartbeat_interval
            generation, member_id, epoch = self.generation, self.member_id, self.epoch

            def make(version: int, generation: int = generation,
                     member_id: str = member_id) -> HeartbeatRequest:
                return HeartbeatRequest(group_id=self.group_id, generation_id=generation,
                                        member_id=member_id,
                                        group_instance_id=cfg.group_instance_id)

            try:
                response = await self._coordinator.request(ApiKey.HEARTBEAT, make)
            except (*CONNECT_ERRORS, KafkaError) as exc:
                logger.info("group %r: heartbeat failed: %s", self.group_id, exc)
                next_at = trio.current_time() + self._backoff.delay(1)
                continue
            if self.epoch != epoch:
                continue
            self._on_heartbeat(error_code(response.error_code))
            self._check_metadata()

    def _on_heartbeat(self, code: ErrorCode) -> None:
        assert self._coordinator is not None
        if code == ErrorCode.NONE:
            self.last_heartbeat = trio.current_time()
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.last_heartbeat = trio.current_time()
            self.request_rejoin("the coordinator started a rebalance")
        elif code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            self._reset(f"heartbeat answered {code.name}",
                        keep_member_id=code == ErrorCode.ILLEGAL_GENERATION)
            self._assignment.changed()
        elif code in COORDINATOR_GONE:
            self._coordinator.forget()
        elif code in (ErrorCode.FENCED_INSTANCE_ID, ErrorCode.GROUP_AUTHORIZATION_FAILED):
            template = _FATAL_JOIN[code]
            self._fail(GroupError(f"group {self.group_id!r}: heartbeat refused: " + template.format(
                instance=self._config.group_instance_id, group=self.group_id), int(code)))
        else:
            logger.warning("group %r: heartbeat answered %s", self.group_id, code.name)

    def _check_metadata(self) -> None:
        """The leader rebalances when a subscribed topic's partition count changed."""
        if self.leader_id != self.member_id or not self._assigned_counts:
            return
        for topic, count in self._assigned_counts.items():
            now = self._cluster.partition_count_nowait(topic)
            if now is not None and now != count:
                self.request_rejoin(f"topic {topic!r} has {now} partitions, not {count}")
                return

    def _fail(self, error: ConsumerError) -> None:
        self.state = "unjoined"
        self.epoch += 1
        if self._round is not None:
            self._round.cancel()
        self._report(error)

    # ------------------------------------------------------------ poll watchdog

    async def _watchdog(self) -> None:
        limit = self._config.max_poll_interval
        period = min(1.0, limit / 8)
        polls = self._consumer.polls
        active_at = trio.current_time()
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            if self._consumer.waiting or self._consumer.polls != polls:
                polls = self._consumer.polls
                active_at = now
                continue
            if now - active_at <= limit or self.state == "unjoined" or self._poll_timeout:
                continue
            logger.warning("group %r: nothing taken from the consumer for %.1fs "
                           "(max_poll_interval=%s); leaving the group", self.group_id,
                           now - active_at, limit)
            self._poll_timeout = True
            if self._round is not None:
                self._round.cancel()
            self._handoff.abandon()
            await self._leave("consumer poll timeout has expired")
            # Not rejoining before the application is back (check_poll).
            self._reset("max_poll_interval exceeded", rejoin=False,
                        keep_member_id=self._config.group_instance_id is not None)
            self._handoff.post_nowait("lose", self._lost)
            self._lost = frozenset()

    async def _leave(self, reason: str) -> None:
        """LeaveGroup for a dynamic member (a static one keeps its place until the
        session timeout, KIP-345)."""
        if self._config.group_instance_id is not None or not self.member_id:
            return
        assert self._coordinator is not None
        member_id = self.member_id

        def make(version: int) -> LeaveGroupRequest:
            if version >= 3:
                return LeaveGroupRequest(group_id=self.group_id, members=(
                    MemberIdentity(member_id=member_id, reason=reason if version >= 5 else None),))
            return LeaveGroupRequest(group_id=self.group_id, member_id=member_id)

        try:
            await self._coordinator.request(ApiKey.LEAVE_GROUP, make)
        except (*CONNECT_ERRORS, KafkaError) as exc:
            logger.info("group %r: LeaveGroup failed: %s", self.group_id, exc)

    # ------------------------------------------------------------ commits

    async def _auto_commits(self) -> None:
        done: dict[TopicPartition, OffsetAndMetadata] = {}
        while True:
            await trio.sleep(self._config.auto_commit_interval)
            if self.state != "stable":
                continue
            offsets = {tp: o for tp, o in self._consumer.consumed_offsets().items()
                       if done.get(tp) != o}
            try:
                await self.commit(offsets)
            except ConsumerError as exc:
                logger.warning("group %r: auto-commit failed: %s", self.group_id, exc)
            else:
                done.update(offsets)

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        if not offsets:
            await trio.lowlevel.checkpoint()
            return
        timeout = self._config.default_api_timeout
        with trio.move_on_after(timeout):
            return await self._commit(offsets)
        raise ConsumerError(f"commit did not complete within default_api_timeout={timeout}s")

    async def _commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        assert self._coordinator is not None
        attempt = 0
        while True:
            while self._joining:
                await self._settled.wait()
            if self.generation < 0:
                raise CommitFailedError(
                    f"cannot commit: this consumer is not a member of group {self.group_id!r} "
                    "now (it was removed, or has not joined yet); its partitions may be "
                    "processed by another member")
            generation, member_id, epoch = self.generation, self.member_id, self.epoch
            make = functools.partial(_commit_request, self.group_id, generation, member_id,
                                     self._config.group_instance_id, offsets)
            try:
                response = await self._coordinator.request(ApiKey.OFFSET_COMMIT, make)
            except (*CONNECT_ERRORS, KafkaError) as exc:
                attempt += 1
                logger.info("group %r: commit failed (%s); retrying", self.group_id, exc)
                await trio.sleep(self._backoff.delay(attempt))
                continue
            errors = {tp: c for tp, c in commit_errors(response).items() if c != ErrorCode.NONE}
            if not errors:
                return
            code = next(iter(errors.values()))
            if code in COORDINATOR_GONE or code in _RETRY_COMMIT:
                if code in COORDINATOR_GONE:
                    self._coordinator.forget()
                attempt += 1
                await trio.sleep(self._backoff.delay(attempt))
                continue
            if code == ErrorCode.REBALANCE_IN_PROGRESS:
                self.request_rejoin("a commit found the group rebalancing")
                raise RebalanceInProgressError(
                    f"group {self.group_id!r} is rebalancing; keep iterating (the rebalance "
                    "completes there) and commit again")
            if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                if self.epoch == epoch and self.generation == generation:
                    self._reset(f"commit answered {code.name}",
                                keep_member_id=code == ErrorCode.ILLEGAL_GENERATION)
                    self._assignment.changed()
                raise CommitFailedError(
                    f"commit refused ({code.name}): generation {generation} of group "
                    f"{self.group_id!r} is over for this member; its partitions may be "
                    "processed by another member now")
            raise ConsumerError(
                f"commit to group {self.group_id!r} failed for "
                f"{sorted((tp.topic, tp.partition) for tp in errors)}: {code.name} "
                f"({code.description})")

    async def committed(
        self, tps: frozenset[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The committed offsets (OffsetFetch with require_stable), retried while the
        answers are retriable, within ``default_api_timeout``."""
        assert self._coordinator is not None
        timeout = self._config.default_api_timeout
        attempt = 0
        with trio.move_on_after(timeout):
            while True:
                make = functools.partial(_fetch_request, self.group_id, tps)
                try:
                    response = await self._coordinator.request(ApiKey.OFFSET_FETCH, make)
                except (*CONNECT_ERRORS, KafkaError) as exc:
                    attempt += 1
                    logger.info("group %r: OffsetFetch failed (%s)", self.group_id, exc)
                    await trio.sleep(self._backoff.delay(attempt))
                    continue
                top, rows = fetch_result(response)
                codes = {top} | {code for _, code in rows.values()}
                codes.discard(ErrorCode.NONE)
                if not codes:
                    return {tp: rows.get(tp, (None, ErrorCode.NONE))[0] for tp in tps}
                code = min(codes)
                if code in COORDINATOR_GONE or code.retriable:
                    if code in COORDINATOR_GONE:
                        self._coordinator.forget()
                    attempt += 1
                    await trio.sleep(self._backoff.delay(attempt))
                    continue
                raise ConsumerError(f"OffsetFetch for group {self.group_id!r} failed: "
                                    f"{code.name} ({code.description})")
        raise ConsumerError(f"committed offsets not fetched within default_api_timeout={timeout}s")

    # ------------------------------------------------------------ close

    async def close(self) -> None:
        """Stop the member's tasks, hand the partitions back (revoked, committing first
        with auto-commit; lost if the member was reset), leave the group."""
        if self._tasks is not None:
            self._tasks.cancel()
        self._handoff.abandon()
        owned = frozenset(self._assignment.partitions)
        kind: Kind = "revoke" if self.generation >= 0 and not self._lost else "lose"
        try:
            await self._handoff.run_now(kind, owned)
        finally:
            await self._leave("the consumer is closing")
            self.state = "unjoined"
            self.generation = -1
            if self._coordinator is not None:
                await self._coordinator.aclose()

