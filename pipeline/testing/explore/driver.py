"""Applying a schedule's faults to the FakeCluster at their times, and healing it."""

from __future__ import annotations

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


def _apply(fake: FakeCluster, event: Event) -> FaultHandle | None:
    kind, node = event.kind, event.node
    brokers = fake.state.brokers
    if node >= len(brokers) or event.partition >= len(fake.state.topics[TOPIC].partitions):
        return None  # the shrinker removed that broker or partition
    if kind == "move":
        if brokers[node].alive:
            fake.move_leader(TOPIC, event.partition, to=node)
    elif kind == "error":
        return fake.fail_next(PRODUCE, event.code, count=event.count, topic=TOPIC,
                              partition=event.partition)
    elif kind == "error_after":
        return fake.fail_after_apply(event.code, count=event.count, topic=TOPIC,
                                     partition=event.partition)
    elif kind == "lost_ack":
        return fake.drop_response_after_apply(PRODUCE, count=event.count, node_id=node)
    elif kind == "drop_request":
        return fake.drop_next_request(PRODUCE, count=event.count, node_id=node)
    elif kind == "drop_conns":
        fake.drop_connections(node)
    elif kind == "slow":
        return fake.delay_responses(event.seconds, node_id=node, before_apply=event.flag)
    elif kind == "stale":
        return fake.stale_metadata(node)
    elif kind == "stop":
        fake.stop_broker(node, elect=event.flag)
    elif kind == "restart":
        fake.restart_broker(node, lose_producer_state=event.flag)
    elif kind == "pid_error":
        return fake.fail_next(INIT_PRODUCER_ID, event.code, count=event.count)
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
    return None

