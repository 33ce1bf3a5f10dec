"""What the producer puts in one batch and one request (S2): the limits it is given."""

from __future__ import annotations

from pipeline.protocol.batch_decoder import decode_record_batches

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
    for at, request in trace.produce_requests:
        total = parts = 0
        for topic in request.topic_data:
            for part in topic.partition_data:
                raw = bytes(part.records or b"")
                total += len(raw)
                parts += 1
                for batch in decode_record_batches(raw):
                    n = len(batch.records)
                    if n > most or (n > 1 and len(raw) > cap):
                        return [Violation("S2 batch", f"a batch of {n} records, {len(raw)} "
                                          f"bytes, for partition {part.index} at {at:.4f}: "
                                          f"max_batch_messages={most}, batch_bytes={cap}")]
        if parts > 1 and total > request_cap:
            return [Violation("S2 request", f"a request of {parts} batches, {total} bytes, "
                              f"at {at:.4f}: max_request_bytes={request_cap}")]
    return []
