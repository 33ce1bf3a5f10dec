"""Fault plans: generated from a seed alone, printed, replayable.

A :class:`Plan` is everything a chaos run does to the cluster and the network, on a
timeline relative to the moment the client under test is ready (connected, first message
acknowledged). It is a pure function of the seed (:func:`make_plan`): no clock, no
cluster state. What the plan cannot know in advance (which node leads partition 3 when a
step fires) is resolved when the step runs and recorded in the run's event log.

Two lanes run side by side:

* the **cluster lane** (``kill-leader``, ``sigterm``, ``move-leader``): one step at a
  time, each at its planned time or when the previous one finished, whichever is later,
  so at most one node is ever down (RF=3, ``min.insync.replicas=2`` and the 3-voter KRaft
  quorum each tolerate one failure);
* the **network lane** (``conn-kills``, ``kill-all``, ``lost-responses``, ``stall``):
  every step at its planned time, through the FaultProxy in front of each node.

Families (``seed`` picks one, in turn) give every kind of fault a primary role in some
schedules; each plan adds one or two network faults on top, so schedules mix. The
``stall`` and ``mixed`` schedules end with the client closing while every node is
blackholed (``close_under_stall``): close must still return within its bound. Seeds
15-21 (every third round of seven) run with tight timeouts (request 3 s, delivery 8 s)
and add one node blackholed for longer than ``delivery_timeout``: the batches of the
partitions it leads fail, and the idempotent producer must recover (new epoch or producer
id) without gaps, duplicates or reordering.

**Transactional schedules** (seeds from ``TXN_FIRST_SEED``, :func:`make_plan` gives
them too): the clients write every message inside a transaction of ``txn_size``
messages (``chaoslab.txn_worker``), and the faults aim at transactions as well: SIGKILL
of the transaction coordinator's node (``kill-coordinator``), leadership moves of its
``__transaction_state`` partition (``move-coordinator``) and of the data partitions,
lost EndTxn answers (``lost-responses`` with ``api="END_TXN"``: the commit was
applied, its answer never arrives), stalls of the coordinator's node past
``request_timeout``. The coordinator is whichever node FindCoordinator names when the
step runs (``target="coordinator"``).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ACTIONS", "CLUSTER_ACTIONS", "FAMILIES", "TXN_ACTIONS", "TXN_FAMILIES",
           "TXN_FIRST_SEED", "Plan", "Step", "make_plan"]

FAMILIES = ("kill-leader", "sigterm", "move-leader", "conn-kills", "lost-responses", "stall",
            "mixed")
CLUSTER_ACTIONS = frozenset({"kill-leader", "sigterm", "move-leader"})
NETWORK_ACTIONS = frozenset({"conn-kills", "kill-all", "lost-responses", "stall"})
ACTIONS = CLUSTER_ACTIONS | NETWORK_ACTIONS

#: Seeds from here on are transactional schedules, one family after the other.
TXN_FIRST_SEED = 101
TXN_FAMILIES = ("txn-kill-coordinator", "txn-kill-leader", "txn-move", "txn-lost-commits",
                "txn-stall", "txn-mixed")
#: Cluster actions of the transactional schedules only (they need the transactional id).
TXN_CLUSTER_ACTIONS = frozenset({"kill-coordinator", "move-coordinator"})
TXN_ACTIONS = ACTIONS | TXN_CLUSTER_ACTIONS
#: Apis whose responses a ``lost-responses`` step may lose.
LOSABLE_APIS = ("PRODUCE", "END_TXN", "ADD_PARTITIONS_TO_TXN")

PARTITIONS = 6
NODES = (1, 2, 3)
# Timeouts (seconds) the clients run with: (request, delivery, close).
NORMAL_TIMEOUTS = (5.0, 60.0, 8.0)
TIGHT_TIMEOUTS = (3.0, 8.0, 8.0)
# The transactional clients': delivery below the transaction timeout (librdkafka requires
# message.timeout.ms <= transaction.timeout.ms), which is short enough that a
# transaction the coordinator must time out is aborted within the schedule.
TXN_TIMEOUTS = (5.0, 15.0, 8.0)
TXN_TIMEOUT = 20.0
TXN_SIZE = 200


@dataclass(frozen=True, slots=True)
class Step:
    """One fault. ``at``: seconds after the client is ready (planned start).

    * ``kill-leader``: SIGKILL the leader of ``partition``; restart it ``seconds`` later.
    * ``sigterm``: SIGTERM ``node`` (controlled shutdown); start it ``seconds`` later.
    * ``move-leader``: make the node ``shift`` places after the current leader of
      ``partition`` (in 1, 2, 3 order, wrapping) its leader.
    * ``conn-kills``: for ``seconds``, every proxied connection (of ``node``, or all
      nodes when None) dies after a random lifetime in ``lifetimes``.
    * ``kill-all``: close every proxied connection (of ``node``, or all) now.
    * ``lost-responses``: over ``seconds``, lose ``count`` Produce responses (of ``node``
      or any): the broker applied the request, the client never hears of it.
    * ``stall``: blackhole ``node`` (or all) for ``seconds`` (longer than the request
      timeout): requests sit unanswered until the client times them out.
    * ``kill-coordinator``: SIGKILL the transaction coordinator's node; restart it
      ``seconds`` later.
    * ``move-coordinator``: move the leadership of the transactional id's
      ``__transaction_state`` partition ``shift`` nodes on: the coordinator moves.

    ``api``: the requests whose responses ``lost-responses`` loses (an ``ApiKey`` name).
    ``target="coordinator"``: the step's node is the transaction coordinator's, looked
    up when it runs (``lost-responses``, ``stall``).
    """

    at: float
    action: str
    partition: int | None = None
    node: int | None = None
    shift: int = 0
    seconds: float = 0.0
    count: int = 0
    lifetimes: tuple[float, float] | None = None
    api: str = "PRODUCE"
    target: str = ""

    @property
    def lane(self) -> str:
        return ("cluster" if self.action in CLUSTER_ACTIONS | TXN_CLUSTER_ACTIONS
                else "network")

    def describe(self) -> str:
        where = ("the coordinator's node" if self.target == "coordinator"
                 else "every node" if self.node is None else f"node {self.node}")
        match self.action:
            case "kill-leader":
                what = (f"SIGKILL the leader of p{self.partition}, restart it after "
                        f"{self.seconds:.1f}s")
            case "sigterm":
                what = f"SIGTERM node {self.node}, start it after {self.seconds:.1f}s"
            case "move-leader":
                what = f"move p{self.partition}'s leadership {self.shift} node(s) on"
            case "conn-kills":
                lo, hi = self.lifetimes or (0.0, 0.0)
                what = (f"kill {where}'s connections after {lo:.2f}-{hi:.2f}s lifetimes, "
                        f"for {self.seconds:.1f}s")
            case "kill-all":
                what = f"kill {where}'s connections once"
            case "lost-responses":
                api = "Produce" if self.api == "PRODUCE" else self.api
                what = f"lose {self.count} {api} responses of {where} over {self.seconds:.1f}s"
            case "kill-coordinator":
                what = (f"SIGKILL the transaction coordinator's node, restart it after "
                        f"{self.seconds:.1f}s")
            case "move-coordinator":
                what = f"move the transaction coordinator {self.shift} node(s) on"
            case "stall":
                what = f"blackhole {where} for {self.seconds:.1f}s"
            case _:
                what = self.action
        return f"t+{self.at:5.1f}s  {self.lane:<7}  {what}"


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    family: str
    steps: tuple[Step, ...]
    request_timeout: float
    delivery_timeout: float
    close_timeout: float
    rate: int = 1000  # messages per second, paced, for the whole run
    # ... sent in bursts every `burst` seconds, into batches of at most `batch_bytes`
    # (every client): each burst is several batches per partition, so requests pipeline
    # (up to 5 in flight per partition) and a fault hits batches queued behind others.
    burst: float = 0.5
    batch_bytes: int = 4096
    tail: float = 8.0  # seconds of sending after the faults are healed
    keys: int = 60  # distinct keys (each key lands on one partition)
    partitions: int = PARTITIONS
    # After the tail: blackhole every node, then close (the close bound must hold).
    close_under_stall: bool = False
    # Transactional schedules: every message in a transaction of txn_size messages.
    transactional: bool = False
    txn_size: int = 0
    transaction_timeout: float = 0.0

    @property
    def tight(self) -> bool:
        return self.delivery_timeout < NORMAL_TIMEOUTS[1]

    def lines(self) -> list[str]:
        head = (f"schedule seed={self.seed} family={self.family}: request_timeout="
                f"{self.request_timeout:g}s delivery_timeout={self.delivery_timeout:g}s "
                f"close_timeout={self.close_timeout:g}s, {self.rate} msgs/s in bursts every "
                f"{self.burst:g}s, keyed over {self.keys} keys, batches <= {self.batch_bytes} "
                f"bytes, {self.tail:g}s of sending after the heal")
        if self.transactional:
            head += (f"; transactions of {self.txn_size} messages, transaction_timeout="
                     f"{self.transaction_timeout:g}s")
        tail = (["  then: blackhole every node and close during it"]
                if self.close_under_stall else [])
        return [head, *("  " + step.describe() for step in self.steps), *tail]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _kill_leader(rng: random.Random, at: float) -> Step:
    return Step(round(at, 1), "kill-leader", partition=rng.randrange(PARTITIONS),
                seconds=round(rng.uniform(2.0, 8.0), 1))


def _sigterm(rng: random.Random, at: float) -> Step:
    return Step(round(at, 1), "sigterm", node=rng.choice(NODES),
                seconds=round(rng.uniform(2.0, 8.0), 1))


def _move(rng: random.Random, at: float) -> Step:
    return Step(round(at, 1), "move-leader", partition=rng.randrange(PARTITIONS),
                shift=rng.choice((1, 2)))


def _network(rng: random.Random, at: float, action: str, request_timeout: float) -> Step:
    node = rng.choice((*NODES, None))
    at = round(at, 1)
    if action == "conn-kills":
        lo = round(rng.uniform(0.1, 0.5), 2)
        return Step(at, action, node=node, seconds=round(rng.uniform(4.0, 10.0), 1),
                    lifetimes=(lo, round(lo + rng.uniform(0.2, 1.0), 2)))
    if action == "kill-all":
        return Step(at, action, node=node)
    if action == "lost-responses":
        return Step(at, action, node=node, count=rng.randint(3, 12),
                    seconds=round(rng.uniform(4.0, 10.0), 1))
    if action == "stall":
        # Longer than the request timeout: the client must time the requests out.
        return Step(at, action, node=node,
                    seconds=round(request_timeout + rng.uniform(1.0, 3.0), 1))
    raise ValueError(f"not a network action: {action!r}")


def make_plan(seed: int) -> Plan:
    """The plan of schedule ``seed`` (an int >= 1; transactional from ``TXN_FIRST_SEED``).
    Same seed, same plan."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 1:
        raise ValueError(f"a schedule seed is an int >= 1, not {seed!r}")
    if seed >= TXN_FIRST_SEED:
        return _make_txn_plan(seed)
    rng = random.Random(seed)
    family = FAMILIES[(seed - 1) % len(FAMILIES)]
    tight = (seed - 1) // len(FAMILIES) % 3 == 2
    request_timeout, delivery_timeout, close_timeout = TIGHT_TIMEOUTS if tight else NORMAL_TIMEOUTS
    steps: list[Step] = []
    network = sorted(NETWORK_ACTIONS - {"stall"})
    at = rng.uniform(1.0, 4.0)
    match family:
        case "kill-leader":
            for _ in range(rng.randint(1, 2)):
                steps.append(_kill_leader(rng, at))
                at += rng.uniform(4.0, 10.0)
        case "sigterm":
            for _ in range(rng.randint(1, 2)):
                steps.append(_sigterm(rng, at))
                at += rng.uniform(4.0, 10.0)
        case "move-leader":
            for _ in range(rng.randint(2, 4)):
                steps.append(_move(rng, at))
                at += rng.uniform(1.5, 5.0)
        case "conn-kills" | "lost-responses" | "stall":
            for _ in range(rng.randint(1, 2)):
                steps.append(_network(rng, at, family, request_timeout))
                at += rng.uniform(5.0, 12.0)
        case "mixed":
            makers = [_kill_leader, _sigterm, _move]
            for _ in range(rng.randint(3, 4)):
                if rng.random() < 0.5:
                    steps.append(rng.choice(makers)(rng, at))
                else:
                    steps.append(_network(rng, at, rng.choice([*network, "stall"]),
                                          request_timeout))
                at += rng.uniform(2.0, 6.0)
    # Every plan mixes in one or two network faults at random moments of the window.
    window = max(at, 12.0)
    for _ in range(rng.randint(1, 2)):
        steps.append(_network(rng, rng.uniform(1.0, window), rng.choice(network),
                              request_timeout))
    if tight:
        # One node blackholed for longer than delivery_timeout: the batches of the
        # partitions it leads fail (their fate unknown to the client), and the idempotent
        # producer must recover (a new epoch or producer id) with no gap, duplicate or
        # reordering. Drawn last, so the steps above are those of the plan without it.
        steps.append(Step(round(rng.uniform(1.0, window), 1), "stall", node=rng.choice(NODES),
                          seconds=round(delivery_timeout + rng.uniform(2.0, 4.0), 1)))
    steps.sort(key=lambda s: s.at)
    return Plan(seed, family, tuple(steps), request_timeout, delivery_timeout, close_timeout,
                close_under_stall=family in ("stall", "mixed"))


