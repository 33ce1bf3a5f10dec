"""The assignors' small rules, each against the Java client's behaviour.

Table tests of pure functions: what the group leader reads from a member's subscription
(the generation of its owned partitions), how ``roundrobin`` deals past members not
subscribed to a topic, and the ``cooperative-sticky`` rules (ownership, quotas, the
balancing moves) on inputs where one rule alone decides the outcome.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping

from pipeline.consumer._assignors import TP, Member, RoundRobinAssignor, member_from_subscription
from pipeline.consumer._sticky import CooperativeStickyAssignor, sticky_assignment, valid_ownership
from pipeline.protocol.consumer_protocol import ConsumerProtocolSubscription, group_partitions


def named(assignment: Mapping[str, frozenset[TP] | set[TP]]) -> dict[str, list[str]]:
    return {m: [f"{t}p{p}" for t, p in sorted(parts)] for m, parts in assignment.items()}


def sub(owned: list[TP], *, generation: int = -1, user_data: bytes | None = None,
        version: int = 3) -> ConsumerProtocolSubscription:
    """A subscription to ``t`` as it reaches the leader: encoded at ``version``, decoded."""
    written = ConsumerProtocolSubscription(
        topics=("t",), user_data=user_data, owned_partitions=group_partitions(owned),
        generation_id=generation)
    return ConsumerProtocolSubscription.decode(written.encode(version))


# ---------------------------------------------------------------- member_from_subscription

def test_a_present_generation_field_wins_over_the_user_data_even_at_zero() -> None:
    """The v2+ generation field is present whenever it is >= 0 (Java's ``Subscription``
    reads only a negative one as absent), and then it is the generation of the owned
    partitions, whatever 4 bytes the user data holds; only an absent field (-1, or a
    v0/v1 subscription) sends the leader to the user data."""
    assert member_from_subscription("m", None, sub([], generation=0,
                                                   user_data=struct.pack(">i", 7))).generation == 0
    assert member_from_subscription("m", None, sub([], generation=5,
                                                   user_data=struct.pack(">i", 7))).generation == 5
    assert member_from_subscription("m", None, sub([], generation=-1,
                                                   user_data=struct.pack(">i", 7))).generation == 7


def test_user_data_too_short_for_a_generation_leaves_it_unknown() -> None:
    """A v1 subscription whose user data is shorter than the 4-byte generation (another
    client's layout, or truncated) has an unknown generation (-1): the Java assignor
    catches the short read and uses DEFAULT_GENERATION; the leader must not fail on
    it. Such a member's claim on a partition then loses to a claim with a known
    generation, even generation 0."""
    for short in (b"", b"\x00", b"\x00\x00\x07"):
        m = member_from_subscription("m", None, sub([("t", 0)], user_data=short, version=1))
        assert m.generation == -1
        assert m.owned == {("t", 0)}
    group = {
        "short": member_from_subscription("short", None,
                                          sub([("t", 0)], user_data=b"\x00\x00\x07", version=1)),
        "known": member_from_subscription("known", None, sub([("t", 0)], generation=0)),
    }
    assert named(CooperativeStickyAssignor().assign({"t": 2}, group)) == {
        "known": ["tp0"], "short": ["tp1"]}


def test_a_subscription_without_a_generation_is_the_member_default() -> None:
    """A member that sends only its topics (no owned partitions, generation, rack or
    instance id) is, to the assignor, exactly a :class:`Member` with default fields:
    the default generation is Kafka's DEFAULT_GENERATION (-1, unknown), so claims of
    members built with defaults resolve as a real bare subscription's do."""
    bare = ConsumerProtocolSubscription.decode(ConsumerProtocolSubscription(topics=("t",)).encode())
    assert member_from_subscription("m", None, bare) == Member("m", frozenset({"t"}))


# ---------------------------------------------------------------- roundrobin

def test_roundrobin_deals_on_to_the_next_subscribed_member() -> None:
    """Kafka's ``roundrobin`` deals every partition to the next member in member order,
    passing over members not subscribed to its topic (a circular iterator that only
    moves forward): with A and C on t0 and t1 and B on t0 only, t1's partitions
    alternate C, A, C after A took t0p0; B, whose only topic is used up, gets none."""
    group = {
        "A": Member("A", frozenset({"t0", "t1"})),
        "B": Member("B", frozenset({"t0"})),
        "C": Member("C", frozenset({"t0", "t1"})),
    }
    got = RoundRobinAssignor().assign({"t0": 1, "t1": 3}, group)
    assert named(got) == {"A": ["t0p0", "t1p1"], "B": [], "C": ["t1p0", "t1p2"]}


# ---------------------------------------------------------------- cooperative-sticky


def claims(topics: str, owned: str = "", generation: int = -1, name: str = "") -> Member:
    """A member subscribed to ``topics`` ("a,b") owning ``owned`` ("a0,b1": a's partition 0
    and b's partition 1)."""
    parts = frozenset((m[1], int(m[2])) for m in re.finditer(r"([a-z]+)(\d+)", owned))
    return Member(name, frozenset(topics.split(",")), owned=parts, generation=generation)


def group_of(**members: Member) -> dict[str, Member]:
    return {m: Member(m, g.topics, g.group_instance_id, g.owned, g.generation)
            for m, g in members.items()}


def test_owned_partitions_that_no_longer_exist_are_neither_kept_nor_assigned() -> None:
    """A member may still claim partitions of a topic that was deleted (it still
    subscribes to it) or partition numbers past the topic's current count (the topic
    was recreated smaller): such a claim is no ownership, the leader never assigns a
    partition that does not exist, and the subscribed but missing topic is skipped."""
    topics = {"t": 2, "u": 1}
    group = group_of(A=claims("t,u,gone", "gone0,t0,t2", 3), B=claims("t", "t1", 3))
    owner, doubly, _ = valid_ownership(topics, group)
    assert (owner, doubly) == ({("t", 0): "A", ("t", 1): "B"}, set())
    assert named(CooperativeStickyAssignor().assign(topics, group)) == {
        "A": ["tp0", "up0"], "B": ["tp1"]}


def test_a_newer_claim_wins_whichever_member_comes_first() -> None:
    """Two members claiming one partition from different generations: the claim from
    the newer generation is the ownership, whether its member id sorts before or after
    the older claimant's (the older one lost the partition in a rebalance it missed)."""
    for older, newer in (("a", "b"), ("b", "a")):
        group = group_of(**{older: claims("t", "t0", 2), newer: claims("t", "t0", 3)})
        owner, doubly, _ = valid_ownership({"t": 2}, group)
        assert (owner, doubly) == ({("t", 0): newer}, set())
        assert CooperativeStickyAssignor().assign({"t": 2}, group)[newer] == {("t", 0)}


def test_an_older_claim_never_wins_over_newer_claims_that_cancel_out() -> None:
    """Two claims from the newest generation cancel each other (neither member keeps the
    partition, it moves through a revocation); a third, older claim does not turn into
    ownership because the newer ones cancelled: nobody keeps the partition this round."""
    group = group_of(a=claims("t", "t0", 3), b=claims("t", "t0", 3), c=claims("t", "t0", 1))
    owner, doubly, _ = valid_ownership({"t": 3}, group)
    assert (owner, doubly) == ({}, {("t", 0)})
    got = CooperativeStickyAssignor().assign({"t": 3}, group)
    assert all(("t", 0) not in parts for parts in got.values())


def test_with_equal_subscriptions_a_member_keeps_its_lowest_partition_numbers() -> None:
    """Over its quota, a member keeps its owned partitions with the lowest partition
    numbers across topics (Kafka sorts them by partition, then topic) and gives up the
    rest: holding a0, a1, b0, b1 with a quota of 2 it keeps a0 and b0; the partitions it
    gives up go to the newcomer in the next rebalance (cooperative)."""
    topics = {"a": 2, "b": 2}
    group = group_of(m=claims("a,b", "a0,a1,b0,b1", 1), n=claims("a,b"))
    full, moving = sticky_assignment(topics, group)
    assert named(full) == {"m": ["ap0", "bp0"], "n": ["ap1", "bp1"]}
    assert moving == {("a", 1): "n", ("b", 1): "n"}
    assert named(CooperativeStickyAssignor().assign(topics, group)) == {"m": ["ap0", "bp0"], "n": []}


def test_the_partitions_kept_follow_partition_number_then_topic_whatever_the_claim_order() -> None:
    """The lowest-partition-first rule holds for partitions a member took over from an
    older claimant too: m (generation 2) owns a0 and b0, k's older claim on b0 lost;
    with a quota of 1, m keeps a0 (partition 0, topic a before b) and b0 moves."""
    topics = {"a": 1, "b": 1}
    group = group_of(k=claims("a,b", "b0", 1), m=claims("a,b", "a0,b0", 2), z=claims("a,b", "", 2))
    full, moving = sticky_assignment(topics, group)
    assert full["m"] == {("a", 0)}
    assert moving == {("b", 0): "k"}


def test_a_fresh_group_with_equal_subscriptions_gets_kafkas_documented_assignment() -> None:
    """Kafka's StickyAssignor javadoc, example 1: C0, C1, C2 subscribed to t0..t3 of two
    partitions each, nothing owned, get the partitions dealt in member order:
    C0 [t0p0, t1p1, t3p0], C1 [t0p1, t2p0, t3p1], C2 [t1p0, t2p1]."""
    topics = {f"t{i}": 2 for i in range(4)}
    group = group_of(**{c: claims("t0,t1,t2,t3") for c in ("C0", "C1", "C2")})
    assert named(CooperativeStickyAssignor().assign(topics, group)) == {
        "C0": ["t0p0", "t1p1", "t3p0"], "C1": ["t0p1", "t2p0", "t3p1"], "C2": ["t1p0", "t2p1"]}


def test_the_deal_passes_over_members_already_at_their_quota_in_member_order() -> None:
    """With equal subscriptions the unowned partitions go round the members still under
    their quota in member order, as the Java leader deals them: B keeps t0 and t1 (its
    quota), so t2..t5 alternate A, C, A, C."""
    group = group_of(A=claims("t"), B=claims("t", "t0,t1", 4), C=claims("t"))
    assert named(CooperativeStickyAssignor().assign({"t": 6}, group)) == {
        "A": ["tp2", "tp4"], "B": ["tp0", "tp1"], "C": ["tp3", "tp5"]}


def test_different_subscriptions_get_kafkas_documented_assignment() -> None:
    """Kafka's StickyAssignor javadoc, example 2: C0 on t0, C1 on t0 and t1, C2 on t0,
    t1 and t2 (1, 2 and 3 partitions) get C0 [t0p0], C1 [t1p0, t1p1], C2 [t2p0, t2p1,
    t2p2]; when C0 leaves, C1 takes t0p0 and nothing else moves."""
    topics = {"t0": 1, "t1": 2, "t2": 3}
    group = group_of(C0=claims("t0"), C1=claims("t0,t1"), C2=claims("t0,t1,t2"))
    first = CooperativeStickyAssignor().assign(topics, group)
    assert named(first) == {"C0": ["t0p0"], "C1": ["t1p0", "t1p1"],
                            "C2": ["t2p0", "t2p1", "t2p2"]}
    rest = {m: Member(m, g.topics, owned=first[m], generation=1)
            for m, g in group.items() if m != "C0"}
    assert named(CooperativeStickyAssignor().assign(topics, rest)) == {
        "C1": ["t0p0", "t1p0", "t1p1"], "C2": ["t2p0", "t2p1", "t2p2"]}


def test_different_subscriptions_are_as_balanced_as_they_can_be() -> None:
    """Kafka's sticky assignors' first goal is balance: three single-partition topics,
    m0 on all three, m1 on t0 and t2, m2 on t2 only: each member can have one, and each
    gets one (the partitions with the fewest eligible members are placed first); one
    member with two and another with none would satisfy no user."""
    topics = {"t0": 1, "t1": 1, "t2": 1}
    group = group_of(m0=claims("t0,t1,t2"), m1=claims("t0,t2"), m2=claims("t2"))
    assert named(CooperativeStickyAssignor().assign(topics, group)) == {
        "m0": ["t1p0"], "m1": ["t0p0"], "m2": ["t2p0"]}


def test_with_different_subscriptions_a_member_gives_up_its_highest_partitions() -> None:
    """Balancing members with different subscriptions moves a member's surplus from its
    highest partition numbers and keeps the lowest (rule 3 holds on this path too): A on
    t and u owns t0..t3 and u0, B (on t only) joins: A keeps t0, t1 and u0, and t2, t3
    move to B through a revocation."""
    topics = {"t": 4, "u": 1}
    group = group_of(A=claims("t,u", "t0,t1,t2,t3,u0", 2), B=claims("t"))
    full, moving = sticky_assignment(topics, group)
    assert named(full) == {"A": ["tp0", "tp1", "up0"], "B": ["tp2", "tp3"]}
    assert moving == {("t", 2): "B", ("t", 3): "B"}
