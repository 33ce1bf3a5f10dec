"""More KIP-848 member rules, against the scripted coordinator of
``test_member848_rules`` (``Coordinator848``): closing, poll timeouts, request pacing,
and what a member shows before it runs. Everything runs on virtual time.
"""

from __future__ import annotations

import itertools
import logging
import random
import uuid
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.consumer import (
    GroupError,
    MaxPollIntervalExceededError,
    TopicPartition,
    open_consumer,
)
from pipeline.consumer._config import make_config
from pipeline.consumer._handoff import Handoff
from pipeline.consumer._member848 import GroupMember848
from pipeline.consumer._state import Assignment
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import consumer_group_heartbeat as cgh
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake_cluster import FakeCluster

from . import test_member848_rules as rules
from .conftest import produce, until
from .test_member848_rules import ALL4, Coordinator848, Member, options, quiet, running, tps

# the scripted coordinator's fixtures
fake = rules.fake
coord = rules.coord


def leaves(coord: Coordinator848) -> list[int]:
    return [r.member_epoch for r in coord.heartbeats if r.member_epoch < 0]


def open_conns(fake: FakeCluster, node: int) -> int:
    """Connections to broker ``node`` the fake serves now."""
    return sum(c.node_id == node for c in fake._server.conns)


# ------------------------------------------------------------------ before running


def _member(**overrides: Any) -> GroupMember848:
    opts = options(**overrides)
    del opts["topics"]
    config = make_config(None, opts)
    assignment = Assignment(1 << 20)
    handoff = Handoff(assignment, owner=None, on_assigned=None, on_revoked=None, on_lost=None,
                      commit_before_revoke=None)
    return GroupMember848(None, config, ("t",), assignment, handoff,  # type: ignore[arg-type]
                          lambda exc: None, None)


async def test_a_member_that_has_not_started_shows_no_membership_and_closes_quietly() -> None:
    """Before its tasks start (an on_statistics snapshot may come while the consumer is
    still starting) a member is unjoined, with epoch 0, no coordinator, no coordinator
    move and no heartbeat; closing it then does nothing and raises nothing."""
    member = _member()
    assert member.state == "unjoined"
    assert member.statistics() == {
        "member_id": member.member_id, "generation": 0, "rebalances": 0,
        "coordinator": None, "coordinator_moves": 0, "since_last_heartbeat": None}
    await member.close()
    assert member.state == "unjoined" and member.member_epoch == 0


def test_member_ids_are_uuids_with_all_128_bits_random() -> None:
    """The member id the client picks (KIP-1082) is a UUID of 128 random bits: across
    seeds every hex digit of it, the first included, takes all 16 values."""
    ids = [uuid.UUID(_member(rng=random.Random(seed)).member_id).hex for seed in range(200)]
    for position in range(32):
        assert {i[position] for i in ids} == set("0123456789abcdef")


# ------------------------------------------------------------------ close


