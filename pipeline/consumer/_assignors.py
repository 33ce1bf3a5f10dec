"""Client-side partition assignors of the classic group protocol (pure functions).

The group's leader member runs one: every member's subscription in, every member's
partitions out. Members of one group agree on the assignor by *name* (JoinGroup's
protocol selection), and Java, librdkafka and we must then compute assignments the
same way for a mixed group to behave as its users expect; the names and semantics
are Kafka's:

* ``range``: per topic, partitions in order, split into contiguous ranges over the
  topic's subscribers in member order; the first ``partitions % members`` get one
  more (Kafka's ``RangeAssignor``). Eager only.
* ``roundrobin``: every subscribed partition (topics sorted, then partitions) dealt
  to the members in member order, skipping members not subscribed to its topic
  (Kafka's ``RoundRobinAssignor``). Eager only.
* ``cooperative-sticky``: balanced and sticky, incremental (KIP-429): ``_sticky.py``.

*Member order* is Kafka's ``MemberInfo`` order: static members (KIP-345) first,
by ``group.instance.id``, then dynamic members by member id; so a static group's
assignment survives restarts, which give members new member ids.

Rack-aware assignment (KIP-881) is not implemented: our subscriptions carry
``client_rack`` so a Java leader can use it, our leader ignores racks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pipeline.protocol.consumer_protocol import ConsumerProtocolSubscription

__all__ = [
    "TP",
    "Assignor",
    "Member",
    "RangeAssignor",
    "RebalanceProtocol",
    "RoundRobinAssignor",
    "member_from_subscription",
    "member_order",
    "rebalance_protocol",
]

#: ``(topic, partition)``
TP = tuple[str, int]
#: Eager: every member revokes everything before a rebalance. Cooperative (KIP-429):
#: members keep what does not move; a moving partition is revoked in one rebalance
#: and assigned in the next.
RebalanceProtocol = Literal["eager", "cooperative"]


@dataclass(frozen=True, slots=True)
class Member:
    """One member's subscription, as the leader's assignor sees it."""

    member_id: str
    topics: frozenset[str]
    group_instance_id: str | None = None
    owned: frozenset[TP] = frozenset()  # what it holds now (subscription v1+)
    generation: int = -1  # the generation ``owned`` is from; -1: unknown
    rack: str | None = None
    user_data: bytes | None = field(default=None, compare=False)


def member_order(member: Member) -> tuple[int, str]:
    """Kafka's MemberInfo order: static members first by instance id, then member id."""
    if member.group_instance_id is not None:
        return (0, member.group_instance_id)
    return (1, member.member_id)


def member_from_subscription(
    member_id: str, group_instance_id: str | None, sub: ConsumerProtocolSubscription
) -> Member:
    """A :class:`Member` from a JoinGroup member's decoded subscription. The owned
    partitions' generation comes from the v2+ field, else from the 4-byte user data
    the Java cooperative-sticky assignor writes (before v2 it was its only place)."""
    generation = sub.generation_id
    if generation < 0 and sub.user_data is not None and len(sub.user_data) >= 4:
        (generation,) = struct.unpack_from(">i", sub.user_data)
    return Member(
        member_id=member_id,
        topics=frozenset(sub.topics),
        group_instance_id=group_instance_id,
        owned=sub.owned,
        generation=generation,
        rack=sub.rack_id,
        user_data=sub.user_data,
    )


class Assignor(Protocol):
    """What the consumer needs of an assignor."""

    @property
    def name(self) -> str:
        """The protocol name offered in JoinGroup (shared with Java / librdkafka)."""

    @property
    def protocols(self) -> tuple[RebalanceProtocol, ...]:
        """The rebalance protocols it supports."""

    def user_data(self, generation: int) -> bytes | None:
        """The subscription's user data (before this member's first join: -1)."""

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
    ) -> dict[str, frozenset[TP]]:
        """``{member_id: partitions}`` for every member (possibly empty sets).
        ``partitions_per_topic`` holds the subscribed topics that exist."""


def _subscribed(
    partitions_per_topic: Mapping[str, int], members: Iterable[Member]
) -> list[str]:
    topics: set[str] = set()
    for m in members:
        topics |= m.topics
    return sorted(t for t in topics if t in partitions_per_topic)


class RangeAssignor:
    """Kafka's ``range``."""

    name = "range"
    protocols: tuple[RebalanceProtocol, ...] = ("eager",)

    def user_data(self, generation: int) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
    ) -> dict[str, frozenset[TP]]:
        out: dict[str, set[TP]] = {m: set() for m in members}
        ordered = sorted(members.values(), key=member_order)
        for topic in _subscribed(partitions_per_topic, ordered):
            subscribers = [m.member_id for m in ordered if topic in m.topics]
            count = partitions_per_topic[topic]
            each, extra = divmod(count, len(subscribers))
            start = 0
            for i, member_id in enumerate(subscribers):
                n = each + (1 if i < extra else 0)
                out[member_id].update((topic, p) for p in range(start, start + n))
                start += n
        return {m: frozenset(parts) for m, parts in out.items()}


class RoundRobinAssignor:
    """Kafka's ``roundrobin``."""

    name = "roundrobin"
    protocols: tuple[RebalanceProtocol, ...] = ("eager",)

    def user_data(self, generation: int) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
    ) -> dict[str, frozenset[TP]]:
        out: dict[str, set[TP]] = {m: set() for m in members}
        ordered = sorted(members.values(), key=member_order)
        turn = 0
        for topic in _subscribed(partitions_per_topic, ordered):
            for partition in range(partitions_per_topic[topic]):
                while topic not in ordered[turn % len(ordered)].topics:
                    turn += 1
                out[ordered[turn % len(ordered)].member_id].add((topic, partition))
                turn += 1
        return {m: frozenset(parts) for m, parts in out.items()}


def rebalance_protocol(assignors: Iterable[Assignor]) -> RebalanceProtocol:
    """The protocol a consumer offering ``assignors`` follows: cooperative only if every
    one of them supports it (the Java client's rule), since the group may pick any."""
    return "cooperative" if all("cooperative" in a.protocols for a in assignors) else "eager"

