"""More KIP-848 member rules, against the scripted coordinator of
``test_member848_rules`` (``Coordinator848``): closing, poll timeouts, request pacing,
and what a member shows before it runs. Everything runs on virtual time.
"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.consumer import (
    ConsumerError,
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
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake_cluster import FakeCluster

from . import test_member848_rules as rules
from .conftest import produce, until
from .test_member848_rules import ALL4, Coordinator848, Member, beats, options, quiet, running, tps

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
