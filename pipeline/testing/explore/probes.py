"""Probes: which protocol guards a run reached, and the guards' own invariants.

For one run (`watching`), the explorer wraps a few methods of the protocol's
stages (partition and broker producers, the accumulator, idempotence) on their
classes, and restores them afterwards. A wrapper looks at the stage's state
when the method is called (or returns) and

* marks the guards whose state it sees (`guards.GUARDS`: e.g. fresh level-0
  messages arriving at a partition producer while its chaser is out), so a
  sweep reports the guards it never put the protocol in front of, and
* checks the invariants a guard keeps where they are cheaper to check directly
  than through their effect on the logs (e.g. a partition producer hands a
  broker producer nothing below its watermark): a broken guard is seen the
  moment it acts, even when the interleaving that would turn it into a
  reordered log never comes.

The producer itself carries nothing for this: no call, flag or counter on its
paths; everything here is the explorer's, installed for the length of a run.
This module is the mechanism (`Watch`, `probe`, `watching`); the probes
themselves are in ``probes_partition.py``, ``probes_broker.py`` and
``probes_idempotence.py``, each registering its own on import.
The wrappers read the stages' private fields by name: `tests/explore`
(``test_probes.py``) fails, naming the field, when a rename leaves a probe
reading nothing.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PP = "pipeline.producer._stages.partition_producer:PartitionProducer"
BP = "pipeline.producer._stages.broker_producer:BrokerProducer"
ACC = "pipeline.producer._stages.accumulator:Accumulator"
IDEM = "pipeline.producer._stages.idempotence:Idempotence"
CLUSTER = "pipeline.cluster.pool:Cluster"
CONNECTION = "pipeline.cluster.connection:BrokerConnection"
LEDGER = "pipeline.producer._outcomes.ledger:"  # (the module: its functions)
RETRY_ERRORS = "pipeline.producer._stages.context:RetryErrors"

EPS = 1e-9

# A violation kind is reported once per run with its first detail.
MAX_DETAILS = 1


@dataclass
class Watch:
    """What one run's probes saw."""

    reached: Counter[str] = field(default_factory=Counter)
    violations: dict[str, str] = field(default_factory=dict)  # kind -> first detail
    # Per partition producer, the order fresh units reached it (their arrival
    # numbers; the unit object kept alive so its id() stays its own).
    arrival: dict[int, tuple[Any, int]] = field(default_factory=dict)
    next_arrival: int = 0
    # Per (broker producer, partition): the last arrival number it was handed
    # since that partition's last chaser there.
    session: dict[tuple[int, Any], int] = field(default_factory=dict)
    # Per (producer id, epoch, partition): the next sequence a fresh batch takes.
    sequences: dict[tuple[int, int, Any], int] = field(default_factory=dict)
    # Per sealed batch sent: (the batch, its producer id, epoch, base sequence).
    stamps: dict[int, tuple[Any, tuple[int, int, int]]] = field(default_factory=dict)
    epochs_started: int = 0
    # Per message: (the message, requests built with it) and (the message, splits).
    attempts: dict[int, tuple[Any, int]] = field(default_factory=dict)
    splits: dict[int, tuple[Any, int]] = field(default_factory=dict)
    # Recoveries seen: [epochs bumped locally, new producer ids].
    recoveries: list[int] = field(default_factory=lambda: [0, 0])
    # A broker fenced the current epoch (the next recovery must take a new id);
    # a broker refused a locally bumped epoch (every later one must).
    fenced: bool = False
    refused: bool = False
    # Produce requests a connection wrote (statistics().requests_sent must agree), and
    # the outcomes the close logged as not handed over to producer.successes/errors.
    produce_written: int = 0
    lost_reports: int = 0
    # Connections the client closed or lost after their handshake: what acks=0 wrote
    # on one may be applied after what a later connection wrote (N2).
    connections_failed: int = 0
    # The producer's "starting a new epoch" warnings (W1: one per recovery).
    recovery_warnings: int = 0
    # (task id, node) of each connect a task was refused since it last asked (G19).
    unreachable: set[tuple[int, int]] = field(default_factory=set)
    # Per partition, the step of its last acknowledgement and of the last error its
    # retries recorded (`RetryErrors.last`): a later timeout names an error only if
    # none came after it (T1).
    delivered: dict[Any, int] = field(default_factory=dict)
    errored: dict[Any, int] = field(default_factory=dict)
    steps: int = 0

    def step(self) -> int:
        self.steps += 1
        return self.steps
    local_epoch: bool = False  # the current epoch is one the producer bumped itself
    # Metadata rounds started and the highest one completed (rounds run one at a time).
    rounds_started: int = 0
    rounds_done: int = 0
    # Per partition producer: (it, the broker producer it was attached to) when
    # told leader_changed; (it, rounds started, when, the retry level) at its last
    # failure (a retry coming back, or leader_changed: no level, no backoff): it
    # re-attaches on metadata fresher than that, and after the level's backoff.
    told: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    failed: dict[int, tuple[Any, int, float, int | None]] = field(default_factory=dict)
    # The schedule scripts OUT_OF_ORDER_SEQUENCE_NUMBER answers (else one that no
    # earlier failure explains is the producer's own gap).
    scripted_out_of_order: bool = False

    def attempts_of(self, msg: Any) -> tuple[int, int]:
        """(requests built with ``msg``, splits of a batch holding it); -1: not a message."""
        if type(msg).__name__ == "RowDelivery":
            return -1, 0
        seen = self.attempts.get(id(msg))
        split = self.splits.get(id(msg))
        return (seen[1] if seen is not None and seen[0] is msg else 0,
                split[1] if split is not None and split[0] is msg else 0)

    def reach(self, guard: str) -> None:
        self.reached[guard] += 1

    def violate(self, kind: str, detail: str) -> None:
        if kind not in self.violations:
            self.violations[kind] = detail

    # -- arrival order ---------------------------------------------------------
    def arrived(self, units: list[Any]) -> None:
        for u in units:
            self.next_arrival += 1
            self.arrival[id(u)] = (u, self.next_arrival)

    def arrival_of(self, unit: Any) -> int | None:
        """The arrival number of a unit (a sealed batch: its first message's)."""
        msgs = getattr(unit, "messages", None)
        first = msgs[0] if msgs else unit
        seen = self.arrival.get(id(first))
        return seen[1] if seen is not None and seen[0] is first else None


