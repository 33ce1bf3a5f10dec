"""Probes of idempotence: recoveries, new epochs and producer ids (probes.py is the
mechanism; GUARDS in guards.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .probes import IDEM, Watch, probe

#: How the producer's warning that a recovery starts begins (idempotence.py).
RECOVERY_WARNING = "idempotent producer: starting a new epoch"


@contextmanager
def counting_recovery_warnings(w: Watch) -> Iterator[None]:
    """Count the producer's recovery warnings into ``w`` (W1) for the length of the
    block, also when the run's logging is quieter than WARNING (the teeth's workers):
    then only this count hears them."""
    logger = logging.getLogger("pipeline.producer")

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if str(record.msg).startswith(RECOVERY_WARNING):
                w.recovery_warnings += 1

    handler = Count(logging.WARNING)
    level, propagate = logger.level, logger.propagate
    if not logger.isEnabledFor(logging.WARNING):
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate

# -- idempotence --------------------------------------------------------------------

@probe(IDEM, "_start_epoch")
def _idem_start_epoch(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def start_epoch(self: Any, pid: int, epoch: int, *, bumped_locally: bool) -> Any:
        if w.epochs_started:
            w.reach("epoch-bumped" if bumped_locally else "new-producer-id-in-a-recovery")
            w.recoveries[0 if bumped_locally else 1] += 1
            if self.in_flight:
                w.violate("G7 bump under flight", (
                    f"a new epoch started with {self.in_flight} batches of the old one "
                    "in flight"))
            if not bumped_locally and not (w.fenced or w.refused or self.producer_epoch >= 32767):
                w.violate("G7 needless new id", (
                    "a recovery took a new producer id although no broker fenced the epoch, "
                    "none refused a local bump and the epoch is not exhausted: it bumps "
                    "its own epoch then (KIP-360)"))
            if bumped_locally and (w.fenced or w.refused):
                w.violate("G7 bump after fencing", (
                    "the producer bumped its own epoch although a broker fenced the current "
                    "one" + (" (and refused an epoch it bumped itself before)" if w.refused
                             else "") + ": only a new producer id recovers from that"))
            if bumped_locally and (pid, epoch) != (self.producer_id, self.producer_epoch + 1):
                w.violate("G7 bump", f"a local bump from {self.producer_id}/"
                          f"{self.producer_epoch} to {pid}/{epoch}")
            if not bumped_locally and pid == self.producer_id:
                w.violate("G7 new id", f"a recovery with a new id kept producer id {pid}")
        w.fenced = False
        w.local_epoch = bumped_locally
        w.epochs_started += 1
        return orig(self, pid, epoch, bumped_locally=bumped_locally)
    return start_epoch


@probe(IDEM, "epoch_fenced")
def _idem_epoch_fenced(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def epoch_fenced(self: Any, producer_id: int, producer_epoch: int, code: Any,
                     *rest: Any, **kw: Any) -> Any:
        if (producer_id, producer_epoch) == (self.producer_id, self.producer_epoch):
            w.reach("epoch-fenced-takes-a-new-id")
            w.fenced = True
            if w.local_epoch:
                w.refused = True  # from now on every recovery takes a new id
        return orig(self, producer_id, producer_epoch, code, *rest, **kw)
    return epoch_fenced


@probe(IDEM, "batch_failed")
def _idem_batch_failed(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def batch_failed(self: Any, batch: Any, reason: str) -> Any:
        if (batch.producer_id, batch.producer_epoch) == (self.producer_id, self.producer_epoch):
            w.reach("failed-batch-starts-a-new-epoch")
        return orig(self, batch, reason)
    return batch_failed
