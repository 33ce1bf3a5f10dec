"""Transactional schedules: what the ``transactions`` workload runs (`txn_runner.py`).

A transactional schedule is a `Schedule` with ``workload="transactions"``: its sends
are the calls of one transactional producer, in order (``Send.via``): ``begin``,
``send`` (a record: a pinned partition or a key), ``offsets`` (a
``send_offsets_to_transaction`` of the consumer offset ``Send.size``), ``commit``,
``abort``. The transactions are sequential (a call waits for the one before it), so a
send's ``at`` is the earliest it is made. The fake cluster's transaction version (1 or
2) and marker delay (its PrepareCommit / PrepareAbort window, where a coordinator
answers CONCURRENT_TRANSACTIONS) are the schedule's; ``transaction_timeout`` is one of
the producer's options, sometimes shorter than a transaction that stalls.

Faults (`Event.kind`, applied by `driver.py`; the partition-leader ones are the
producer workload's, `schedule.py`):

=================  =========================================================================
coord_move         the transaction coordinator moves to broker ``node`` (NOT_COORDINATOR at
                   the old one, FindCoordinator names the new one)
end_txn_error      the next ``count`` EndTxn requests are answered ``code`` unapplied
                   (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS,
                   CONCURRENT_TRANSACTIONS)
add_txn_error      the same for AddPartitionsToTxn (transaction version 1)
offsets_error      the same for AddOffsetsToTxn and TxnOffsetCommit
find_error         the next ``count`` FindCoordinator requests: COORDINATOR_NOT_AVAILABLE
pid_error          the next ``count`` InitProducerId requests get ``code``
end_txn_lost       the next EndTxn's answer is lost: applied first (``flag``) or not at all
add_txn_lost       the same for AddPartitionsToTxn
fence              a successor opens a producer with the same transactional id (fencing
                   this one, aborting its open transaction); ``flag``: it then commits a
                   transaction of ``count`` records of its own (`txn_runner.py` runs it)
=================  =========================================================================
"""

from __future__ import annotations

import random
from typing import Any

from pipeline.protocol.errors import ErrorCode

from .schedule import RETRIABLE_AFTER, RETRIABLE_BEFORE, Event, Schedule, Send

TRANSACTIONAL_ID = "explore-txn"
GROUP_ID = "explore-group"
#: the (topic, partition) whose consumer offset a transaction may commit
OFFSETS_PARTITION = ("explore-in", 0)

COORDINATOR_ERRORS = (
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.CONCURRENT_TRANSACTIONS,
)

# How often each fault kind is drawn; a swarm schedule keeps a subset.
TXN_FAULT_WEIGHTS = {
    "coord_move": 4, "end_txn_error": 3, "add_txn_error": 2, "offsets_error": 1,
    "find_error": 1, "pid_error": 1, "end_txn_lost": 3, "add_txn_lost": 2, "fence": 2,
    "move": 3, "error": 2, "error_after": 1, "lost_ack": 2, "drop_conns": 1, "slow": 2,
    "stop": 1,
}


# The share of transactional seeds drawn as slot waits (``txn_generate``).
SLOT_WAIT_SHARE = 0.15


def txn_options(rng: random.Random) -> dict[str, Any]:
    linger = rng.choice([0.0, 0.0, 0.005, 0.02])
    request_timeout = rng.choice([0.3, 0.5, 1.0])
    backoff = rng.choice([0.0, 0.01, 0.05, 0.1])
    return dict(
        linger=linger,
        max_in_flight=rng.randint(1, 5),
        max_batch_messages=rng.choice([1, 2, 5, 100]),
        retry_backoff=backoff,
        retry_backoff_max=max(backoff, rng.choice([0.05, 0.2, 0.5])),
        request_timeout=request_timeout,
        delivery_timeout=round(linger + request_timeout + rng.choice([1.0, 2.0, 5.0]), 3),
        close_timeout=rng.choice([0.5, 2.0, 10.0]),
        max_block=rng.choice([2.0, 5.0, 10.0]),
        # Mostly far beyond a transaction; sometimes shorter than one that stalls.
        transaction_timeout=rng.choice([60.0, 60.0, 60.0, 1.0, 2.5]),
    )


def _transactions(rng: random.Random, partitions: int) -> tuple[list[Send], float]:
    sends: list[Send] = []
    at = 0.0
    for k in range(rng.randint(1, 8)):
        at = round(at + rng.uniform(0.0, 0.3), 4)
        sends.append(Send(at, 0, 0, via="begin"))
        for _ in range(rng.randint(1, 12)):
            at += rng.choice([0.0, 0.0, 0.001, 0.01, 0.05])
            if rng.random() < 0.05:  # a stall: longer than a short transaction_timeout
                at += rng.uniform(0.5, 3.0)
            if rng.random() < 0.5:
                partition, key = rng.randrange(partitions), None
            else:
                partition, key = None, f"k{rng.randrange(8)}"
            sends.append(Send(round(at, 4), 0, rng.choice([0, 5, 20, 60]), partition, key))
        if rng.random() < 0.3:
            sends.append(Send(round(at, 4), 0, 10 * (k + 1), via="offsets"))
        at = round(at + rng.choice([0.0, 0.01, 0.1]), 4)
        sends.append(Send(at, 0, 0, via="commit" if rng.random() < 0.75 else "abort"))
    if rng.random() < 0.1:
        sends.pop()  # the last transaction is still open when the producer closes
    return sends, at


