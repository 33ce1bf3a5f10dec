"""The schedules a sweep runs: ``make explore``, the CI sweep and ``make
mutants-explore`` all take schedule i of a sweep from seed S as ``schedule_for(S + i)``.

A seed picks one of three generators:

* *plain* (``schedule.generate``): every fault kind, times drawn from continuous
  ranges (the explorer's first generator; its seeds replay as before with
  ``--plain``);
* *swarm*: the plain generator with a random subset of the fault kinds (swarm
  testing: a schedule of only stops and stale metadata reaches what twelve kinds
  at once drown);
* *targeted* (``profiles.py``): times on a grid, so answers, bounces, backoffs
  and sends collide, in profiles aimed at the protocol's guards.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

from pipeline.protocol.errors import ErrorCode

from .profiles import targeted
from .routing import misrouted
from .schedule import FAULT_WEIGHTS, PID_ERRORS, Event, Schedule, generate, with_options

# Shares of a sweep (the rest: plain).
SWARM, TARGETED = 0.2, 0.55


# Share of schedules whose send() is the pure-Python twin (Intake.send) instead of
# the C Sender (when built): both implement the intake's rules.
PYTHON_SEND = 0.3

# Share of schedules routed by a user's partitioner, and of schedules with a few sends
# pinned to a partition the topic does not have (routing.py).
CUSTOM_PARTITIONER, MISROUTED = 0.25, 0.2

# Share of schedules whose send() loops may become send_many() / send_batch() calls.
BULKED = 0.3

# Share of schedules whose topic stamps records with the broker's append time.
LOG_APPEND_TIME = 0.2

# Share of idempotent schedules whose fake answers as tansu does, and of schedules
# whose producer ids start at 0.
TANSU, ZERO_PRODUCER_ID = 0.2, 0.2

# Share of schedules whose topic is created after the sends begin (late_topic).
LATE_TOPIC = 0.1

# Share of schedules with impatient send() calls (impatient).
IMPATIENT = 0.2

# Share of schedules whose keyless records land the sticky partitioner's byte count
# exactly on batch_bytes (sticky_edge).
STICKY_EDGE = 0.1

# Share of idempotent schedules where a leader answers OUT_OF_ORDER_SEQUENCE_NUMBER to
# batches no earlier failure explains (unexplained_gap).
UNEXPLAINED_GAP = 0.15

# Share of the default partitioner's schedules routed by librdkafka's "murmur2" instead
# (keyed rows hashed in one C loop, keyless records all to one partition).
MURMUR2 = 0.1

# Share of schedules whose batches the ledger settles twice in part (Schedule.resettle):
# its guard against a stage's double settle, seen from the outcomes.
RESETTLE = 0.05

# Share of schedules where a leader answers a Produce request without one of its
# partitions (incomplete): the batch's fate is unknown, it is retried or fails.
INCOMPLETE = 0.05


def schedule_for(seed: int, mode: str = "both") -> Schedule:
    rng = random.Random(seed * 104729 + 3)
    roll = rng.random()
    if roll < TARGETED:
        schedule = targeted(seed, mode)
    elif roll < TARGETED + SWARM:
        kinds = [k for k in FAULT_WEIGHTS if rng.random() < 0.4]
        schedule = replace(generate(seed, mode, frozenset(kinds)),
                           profile="swarm:" + "+".join(kinds))
    else:
        schedule = generate(seed, mode)
    if rng.random() < PYTHON_SEND:
        schedule = replace(schedule, send_path="python")
    if rng.random() < CUSTOM_PARTITIONER:
        schedule = replace(schedule, partitioner="custom")
    if rng.random() < MISROUTED:
        schedule = misrouted(schedule, rng)
    if rng.random() < BULKED:
        schedule = bulked(schedule, rng)
    if rng.random() < LOG_APPEND_TIME:
        schedule = replace(schedule, log_append_time=True)
    if rng.random() < TANSU and schedule.idempotent:
        # (every recovery takes a new producer id there: half of them meet
        # InitProducerId errors first, retried with backoff)
        failing = Event(0.0, "pid_error", code=int(rng.choice(PID_ERRORS)),
                        count=rng.randint(1, 3))
        schedule = replace(schedule, tansu_sequences=True, events=(
            (failing, *schedule.events) if rng.random() < 0.5 else schedule.events))
    if rng.random() < ZERO_PRODUCER_ID:
        schedule = replace(schedule, first_producer_id=0)
    if rng.random() < LATE_TOPIC:
        schedule = late_topic(schedule, rng)
    if rng.random() < IMPATIENT:
        schedule = impatient(schedule, rng)
    if rng.random() < STICKY_EDGE:
        schedule = sticky_edge(schedule, rng)
    if rng.random() < UNEXPLAINED_GAP and schedule.idempotent:
        schedule = unexplained_gap(schedule, rng)
    if rng.random() < MURMUR2 and schedule.partitioner == "default":
        schedule = replace(schedule, partitioner="murmur2")
    if rng.random() < RESETTLE:
        schedule = replace(schedule, resettle=True)
    if rng.random() < INCOMPLETE:
        schedule = incomplete(schedule, rng)
    return schedule


def incomplete(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with a leader leaving a partition out of its answers to the next
    one or two Produce requests touching it, once or twice before ``heal_at``: the
    batch is in the log, and the producer hears nothing of it
    (``BrokerProducer._handle_partition``: retried as a batch whose fate is unknown)."""
    events = list(schedule.events)
    start = max(schedule.topic_at, 0.0)
    for _ in range(rng.randint(1, 2)):
        at = round(rng.uniform(start, max(start, schedule.heal_at)), 4)
        events.append(Event(at, "incomplete", partition=rng.randrange(schedule.partitions),
                            count=rng.randint(1, 2)))
    return replace(schedule, events=tuple(sorted(events, key=lambda e: e.at)))


