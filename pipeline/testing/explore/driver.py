"""Applying a schedule's faults to the FakeCluster at their times, and healing it."""

from __future__ import annotations

from collections.abc import Callable

import trio

from pipeline.testing.fake_cluster import FakeCluster, FaultHandle

from .schedule import TOPIC, Event, Schedule

PRODUCE, INIT_PRODUCER_ID = 0, 22


async def drive_faults(fake: FakeCluster, schedule: Schedule) -> None:
    async with trio.open_nursery() as nursery:
        for event in schedule.events:
            if event.at >= schedule.heal_at:
                break
            await trio.sleep_until(event.at)
            handle = _apply(fake, event)
            if handle is not None and event.duration > 0:
                nursery.start_soon(_remove_at, handle, event.at + event.duration)
        await trio.sleep_until(schedule.heal_at)
        heal(fake)
        nursery.cancel_scope.cancel()


async def _remove_at(handle: FaultHandle, at: float) -> None:
    await trio.sleep_until(at)
    handle.remove()


def heal(fake: FakeCluster) -> None:
    """Every fault removed, every broker back (keeping its producer state)."""
    fake.clear_faults()
    for node, broker in fake.state.brokers.items():
        if not broker.alive:
            fake.restart_broker(node)
    alive = [b.node_id for b in fake.state.alive_brokers()]
    for part in fake.state.topics[TOPIC].partitions:
        if part.leader not in alive:  # offline since a stop without election
            fake.move_leader(TOPIC, part.index, to=alive[0])


Apply = Callable[[FakeCluster, Event], "FaultHandle | None"]
# How each `Event.kind` is applied (schedule.py lists what each means). A new
# state machine's faults (a coordinator moving, a group rebalancing) join with
# `fault` (docs/testing.md, "Built to grow"); a handle returned is removed after
# the event's `duration`.
FAULTS: dict[str, Apply] = {}


def fault(kind: str) -> Callable[[Apply], Apply]:
    def register(fn: Apply) -> Apply:
        FAULTS[kind] = fn
        return fn
    return register


def _apply(fake: FakeCluster, event: Event) -> FaultHandle | None:
    brokers = fake.state.brokers
    if event.node >= len(brokers) or event.partition >= len(fake.state.topics[TOPIC].partitions):
        return None  # the shrinker removed that broker or partition
    apply = FAULTS.get(event.kind)
    if apply is None:
        raise ValueError(f"unknown fault kind {event.kind!r}")
    return apply(fake, event)


@fault("move")
def _move(fake: FakeCluster, e: Event) -> None:
    if fake.state.brokers[e.node].alive:
        fake.move_leader(TOPIC, e.partition, to=e.node)


@fault("error")
def _error(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_next(PRODUCE, e.code, count=e.count, topic=TOPIC, partition=e.partition)


@fault("error_after")
def _error_after(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_after_apply(e.code, count=e.count, topic=TOPIC, partition=e.partition)


@fault("incomplete")
def _incomplete(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.omit_after_apply(count=e.count, topic=TOPIC, partition=e.partition)


@fault("lost_ack")
def _lost_ack(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.drop_response_after_apply(PRODUCE, count=e.count, node_id=e.node)


@fault("drop_request")
def _drop_request(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.drop_next_request(PRODUCE, count=e.count, node_id=e.node)


@fault("drop_conns")
def _drop_conns(fake: FakeCluster, e: Event) -> None:
    fake.drop_connections(e.node)


@fault("slow")
def _slow(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.delay_responses(e.seconds, node_id=e.node, before_apply=e.flag)


@fault("stale")
def _stale(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.stale_metadata(e.node)


@fault("stop")
def _stop(fake: FakeCluster, e: Event) -> None:
    fake.stop_broker(e.node, elect=e.flag)


@fault("restart")
def _restart(fake: FakeCluster, e: Event) -> None:
    fake.restart_broker(e.node, lose_producer_state=e.flag)


@fault("pid_error")
def _pid_error(fake: FakeCluster, e: Event) -> FaultHandle:
    return fake.fail_next(INIT_PRODUCER_ID, e.code, count=e.count)