def _events(rng: random.Random, brokers: int, partitions: int, heal_at: float,
            version: int, kinds: frozenset[str] | None) -> list[Event]:
    weights = [(k, w if (kinds is None or k in kinds) else 0)
               for k, w in TXN_FAULT_WEIGHTS.items()]
    if version >= 2:  # no AddPartitionsToTxn under version 2
        weights = [(k, 0 if k.startswith("add_txn") else w) for k, w in weights]
    if not any(w for _, w in weights):
        return []
    names, w = zip(*weights, strict=True)
    events: list[Event] = []
    stopped = 0
    for _ in range(rng.randint(0, 10)):
        kind = rng.choices(names, w)[0]
        at = round(rng.uniform(0, heal_at), 4)
        node, p = rng.randrange(brokers), rng.randrange(partitions)
        if kind in ("coord_move", "move"):
            events.append(Event(at, kind, node=node, partition=p if kind == "move" else -1))
        elif kind in ("end_txn_error", "add_txn_error", "offsets_error"):
            events.append(Event(at, kind, code=int(rng.choice(COORDINATOR_ERRORS)),
                                count=rng.randint(1, 3)))
        elif kind == "find_error":
            events.append(Event(at, kind, code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                count=rng.randint(1, 3)))
        elif kind == "pid_error":
            events.append(Event(at, kind, code=int(rng.choice(COORDINATOR_ERRORS)),
                                count=rng.randint(1, 3)))
        elif kind in ("end_txn_lost", "add_txn_lost"):
            events.append(Event(at, kind, flag=rng.random() < 0.6))
        elif kind == "fence":
            events.append(Event(at, kind, flag=rng.random() < 0.5, count=rng.randint(1, 4)))
        elif kind == "error":
            events.append(Event(at, kind, partition=p, code=int(rng.choice(RETRIABLE_BEFORE)),
                                count=rng.randint(1, 3)))
        elif kind == "error_after":
            events.append(Event(at, kind, partition=p, code=int(rng.choice(RETRIABLE_AFTER))))
        elif kind == "lost_ack":
            events.append(Event(at, kind, node=node, count=rng.randint(1, 2)))
        elif kind == "drop_conns":
            events.append(Event(at, kind, node=node))
        elif kind == "slow":
            events.append(Event(at, kind, node=node, seconds=rng.choice([0.05, 0.3, 1.0]),
                                duration=rng.choice([0.1, 0.5, 2.0]), flag=rng.random() < 0.5))
        elif kind == "stop" and stopped < brokers - 1:
            stopped += 1
            events.append(Event(at, kind, node=node, flag=True))
            back = round(min(at + rng.choice([0.05, 0.3, 1.0]), heal_at), 4)
            events.append(Event(back, "restart", node=node))
    events.sort(key=lambda e: e.at)
    return events


def txn_generate(seed: int, kinds: frozenset[str] | None = None) -> Schedule:
    """The transactional schedule for ``seed`` (``kinds``: only these fault kinds)."""
    rng = random.Random(seed * 7919 + 11)
    version = rng.choice([1, 2])
    brokers = rng.randint(2, 4)
    partitions = rng.randint(1, 4)
    leaders = tuple(rng.randrange(brokers) for _ in range(partitions))
    options = txn_options(rng)
    sends, last = _transactions(rng, partitions)
    heal_at = round(rng.uniform(0.2, max(0.3, last)), 3)
    events = _events(rng, brokers, partitions, heal_at, version, kinds)
    # Slot waits, drawn on a roll of their own (every other draw of the seed stays as
    # it was): one request slot per connection, metadata refreshed often and every
    # broker slow until healed, so a Produce drained behind a Metadata request waits
    # for the slot, and an abort may come meanwhile (X12: nothing of it is written).
    own = random.Random(seed * 6007 + 3)
    profile = ""
    if own.random() < SLOT_WAIT_SHARE:
        profile = "slot-wait"
        options.update(max_in_flight=1, metadata_max_age=own.choice([0.02, 0.1]))
        events = sorted([*events, *(
            Event(0.0, "slow", node=node, seconds=own.choice([0.05, 0.2]), duration=heal_at)
            for node in range(brokers))], key=lambda e: e.at)
    return Schedule(
        seed=seed,
        idempotent=True,
        brokers=brokers,
        partitions=partitions,
        leaders=leaders,
        options=tuple(sorted(options.items())),
        sends=tuple(sends),
        events=tuple(events),
        flushes=(),
        heal_at=heal_at,
        close_at=round(last + rng.uniform(0.1, 1.0), 3),
        max_message_bytes=1024 * 1024,
        workload="transactions",
        transaction_version=version,
        txn_marker_delay=rng.choice([0.0, 0.0, 0.01, 0.05, 0.3]),
        profile=profile,
    )


def txn_schedule_for(seed: int) -> Schedule:
    """Seed ``seed`` of a transactional sweep: plain (70%) or swarm (a random subset of
    the fault kinds, so a rare pair is not drowned by the others)."""
    rng = random.Random(seed * 104729 + 5)
    if rng.random() < 0.3:
        kinds = frozenset(k for k in TXN_FAULT_WEIGHTS if rng.random() < 0.4)
        schedule = txn_generate(seed, kinds)
        from dataclasses import replace
        swarm = "swarm:" + "+".join(sorted(kinds))
        return replace(schedule, profile=f"{schedule.profile}+{swarm}" if schedule.profile
                       else swarm)
    return txn_generate(seed)
