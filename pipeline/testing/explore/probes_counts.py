"""Probes that count, independently of the producer's own counters, what those
counters promise (checker O4 and O5): the Produce requests a connection wrote, and
the outcomes the close could not hand over to ``producer.successes`` / ``errors``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .probes import CONNECTION, LEDGER, Watch, probe


@probe(CONNECTION, "_send")
def _written(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        pending = await orig(self, request, *args, **kwargs)
        if pending is not None and type(request).__name__ == "ProduceRequest":
            w.produce_written += 1  # (None: its wait for a slot ended, nothing written)
        return pending
    return send


@probe(CONNECTION, "_fail")
def _failed(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def fail(self: Any, error: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed_error is None and self._next_correlation_id > 1:
            w.connections_failed += 1
        return orig(self, error, *args, **kwargs)
    return fail


@probe(LEDGER, "_log_lost")
def _lost(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
    def log_lost(n: int) -> Any:
        w.lost_reports += n
        return orig(n)
    return log_lost