# --------------------------------------------------------------------------- transactional


def _lost(rng: random.Random, at: float, api: str) -> Step:
    """Lost answers of ``api``: EndTxn goes to the coordinator only, so aim there."""
    target = "coordinator" if api == "END_TXN" else ""
    node = None if target else rng.choice((*NODES, None))
    return Step(round(at, 1), "lost-responses", node=node, api=api, target=target,
                count=rng.randint(2, 5) if api != "PRODUCE" else rng.randint(3, 12),
                seconds=round(rng.uniform(4.0, 10.0), 1))


def _coordinator_stall(rng: random.Random, at: float, request_timeout: float) -> Step:
    return Step(round(at, 1), "stall", target="coordinator",
                seconds=round(request_timeout + rng.uniform(1.0, 3.0), 1))


def _kill_coordinator(rng: random.Random, at: float) -> Step:
    return Step(round(at, 1), "kill-coordinator", seconds=round(rng.uniform(2.0, 8.0), 1))


def _move_coordinator(rng: random.Random, at: float) -> Step:
    return Step(round(at, 1), "move-coordinator", shift=rng.choice((1, 2)))


def _make_txn_plan(seed: int) -> Plan:
    rng = random.Random(seed)
    family = TXN_FAMILIES[(seed - TXN_FIRST_SEED) % len(TXN_FAMILIES)]
    request_timeout, delivery_timeout, close_timeout = TXN_TIMEOUTS
    steps: list[Step] = []
    at = rng.uniform(2.0, 4.0)
    match family:
        case "txn-kill-coordinator":
            for _ in range(rng.randint(1, 2)):
                steps.append(_kill_coordinator(rng, at))
                at += rng.uniform(8.0, 14.0)
        case "txn-kill-leader":
            for _ in range(rng.randint(1, 2)):
                steps.append(_kill_leader(rng, at))
                at += rng.uniform(6.0, 12.0)
        case "txn-move":
            for _ in range(rng.randint(2, 4)):
                steps.append((_move_coordinator if rng.random() < 0.5 else _move)(rng, at))
                at += rng.uniform(1.5, 5.0)
        case "txn-lost-commits":
            for _ in range(rng.randint(1, 2)):
                steps.append(_lost(rng, at, "END_TXN"))
                at += rng.uniform(5.0, 10.0)
        case "txn-stall":
            for _ in range(rng.randint(1, 2)):
                steps.append(_coordinator_stall(rng, at, request_timeout)
                             if rng.random() < 0.6 else
                             _network(rng, at, "stall", request_timeout))
                at += rng.uniform(6.0, 12.0)
        case "txn-mixed":
            cluster = [_kill_coordinator, _kill_leader, _move_coordinator, _move]
            for _ in range(rng.randint(3, 4)):
                if rng.random() < 0.5:
                    steps.append(rng.choice(cluster)(rng, at))
                else:
                    kind = rng.choice(("lost-commit", "lost-produce", "stall", "conn-kills"))
                    if kind == "lost-commit":
                        steps.append(_lost(rng, at, "END_TXN"))
                    elif kind == "lost-produce":
                        steps.append(_lost(rng, at, "PRODUCE"))
                    elif kind == "stall":
                        steps.append(_coordinator_stall(rng, at, request_timeout))
                    else:
                        steps.append(_network(rng, at, "conn-kills", request_timeout))
                at += rng.uniform(3.0, 7.0)
    # One more network fault at a random moment: lost answers of a transactional or a
    # Produce request (AddPartitionsToTxn: the version 1 protocol, which librdkafka
    # speaks), or connection kills.
    window = max(at, 12.0)
    extra = rng.choice(("PRODUCE", "END_TXN", "ADD_PARTITIONS_TO_TXN", "conn-kills"))
    steps.append(_network(rng, rng.uniform(1.0, window), extra, request_timeout)
                 if extra == "conn-kills" else _lost(rng, rng.uniform(1.0, window), extra))
    steps.sort(key=lambda s: s.at)
    return Plan(seed, family, tuple(steps), request_timeout, delivery_timeout, close_timeout,
                transactional=True, txn_size=TXN_SIZE, transaction_timeout=TXN_TIMEOUT)
