"""The assignors: Kafka's documented examples, and properties over generated groups.

Properties (hypothesis): every subscribed partition is assigned exactly once and only
to a subscriber; ``cooperative-sticky`` is balanced, sticky across rebalances, resolves
conflicting claims by generation, and -- simulated as members revoking what they lose
and rejoining -- reaches the balanced assignment in two rebalances without ever letting
two members hold one partition.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.consumer._assignors import (
    TP,
    Member,
    RangeAssignor,
    RoundRobinAssignor,
    member_from_subscription,
    rebalance_protocol,
)
from pipeline.consumer._sticky import CooperativeStickyAssignor, sticky_assignment
from pipeline.protocol.consumer_protocol import ConsumerProtocolSubscription, group_partitions


def members(**subs: str) -> dict[str, Member]:
    return {m: Member(m, frozenset(t.split(","))) for m, t in subs.items()}


def named(assignment: Mapping[str, frozenset[TP]]) -> dict[str, list[str]]:
    return {m: [f"{t}p{p}" for t, p in sorted(parts)] for m, parts in assignment.items()}


# ---------------------------------------------------------------- documented examples

def test_range_javadoc_example() -> None:
    got = RangeAssignor().assign({"t0": 3, "t1": 3}, members(C0="t0,t1", C1="t0,t1"))
    assert named(got) == {"C0": ["t0p0", "t0p1", "t1p0", "t1p1"], "C1": ["t0p2", "t1p2"]}


def test_roundrobin_javadoc_examples() -> None:
    got = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, members(C0="t0,t1", C1="t0,t1"))
    assert named(got) == {"C0": ["t0p0", "t0p2", "t1p1"], "C1": ["t0p1", "t1p0", "t1p2"]}
    got = RoundRobinAssignor().assign(
        {"t0": 1, "t1": 2, "t2": 3}, members(C0="t0", C1="t0,t1", C2="t0,t1,t2")
    )
    assert named(got) == {
        "C0": ["t0p0"], "C1": ["t1p0"], "C2": ["t1p1", "t2p0", "t2p1", "t2p2"],
    }


def test_static_members_come_first_by_instance_id() -> None:
    group = {
        "a": Member("a", frozenset({"t"})),
        "z": Member("z", frozenset({"t"}), group_instance_id="i-1"),
        "m": Member("m", frozenset({"t"}), group_instance_id="i-0"),
    }
    got = RangeAssignor().assign({"t": 3}, group)
    assert named(got) == {"m": ["tp0"], "z": ["tp1"], "a": ["tp2"]}


def test_missing_topics_are_skipped_and_every_member_gets_an_entry() -> None:
    got = RangeAssignor().assign({"t": 1}, members(A="t,gone", B="t"))
    assert named(got) == {"A": ["tp0"], "B": []}
    assert CooperativeStickyAssignor().assign({}, members(A="gone")) == {"A": frozenset()}


def test_rebalance_protocol_is_cooperative_only_if_every_assignor_is() -> None:
    sticky, rng = CooperativeStickyAssignor(), RangeAssignor()
    assert rebalance_protocol([sticky]) == "cooperative"
    assert rebalance_protocol([sticky, rng]) == "eager"


def test_generation_of_owned_partitions_from_v2_field_or_java_user_data() -> None:
    v2 = ConsumerProtocolSubscription(topics=("t",), generation_id=4,
                                      owned_partitions=group_partitions([("t", 1)]))
    assert member_from_subscription("m", None, v2).generation == 4
    v1 = ConsumerProtocolSubscription(topics=("t",), user_data=struct.pack(">i", 9))
    m = member_from_subscription("m", "inst", ConsumerProtocolSubscription.decode(v1.encode(1)))
    assert (m.generation, m.group_instance_id) == (9, "inst")
    assert CooperativeStickyAssignor().user_data(9) == struct.pack(">i", 9)


# ---------------------------------------------------------------- generated groups

@st.composite
def groups(draw: st.DrawFn, *, same_topics: bool | None = None) -> tuple[dict[str, int], dict[str, Member]]:
    """Topics with partition counts, members with subscriptions, and owned partitions
    from some earlier (arbitrary but disjoint) assignment."""
    topics = {f"t{i}": draw(st.integers(0, 7)) for i in range(draw(st.integers(1, 4)))}
    names = sorted(topics)
    count = draw(st.integers(1, 6))
    same = draw(st.booleans()) if same_topics is None else same_topics
    common = draw(st.sets(st.sampled_from(names), min_size=1))
    out: dict[str, Member] = {}
    every = [(t, p) for t in names for p in range(topics[t])]
    owner = {tp: draw(st.integers(-1, count - 1)) for tp in every}
    for i in range(count):
        subs = common if same else draw(st.sets(st.sampled_from(names), min_size=1))
        owned = frozenset(tp for tp, o in owner.items() if o == i)
        static = draw(st.none() | st.sampled_from(["s0", "s1", "s2"]))
        if static in {m.group_instance_id for m in out.values()}:
            static = None
        out[f"m{i}"] = Member(f"m{i}", frozenset(subs), static, owned, generation=3)
    return topics, out


def subscribed(topics: dict[str, int], group: Mapping[str, Member]) -> set[TP]:
    return {(t, p) for m in group.values() for t in m.topics if t in topics for p in range(topics[t])}


def check_exactly_once(topics: dict[str, int], group: Mapping[str, Member],
                       assignment: Mapping[str, frozenset[TP] | set[TP]]) -> None:
    assert set(assignment) == set(group)
    seen: list[TP] = [tp for parts in assignment.values() for tp in parts]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    assert set(seen) == subscribed(topics, group)
    for m, parts in assignment.items():
        assert all(t in group[m].topics for t, _ in parts), "assigned an unsubscribed topic"


def check_balanced(group: Mapping[str, Member], assignment: Mapping[str, set[TP] | frozenset[TP]]) -> None:
    counts = {m: len(p) for m, p in assignment.items()}
    if len({g.topics for g in group.values()}) == 1:
        assert max(counts.values()) - min(counts.values()) <= 1
        return
    for m, parts in assignment.items():
        for t, _ in parts:
            for other in group:
                if t in group[other].topics:
                    assert counts[other] >= counts[m] - 1, f"{t} could move {m} -> {other}"


@settings(max_examples=300, deadline=None)
@given(groups())
def test_range_and_roundrobin_assign_every_partition_once(case: tuple[dict[str, int], dict[str, Member]]) -> None:
    topics, group = case
    for assignor in (RangeAssignor(), RoundRobinAssignor()):
        check_exactly_once(topics, group, assignor.assign(topics, group))


@settings(max_examples=300, deadline=None)
@given(groups(same_topics=True))
def test_roundrobin_with_equal_subscriptions_is_balanced(case: tuple[dict[str, int], dict[str, Member]]) -> None:
    topics, group = case
    check_balanced(group, RoundRobinAssignor().assign(topics, group))


@settings(max_examples=400, deadline=None)
@given(groups())
def test_sticky_is_complete_balanced_and_keeps_owned_partitions_up_to_its_quota(
    case: tuple[dict[str, int], dict[str, Member]],
) -> None:
    topics, group = case
    full, moving = sticky_assignment(topics, group)
    check_exactly_once(topics, group, full)
    check_balanced(group, full)
    if len({m.topics for m in group.values()}) == 1:
        n = len(subscribed(topics, group))
        low = n // len(group)
        valid = {m: {tp for tp in g.owned if tp[0] in g.topics} for m, g in group.items()}
        for m in group:
            assert len(full[m] & valid[m]) >= min(len(valid[m]), low), f"{m} lost more than its surplus"
        # As few moves as possible: the larger quotas go to the members holding the most.
        held = sorted((len(v) for v in valid.values()), reverse=True)
        extra = n % len(group)
        fewest = sum(max(0, c - low - (1 if i < extra else 0)) for i, c in enumerate(held))
        assert sum(len(valid[m] - full[m]) for m in group) == fewest
    # The cooperative assignment is the full one minus exactly the moving partitions.
    coop = CooperativeStickyAssignor().assign(topics, group)
    for m in group:
        assert coop[m] == full[m] - set(moving)
        assert all(tp not in g.owned for tp in coop[m] - group[m].owned for g in group.values()), \
            "a partition given while another member owns it"


@settings(max_examples=300, deadline=None)
@given(groups())
def test_sticky_moves_nothing_once_balanced(case: tuple[dict[str, int], dict[str, Member]]) -> None:
    topics, group = case
    first = CooperativeStickyAssignor().assign(topics, group)
    settled = run_rebalances(topics, group, first)[-1]
    again = CooperativeStickyAssignor().assign(topics, owning(group, settled, 9))
    assert again == settled


def owning(group: Mapping[str, Member], assignment: Mapping[str, frozenset[TP]],
           generation: int) -> dict[str, Member]:
    return {m: Member(m, g.topics, g.group_instance_id, assignment.get(m, frozenset()), generation)
            for m, g in group.items()}


def run_rebalances(topics: dict[str, int], group: Mapping[str, Member],
                   first: dict[str, frozenset[TP]]) -> list[dict[str, frozenset[TP]]]:
    """Cooperative rounds as members live them: a member revokes what its assignment
    lacks and, having revoked something, rejoins; stop when nobody revoked."""
    holdings = {m: set(g.owned) for m, g in group.items()}
    rounds = [first]
    assignment = first
    for generation in range(4, 10):
        revoked = False
        for m, parts in assignment.items():
            lost = holdings[m] - parts
            revoked |= bool(lost)
            holdings[m] -= lost  # revoked first ...
        for m, parts in assignment.items():
            for tp in parts - holdings[m]:  # ... then taken: nobody else may hold it now
                assert all(tp not in holdings[o] for o in holdings if o != m), f"{tp} held twice"
            holdings[m] |= parts
        if not revoked:
            return rounds
        assignment = CooperativeStickyAssignor().assign(
            topics, owning(group, {m: frozenset(h) for m, h in holdings.items()}, generation))
        rounds.append(assignment)
    raise AssertionError(f"no stable assignment after {len(rounds)} rebalances: {rounds}")


@settings(max_examples=300, deadline=None)
@given(groups(), st.integers(0, 3), st.data())
def test_cooperative_membership_change_settles_in_two_rebalances(
    case: tuple[dict[str, int], dict[str, Member]], joiners: int, data: st.DataObject,
) -> None:
    topics, group = case
    # A settled group first, then members leave (their partitions unowned) and join.
    settled = run_rebalances(topics, group, CooperativeStickyAssignor().assign(topics, group))[-1]
    survivors = {m: g for m, g in group.items() if data.draw(st.booleans()) or m == "m0"}
    new = owning(survivors, settled, 5)
    for j in range(joiners):
        new[f"n{j}"] = Member(f"n{j}", group["m0"].topics, None, frozenset(), -1)
    rounds = run_rebalances(topics, new, CooperativeStickyAssignor().assign(topics, new))
    assert len(rounds) <= 2, "more than the revoke round and the assign round"
    check_exactly_once(topics, new, rounds[-1])
    check_balanced(new, rounds[-1])
    for m in survivors:  # stickiness across the change
        kept = rounds[-1][m] & settled[m]
        if len({g.topics for g in new.values()}) == 1:
            n = len(subscribed(topics, new))
            assert len(kept) >= min(len(settled[m]), n // len(new))


def test_a_higher_generation_claim_wins_and_a_same_generation_double_claim_moves() -> None:
    topics = {"t": 2}
    group = {
        "old": Member("old", frozenset({"t"}), owned=frozenset({("t", 0)}), generation=2),
        "new": Member("new", frozenset({"t"}), owned=frozenset({("t", 0)}), generation=3),
    }
    assert named(CooperativeStickyAssignor().assign(topics, group)) == {"old": ["tp1"], "new": ["tp0"]}
    tie = {m: Member(m, frozenset({"t"}), owned=frozenset({("t", 0)}), generation=3)
           for m in ("a", "b")}
    first = CooperativeStickyAssignor().assign(topics, tie)
    assert ("t", 0) not in first["a"] | first["b"], "a doubly claimed partition is revoked first"
    final = run_rebalances(topics, tie, first)[-1]
    assert sorted(final["a"] | final["b"]) == [("t", 0), ("t", 1)]


def test_a_joining_member_gets_partitions_only_after_their_owner_revoked_them() -> None:
    topics = {"t": 4}
    group = {"a": Member("a", frozenset({"t"}), owned=frozenset(("t", p) for p in range(4)),
                         generation=1),
             "b": Member("b", frozenset({"t"}))}
    first = CooperativeStickyAssignor().assign(topics, group)
    assert named(first) == {"a": ["tp0", "tp1"], "b": []}
    second = CooperativeStickyAssignor().assign(topics, owning(group, first, 2))
    assert named(second) == {"a": ["tp0", "tp1"], "b": ["tp2", "tp3"]}
