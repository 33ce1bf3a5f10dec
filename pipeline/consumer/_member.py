"""The classic group protocol's member: join, sync, heartbeat, commit, leave.

The Java ``ConsumerCoordinator`` / ``AbstractCoordinator`` as trio tasks of one member:

* the **membership loop** runs a join round whenever one is requested: prepare
  (eager: revoke everything, committing first with auto-commit; after the member was
  reset: its partitions are *lost*), JoinGroup (MEMBER_ID_REQUIRED answered by
  joining again with the given id, KIP-394), the leader's assignment
  (``_assignors.py``, Kafka's subscription bytes), SyncGroup, then the new assignment
  through the :class:`Handoff` (cooperative: revoke what moves away, rejoin, assign
  what is new, KIP-429);
* the **heartbeat** task and the **poll watchdog** (``_liveness.py``): liveness that
  does not depend on the application's processing time;
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

import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.errors import KafkaError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._assignors import Assignor
from pipeline.consumer._commits import fetch_committed, send_commit
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._coordinator import COORDINATOR_GONE, Coordinator, open_coordinator
from pipeline.consumer._errors import (
    CommitFailedError,
    ConsumerError,
    GroupError,
    MaxPollIntervalExceededError,
    RebalanceInProgressError,
)
from pipeline.consumer._handoff import Handoff, Kind
from pipeline.consumer._leader import leader_assignment, subscription_bytes
from pipeline.consumer._liveness import FATAL, Liveness
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
)
from pipeline.protocol.errors import DecodeError, ErrorCode, error_code
from pipeline.protocol.messages.join_group import (
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
)
from pipeline.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment

__all__ = ["GroupMember"]

logger = logging.getLogger("pipeline.consumer")

R = TypeVar("R", bound=Response)



class _Rejoin(Exception):
    """This join attempt cannot complete; start over (member id kept or reset)."""


class GroupMember(Liveness):
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
        # Commits this member made (statistics): how many, and the last offset of each
        # partition it committed.
        self.commits = 0
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.last_heartbeat: float | None = None  # trio time of the last answered heartbeat
        self._owned_generation = -1  # the generation the owned partitions came from
        self._lost: frozenset[TopicPartition] = frozenset()  # to hand over as lost first
        # As the leader: the subscribed topics' partition counts it assigned from (None:
        # the topic did not exist), and when it last asked metadata about missing ones.
        self._assigned_counts: dict[str, int | None] = {}
        self._missing_checked = -math.inf
        self._rejoin_needed = trio.Event()
        # A JoinGroup / SyncGroup is in flight, or the first join is still to come (run()
        # requests it): a commit waits for it either way, whichever task trio runs first.
        self._joining = True
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
        async with open_coordinator(self._cluster, self._config) as self._coordinator:
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
        # epoch is still the round's own: a reset during the join (a heartbeat or commit
        # sent before it, answered after) made this join's answer stale, as the Java
        # client ignores a join answered after the member was reset; the reset requested
        # the next round, so nothing is handed over from this one.
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
        return subscription_bytes(assignor, self._topics, owned, self._owned_generation,
                                  self._config.client_rack)

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
            try:
                assignments = await self._assign(join)
            except (*CONNECT_ERRORS, KafkaError) as exc:
                if isinstance(exc, ConsumerError):
                    raise
                # No metadata for the subscribed topics: join again (the group waits
                # for the leader up to the rebalance timeout meanwhile).
                logger.warning("group %r: cannot assign (%s); joining again", self.group_id, exc)
                await trio.sleep(self._backoff.delay(1))
                raise _Rejoin from exc

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
            template = FATAL.get(code, "{code}: {description}")
            raise GroupError(f"group {self.group_id!r}: {what} failed: " + template.format(
                strategy=",".join(self._config.partition_assignment_strategy),
                session=self._config.session_timeout, instance=self._config.group_instance_id,
                group=self.group_id, code=code.name, description=code.description,
            ), int(code))
        logger.info("group %r: %s answered %s; retrying", self.group_id, what, code.name)
        await trio.sleep(self._backoff.delay(1))

    async def _assign(self, join: JoinGroupResponse) -> dict[str, bytes]:
        assignor = self._assignors.get(join.protocol_name or "")
        if assignor is None:
            raise GroupError(f"group {self.group_id!r} chose assignor {join.protocol_name!r}, "
                             "which this member did not offer")
        assignments, self._assigned_counts = await leader_assignment(
            self._cluster, self.group_id, assignor, join)
        return assignments

    def _fail(self, error: ConsumerError) -> None:
        self.state = "unjoined"
        self.epoch += 1
        if self._round is not None:
            self._round.cancel()
        self._report(error)

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
        """Commit as this member (module doc), within ``default_api_timeout``."""
        if not offsets:
            await trio.lowlevel.checkpoint()
            return
        timeout = self._config.default_api_timeout
        with trio.move_on_after(timeout):
            await self._commit(offsets)
            self._consumer._on_committed(offsets)
            return
        raise ConsumerError(f"commit did not complete within default_api_timeout={timeout}s")

    async def _commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        assert self._coordinator is not None
        while self._joining:
            await self._settled.wait()
        if self.generation < 0:
            raise CommitFailedError(
                f"cannot commit: this consumer is not a member of group {self.group_id!r} "
                "now (it was removed, or has not joined yet); its partitions may be "
                "processed by another member")
        generation, member_id, epoch = self.generation, self.member_id, self.epoch
        errors = await send_commit(self._coordinator, self._backoff, self.group_id, generation,
                                   member_id, self._config.group_instance_id, offsets)
        if not errors:
            self.commits += 1
            self.committed_offsets.update((tp, o.offset) for tp, o in offsets.items())
            return
        code = next(iter(errors.values()))
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
        with trio.move_on_after(timeout):
            return await fetch_committed(self._coordinator, self._backoff, self.group_id, tps)
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

