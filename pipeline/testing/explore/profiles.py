"""Targeted schedules: generators that put the protocol in the states its guards exist for.

The plain generator (`schedule.generate`) draws every time from a continuous
range, so two things rarely happen at one virtual instant; but the retry-ordering
protocol's guards matter exactly when they do: an answer bounces a partition
while fresh messages are on their way to it, a leader moves before a chaser is
back, a second failure lands while the first one's retries are queued. Here
every time is a multiple of one *quantum* (sends, faults, answers delayed by a
slow broker, backoffs, lingers), so answers, bounces, backoff ends and sends
collide at the same instants, and trio's seeded scheduler picks how their steps
interleave (each scheduler pass one task step).

Each *profile* aims at one family of states (docs/testing.md, "Which schedules
reach which guard"):

* ``pipelined``: several batches of a partition in flight at a slow leader when
  one fails, the leader moving right after, a stream of sends throughout;
* ``chaser``: repeated failures (retries at two levels at once), leaders moving
  back and forth, sends arriving while a chaser is out;
* ``epoch``: idempotent, pipelined batches with lost answers, answers after the
  append, in-flight expiries, forgotten producer state and fencing: epoch bumps
  and new producer ids with batches queued behind them;
* ``give-up``: few retries, short delivery timeouts, stopped leaders: give-ups,
  expiries of held-back messages, leaving a broker producer with a chaser;
* ``sizes``: the topic's limit below the producer's (KIP-126 splits), batches
  capped by ``max_message_bytes``, acks=0;
* ``expiry``: delivery timeouts running out while a partition's leader is
  offline (messages waiting in the partition stage), at a slow leader (batches
  in flight, several partitions a request), after a bounce, and at the close.

Every profile mixes the send paths (``send()``, with headers, ``send_many()``,
``producer.input``, columnar loops) in one schedule, on both idempotence modes
unless the profile needs one.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pipeline.protocol.errors import ErrorCode

from .schedule import (
    FATAL,
    PID_ERRORS,
    RETRIABLE_AFTER,
    RETRIABLE_BEFORE,
    Event,
    Schedule,
    Send,
    _pick,
    _value_size_for_bound,
)

Profile = Callable[[random.Random, int, str], Schedule]


class _Draft:
    """A schedule being built on a grid of ``q`` seconds."""

    def __init__(self, rng: random.Random, seed: int, mode: str, profile: str,
                 idempotent_share: float = 0.5) -> None:
        self.rng, self.seed, self.profile = rng, seed, profile
        self.idempotent = mode == "on" or (mode == "both" and rng.random() < idempotent_share)
        self.q = rng.choice([0.01, 0.02, 0.05])
        self.brokers = rng.randint(2, 3)
        self.partitions = _pick(rng, [(1, 3), (2, 3), (3, 1)])
        self.leaders = tuple(rng.randrange(self.brokers) for _ in range(self.partitions))
        self.mmb = rng.choice([600, 1200, 4096])
        self.sends: list[Send] = []
        self.events: list[Event] = []
        self.flushes: list[float] = []
        self.sources = rng.randint(1, 3)
        self.options = self._options()
        self.heal_at = self.t(rng.randint(15, 60))
        self.topic_mmb = 0
        self.strict = False
        self.min_isr = 1

    def t(self, k: float) -> float:
        """k quanta, as a virtual time."""
        return round(k * self.q, 6)

    def grid(self, start: float, end: float) -> float:
        """A random grid instant in [start, end)."""
        lo, hi = round(start / self.q), max(round(start / self.q) + 1, round(end / self.q))
        return self.t(self.rng.randrange(lo, hi))

    def _options(self) -> dict[str, object]:
        rng, q = self.rng, self.q
        request_timeout = q * rng.choice([10, 20, 40])
        linger = _pick(rng, [(0.0, 4), (q, 2), (2 * q, 1)])
        backoff = _pick(rng, [(0.0, 2), (q, 3), (2 * q, 2), (5 * q, 1)])
        acks = "all" if self.idempotent else _pick(rng, [("all", 4), (1, 2), (0, 1)])
        return dict(
            acks=acks,
            max_in_flight=_pick(rng, [(1, 1), (2, 2), (3, 2), (5, 3)]),
            linger=linger,
            batch_bytes=rng.choice([self.mmb, 4 * self.mmb, 16384]),
            max_batch_messages=_pick(rng, [(1, 2), (2, 3), (3, 2), (5, 1), (100, 1)]),
            retries=_pick(rng, [(0, 0 if self.idempotent else 1), (1, 1), (2, 1), (5, 1),
                                (2**31 - 1, 5)]),
            retry_backoff=backoff,
            retry_backoff_max=max(backoff, q * rng.choice([4, 10, 30])),
            # No jitter mostly: a jittered backoff ends off the grid.
            retry_backoff_jitter=_pick(rng, [(0.0, 5), (0.2, 1)]),
            request_timeout=round(request_timeout, 6),
            delivery_timeout=round(linger + request_timeout + q * rng.choice([20, 50, 100, 300]),
                                   6),
            close_timeout=round(q * rng.choice([10, 50, 200]), 6),
            max_request_bytes=rng.choice([self.mmb, 2 * self.mmb, 1024 * 1024]),
            buffer_memory=_pick(rng, [(32 * 1024 * 1024, 4), (64 * 1024, 1), (4 * self.mmb, 1)]),
            max_block=5.0,
            # small: a full inbox holds up a hand-off or a chaser
            channel_capacity=_pick(rng, [(1, 2), (2, 2), (16, 1), (1024, 2)]),
            metadata_max_age=_pick(rng, [(300.0, 3), (q * 50, 1)]),
            return_successes=rng.random() < 0.5,
        )

    # -- sends -------------------------------------------------------------------
    def stream(self, start: float, end: float, *, partition: int | None, density: float,
               burst: tuple[int, int] = (1, 4), inputs: int = 1) -> None:
        """Sends at grid instants in [start, end): at each, with probability
        ``density``, a burst (one source's calls in a row, each its own scheduler
        pass) by one path; mostly to ``partition`` (None: keys or no key)."""
        rng = self.rng
        k0, k1 = round(start / self.q), round(end / self.q)
        for k in range(k0, k1):
            if rng.random() >= density:
                continue
            at = self.t(k)
            source = rng.randrange(self.sources)
            via = _pick(rng, [("send", 6), ("headers", 1), ("many", 2), ("batch", 1),
                              ("input", inputs), ("loop", 1)])
            n = rng.randint(*burst) if via != "loop" else rng.randint(20, 50)
            for _ in range(n):
                p, key = partition, None
                if p is None or rng.random() < 0.15:
                    if rng.random() < 0.5:
                        p = rng.randrange(self.partitions)
                    else:
                        p, key = None, f"k{source}-{rng.randrange(6)}"
                if via == "loop" and rng.random() < 0.9:
                    p, key = None, None  # a columnar loop's common call
                size = rng.choice([0, 5, 20, 60, 200]) if via != "loop" else rng.choice([0, 20])
                if rng.random() < 0.03:
                    size = _value_size_for_bound(self.mmb + rng.randint(-3, 3), key)
                self.sends.append(Send(at, source, size, p, key, via,
                                       columns=via == "loop" and rng.random() < 0.5,
                                       wait=via == "loop" and rng.random() < 0.3,
                                       callback=via == "loop" and rng.random() < 0.3))

    # -- faults ------------------------------------------------------------------
    def event(self, at: float, kind: str, **fields: object) -> None:
        self.events.append(Event(at, kind, **fields))  # type: ignore[arg-type]

    def other(self, node: int) -> int:
        return (node + 1 + self.rng.randrange(max(self.brokers - 1, 1))) % self.brokers

    def retriable(self) -> int:
        return int(self.rng.choice(RETRIABLE_BEFORE))

    def build(self, *, close_at: float | None = None, abort: float = 0.08) -> Schedule:
        rng = self.rng
        options = self.options
        settle = float(options["delivery_timeout"]) + float(options["request_timeout"])  # type: ignore[arg-type]
        if close_at is None:
            if rng.random() < 0.25:
                close_at = self.grid(self.t(5), self.heal_at)
            else:
                close_at = round(self.heal_at + 2 * settle + rng.uniform(0.5, 2.0), 3)
                # a last stream after healing (the liveness window, L1)
                self.stream(self.heal_at + settle, close_at, partition=None, density=0.02)
        for _ in range(_pick(rng, [(0, 3), (1, 2), (2, 1)])):
            self.flushes.append(self.grid(0, close_at))
        self.events.sort(key=lambda e: e.at)
        sends = sorted(self.sends, key=lambda s: s.at)
        return Schedule(
            seed=self.seed,
            idempotent=self.idempotent,
            brokers=self.brokers,
            partitions=self.partitions,
            leaders=self.leaders,
            options=tuple(sorted(options.items())),
            sends=tuple(sends),
            events=tuple(self.events),
            flushes=tuple(sorted(self.flushes)),
            heal_at=self.heal_at,
            close_at=close_at,
            max_message_bytes=self.mmb,
            abort=rng.random() < abort,
            topic_max_message_bytes=self.topic_mmb,
            strict_unknown_producer=self.strict,
            min_insync_replicas=self.min_isr,
            profile=self.profile,
        )


def pipelined(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Several batches of a partition in flight at a slow leader when one fails."""
    d = _Draft(rng, seed, mode, "pipelined", idempotent_share=0.75)
    d.options["linger"] = 0.0
    d.options["max_in_flight"] = rng.choice([2, 3, 5, 5])
    d.options["max_batch_messages"] = rng.choice([1, 1, 2, 3])
    p = rng.randrange(d.partitions)
    leader = d.leaders[p]
    delay = d.t(rng.choice([1, 2, 3, 5]))
    d.event(0.0, "slow", node=leader, seconds=delay, duration=d.heal_at,
            flag=rng.random() < 0.3)
    for _ in range(rng.randint(1, 3)):
        at = d.grid(d.t(3), d.heal_at)
        code = d.retriable() if rng.random() < 0.85 else int(rng.choice(RETRIABLE_AFTER))
        kind = "error" if code in map(int, RETRIABLE_BEFORE) else "error_after"
        d.event(at, kind, partition=p, code=code, count=rng.randint(1, 2))
        if rng.random() < 0.6:  # the leader moves before (or as) the chaser returns
            to = d.other(leader)
            d.event(round(at + d.t(rng.randint(0, 3)), 6), "move", node=to, partition=p)
            if rng.random() < 0.5:
                d.event(round(at + d.t(rng.randint(1, 8)), 6), "slow", node=to,
                        seconds=delay, duration=d.heal_at, flag=False)
            leader = to
    if rng.random() < 0.3:
        d.event(d.grid(0, d.heal_at), rng.choice(["lost_ack", "drop_request"]), node=leader,
                count=rng.randint(1, 2))
    d.stream(0.0, d.heal_at, partition=p, density=0.4)
    if d.partitions > 1:
        d.stream(0.0, d.heal_at, partition=None, density=0.08)
    return d.build()


