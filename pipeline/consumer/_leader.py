"""The group leader's part of a join: every member's subscription in, assignments out.

The bytes are Kafka's (``ConsumerProtocolSubscription`` / ``ConsumerProtocolAssignment``,
written at version 3 as the Java client writes them), so Java and librdkafka members
read what we assign and we read what they subscribe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pipeline.cluster.errors import UnknownTopicError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._assignors import Assignor, Member, member_from_subscription
from pipeline.protocol.consumer_protocol import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    group_partitions,
)
from pipeline.protocol.errors import DecodeError
from pipeline.protocol.messages.join_group import JoinGroupResponse

__all__ = ["leader_assignment", "subscription_bytes"]

logger = logging.getLogger("pipeline.consumer")


def subscription_bytes(assignor: Assignor, topics: Iterable[str],
                       owned: Iterable[tuple[str, int]], generation: int,
                       rack: str | None) -> bytes:
    """This member's JoinGroup metadata for ``assignor``: its topics, what it owns and
    from which generation (cooperative; eager members own nothing when they join)."""
    return ConsumerProtocolSubscription(
        topics=tuple(sorted(topics)),
        user_data=assignor.user_data(generation),
        owned_partitions=group_partitions(owned),
        generation_id=generation,
        rack_id=rack,
    ).encode()


async def leader_assignment(
    cluster: Cluster, group_id: str, assignor: Assignor, join: JoinGroupResponse
) -> tuple[dict[str, bytes], dict[str, int | None]]:
    """``({member_id: assignment bytes}, {topic: partition count assigned from})``, the
    count None for a subscribed topic that does not exist (left out of the assignment).
    A member whose subscription does not decode gets nothing (and is logged)."""
    members: dict[str, Member] = {}
    for m in join.members:
        try:
            sub = ConsumerProtocolSubscription.decode(m.metadata)
        except DecodeError as exc:
            logger.warning("group %r: member %s sent a subscription that does not decode "
                           "(%s); it gets nothing", group_id, m.member_id, exc)
            sub = ConsumerProtocolSubscription(topics=())
        members[m.member_id] = member_from_subscription(m.member_id, m.group_instance_id, sub)
    counts: dict[str, int | None] = {}
    for topic in sorted({t for m in members.values() for t in m.topics}):
        try:
            counts[topic] = await cluster.partitions_for(topic)
        except UnknownTopicError:
            counts[topic] = None
            logger.info("group %r: subscribed topic %r does not exist", group_id, topic)
    result = assignor.assign({t: n for t, n in counts.items() if n is not None}, members)
    logger.info("group %r generation %d: leader %s assigned %s", group_id,
                join.generation_id, join.member_id, {m: sorted(p) for m, p in result.items()})
    assignments = {m: ConsumerProtocolAssignment.of(parts).encode() for m, parts in result.items()}
    return assignments, counts
