"""Failures nobody observes: logged, aggregated, never silent.

A record whose failure reaches no one (its delivery was never awaited, it had no
``on_delivery``, its ``send_many`` / ``send_batch`` group was never awaited) would be lost
quietly: a typo in a topic name would go unseen. sarama sends every failure to
``Errors()``; librdkafka logs. Here the ledger hands each such failure to
``Unobserved.add`` (failures are rare: nothing is done per successful record), and:

* ``run`` (a task of the producer) opens a window of ``window`` seconds at the first
  failure not yet reported; when it ends, it logs ONE warning for every failure of the
  window still unobserved, aggregated by topic and partition with each group's first
  error; a caller who reads a failure within the window makes it observed (it is not
  reported). So a burst of failures gives one warning, a steady stream one per window.
* ``close`` (leaving the ``open_producer`` block) reports the rest at once, and returns
  them, so ``raise_on_unobserved_failure=True`` can raise them.

Observed means: ``await delivery``, ``delivery.result()`` or ``wait_all`` read the
failure (``observe``), an ``on_delivery`` callback was called with it, or the
``DeliveryGroup`` of its ``send_many`` / ``send_batch`` call was awaited.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, NamedTuple

import trio

from pipeline.producer._errors import TransactionAbortedError

log = logging.getLogger("pipeline.producer")

__all__ = ["OBSERVED", "Unobserved", "observed"]

#: ``ProducerMessage._sink`` once its failure was read by the caller (set after it is
#: settled, when the ledger no longer reads the sink).
OBSERVED = object()


class _Failure(NamedTuple):
    at: float
    holder: Any  # the message, a burst's UnheardRows, or the DeliveryGroup
    topic: str
    partition: int | None
    records: int
    cause: BaseException


def observed(holder: Any) -> bool:
    """Has the caller read this failure (see the module docstring)?"""
    if getattr(holder, "_sink", None) is OBSERVED:
        return True
    return bool(getattr(holder, "observed", False))


class Unobserved:
    """The failures no caller has read yet, oldest first."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._pending: deque[_Failure] = deque()
        self._added = trio.Event()
        #: warnings logged (one per aggregation), and records they named
        self.warnings = 0
        self.reported = 0

    def add(self, holder: Any, topic: str, partition: int | None, count: int,
            cause: BaseException) -> None:
        if isinstance(cause, TransactionAbortedError):
            return  # the caller aborted the transaction: that is its report
        self._pending.append(_Failure(trio.current_time(), holder, topic, partition, count,
                                      cause))
        self._added.set()

    async def run(self) -> None:
        """Report what stayed unobserved for a window (until cancelled)."""
        while True:
            while not self._pending:
                self._added = trio.Event()
                await self._added.wait()
            await trio.sleep_until(self._pending[0].at + self.window)
            due = list(self._pending)
            self._pending.clear()
            self._warn(due, closing=False)

    def close(self) -> list[_Failure]:
        """The producer is closing: report every failure still unobserved; return them."""
        left = [f for f in self._pending if not observed(f.holder)]
        self._pending.clear()
        self._warn(left, closing=True)
        return left

    def _warn(self, failures: list[_Failure], *, closing: bool) -> None:
        failures = [f for f in failures if not observed(f.holder)]
        if not failures:
            return
        groups: dict[tuple[str, int | None], list[Any]] = {}
        for f in failures:
            group = groups.setdefault((f.topic, f.partition), [0, f.cause])
            # (rows of a burst: those whose failure nobody read by now)
            unread = getattr(f.holder, "unread", None)
            group[0] += f.records if unread is None else unread()
        total = sum(n for n, _ in groups.values())
        parts = "; ".join(
            f"{n} to {topic}{'' if p is None or p < 0 else f'[{p}]'} "
            f"(first: {type(cause).__name__}: {cause})"
            for (topic, p), (n, cause) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:5])
        more = f"; and {len(groups) - 5} more topic-partitions" if len(groups) > 5 else ""
        when = "when the producer closed" if closing else f"within {self.window}s"
        log.warning(
            "%d record(s) failed and nobody read their outcome %s: %s%s. Await the "
            "deliveries (or wait_all / the send_many group), pass on_delivery, or set "
            "raise_on_unobserved_failure=True to raise them when the producer closes",
            total, when, parts, more)
        self.warnings += 1
        self.reported += total