def chaser(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Repeated failures and moving leaders while sends keep arriving."""
    d = _Draft(rng, seed, mode, "chaser")
    p = rng.randrange(d.partitions)
    node = d.leaders[p]
    for _ in range(rng.randint(2, 5)):
        at = d.grid(d.t(2), d.heal_at)
        roll = rng.random()
        if roll < 0.45:
            d.event(at, "error", partition=p, code=d.retriable(), count=rng.randint(1, 4))
        elif roll < 0.75:
            node = d.other(node)
            d.event(at, "move", node=node, partition=p)
            if rng.random() < 0.4:  # and straight back
                d.event(round(at + d.t(rng.randint(0, 3)), 6), "move", node=d.other(node),
                        partition=p)
        elif roll < 0.9:
            d.event(at, "slow", node=rng.randrange(d.brokers), seconds=d.t(rng.randint(1, 5)),
                    duration=d.t(rng.randint(5, 30)), flag=rng.random() < 0.5)
        else:
            d.event(at, rng.choice(["lost_ack", "drop_request", "drop_conns"]),
                    node=rng.randrange(d.brokers), count=rng.randint(1, 2))
    d.stream(0.0, d.heal_at, partition=p, density=0.4)
    if d.partitions > 1 and rng.random() < 0.5:
        d.stream(0.0, d.heal_at, partition=None, density=0.15)
    return d.build()


def epoch(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Epoch bumps and new producer ids with pipelined batches behind them."""
    d = _Draft(rng, seed, "on" if mode != "off" else "off", "epoch")
    d.options["max_in_flight"] = rng.choice([3, 5])
    d.options["linger"] = 0.0
    rt = float(d.options["request_timeout"])  # type: ignore[arg-type]
    if rng.random() < 0.5:  # batches expire in flight or waiting
        d.options["delivery_timeout"] = round(rt + d.t(rng.choice([5, 10, 20])), 6)
    p = rng.randrange(d.partitions)
    leader = d.leaders[p]
    d.event(0.0, "slow", node=leader, seconds=d.t(rng.choice([1, 2, 4])), duration=d.heal_at,
            flag=rng.random() < 0.5)
    d.strict = rng.random() < 0.3
    for _ in range(rng.randint(2, 4)):
        at = d.grid(d.t(3), d.heal_at)
        kind = _pick(rng, [("lost_ack", 3), ("drop_request", 2), ("error_after", 2),
                           ("restart", 2), ("fence", 1), ("error", 2), ("pid_error", 1),
                           ("slow", 1)])
        if kind == "restart":
            d.event(at, "stop", node=leader, flag=True)
            d.event(round(at + d.t(rng.randint(1, 10)), 6), "restart", node=leader,
                    flag=rng.random() < 0.7)
        elif kind == "fence":
            # (not OUT_OF_ORDER: one nothing explains is the producer's own gap, G10)
            d.event(at, "error", partition=p, count=1, code=int(rng.choice([
                ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH,
                ErrorCode.PRODUCER_FENCED])))
        elif kind == "error_after":
            d.event(at, kind, partition=p, code=int(rng.choice(RETRIABLE_AFTER)),
                    count=rng.randint(1, 2))
        elif kind == "error":
            code = int(rng.choice(FATAL)) if rng.random() < 0.3 else d.retriable()
            d.event(at, kind, partition=p, code=code, count=rng.randint(1, 2))
        elif kind == "pid_error":
            d.event(at, kind, code=int(rng.choice(PID_ERRORS)), count=rng.randint(1, 3))
        elif kind == "slow":  # longer than the request timeout: answers lost to it
            d.event(at, "slow", node=leader, seconds=round(rt + d.t(rng.randint(1, 5)), 6),
                    duration=d.t(rng.randint(2, 10)), flag=rng.random() < 0.5)
        else:
            d.event(at, kind, node=leader, count=rng.randint(1, 3))
    d.stream(0.0, d.heal_at, partition=p, density=0.5)
    if d.partitions > 1:
        d.stream(0.0, d.heal_at, partition=None, density=0.1)
    return d.build()


def give_up(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Give-ups: retries and delivery timeouts running out, leaders gone."""
    d = _Draft(rng, seed, mode, "give-up")
    d.options["retries"] = rng.choice([0, 0, 1, 2]) if not d.idempotent else rng.choice([1, 2])
    rt = float(d.options["request_timeout"])  # type: ignore[arg-type]
    d.options["delivery_timeout"] = round(float(d.options["linger"]) + rt  # type: ignore[arg-type]
                                          + d.t(rng.choice([5, 10, 30])), 6)
    if rng.random() < 0.3:
        d.min_isr = 2
    p = rng.randrange(d.partitions)
    leader = d.leaders[p]
    for _ in range(rng.randint(2, 5)):
        at = d.grid(d.t(2), d.heal_at)
        kind = _pick(rng, [("error", 4), ("move", 3), ("stop", 2), ("drop_conns", 1),
                           ("slow", 2), ("stale", 1)])
        if kind == "error":
            d.event(at, kind, partition=p, count=rng.randint(1, 4),
                    code=int(rng.choice(FATAL)) if rng.random() < 0.15 else d.retriable())
        elif kind == "move":
            leader = d.other(leader)
            d.event(at, kind, node=leader, partition=p)
        elif kind == "stop":
            d.event(at, kind, node=leader, flag=rng.random() < 0.5)
            d.event(round(at + d.t(rng.randint(2, 30)), 6), "restart", node=leader,
                    flag=rng.random() < 0.3)
        elif kind == "slow":
            d.event(at, kind, node=leader, seconds=round(rt * rng.choice([0.5, 1.5]), 6),
                    duration=d.t(rng.randint(2, 20)), flag=rng.random() < 0.5)
        elif kind == "stale":
            d.event(at, kind, node=rng.randrange(d.brokers), duration=d.t(rng.randint(5, 40)))
        else:
            d.event(at, kind, node=leader)
    d.stream(0.0, d.heal_at, partition=p, density=0.35)
    if d.partitions > 1 and rng.random() < 0.5:
        d.stream(0.0, d.heal_at, partition=None, density=0.1)
    return d.build()


def sizes(rng: random.Random, seed: int, mode: str) -> Schedule:
    """The broker's limit below the producer's (KIP-126 splits), capped batches, acks=0."""
    d = _Draft(rng, seed, mode, "sizes")
    d.options["batch_bytes"] = rng.choice([4 * d.mmb, 16384])
    d.options["max_batch_messages"] = 100
    d.options["linger"] = d.t(rng.choice([1, 2, 5]))
    if rng.random() < 0.7:
        d.topic_mmb = d.mmb // rng.choice([2, 3])
    p = rng.randrange(d.partitions)
    for _ in range(rng.randint(0, 3)):
        at = d.grid(d.t(2), d.heal_at)
        if rng.random() < 0.5:
            d.event(at, "error", partition=p, code=d.retriable(), count=rng.randint(1, 2))
        else:
            d.event(at, "move", node=d.other(d.leaders[p]), partition=p)
    d.stream(0.0, d.heal_at, partition=p, density=0.4, burst=(2, 6))
    return d.build()


def expiry(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Messages outliving their delivery timeout while their partition cannot
    deliver them: waiting in the partition stage while its leader is offline
    (a broker stopped without an election, for longer than the timeout), in
    flight at a leader slower than what is left of it (several partitions of
    one request, expiring at different times), bounced back while expired, and
    still there at the close."""
    d = _Draft(rng, seed, mode, "expiry", idempotent_share=0.65)
    rt = float(d.options["request_timeout"])  # type: ignore[arg-type]
    linger = float(d.options["linger"])  # type: ignore[arg-type]
    dt = round(linger + rt + d.t(rng.choice([1, 2, 5, 10, 20])), 6)
    d.options["delivery_timeout"] = dt
    # one request at a time at a slow leader: the batches behind it are sent
    # late, and their deadlines come while they are in flight
    d.options["max_in_flight"] = rng.choice([1, 1, 2, 5])
    leader = rng.randrange(d.brokers)
    if rng.random() < 0.7:  # one broker leads all: requests carry several partitions
        d.leaders = (leader,) * d.partitions
    p = rng.randrange(d.partitions)
    leader = d.leaders[p]
    if rng.random() < 0.85:  # answers slower than what is left of the batches sent late
        d.event(0.0, "slow", node=leader, seconds=round(rt * rng.choice([0.6, 0.8, 0.95]), 6),
                duration=d.heal_at, flag=rng.random() < 0.5)
    for _ in range(rng.randint(1, 3)):
        at = d.grid(d.t(2), d.heal_at)
        kind = _pick(rng, [("offline", 3), ("slow", 4), ("error", 2), ("stale", 1),
                           ("drop", 2)])
        if kind == "offline":  # no leader for longer than the timeout, or a bit less
            d.event(at, "stop", node=leader, flag=False)
            back = round(at + dt * rng.choice([0.5, 1.0, 1.5, 3.0]), 6)
            if back < d.heal_at or rng.random() < 0.5:
                d.event(min(back, d.heal_at), "restart", node=leader, flag=rng.random() < 0.3)
        elif kind == "slow":  # answers arriving around the batches' deadlines
            d.event(at, "slow", node=leader, seconds=round(rt * rng.choice([0.5, 0.9, 1.5]), 6),
                    duration=round(dt * rng.choice([1.0, 2.0]), 6), flag=rng.random() < 0.5)
        elif kind == "error":  # bounced back with their deadline near
            d.event(at, "error", partition=p, code=d.retriable(), count=rng.randint(1, 4))
        elif kind == "stale":
            d.event(at, "stale", node=rng.randrange(d.brokers), duration=round(dt, 6))
        else:  # requests never applied: an expired one leaves a gap in the sequences
            d.event(at, "drop_request", node=leader, count=rng.randint(1, 3))
    d.stream(0.0, d.heal_at, partition=p, density=0.4)
    if d.partitions > 1:
        d.stream(0.0, d.heal_at, partition=None, density=0.2)
    # Half the time the close comes in the middle of it all (a third of those
    # without a flush): what waits and what is in flight meets the close.
    close_at = d.grid(d.t(5), d.heal_at) if rng.random() < 0.5 else None
    return d.build(close_at=close_at, abort=0.3)


def slot_wait(rng: random.Random, seed: int, mode: str) -> Schedule:
    """Produce requests waiting for a connection's request slot while a metadata
    request holds it: one broker leads every partition, one request at a time
    (``max_in_flight`` 1), its answers come late (Metadata's too), metadata is
    refreshed often, and a batch's delivery timeout is shorter than two slow answers.
    A request drained behind the metadata request waits for the slot until the first
    deadline of what it carries; if that comes first, its batches go back to their
    queues unwritten (``Accumulator.unsend``) and expire there, on time."""
    d = _Draft(rng, seed, mode, "slot-wait")
    d.brokers, d.leaders = 1, (0,) * d.partitions
    rt = float(d.options["request_timeout"])  # type: ignore[arg-type]
    linger = float(d.options["linger"])  # type: ignore[arg-type]
    d.options["max_in_flight"] = 1
    d.options["metadata_max_age"] = d.t(rng.choice([2, 4, 8]))
    d.options["delivery_timeout"] = round(linger + rt + d.t(rng.choice([1, 2, 4, 8])), 6)
    d.event(0.0, "slow", node=0, seconds=round(rt * rng.choice([0.5, 0.7, 0.9]), 6),
            duration=d.heal_at, flag=rng.random() < 0.5)
    for _ in range(rng.randint(0, 2)):  # refreshes asked for by errors, too
        d.event(d.grid(0, d.heal_at), "error", partition=rng.randrange(d.partitions),
                code=d.retriable(), count=rng.randint(1, 2))
    d.stream(0.0, d.heal_at, partition=None, density=0.5)
    # and after healing, in the liveness window (L1): a slot or a partition left taken
    # by a request that went back would hold these up for good
    settle = float(d.options["delivery_timeout"]) + rt  # type: ignore[arg-type]
    after = round(d.heal_at + settle, 6)
    d.stream(after, after + d.t(30), partition=None, density=0.3)
    return d.build(close_at=round(after + d.t(30) + 2 * settle, 6), abort=0.1)


PROFILES: dict[str, tuple[Profile, int]] = {
    "pipelined": (pipelined, 3),
    "chaser": (chaser, 3),
    "epoch": (epoch, 2),
    "give-up": (give_up, 2),
    "sizes": (sizes, 1),
}
# Profiles drawn on a roll of their own (a share of the targeted seeds), so that
# adding one leaves every other seed's schedule as it was.
EXTRA: dict[str, tuple[Profile, float]] = {
    "expiry": (expiry, 0.18),
    "slot-wait": (slot_wait, 0.12),
}


def targeted(seed: int, mode: str = "both", profile: str | None = None) -> Schedule:
    """A schedule of one profile (drawn from the seed unless named)."""
    rng = random.Random(seed * 7919 + 17)
    if profile in EXTRA:
        return EXTRA[profile][0](rng, seed, mode)
    if profile is None:
        roll = random.Random(seed * 6151 + 29).random()
        for fn, share in EXTRA.values():
            if roll < share:
                return fn(rng, seed, mode)
            roll -= share
    name = profile or _pick(rng, [(n, w) for n, (_, w) in PROFILES.items()])
    return PROFILES[name][0](rng, seed, mode)