def _resolve(target: str) -> type:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


Wrapper = Callable[[Watch, Callable[..., Any]], Callable[..., Any]]
_PROBES: list[tuple[str, str, Wrapper]] = []


def probe(target: str, method: str) -> Callable[[Wrapper], Wrapper]:
    """Register ``wrapper(watch, original) -> replacement`` for ``target.method``."""

    def register(wrapper: Wrapper) -> Wrapper:
        _PROBES.append((target, method, wrapper))
        return wrapper

    return register


@contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Install every probe for the length of the block (one run)."""
    saved: list[tuple[type, str, Any]] = []
    try:
        for target, method, wrapper in _PROBES:
            cls = _resolve(target)
            original = cls.__dict__[method]
            replacement = functools.wraps(original)(wrapper(watch, original))
            saved.append((cls, method, original))
            setattr(cls, method, replacement)
        yield watch
    finally:
        for cls, method, original in reversed(saved):
            setattr(cls, method, original)


def targets() -> list[tuple[str, str]]:
    return [(t, m) for t, m, _ in _PROBES]


def records_in(batch: Any) -> int:
    """Records in a sealed batch (a run of rows counts its rows)."""
    n = 0
    for m in batch.messages:
        n += getattr(m, "count", 1) if type(m).__name__ == "RowRun" else 1
    return n
