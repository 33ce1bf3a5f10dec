"""The ``cooperative-sticky`` assignor: balanced, sticky and incremental (KIP-429).

Semantics are Kafka's ``CooperativeStickyAssignor`` (``AbstractStickyAssignor``):

1. **Ownership.** A member's owned partitions count only for topics it still
   subscribes to and partitions that still exist. Two members claiming one partition
   resolve by generation: the higher generation keeps it; at the same generation
   neither does (the claim is invalid, and the partition is treated as moving).
2. **Balance.** When every member subscribes to the same topics, each member ends with
   ``n // m`` or ``n // m + 1`` partitions, exactly ``n % m`` members with the larger
   count. Otherwise no partition could move from a member to one of its eligible
   members holding two or more fewer.
3. **Stickiness.** A member keeps its valid owned partitions up to its quota (lowest
   partition numbers first, as Kafka keeps them); only the surplus moves.
4. **Cooperation.** A partition that changes owner (or that a member still holds
   for a topic it no longer subscribes to) is *left out* of this assignment:
   its old owner, not finding it in its assignment, revokes it and rejoins; the
   follow-up rebalance assigns it (now unowned) to its new member. So no partition
   is ever assigned to one member while another still holds it.

The assignment itself is computed independently of Kafka's code (different tie
breaks); it is deterministic for a given input.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from pipeline.consumer._assignors import TP, Member, RebalanceProtocol, member_order

__all__ = ["CooperativeStickyAssignor", "sticky_assignment", "valid_ownership"]


def valid_ownership(
    partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
) -> tuple[dict[TP, str], set[TP], dict[TP, set[str]]]:
    """``({partition: owner}, doubly_claimed, {partition: members})``: rule 1 of the
    module doc; the last map holds the claims dropped because their member no longer
    subscribes to the topic: it still holds them until it revokes them."""
    owner: dict[TP, str] = {}
    doubly: set[TP] = set()
    unsubscribed: dict[TP, set[str]] = {}
    for member in sorted(members.values(), key=lambda m: m.member_id):
        for tp in sorted(member.owned):
            topic, partition = tp
            if not 0 <= partition < partitions_per_topic.get(topic, 0):
                continue
            if topic not in member.topics:
                unsubscribed.setdefault(tp, set()).add(member.member_id)
                continue
            if tp in doubly:
                continue
            other = owner.get(tp)
            if other is None:
                owner[tp] = member.member_id
            elif members[other].generation == member.generation:
                doubly.add(tp)
                del owner[tp]
            elif member.generation > members[other].generation:
                owner[tp] = member.member_id
    return owner, doubly, unsubscribed


def sticky_assignment(
    partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
) -> tuple[dict[str, set[TP]], dict[TP, str]]:
    """The sticky assignment before cooperation (rules 1-3), and the partitions whose
    owner changes ``{partition: new member}`` (rule 4 leaves them out)."""
    owner, doubly, unsubscribed = valid_ownership(partitions_per_topic, members)
    kept: dict[str, list[TP]] = {m: [] for m in members}
    for tp, member_id in owner.items():
        kept[member_id].append(tp)
    for parts in kept.values():
        parts.sort(key=lambda tp: (tp[1], tp[0]))
    topic_sets = {frozenset(m.topics & partitions_per_topic.keys()) for m in members.values()}
    if len(topic_sets) <= 1:
        assignment = _constrained(partitions_per_topic, members, kept)
    else:
        assignment = _general(partitions_per_topic, members, kept)
    moving = {
        tp: member_id
        for member_id, parts in assignment.items()
        for tp in parts
        if tp in doubly
        or owner.get(tp, member_id) != member_id
        or unsubscribed.get(tp, set()) - {member_id}
    }
    return assignment, moving


def _all_partitions(partitions_per_topic: Mapping[str, int], topics: set[str]) -> list[TP]:
    return [(t, p) for t in sorted(topics) for p in range(partitions_per_topic[t])]


def _constrained(
    partitions_per_topic: Mapping[str, int],
    members: Mapping[str, Member],
    kept: dict[str, list[TP]],
) -> dict[str, set[TP]]:
    """Every member subscribes to the same topics: quotas of ``n // m`` and one more."""
    topics = next(iter(members.values())).topics & partitions_per_topic.keys()
    every = _all_partitions(partitions_per_topic, set(topics))
    low, extra = divmod(len(every), len(members))
    # The members holding the most get the larger quotas: the fewest moves.
    order = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: low + (1 if i < extra else 0) for i, m in enumerate(order)}
    assignment = {m: set(kept[m][: quota[m]]) for m in members}
    taken = set().union(*assignment.values()) if assignment else set()
    hungry = sorted(members, key=lambda m: member_order(members[m]))
    turn = 0
    for tp in every:
        if tp in taken:
            continue
        while len(assignment[hungry[turn % len(hungry)]]) >= quota[hungry[turn % len(hungry)]]:
            turn += 1
        assignment[hungry[turn % len(hungry)]].add(tp)
        turn += 1
    return assignment


def _general(
    partitions_per_topic: Mapping[str, int],
    members: Mapping[str, Member],
    kept: dict[str, list[TP]],
) -> dict[str, set[TP]]:
    """Members subscribe to different topics: keep what is owned, give the rest to the
    least loaded eligible member, then move partitions while that improves balance."""
    eligible: dict[str, list[str]] = {}
    for member_id in sorted(members):
        for topic in members[member_id].topics:
            if topic in partitions_per_topic:
                eligible.setdefault(topic, []).append(member_id)
    assignment = {m: set(kept[m]) for m in members}
    taken = set().union(*assignment.values()) if assignment else set()
    free = [tp for tp in _all_partitions(partitions_per_topic, set(eligible)) if tp not in taken]
    free.sort(key=lambda tp: (len(eligible[tp[0]]), tp))
    for tp in free:
        target = min(eligible[tp[0]], key=lambda m: (len(assignment[m]), m))
        assignment[target].add(tp)
    while _move_one(assignment, eligible):
        pass
    return assignment


def _move_one(assignment: dict[str, set[TP]], eligible: dict[str, list[str]]) -> bool:
    """Move one partition from a member to an eligible one holding two or more fewer;
    False when no such move exists (each move lowers the sum of squared counts, so
    repeating ends)."""
    for heavy in sorted(assignment, key=lambda m: (-len(assignment[m]), m)):
        count = len(assignment[heavy])
        for tp in sorted(assignment[heavy], reverse=True):
            light = min(eligible[tp[0]], key=lambda m: (len(assignment[m]), m))
            if len(assignment[light]) < count - 1:
                assignment[heavy].remove(tp)
                assignment[light].add(tp)
                return True
    return False


class CooperativeStickyAssignor:
    """Kafka's ``cooperative-sticky`` (module doc). Also usable in an eager group, where
    members own nothing when they join, as the Java client's is."""

    name = "cooperative-sticky"
    protocols: tuple[RebalanceProtocol, ...] = ("cooperative", "eager")

    def user_data(self, generation: int) -> bytes | None:
        # The Java assignor's user data: the generation its owned partitions are from
        # (what a leader reads from subscriptions older than v2).
        return struct.pack(">i", generation)

    def assign(
        self, partitions_per_topic: Mapping[str, int], members: Mapping[str, Member]
    ) -> dict[str, frozenset[TP]]:
        assignment, moving = sticky_assignment(partitions_per_topic, members)
        for tp, member_id in moving.items():
            assignment[member_id].discard(tp)
        return {m: frozenset(parts) for m, parts in assignment.items()}