async def test_aclose_inside_the_block_leaves_once_stops_heartbeating_and_drops_the_connection(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """consumer.aclose() while the ``open_consumer`` block goes on: the coordinator gets
    one leave heartbeat (epoch -1) and then nothing, the group has no member left (never
    a join after the leave), the coordinator's connection is closed at once, the state
    is "closed", and a second aclose() sends nothing."""
    quiet(coord)
    m = Member()
    async with running(fake, m):
        await until(lambda: m.c.state == "stable")
        node = fake.coordinators.node_for(GROUP, "g")
        before = open_conns(fake, node)
        await m.c.aclose()
        await trio.sleep(0.1)
        assert open_conns(fake, node) == before - 1
        assert leaves(coord) == [-1] and coord.heartbeats[-1].member_epoch == -1
        n = len(coord.heartbeats)
        await trio.sleep(30)  # 30 heartbeat intervals
        assert len(coord.heartbeats) == n
        assert coord.members == {}
        assert m.c.state == "closed"
        await m.c.aclose()
        assert len(coord.heartbeats) == n


async def test_a_member_closed_after_a_poll_timeout_loses_its_partitions_and_leaves_once(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """After a poll timeout the member has left (epoch 0 in its group metadata); closed
    before the application iterates again, its partitions are lost (on_lost, no
    on_revoked, nothing committed) and no second leave is sent."""
    m = Member()
    async with running(fake, m, max_poll_interval=10.0, enable_auto_commit=True,
                       auto_commit_interval=1000.0):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: bool(leaves(coord)), 15)
        await trio.sleep(1)
        assert m.c.group_metadata().generation_id == 0
    assert leaves(coord) == [-1]
    assert m.events == [("assigned", ALL4), ("lost", ALL4)]
    assert fake.requests_of(ApiKey.OFFSET_COMMIT) == []


# ------------------------------------------------------------------ losing membership


async def test_a_fenced_member_is_unjoined_until_it_lost_its_partitions_then_waits_for_a_target(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Fenced while the application is busy: the member is "unjoined" until the
    application's iteration runs on_lost; it then joins again and stays "rebalancing"
    while the coordinator's answers bring no target yet (the old target does not count),
    and is stable once the new one arrives."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: len(m.records) == 21)
        coord.errors.append(int(ErrorCode.FENCED_MEMBER_EPOCH))
        coord.members.clear()
        await until(lambda: m.c.group_metadata().generation_id == 0, 5)
        await trio.sleep(3)
        assert m.c.state == "unjoined"
        coord.hold_assignment = 3
        n = len(coord.heartbeats)
        m.iterating = True
        await until(lambda: len(coord.heartbeats) >= n + 2, 5)
        assert coord.heartbeats[n].member_epoch == 0
        assert m.c.group_metadata().generation_id > 0
        assert m.c.state == "rebalancing"
        await until(lambda: m.c.state == "stable", 10)
        assert m.events == [("assigned", ALL4), ("lost", ALL4), ("assigned", ALL4)]


async def test_a_revocation_pending_at_a_poll_timeout_is_dropped_for_on_lost(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A revocation still waiting for the application when the poll timeout makes the
    member leave is not run: the partitions are lost (on_lost only: the member can no
    longer commit for them). Joining again, the member is "rebalancing" until its new
    target arrives."""
    m = Member()
    async with running(fake, m, max_poll_interval=10.0):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: len(m.records) == 21)
        coord.set_target(m.member_id, tps(0, 1))
        await until(lambda: bool(leaves(coord)), 15)
        coord.hold_assignment = 3
        n = len(coord.heartbeats)
        m.iterating = True
        await until(lambda: len(coord.heartbeats) >= n + 2, 5)
        assert coord.heartbeats[n].member_epoch == 0
        assert m.c.state == "rebalancing"
        await until(lambda: m.c.state == "stable", 10)
        assert [type(e) for e in m.errors] == [MaxPollIntervalExceededError]
        assert m.events[:2] == [("assigned", ALL4), ("lost", ALL4)]
        assert ("revoked", tps(2, 3)) not in m.events


# ------------------------------------------------------------------ heartbeats


async def test_a_stable_member_stays_stable_while_a_heartbeat_is_unanswered(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A slow heartbeat answer does not make a stable member look rebalancing: only a
    join (epoch 0) does."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        coord.answer_delay = 3.0
        n = len(coord.heartbeats)
        await until(lambda: len(coord.heartbeats) > n, 5)
        for _ in range(5):
            await trio.sleep(0.5)
            assert m.c.state == "stable"


async def test_a_first_join_that_fails_is_retried_after_retry_backoff_then_doubling(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Joins whose connection drops are sent again retry_backoff after the first
    failure, doubling per consecutive failure."""
    coord.drops = 3
    m = Member()
    async with running(fake, m, retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable", 5)
        times = coord.times
        assert [r.member_epoch for r in coord.heartbeats[:4]] == [0, 0, 0, 0]
        gaps = [times[i + 1] - times[i] for i in range(3)]
        assert gaps == pytest.approx([0.1, 0.2, 0.4], abs=0.01)


async def test_a_refused_coordinator_lookup_fails_the_consumer_without_retrying(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """FindCoordinator refused for good (GROUP_AUTHORIZATION_FAILED): the next iteration
    raises a GroupError naming it, and the lookup is not asked again."""
    fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    m = Member()
    async with running(fake, m):
        await until(lambda: bool(m.errors), 10)
        assert isinstance(m.errors[0], GroupError)
        assert "GROUP_AUTHORIZATION_FAILED" in str(m.errors[0])
        assert m.c.state == "failed"
        await trio.sleep(30)
        assert len(fake.requests_of(ApiKey.FIND_COORDINATOR)) == 1
        assert coord.heartbeats == []


async def test_heartbeats_follow_the_interval_the_coordinator_gives_exactly(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Accepted heartbeats are heartbeat_interval_ms apart to the millisecond, whatever
    the interval: 20 s, and 1 ms (any interval above 0 is the coordinator's)."""
    quiet(coord)
    coord.interval_ms = 20_000
    m = Member()
    async with running(fake, m):
        await until(lambda: m.c.state == "stable")
        n = len(coord.times)
        await until(lambda: len(coord.times) >= n + 3, 70)
        gaps = [b - a for a, b in itertools.pairwise(coord.times[n:])]
        assert gaps == pytest.approx([20.0, 20.0], abs=0.001)
        coord.interval_ms = 1
        await until(lambda: len(coord.times) >= n + 5, 25)
        await trio.sleep(0.1)
        k = len(coord.times)
        await trio.sleep(0.1)
        assert len(coord.times) - k == pytest.approx(100, abs=2)


@pytest.mark.parametrize("message", ["group g is not for you", None])
async def test_a_refused_heartbeat_gives_the_coordinators_message_or_the_codes_meaning(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any, message: str | None,
) -> None:
    """The GroupError of a refused heartbeat carries the coordinator's error message, or,
    without one, what the error code means."""
    m = Member()
    async with running(fake, m):
        await until(lambda: len(m.records) == 20)
        coord.error_message = message
        coord.errors.append(int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
        await until(lambda: bool(m.errors), 10)
        text = str(m.errors[0])
        expected = message or ErrorCode.GROUP_AUTHORIZATION_FAILED.description
        assert f"GROUP_AUTHORIZATION_FAILED ({expected})" in text


# ------------------------------------------------------------------ reconciling


async def test_a_target_topic_the_metadata_lags_on_is_retried_paced_by_retry_backoff(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A target naming a topic id the brokers' metadata does not have yet (the topic
    was deleted and created again; the metadata still has the old id): the member keeps
    what it owns, refreshes metadata once per retry_backoff (not slower), never assigns
    by the old name-to-id mapping, and assigns the new partitions in the very round of
    metadata that knows the id."""
    quiet(coord)  # owns nothing: no fetch holds up a metadata request
    fake.create_topic("u", 2)
    m = Member()
    async with running(fake, m, topics=["t", "u"], retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable")
        lagging = fake.stale_metadata()
        fake.delete_topic("u")
        fake.create_topic("u", 2)
        target = frozenset({TopicPartition("u", 0), TopicPartition("u", 1)})
        coord.set_target("quiet", target)
        n = len(coord.heartbeats)
        await until(lambda: len(coord.heartbeats) > n, 5)
        await trio.sleep(0.05)
        n_meta = len(fake.requests_of(ApiKey.METADATA))
        await trio.sleep(2)
        rounds = [r.time for r in fake.requests_of(ApiKey.METADATA)[n_meta:]]
        assert len(rounds) == pytest.approx(20, abs=1)
        assert all(b - a >= 0.1 - 1e-6 for a, b in itertools.pairwise(rounds))
        assert m.c.assignment() == frozenset()
        lagging.remove()
        n_meta = len(fake.requests_of(ApiKey.METADATA))
        with trio.fail_after(5):
            while m.c.assignment() != target:  # noqa: ASYNC110 - the application's iteration assigns
                await trio.sleep(0.001)
        fresh = fake.requests_of(ApiKey.METADATA)[n_meta].time
        assert trio.current_time() - fresh <= 0.01


# ------------------------------------------------------------------ max_poll_interval


async def test_a_consumer_never_iterated_leaves_after_max_poll_interval(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """The poll deadline runs from the start: a consumer the application never
    iterates joins, then leaves (epoch -1) once max_poll_interval has passed."""
    async with open_consumer(fake.bootstrap, connector=fake.connector,
                             **options(max_poll_interval=10.0)) as consumer:
        t0 = trio.current_time()
        await until(lambda: bool(leaves(coord)), 20)
        assert 10 < trio.current_time() - t0 <= 12
        assert consumer.state == "unjoined"


async def test_a_member_still_joining_does_not_leave_on_a_poll_timeout(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A member without an epoch yet (its joins refused as COORDINATOR_LOAD_IN_PROGRESS)
    has nothing to leave: past max_poll_interval it sends no leave heartbeat, and once
    joined its first iteration raises no MaxPollIntervalExceededError."""
    coord.errors.extend([int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)] * 100)
    async with open_consumer(fake.bootstrap, connector=fake.connector,
                             **options(max_poll_interval=5.0)) as consumer:
        await trio.sleep(8)
        assert coord.errors and leaves(coord) == []
        coord.errors.clear()
        await until(lambda: consumer.state == "stable", 5)
        assert leaves(coord) == []
        with trio.fail_after(5):
            record = await consumer.__anext__()
        assert record.topic == "t"


# ------------------------------------------------------------------ commits


async def test_an_empty_commit_is_a_checkpoint_and_a_commit_reaches_the_interceptors(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """commit() with nothing to commit sends nothing but is still a trio checkpoint (a
    cancelled caller is cancelled there); a commit Kafka accepted is passed to the
    interceptors' on_commit, with its offsets."""
    seen: list[dict[TopicPartition, Any]] = []

    class Interceptor:
        def on_commit(self, offsets: dict[TopicPartition, Any]) -> None:
            seen.append(offsets)

    m = Member()
    async with running(fake, m, interceptors=[Interceptor()]):
        await until(lambda: len(m.records) == 20)
        with trio.testing.assert_checkpoints():
            await m.c.commit({})
        assert seen == [] and fake.requests_of(ApiKey.OFFSET_COMMIT) == []
        await m.c.commit({("t", 0): 3})
        assert [{tp: o.offset for tp, o in s.items()} for s in seen] == [
            {TopicPartition("t", 0): 3}]


async def test_the_poll_deadline_is_checked_every_eighth_of_a_short_max_poll_interval(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Under 8 s, max_poll_interval is checked every max_poll_interval/8 from the start:
    the member leaves at the first check more than max_poll_interval after the last
    check that saw the application iterating (with max_poll_interval=4 and the last
    record handed out between the checks at 10 s and 10.5 s: at 14.5 s), never sooner
    than max_poll_interval after that record."""
    quiet(coord)
    coord.targets["quiet"] = ALL4
    m = Member()
    async with running(fake, m, max_poll_interval=4.0):
        t_start = trio.current_time()
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await trio.sleep_until(t_start + 10.25)
        await produce(fake, "t", [b"x"], partition=0)
        last = trio.current_time()
        await until(lambda: len(m.records) == 21, 1)
        with trio.fail_after(10):
            while not leaves(coord):  # noqa: ASYNC110 - the watchdog leaves
                await trio.sleep(0.001)
        left = next(t for t, r in zip(coord.times, coord.heartbeats, strict=True)
                    if r.member_epoch < 0)
        assert 10 < last - t_start < 10.5
        assert left - t_start == pytest.approx(14.5, abs=0.002)
        assert left - last > 4


async def test_heartbeats_go_on_naming_what_is_owned_after_an_owned_topic_is_deleted(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """An owned topic deleted (gone from the metadata) is left out of the partitions
    the heartbeats report; the member goes on heartbeating with the rest."""
    fake.create_topic("u", 2)
    m = Member()
    async with running(fake, m, topics=["t", "u"]):
        await until(lambda: len(m.c.assignment()) == 6)
        fake.delete_topic("u")
        await until(lambda: "u" not in m.c._cluster.metadata.topics, 30)
        n = len(coord.heartbeats)
        await until(lambda: len(coord.heartbeats) >= n + 3, 10)
        topic_id = fake.state.topics["t"].topic_id
        assert coord.heartbeats[-1].topic_partitions == (
            cgh.TopicPartitions(topic_id=topic_id, partitions=(0, 1, 2, 3)),)


async def test_a_fenced_member_does_not_try_to_auto_commit_until_it_is_stable_again(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While a fenced member waits for the application to take its lost partitions, it
    is no member: auto-commit does not try (no failed auto-commit is logged)."""
    m = Member()
    async with running(fake, m, enable_auto_commit=True, auto_commit_interval=1.0):
        await until(lambda: len(m.records) == 20)
        m.iterating = False
        await produce(fake, "t", [b"x"], partition=0)
        await until(lambda: len(m.records) == 21)
        coord.errors.append(int(ErrorCode.FENCED_MEMBER_EPOCH))
        coord.members.clear()  # a commit before the fence fails: retried at each interval
        await until(lambda: m.c.group_metadata().generation_id == 0, 5)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pipeline.consumer"):
            await trio.sleep(5)
        assert [r.message for r in caplog.records if "auto-commit" in r.message] == []
        m.iterating = True
        await until(lambda: m.c.state == "stable", 10)


async def test_a_member_fenced_while_its_target_waits_for_metadata_joins_again(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Fenced while its target waits for the metadata to know a topic id: the member
    drops that target, joins again (rebalancing, owning nothing, until a target comes),
    and assigns the target it gets then once the metadata knows the id."""
    quiet(coord)
    fake.create_topic("u", 2)
    m = Member()
    async with running(fake, m, topics=["t", "u"], retry_backoff=0.1, retry_backoff_max=5.0):
        await until(lambda: m.c.state == "stable")
        lagging = fake.stale_metadata()
        fake.delete_topic("u")
        fake.create_topic("u", 2)
        target = frozenset({TopicPartition("u", 0), TopicPartition("u", 1)})
        coord.set_target("quiet", target)
        n = len(coord.heartbeats)
        await until(lambda: len(coord.heartbeats) > n, 5)
        await trio.sleep(0.55)
        coord.errors.append(int(ErrorCode.FENCED_MEMBER_EPOCH))
        coord.members.clear()
        coord.hold_assignment = 3  # the answers to the new join bring no target yet
        await until(lambda: sum(r.member_epoch == 0 for r in coord.heartbeats) == 2, 5)
        await trio.sleep(1)
        assert m.c.assignment() == frozenset() and m.errors == []
        assert m.c.state == "rebalancing"
        lagging.remove()
        await until(lambda: m.c.assignment() == target, 5)


class SlowRevoke(Member):
    """A member whose on_revoked takes 20 s (virtual)."""

    def callbacks(self) -> dict[str, Any]:
        out = super().callbacks()
        log = out["on_revoked"]

        async def on_revoked(consumer: Any, parts: frozenset[TopicPartition]) -> None:
            log(consumer, parts)
            await trio.sleep(20)

        out["on_revoked"] = on_revoked
        return out


async def test_closing_while_the_application_runs_a_slow_revocation_loses_partitions_once(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """The application is inside a slow on_revoked when the poll timeout makes the
    member leave (its partitions queued as lost), and another task closes the consumer:
    close hands them over as lost, and the application's iteration, finishing its
    callback, does not run on_lost for them again."""
    m = SlowRevoke()
    async with running(fake, m, max_poll_interval=10.0):
        await until(lambda: len(m.records) == 20)
        coord.set_target(m.member_id, tps(0, 1))
        await until(lambda: ("revoked", tps(2, 3)) in m.events, 5)
        await until(lambda: bool(leaves(coord)), 15)
        await m.c.aclose()
        await trio.sleep(20)
    assert [e for e in m.events if e[0] == "lost"] == [("lost", ALL4)]
    assert leaves(coord) == [-1]


async def test_a_target_that_only_adds_partitions_is_reported_by_one_heartbeat(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """A new target that only adds partitions revokes nothing: on_assigned with the new
    ones, and one heartbeat at once reporting them all (no heartbeat for an empty
    revocation before it)."""
    coord.interval_ms = 20_000
    coord.server_member_id = "grow"
    coord.targets["grow"] = tps(0, 1)
    m = Member()
    async with running(fake, m):
        await until(lambda: m.c.assignment() == tps(0, 1))
        coord.set_target("grow", ALL4)
        n = len(coord.heartbeats)
        await until(lambda: len(coord.heartbeats) > n, 25)
        await trio.sleep(2)
        assert m.events == [("assigned", tps(0, 1)), ("assigned", tps(2, 3))]
        after = coord.heartbeats[n + 1:]
        assert len(after) == 1
        assert sum(len(t.partitions) for t in after[0].topic_partitions) == 4


async def test_a_fenced_member_owning_nothing_rejoins_without_waiting_for_the_application(
    fake: FakeCluster, coord: Coordinator848, autojump_clock: Any,
) -> None:
    """Fenced while owning nothing, the member has nothing for the application to hand
    over: it joins again at once even though the application is not iterating."""
    quiet(coord)
    async with open_consumer(fake.bootstrap, connector=fake.connector, **options()):
        await until(lambda: len(coord.heartbeats) >= 2, 5)
        coord.errors.append(int(ErrorCode.FENCED_MEMBER_EPOCH))
        coord.members.clear()
        await until(lambda: sum(r.member_epoch == 0 for r in coord.heartbeats) == 2, 5)
