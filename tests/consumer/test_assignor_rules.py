"""The assignors' small rules, each against the Java client's behaviour.

Table tests of pure functions: what the group leader reads from a member's subscription
(the generation of its owned partitions), how ``roundrobin`` deals past members not
subscribed to a topic, and the ``cooperative-sticky`` rules (ownership, quotas, the
balancing moves) on inputs where one rule alone decides the outcome.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from pipeline.consumer._assignors import TP, Member, RoundRobinAssignor, member_from_subscription
from pipeline.consumer._sticky import CooperativeStickyAssignor
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
