"""Fault schedules: what the explorer runs, as plain data.

A `Schedule` is everything one run depends on: the cluster's shape, the
producer's options, the messages sent (when, by which source, with which
key or partition, how big) and the faults (when, which, where). It is a
frozen value: `generate(seed, mode)` builds one from a seed, the shrinker
builds smaller ones from it, and `to_json`/`from_json` keep one as a
regression test. Running it (`runner.run_schedule`) is deterministic: the
same schedule always gives the same trace.

Times are virtual seconds on trio's MockClock. Faults happen in
``[0, heal_at)``; at ``heal_at`` every fault is removed and every stopped
broker restarted, so the cluster is healthy from then on. ``close_at`` may
come before ``heal_at`` (shutdown in the middle of retries) or after it.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline.protocol.errors import ErrorCode

TOPIC = "t"

# Faults, by `Event.kind`:
#   move         partition's leadership to `node` (ping-pong and moves back to a
#                broker that was slow come from sequences of these)
#   error        the next `count` Produce requests touching `partition` get `code`,
#                not applied (NOT_LEADER without a move = stale leader, ...)
#   error_after  the same, but applied first (NOT_ENOUGH_REPLICAS_AFTER_APPEND,
#                REQUEST_TIMED_OUT: the batch is in the log, the answer an error)
#   incomplete   the next `count` Produce requests touching `partition` are applied,
#                then answered without that partition (sweep.incomplete)
#   lost_ack     the next `count` Produce requests to `node` are applied, then the
#                connection closes (the ack is lost)
#   drop_request the next `count` Produce requests to `node` close the connection
#                unapplied
#   drop_conns   every connection to `node` closes now
#   slow         `node` delays its answers by `seconds` for `duration`
#                (`flag`: before applying the request, so it may be applied after
#                the client gave up on it)
#   stale        `node` answers Metadata with the current view for `duration`
#   stop         broker `node` stops (`flag`: elect another leader, else offline)
#   restart      broker `node` comes back (`flag`: its partitions forgot producer state)
#   pid_error    the next `count` InitProducerId requests get `code`
FAULT_KINDS = (
    "move", "error", "error_after", "lost_ack", "drop_request", "drop_conns",
    "slow", "stale", "stop", "restart", "pid_error", "incomplete",
)

RETRIABLE_BEFORE = (
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.CORRUPT_MESSAGE,
)
# What a Kafka produce waiting in purgatory (acks=all) may complete with, the
# batch already in the leader's log: a timeout, the ISR shrinking, the leader
# moving away, its log dir failing.
RETRIABLE_AFTER = (
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.KAFKA_STORAGE_ERROR,
)
FATAL = (ErrorCode.INVALID_RECORD, ErrorCode.POLICY_VIOLATION)
PID_ERRORS = (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR)


@dataclass(frozen=True, slots=True)
class Send:
    """One message: sent at `at` by source `source` (its own task and keys)."""

    at: float
    source: int
    size: int  # value bytes
    partition: int | None = None  # explicit, else the key picks it
    key: str | None = None
    # "send": send()'s fast path; "headers": send() with a header (the general
    # path); "many": send_many() with the source's other "many" sends at `at`;
    # "batch": send_batch() of the same as rows (values, keys, partitions lists);
    # "input": put on producer.input (outcomes read from producer.errors/successes);
    # "nowait", "timed": send_nowait(), send() under a timeout (sweep.impatient);
    # "loop": send() in one tight loop with the source's other "loop" sends at
    # `at` (mostly no key, no partition, no await between them: a high-rate loop, whose
    # bursts become columnar send() bursts, burst.py); at `close_at`, the
    # loop is the closing task's last act before the close (any source).
    via: str = "send"
    # "loop" only (read from a loop's first send): `columns` forces the loop's
    # first burst columnar; `wait` has another task await each of the loop's
    # deliveries (RowDelivery.__await__) and compare what it returns;
    # `callback` passes on_delivery to two sends of three (a mixed burst).
    columns: bool = False
    wait: bool = False
    callback: bool = False
    # "nowait": send_nowait(); "timed": send() under trio.move_on_after(within)
    # (sweep.impatient); a cancelled call must leave no trace.
    within: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    kind: str
    node: int = -1
    partition: int = -1
    code: int = 0
    count: int = 1
    seconds: float = 0.0
    duration: float = 0.0
    flag: bool = False


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int  # trio's scheduler, the fake's rng and the producer's rng
    idempotent: bool
    brokers: int
    partitions: int
    leaders: tuple[int, ...]
    options: tuple[tuple[str, Any], ...]  # producer options (see `producer_options`)
    sends: tuple[Send, ...]
    events: tuple[Event, ...]
    flushes: tuple[float, ...]
    heal_at: float
    close_at: float
    max_message_bytes: int  # the producer's and the fake broker's limit
    # The producer's block ends at close_at by an exception (a user's error):
    # the close flushes nothing and fails what is left at once with ProducerClosed.
    abort: bool = False
    # The fake cluster's own settings (0 / False / 1: the same as the producer's, Kafka
    # >= 2.5, one in-sync replica is enough): the topic's max.message.bytes below the
    # producer's limit makes the broker refuse batches the producer built (split,
    # KIP-126); strict_unknown_producer answers UNKNOWN_PRODUCER_ID to a producer a
    # partition forgot (Kafka < 2.5); min.insync.replicas above 1 makes a stopped
    # broker cost NOT_ENOUGH_REPLICAS.
    topic_max_message_bytes: int = 0
    strict_unknown_producer: bool = False
    min_insync_replicas: int = 1
    # What the run drives (runner.WORKLOADS): "producer", or "transactions" (a
    # transactional producer: txn_schedule.py).
    workload: str = "producer"
    # The transactions workload's fake cluster: its finalized transaction.version (1 or
    # 2) and the delay of its transaction markers (PrepareCommit / PrepareAbort, when
    # the coordinator answers CONCURRENT_TRANSACTIONS).
    transaction_version: int = 2
    txn_marker_delay: float = 0.0
    # send()'s implementation: "" the default (the C Sender when built), "python"
    # Intake.send, its pure-Python twin (send_path.use).
    send_path: str = ""
    # The producer's partitioner: "default", "murmur2" (librdkafka's), or "custom" (a
    # user's): routing.py.
    partitioner: str = "default"
    # The topic's message.timestamp.type is LogAppendTime: acknowledged records carry
    # the broker's append time (checker A3).
    log_append_time: bool = False
    # A stage's bug simulated at the ledger (runner._instrument): each batch of two or
    # more messages is settled first in part (its first half, with the same answer),
    # then whole. The ledger must count the repeats as settled twice and leave every
    # message the outcome, offset and timestamp one settle gives it (checker O1).
    resettle: bool = False
    # The fake answers idempotent batches as tansu does (a re-sent batch:
    # DUPLICATE_SEQUENCE_NUMBER; an epoch bumped by the producer: PRODUCER_FENCED), and
    # hands out producer ids from this one (Kafka's first is 0).
    tansu_sequences: bool = False
    first_producer_id: int = 1000
    # When the topic is created (0: before the producer opens): until then the topic
    # stage waits for its metadata, and what passes its deadline meanwhile fails.
    topic_at: float = 0.0
    # Which generator made it (sweep.py), for reports; not part of the run.
    profile: str = field(default="", compare=False)
    note: str = field(default="", compare=False)

    def option(self, name: str) -> Any:
        return dict(self.options)[name]

    @property
    def size(self) -> tuple[int, int, int, int]:
        """What shrinking makes smaller: events, messages, partitions, brokers."""
        return (len(self.events), len(self.sends), self.partitions, self.brokers)

    def describe(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.options)
        return (
            f"seed={self.seed} idempotent={self.idempotent} brokers={self.brokers} "
            f"partitions={self.partitions} sends={len(self.sends)} events={len(self.events)} "
            f"flushes={len(self.flushes)} heal_at={self.heal_at} close_at={self.close_at} "
            f"max_message_bytes={self.max_message_bytes}{' abort' if self.abort else ''}"
            f"{f' topic_max_message_bytes={self.topic_max_message_bytes}' if self.topic_max_message_bytes else ''}"
            f"{' strict_unknown_producer' if self.strict_unknown_producer else ''}"
            f"{f' min_insync_replicas={self.min_insync_replicas}' if self.min_insync_replicas > 1 else ''}"
            f"{f' send_path={self.send_path}' if self.send_path else ''}"
            f"{f' partitioner={self.partitioner}' if self.partitioner != 'default' else ''}"
            f"{' log_append_time' if self.log_append_time else ''}"
            f"{' resettle' if self.resettle else ''}"
            f"{' tansu_sequences' if self.tansu_sequences else ''}"
            f"{f' topic_at={self.topic_at}' if self.topic_at else ''}"
            f"{f' first_producer_id={self.first_producer_id}' if self.first_producer_id != 1000 else ''}"
            f"{f' workload={self.workload} transaction_version={self.transaction_version} txn_marker_delay={self.txn_marker_delay}' if self.workload != 'producer' else ''}"
            f"{f' profile={self.profile}' if self.profile else ''} {opts}"
        )


# -- JSON (regression files) -------------------------------------------------

def to_json(schedule: Schedule) -> str:
    data = asdict(schedule)
    data["options"] = dict(schedule.options)
    return json.dumps(data, indent=1, sort_keys=True)


def from_json(text: str) -> Schedule:
    data = json.loads(text)
    data["leaders"] = tuple(data["leaders"])
    data["options"] = tuple(sorted(data["options"].items()))
    data["sends"] = tuple(Send(**s) for s in data["sends"])
    data["events"] = tuple(Event(**e) for e in data["events"])
    data["flushes"] = tuple(data["flushes"])
    return Schedule(**data)


# -- generation ---------------------------------------------------------------

def _pick(rng: random.Random, weighted: list[tuple[Any, int]]) -> Any:
    values, weights = zip(*weighted, strict=True)
    return rng.choices(values, weights)[0]


def _options(rng: random.Random, idempotent: bool, max_message_bytes: int) -> dict[str, Any]:
    linger = rng.choice([0.0, 0.0, 0.002, 0.01, 0.05])
    request_timeout = rng.choice([0.3, 0.5, 1.0, 2.0])
    backoff = rng.choice([0.0, 0.01, 0.05, 0.1])
    options: dict[str, Any] = dict(
        acks="all" if idempotent else rng.choice(["all", 1]),
        max_in_flight=rng.randint(1, 5),
        linger=linger,
        batch_bytes=rng.choice([max_message_bytes // 2, max_message_bytes, 4 * max_message_bytes,
                                16384]),
        max_batch_messages=rng.choice([1, 2, 3, 5, 10, 100]),
        retries=_pick(rng, [(0, 0 if idempotent else 1), (1, 2), (2, 2), (5, 2), (2**31 - 1, 6)]),
        retry_backoff=backoff,
        retry_backoff_max=max(backoff, rng.choice([0.01, 0.1, 0.5])),
        retry_backoff_jitter=rng.choice([0.0, 0.2]),
        request_timeout=request_timeout,
        delivery_timeout=round(linger + request_timeout + rng.choice([0.5, 1.0, 2.0, 5.0, 10.0]), 3),
        close_timeout=rng.choice([0.2, 0.5, 1.0, 3.0, 10.0]),
        max_request_bytes=rng.choice([max_message_bytes, 2 * max_message_bytes, 1024 * 1024]),
        buffer_memory=rng.choice([2 * max_message_bytes, 64 * 1024, 32 * 1024 * 1024]),
        max_block=rng.choice([0.5, 5.0]),
        channel_capacity=rng.choice([1, 2, 16, 1024]),
        metadata_max_age=rng.choice([1.0, 300.0]),
        return_successes=rng.random() < 0.5,
    )
    return options


def _value_size_for_bound(bound: int, key: str | None) -> int:
    """The value length whose single-record batch bound (send()'s size) is `bound`."""
    from pipeline.protocol.records import batch_size_for_record

    kb = key.encode() if key is not None else None
    size = max(0, bound - batch_size_for_record(kb, b""))
    while size > 0 and batch_size_for_record(kb, b"x" * size) > bound:
        size -= 1
    while batch_size_for_record(kb, b"x" * (size + 1)) <= bound:
        size += 1
    return size


def _sends(rng: random.Random, partitions: int, close_at: float, mmb: int) -> list[Send]:
    sources = rng.randint(1, 3)
    n = _pick(rng, [(rng.randint(1, 10), 2), (rng.randint(10, 60), 5), (rng.randint(60, 200), 2)])
    big = rng.random() < 0.3  # some messages right at the size limit
    input_weight = 2 if rng.random() < 0.25 else 0  # some schedules use producer.input
    out: list[Send] = []
    at = 0.0
    for i in range(n):
        # bursts (several sends at one instant) and spread-out sends; a few after close
        if i == 0 or rng.random() < 0.6:
            at = round(rng.uniform(0.0, close_at * 1.05), 4)
        source = rng.randrange(sources)
        if rng.random() < 0.5:
            partition, key = rng.randrange(partitions), None
        else:
            partition, key = None, f"k{source}-{rng.randrange(6)}"
        via = _pick(rng, [("send", 6), ("headers", 1), ("many", 2), ("input", input_weight)])
        if big and rng.random() < 0.3:
            size = _value_size_for_bound(mmb + rng.randint(-4, 4), key)
        else:
            size = rng.choice([0, 1, 5, 20, 60, 200])
        out.append(Send(at, source, size, partition, key, via))
    out.sort(key=lambda s: s.at)
    return out


def _loops(rng: random.Random, sources: int, close_at: float, mmb: int,
           abort: bool, batch_messages: int, partitions: int) -> list[Send]:
    """High-rate send() loops: 70-300 messages each, small values, no key or
    partition (the columnar send() path's calls). Drawn after everything else,
    so a schedule without loops is the one this seed always gave."""
    # In one schedule of five, mostly one loop, sizes skewed small (mean ~150):
    # a loop costs what its batches cost (max_batch_messages=1: one request per
    # message), and the CI sweep's time is kept about the same.
    if rng.random() >= 0.2:
        return []
    out: list[Send] = []
    for _ in range(_pick(rng, [(1, 5), (2, 2), (3, 1)])):
        # Sometimes at close_at: the closing task's own last act (runner), so the
        # close finds its burst still in the intake, never taken by the
        # dispatcher (the close seals it; without a flush: Schedule.abort).
        last = rng.random() < (0.5 if abort else 0.15)
        at = close_at if last else round(rng.uniform(0.0, close_at * 1.05), 4)
        source = rng.randrange(sources)
        # Forced for half of the loops: a producer's first loop is messages (no
        # burst of >= COLUMNS_MIN was taken yet) and most schedules have one loop.
        columns = rng.random() < 0.5
        wait = rng.random() < 0.3
        callback = rng.random() < 0.3
        # A few keyed or pinned calls inside a third of the loops: per-message
        # calls between columnar bursts of one task (each must close the burst
        # ahead of it, or a later row would overtake it).
        mixed = 0.05 if rng.random() < 0.3 else 0.0
        sizes = rng.choice([(0,), (0, 5, 20), (20, 60)])
        big = rng.random() < 0.1  # one row right at the size limit (S1 on the row path)
        n = 70 + int(230 * rng.random() ** 2)
        if batch_messages <= 3:
            n = min(n, 100)  # a request per 1-3 rows: 100 make as many runs, at a third the cost
        at_big = rng.randrange(n) if big else -1
        for i in range(n):
            size = (_value_size_for_bound(mmb + rng.randint(-2, 2), None) if i == at_big
                    else rng.choice(sizes))
            key, partition = None, None
            if rng.random() < mixed:
                if rng.random() < 0.5:
                    key = f"k{source}-{rng.randrange(6)}"
                else:
                    partition = rng.randrange(partitions)
            out.append(Send(at, source, size, partition, key, via="loop", columns=columns,
                            wait=wait, callback=callback))
    return out


# How often each fault kind is drawn (`_events`); a swarm schedule keeps a subset.
FAULT_WEIGHTS = {
    "move": 6, "error": 5, "error_after": 2, "lost_ack": 3, "drop_request": 2,
    "drop_conns": 2, "slow": 3, "stale": 2, "stop": 2, "pid_error": 1,
}


def _events(rng: random.Random, s_brokers: int, partitions: int, heal_at: float,
            idempotent: bool, kinds: frozenset[str] | None = None) -> list[Event]:
    events: list[Event] = []
    n = rng.randint(0, 12)
    stopped: set[int] = set()
    slow: list[int] = []
    weights = [(k, w if (kinds is None or k in kinds) and (k != "pid_error" or idempotent)
                else 0) for k, w in FAULT_WEIGHTS.items()]
    if not any(w for _, w in weights):
        return events

    def when() -> float:
        return round(rng.uniform(0, heal_at), 4)

    for _ in range(n):
        kind = _pick(rng, weights)
        at = when()
        node = rng.randrange(s_brokers)
        p = rng.randrange(partitions)
        if kind == "move":
            to = rng.choice(slow) if slow and rng.random() < 0.5 else node
            events.append(Event(at, "move", node=to, partition=p))
            if rng.random() < 0.3:  # ping-pong: away and straight back
                other = (to + 1 + rng.randrange(max(s_brokers - 1, 1))) % s_brokers
                back = round(at + rng.choice([0.0, 0.01, 0.1, 0.5]), 4)
                events.append(Event(back, "move", node=other, partition=p))
                events.append(Event(round(back + rng.choice([0.0, 0.05, 0.3]), 4), "move",
                                    node=to, partition=p))
        elif kind == "error":
            code = rng.choice(FATAL) if rng.random() < 0.1 else rng.choice(RETRIABLE_BEFORE)
            events.append(Event(at, "error", partition=p, code=int(code), count=rng.randint(1, 4)))
        elif kind == "error_after":
            events.append(Event(at, "error_after", partition=p,
                                code=int(rng.choice(RETRIABLE_AFTER)), count=rng.randint(1, 2)))
        elif kind in ("lost_ack", "drop_request"):
            events.append(Event(at, kind, node=node, count=rng.randint(1, 3)))
        elif kind == "drop_conns":
            events.append(Event(at, kind, node=node))
        elif kind == "slow":
            slow.append(node)
            events.append(Event(at, "slow", node=node, seconds=rng.choice([0.05, 0.3, 1.0, 3.0]),
                                duration=rng.choice([0.1, 0.5, 2.0]), flag=rng.random() < 0.5))
        elif kind == "stale":
            events.append(Event(at, "stale", node=node, duration=rng.choice([0.2, 1.0, 3.0])))
        elif kind == "stop" and len(stopped) < s_brokers - 1:
            stopped.add(node)
            events.append(Event(at, "stop", node=node, flag=rng.random() < 0.7))
            if rng.random() < 0.7:
                back = round(min(at + rng.choice([0.05, 0.3, 1.0]), heal_at), 4)
                events.append(Event(back, "restart", node=node, flag=rng.random() < 0.3))
        elif kind == "pid_error":
            events.append(Event(at, "pid_error", code=int(rng.choice(PID_ERRORS)),
                                count=rng.randint(1, 3)))
    events.sort(key=lambda e: e.at)
    return events


def generate(seed: int, mode: str = "both", kinds: frozenset[str] | None = None) -> Schedule:
    """The schedule for `seed`; `mode` "on"/"off" fixes idempotence, "both" draws it.
    `kinds` keeps only those fault kinds (swarm testing: each schedule a subset,
    so a rare combination is not drowned by the others)."""
    rng = random.Random(seed)
    idempotent = mode == "on" or (mode == "both" and rng.random() < 0.5)
    brokers = rng.randint(2, 4)
    partitions = rng.randint(1, 4)
    leaders = tuple(rng.randrange(brokers) for _ in range(partitions))
    mmb = rng.choice([300, 600, 1200, 4096])
    options = _options(rng, idempotent, mmb)
    heal_at = round(rng.uniform(0.5, 6.0), 3)
    settle = options["delivery_timeout"] + options["request_timeout"]
    if rng.random() < 0.35:
        close_at = round(rng.uniform(0.1, heal_at), 3)  # shutdown in the middle of the faults
    else:
        # late enough for L1: a window of sends after everything older settled
        close_at = round(heal_at + 2 * settle + rng.uniform(0.5, 3.0), 3)
    sends = _sends(rng, partitions, close_at, mmb)
    events = _events(rng, brokers, partitions, heal_at, idempotent, kinds)
    flushes = tuple(sorted(round(rng.uniform(0, close_at), 3) for _ in range(rng.randint(0, 3))))
    abort = rng.random() < 0.1
    loops = _loops(rng, 1 + max((s.source for s in sends), default=0), close_at, mmb, abort,
                   options["max_batch_messages"], partitions)
    sends = sorted(sends + loops, key=lambda s: s.at)  # (stable: a loop stays in order)
    return Schedule(
        seed=seed,
        idempotent=idempotent,
        brokers=brokers,
        partitions=partitions,
        leaders=leaders,
        options=tuple(sorted(options.items())),
        sends=tuple(sends),
        events=tuple(events),
        flushes=flushes,
        heal_at=heal_at,
        close_at=close_at,
        max_message_bytes=mmb,
        abort=abort,
    )


def with_options(schedule: Schedule, **changes: Any) -> Schedule:
    options = dict(schedule.options)
    options.update(changes)
    return replace(schedule, options=tuple(sorted(options.items())))
