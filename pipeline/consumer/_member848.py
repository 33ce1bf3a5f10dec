"""The KIP-848 group member (``group_protocol="consumer"``): the broker assigns.

No JoinGroup, SyncGroup or client-side assignor: the member sends ConsumerGroupHeartbeat
every ``heartbeat_interval`` the coordinator gives, with its subscription and the
partitions it owns, and gets back its member epoch and, when it changed, its *target*
assignment (topic ids). Three tasks:

* **heartbeats** join (epoch 0, a member id of our own, KIP-1082), keep the member alive
  and carry what it owns; FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID mean the coordinator
  dropped it: its partitions are lost and it joins again with epoch 0;
* the **reconciler** moves from what is owned to the target: revoke what is no longer
  in it (through the :class:`Handoff`: the application's iteration runs the commit and
  ``on_revoked``), then assign what is new; after each step a heartbeat reports it at
  once, so the coordinator hands revoked partitions to their next owner (the broker
  only includes a partition in a target once its previous owner released it);
* the **poll watchdog**: past ``max_poll_interval`` without an iteration the member
  leaves (member epoch -1; a static member -2, keeping its place until the session
  times out), its partitions are lost, and the next iteration raises
  :class:`MaxPollIntervalExceededError` before joining again.

Commits carry the member epoch (OffsetCommit v9: ``generation_id_or_member_epoch``); a
STALE_MEMBER_EPOCH answer is retried after the next heartbeat.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping
from typing import Any

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.errors import KafkaError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._commits import fetch_committed, send_commit
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._coordinator import COORDINATOR_GONE, Coordinator, open_coordinator
from pipeline.consumer._errors import (
    CommitFailedError,
    ConsumerError,
    GroupError,
    MaxPollIntervalExceededError,
)
from pipeline.consumer._handoff import Handoff
from pipeline.consumer._state import Assignment
from pipeline.consumer._types import (
    ConsumerGroupMetadata,
    ConsumerState,
    OffsetAndMetadata,
    TopicPartition,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages import consumer_group_heartbeat as cgh

__all__ = ["GroupMember848"]

logger = logging.getLogger("pipeline.consumer")

LEAVE, STATIC_LEAVE = -1, -2  # member epochs that leave the group
_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.REQUEST_TIMED_OUT})
_LOST = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})


class GroupMember848:
    """One consumer's membership of a KIP-848 group (module doc); the same face to the
    :class:`~pipeline.consumer._api.Consumer` as the classic ``GroupMember``."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, topics: tuple[str, ...],
                 assignment: Assignment, handoff: Handoff, report: Any, consumer: Any) -> None:
        assert config.group_id is not None
        self._cluster = cluster
        self._config = config
        self.group_id: str = config.group_id
        self._topics = topics
        self._assignment = assignment
        self._handoff = handoff
        self._report = report
        self._consumer = consumer
        self._backoff = cluster_backoff(config.cluster, config.cluster.rng or random.Random())
        self.member_id = str(uuid.UUID(int=(config.cluster.rng or random.Random()).getrandbits(128)))
        self.member_epoch = 0
        self.state: ConsumerState = "unjoined"
        self.rebalances = 0
        # Commits this member made (statistics): how many, and the last offset of each
        # partition it committed.
        self.commits = 0
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.last_heartbeat: float | None = None
        self._interval = config.heartbeat_interval  # until the coordinator says
        self._target: frozenset[TopicPartition] | None = None  # the latest target, by name
        self._target_ids: tuple[cgh.ResponseTopicPartitions, ...] | None = None
        self._target_changed = trio.Event()
        self._beat_now = trio.Event()
        self._beaten = trio.Event()  # set after each answered heartbeat
        # Joins (epoch 0) refused in a row: each waits retry_backoff, doubling. Kafka 4.1
        # refuses the rejoin of a fenced member it still holds at a later epoch until
        # its session times out (KAFKA-19233); unpaced, that is a heartbeat storm.
        self._refused_joins = 0
        self._left = False  # left after a poll timeout: no heartbeats until check_poll
        self._back = trio.Event()
        self._poll_timeout = False
        self._coordinator: Coordinator | None = None
        self._tasks: trio.CancelScope | None = None

    # ------------------------------------------------------------ public face

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(self.group_id, self.member_epoch, self.member_id,
                                     self._config.group_instance_id)

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time()
        return {
            "member_id": self.member_id,
            "generation": self.member_epoch,
            "rebalances": self.rebalances,
            "coordinator": self._coordinator.node_id if self._coordinator else None,
            "coordinator_moves": self._coordinator.moves if self._coordinator else 0,
            "since_last_heartbeat":
                None if self.last_heartbeat is None else now - self.last_heartbeat,
        }

    def check_poll(self) -> None:
        if self._poll_timeout:
            self._poll_timeout = False
            self._left = False
            self.member_epoch = 0
            self._back.set()
            raise MaxPollIntervalExceededError(
                f"more than max_poll_interval={self._config.max_poll_interval}s passed "
                f"between two iterations, so this member left group {self.group_id!r} and its "
                "partitions went to other members; raise max_poll_interval, or process less "
                "per iteration (batches(max_records=...)). Iterating again rejoins the group.")

    # ------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_coordinator(self._cluster, self._config) as self._coordinator:
            with trio.CancelScope() as self._tasks:
                async with trio.open_nursery() as tasks:
                    tasks.start_soon(self._reconciler)
                    tasks.start_soon(self._watchdog)
                    if self._config.enable_auto_commit:
                        tasks.start_soon(self._auto_commits)
                    task_status.started()
                    try:
                        await self._heartbeats()
                    except ConsumerError as exc:
                        self.state = "unjoined"
                        self._report(exc)
                        tasks.cancel_scope.cancel()
            await trio.sleep_forever()  # the connections serve close() until cancelled

    def _request(self, epoch: int) -> cgh.ConsumerGroupHeartbeatRequest:
        owned: dict[str, list[int]] = {}
        for tp in self._assignment.partitions:
            owned.setdefault(tp.topic, []).append(tp.partition)
        topics = self._cluster.metadata.topics
        joining = epoch == 0
        return cgh.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
            instance_id=self._config.group_instance_id, rack_id=self._config.client_rack,
            rebalance_timeout_ms=int(self._config.max_poll_interval * 1000),
            subscribed_topic_names=tuple(sorted(self._topics)),
            topic_partitions=() if joining else tuple(
                cgh.TopicPartitions(topic_id=topics[t].topic_id, partitions=tuple(sorted(ps)))
                for t, ps in sorted(owned.items()) if t in topics and topics[t].topic_id),
        )

    async def _heartbeat(self, epoch: int) -> cgh.ConsumerGroupHeartbeatResponse:
        assert self._coordinator is not None
        request = self._request(epoch)
        return await self._coordinator.request(ApiKey.CONSUMER_GROUP_HEARTBEAT,
                                               lambda version: request)

    async def _heartbeats(self) -> None:
        attempt = 0
        while True:
            if self._left:
                await self._back.wait()
                self._back = trio.Event()
                continue
            if self.member_epoch == 0:
                self.state = "rebalancing"
            try:
                response = await self._heartbeat(self.member_epoch)
            except (*CONNECT_ERRORS, KafkaError) as exc:
                if isinstance(exc, ConsumerError):
                    raise
                attempt += 1
                logger.info("group %r: heartbeat failed: %s", self.group_id, exc)
                await trio.sleep(self._backoff.delay(attempt))
                continue
            attempt = 0
            accepted = await self._on_answer(response)
            self._beaten.set()
            self._beaten = trio.Event()
            if accepted:
                # As the Java client: the interval only follows an accepted heartbeat; a
                # refused one is sent again (rejoining, or to the coordinator found again)
                # after its backoff, not one interval later.
                with trio.move_on_after(self._interval):
                    await self._beat_now.wait()
            self._beat_now = trio.Event()

    async def _on_answer(self, response: cgh.ConsumerGroupHeartbeatResponse) -> bool:
        """Act on a heartbeat's answer; whether the coordinator accepted it."""
        assert self._coordinator is not None
        code = error_code(response.error_code)
        if code == ErrorCode.NONE:
            self._refused_joins = 0
            self.last_heartbeat = trio.current_time()
            if response.member_id:
                self.member_id = response.member_id
            if response.member_epoch != self.member_epoch:
                self.rebalances += 1
            self.member_epoch = response.member_epoch
            if response.heartbeat_interval_ms > 0:
                self._interval = response.heartbeat_interval_ms / 1000
            if response.assignment is not None:
                self._target_ids = response.assignment.topic_partitions
                self._target_changed.set()
            if self.state != "stable" and self._target_ids is not None:
                self.state = "stable"
                self._assignment.changed()
            return True
        if code in _LOST:
            logger.info("group %r: heartbeat answered %s; joining again", self.group_id, code.name)
            was_join = self.member_epoch == 0
            self.member_epoch = 0
            self.state = "unjoined"
            self._target_ids = None
            owned = frozenset(self._assignment.partitions)
            if owned:
                await self._handoff.post("lose", owned)
            if was_join:  # (a first fence rejoins at once, as the Java client does)
                self._refused_joins += 1
                await trio.sleep(self._backoff.delay(self._refused_joins))
            return False
        if code in COORDINATOR_GONE or code in _RETRY:
            if code in COORDINATOR_GONE:
                self._coordinator.forget()
            await trio.sleep(self._backoff.delay(1))
            return False
        raise GroupError(f"group {self.group_id!r}: ConsumerGroupHeartbeat refused: "
                         f"{code.name} ({response.error_message or code.description})",
                         int(code))

    async def _reconciler(self) -> None:
        while True:
            await self._target_changed.wait()
            self._target_changed = trio.Event()
            target_ids = self._target_ids
            if target_ids is None:
                continue
            target = await self._names(target_ids)
            if target is None:
                self._target_changed.set()  # metadata did not know a topic id yet
                await trio.sleep(self._backoff.delay(1))
                continue
            owned = frozenset(self._assignment.partitions)
            revoked, added = owned - target, target - owned
            if revoked:
                await self._handoff.post("revoke", revoked)
                self._beat_now.set()  # tell the coordinator at once: others wait for them
            if added or self._target is None:
                await self._handoff.post("assign", added)
                self._beat_now.set()
            self._target = target

    async def _names(self, ids: tuple[cgh.ResponseTopicPartitions, ...]
                     ) -> frozenset[TopicPartition] | None:
        """The target by topic name (metadata refreshed once for an unknown topic id)."""
        for attempt in range(2):
            by_id = {t.topic_id: name for name, t in self._cluster.metadata.topics.items()
                     if t.topic_id is not None}
            if all(t.topic_id in by_id for t in ids):
                return frozenset(TopicPartition(by_id[t.topic_id], p)
                                 for t in ids for p in t.partitions)
            if attempt == 0:
                try:
                    await self._cluster.refresh(self._topics, force=True)
                except KafkaError as exc:
                    logger.info("group %r: metadata refresh failed: %s", self.group_id, exc)
        return None

    async def _watchdog(self) -> None:
        limit = self._config.max_poll_interval
        polls = self._consumer.polls
        active_at = trio.current_time()
        while True:
            await trio.sleep(min(1.0, limit / 8))
            now = trio.current_time()
            if self._consumer.waiting or self._consumer.polls != polls:
                polls, active_at = self._consumer.polls, now
                continue
            if now - active_at <= limit or self._left or self.member_epoch <= 0:
                continue
            logger.warning("group %r: nothing taken from the consumer for %.1fs "
                           "(max_poll_interval=%s); leaving the group", self.group_id,
                           now - active_at, limit)
            self._left = self._poll_timeout = True
            self._handoff.abandon()
            await self._leave()
            self.state = "unjoined"
            self._target_ids = None
            self._handoff.post_nowait("lose", frozenset(self._assignment.partitions))

    async def _leave(self) -> None:
        epoch = STATIC_LEAVE if self._config.group_instance_id is not None else LEAVE
        try:
            await self._heartbeat(epoch)
        except (*CONNECT_ERRORS, KafkaError) as exc:
            logger.info("group %r: leaving failed: %s", self.group_id, exc)
        self.member_epoch = 0

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
            await self._commit(offsets)
            self._consumer._on_committed(offsets)
            return
        raise ConsumerError(f"commit did not complete within default_api_timeout={timeout}s")

    async def _commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        assert self._coordinator is not None
        while True:
            if self.member_epoch <= 0:
                raise CommitFailedError(
                    f"cannot commit: this consumer is not a member of group {self.group_id!r} "
                    "now (it was removed, or has not joined yet); its partitions may be "
                    "processed by another member")
            errors = await send_commit(self._coordinator, self._backoff, self.group_id,
                                       self.member_epoch, self.member_id,
                                       self._config.group_instance_id, offsets)
            if not errors:
                self.commits += 1
                self.committed_offsets.update((tp, o.offset) for tp, o in offsets.items())
                return
            code = next(iter(errors.values()))
            if code == ErrorCode.STALE_MEMBER_EPOCH:
                self._beat_now.set()  # the next heartbeat brings the current epoch
                await self._beaten.wait()
                continue
            if code in _LOST:
                raise CommitFailedError(
                    f"commit refused ({code.name}): this member's epoch in group "
                    f"{self.group_id!r} is over; its partitions may be processed by another "
                    "member now")
            raise ConsumerError(f"commit to group {self.group_id!r} failed: {code.name} "
                                f"({code.description})")

    async def committed(
        self, tps: frozenset[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        assert self._coordinator is not None
        timeout = self._config.default_api_timeout
        with trio.move_on_after(timeout):
            return await fetch_committed(self._coordinator, self._backoff, self.group_id, tps)
        raise ConsumerError(f"committed offsets not fetched within default_api_timeout={timeout}s")

    # ------------------------------------------------------------ close

    async def close(self) -> None:
        """Hand the partitions back (revoked, committing first with auto-commit), leave."""
        if self._tasks is not None:
            self._tasks.cancel()
        self._handoff.abandon()
        owned = frozenset(self._assignment.partitions)
        try:
            await self._handoff.run_now("revoke" if self.member_epoch > 0 else "lose", owned)
        finally:
            if self.member_epoch > 0:
                await self._leave()
            self.state = "unjoined"
            if self._coordinator is not None:
                await self._coordinator.aclose()
