"""What the producer puts in one batch and one request (S2): the limits it is given."""

from __future__ import annotations

from .checker import Violation, invariant
from .trace import Trace


@invariant
def _wire_limits(trace: Trace) -> list[Violation]:
    """S2: every batch on the wire holds at most ``max_batch_messages`` records; one of
    several records is at most ``batch_bytes`` (and ``max_message_bytes``, S1) long,
    its records' size bounds summed being no more; and a request of several batches
    carries at most ``max_request_bytes`` of them (a batch too big for the rest of a
    request waits for the next one; alone, it goes anyway)."""
    s = trace.schedule
    if trace.crash:
        return []
    most = s.option("max_batch_messages")
    cap = min(s.option("batch_bytes"), s.max_message_bytes)
    request_cap = s.option("max_request_bytes")
    for at, parts in trace.received():
        for p, nbytes, values in parts:
            if len(values) > most or (len(values) > 1 and nbytes > cap):
                return [Violation("S2 batch", f"a batch of {len(values)} records, {nbytes} "
                                  f"bytes, for partition {p} at {at:.4f}: "
                                  f"max_batch_messages={most}, batch_bytes={cap}")]
        total = sum(nbytes for _, nbytes, _ in parts)
        if len(parts) > 1 and total > request_cap:
            return [Violation("S2 request", f"a request of {len(parts)} batches, {total} "
                              f"bytes, at {at:.4f}: max_request_bytes={request_cap}")]
    return []
