"""Probes of ``buffer_memory``'s admission (B1): the ledger reserves a message's bytes
exactly when they fit (``buffered_bytes + size <= buffer_memory``) or nothing is
reserved at all (a message larger than the buffer goes alone, as Kafka's Java
client's ``BufferPool`` lends a whole buffer). Refusing one that fits makes ``send()``
wait (and fail with BufferFullError after ``max_block``) for no reason; taking one
that does not fit lets memory grow past its bound. Checked at the three ways in
(``admit``, ``admit_row``, ``try_reserve``); ``reserve_over`` is the documented way
over the bound and is not one of them (probes.py is the mechanism)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .probes import Watch, probe

LEDGER_CLASS = "pipeline.producer._outcomes.ledger:Ledger"


def _judge(w: Watch, call: str, before: int, size: int, limit: int, took: bool,
           after: int) -> None:
    fits = before == 0 or before + size <= limit
    if took and (not fits or after != before + size):
        w.violate("B1 admission", (
            f"{call} took {size} bytes with {before} of buffer_memory={limit} in use "
            f"(now {after}): only what fits, or anything into an empty buffer"))
    elif not took and (fits or after != before):
        w.violate("B1 admission", (
            f"{call} refused {size} bytes with {before} of buffer_memory={limit} in use "
            f"(now {after}): what fits, or anything into an empty buffer, is taken"))


def _admission(call: str, size_at: int) -> Callable[[Watch, Callable[..., Any]], Callable[..., Any]]:
    def wrapper(w: Watch, orig: Callable[..., Any]) -> Callable[..., Any]:
        def admit(self: Any, *args: Any) -> Any:
            before = self.buffered_bytes
            took = orig(self, *args)
            _judge(w, call, before, args[size_at], self.buffer_memory, bool(took),
                   self.buffered_bytes)
            return took
        return admit
    return wrapper


probe(LEDGER_CLASS, "admit")(_admission("admit", 1))  # (msg, size, deadline)
probe(LEDGER_CLASS, "admit_row")(_admission("admit_row", 0))  # (size)
probe(LEDGER_CLASS, "try_reserve")(_admission("try_reserve", 0))  # (size)