def unexplained_gap(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with a leader answering OUT_OF_ORDER_SEQUENCE_NUMBER, before it
    applies them, to the next one or two batches of a partition, once or twice before
    ``heal_at``: what a leader that lost or skipped the partition's last batches answers
    (an unclean election, a truncated log). Unless an earlier failure of the partition
    explains it, the batch fails with that answer and the producer starts a new epoch
    for the batches behind it (``BrokerProducer._handle_partition``)."""
    events = list(schedule.events)
    start = max(schedule.topic_at, 0.0)  # (a late topic has no partitions before)
    for _ in range(rng.randint(1, 2)):
        at = round(rng.uniform(start, max(start, schedule.heal_at)), 4)
        events.append(Event(at, "error", partition=rng.randrange(schedule.partitions),
                            code=int(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
                            count=rng.randint(1, 2)))
    return replace(schedule, events=tuple(sorted(events, key=lambda e: e.at)))


def sticky_edge(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with every keyless, unpinned record of one value size and
    ``batch_bytes`` exactly ``k`` of their size bounds, or one byte more: the sticky
    partitioner's count of a partition's bytes lands on ``batch_bytes`` itself (the
    record reaching it is the partition's last) or one byte short of it (one more
    record goes there), so K1 judges both sides of the edge."""
    from pipeline.protocol.records import batch_size_for_record

    if schedule.partitions < 2:
        return schedule
    size = rng.choice((0, 5, 20))
    bound = batch_size_for_record(None, b"x" * size)
    sends = tuple(replace(s, size=size) if s.key is None and s.partition is None else s
                  for s in schedule.sends)
    return with_options(replace(schedule, sends=sends),
                        batch_bytes=rng.randint(2, 5) * bound + rng.choice((0, 1)))


def impatient(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with some of its ``send()`` calls impatient: ``send_nowait()``
    (refused at once with BufferFullError when the buffer or the intake is full), or
    ``send()`` under a user's timeout (cancelled while it waits: it must leave no
    trace), in a small buffer and, half the time, a one-slot intake, so they wait."""
    sends = []
    for s in schedule.sends:
        if s.via == "send":
            roll = rng.random()
            if roll < 0.3:
                s = replace(s, via="timed", within=rng.choice((0.0, 0.002, 0.05, 0.3)))
            elif roll < 0.5:
                s = replace(s, via="nowait")
        sends.append(s)
    return with_options(replace(schedule, sends=tuple(sends)),
                        buffer_memory=2 * schedule.max_message_bytes,
                        channel_capacity=rng.choice((1, schedule.option("channel_capacity"))))


def late_topic(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with its topic created up to one and a half delivery timeouts after
    the producer opens (before ``heal_at`` and the close): the sends before it wait for the topic's
    metadata, and the first ones expire meanwhile. The faults before it go (they
    would name partitions the topic does not have yet)."""
    latest = min(1.5 * schedule.option("delivery_timeout"), schedule.heal_at,
                 schedule.close_at - 0.05)
    at = round(rng.uniform(0.05, latest), 3)
    if at >= latest:
        return schedule
    return replace(schedule, topic_at=at,
                   events=tuple(e for e in schedule.events if e.at >= at))


def bulked(schedule: Schedule, rng: random.Random) -> Schedule:
    """``schedule`` with each of its send() loops, one time in three, made one
    ``send_many()`` of the same messages, and one in three one ``send_batch()``: calls
    big enough for their columnar paths (``COLUMNS_MIN`` messages and more), with a
    loop's few keyed and pinned messages among them."""
    pick: dict[tuple[int, float], str] = {}
    sends = []
    for s in schedule.sends:
        if s.via == "loop":
            via = pick.setdefault((s.source, s.at), rng.choice(("loop", "many", "batch")))
            if via != "loop":
                s = replace(s, via=via, columns=False, wait=False, callback=False)
        sends.append(s)
    return replace(schedule, sends=tuple(sends))


def schedules(seed: int, n: int, mode: str = "both") -> Iterator[Schedule]:
    for i in range(n):
        yield schedule_for(seed + i, mode)


# One schedule in TXN_EVERY of the teeth's sweep (``make mutants-explore``) is the
# transactions workload's: the stages' transactional branches are judged too.
TXN_EVERY = 10


def teeth_schedule(seed: int, i: int) -> Schedule:
    """Schedule ``i`` of the teeth's sweep from ``seed``: ``schedule_for(seed + i)``, or
    every ``TXN_EVERY``-th, ``txn_schedule_for(seed + i)``."""
    from .txn_schedule import txn_schedule_for

    if i % TXN_EVERY == TXN_EVERY - 1:
        return txn_schedule_for(seed + i)
    return schedule_for(seed + i)
