"""Liveness that does not depend on processing time: heartbeats and the poll watchdog.

Mixed into :class:`~pipeline.consumer._member.GroupMember` (it holds the state these
read and change; ``_member.py`` explains the membership they keep alive):

* **heartbeats** run in their own task while the member is stable, every
  ``heartbeat_interval``, whatever the application is doing: a slow handler does not
  drop the member. The answers drive the membership: REBALANCE_IN_PROGRESS requests a
  rejoin; UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION reset the member (its partitions are
  lost) and rejoin; NOT_COORDINATOR forgets the coordinator; FENCED_INSTANCE_ID and
  GROUP_AUTHORIZATION_FAILED fail the consumer. As the leader, a change in a subscribed
  topic's partition count (seen in metadata) requests a rejoin.
* the **poll watchdog**: past ``max_poll_interval`` without the application taking
  anything (and not waiting inside an iteration), the member leaves the group (a
  static member just stops: its partitions wait for it until the session timeout),
  its partitions are handed over as lost, and the next iteration raises
  :class:`MaxPollIntervalExceededError` before rejoining.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS
from pipeline.cluster.errors import KafkaError
from pipeline.consumer._coordinator import COORDINATOR_GONE
from pipeline.consumer._errors import GroupError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.heartbeat import HeartbeatRequest
from pipeline.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster
    from pipeline.consumer._config import ConsumerConfig
    from pipeline.consumer._coordinator import Coordinator
    from pipeline.consumer._errors import ConsumerError
    from pipeline.consumer._handoff import Handoff
    from pipeline.consumer._state import Assignment
    from pipeline.consumer._types import ConsumerState, TopicPartition
    from pipeline.util.backoff import Backoff

__all__ = ["FATAL", "Liveness"]

logger = logging.getLogger("pipeline.consumer")

#: What the coordinator's refusals mean, for the error the application gets.
FATAL = {
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


class Liveness:
    """Heartbeat and watchdog tasks of a group member (module doc)."""

    if TYPE_CHECKING:
        _cluster: Cluster
        _config: ConsumerConfig
        _coordinator: Coordinator | None
        _assignment: Assignment
        _handoff: Handoff
        _backoff: Backoff
        _consumer: Any
        _round: trio.CancelScope | None
        _poll_timeout: bool
        _joining: bool
        _lost: frozenset[TopicPartition]
        _assigned_counts: dict[str, int | None]
        _missing_checked: float
        group_id: str
        member_id: str
        leader_id: str
        generation: int
        epoch: int
        state: ConsumerState
        last_heartbeat: float | None

        def request_rejoin(self, reason: str) -> None: ...
        def _reset(self, reason: str, *, keep_member_id: bool = False,
                   rejoin: bool = True) -> None: ...
        def _fail(self, error: ConsumerError) -> None: ...

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
        elif code in COORDINATOR_GONE:
            self._coordinator.forget()
        elif code in (ErrorCode.FENCED_INSTANCE_ID, ErrorCode.GROUP_AUTHORIZATION_FAILED):
            template = FATAL[code]
            self._fail(GroupError(f"group {self.group_id!r}: heartbeat refused: " + template.format(
                instance=self._config.group_instance_id, group=self.group_id), int(code)))
        else:
            logger.warning("group %r: heartbeat answered %s", self.group_id, code.name)

    def _check_metadata(self) -> None:
        """As the leader, rebalance when a subscribed topic's partition count changed, or
        a subscribed topic that did not exist now does (metadata for those is asked at
        most every ``metadata_max_age``, the Java client's pace)."""
        if self.leader_id != self.member_id or not self._assigned_counts:
            return
        missing = [t for t, n in self._assigned_counts.items() if n is None]
        now = trio.current_time()
        if missing and now - self._missing_checked >= self._config.cluster.metadata_max_age:
            self._missing_checked = now
            self._cluster.request_refresh(missing)
        for topic, count in self._assigned_counts.items():
            seen = self._cluster.partition_count_nowait(topic)
            if seen is not None and seen != count:
                self.request_rejoin(f"topic {topic!r} has {seen} partitions, not {count}")
                return

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
