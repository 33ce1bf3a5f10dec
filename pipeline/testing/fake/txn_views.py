"""DescribeTransactions and ListTransactions: the fake transaction coordinator's state
as Kafka 4.1 reports it (state names, epoch, timeout, start time (-1 until a transaction
starts), the partitions of an open transaction; an unknown id is
TRANSACTIONAL_ID_NOT_FOUND). Read-only."""

from __future__ import annotations

import re

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import describe_transactions as dtx
from pipeline.protocol.messages import list_transactions as ltx

from .txn import STATES, TransactionCoordinator, now_ms

__all__ = ["describe_transactions", "list_transactions"]


def describe_transactions(txn: TransactionCoordinator, node_id: int,
                          request: dtx.DescribeTransactionsRequest,
                          injected: int | None = None) -> dtx.DescribeTransactionsResponse:
    """DescribeTransactions: each id's state at its coordinator."""
    states = []
    for tid in request.transactional_ids:
        meta = txn.transactions.get(tid)
        if injected is not None:
            code = ErrorCode(injected)
        elif tid == "":
            code = ErrorCode.INVALID_REQUEST
        elif txn.not_coordinator(node_id, tid):
            code = ErrorCode.NOT_COORDINATOR
        elif meta is None:
            code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(meta.partitions):
                by_topic.setdefault(topic, []).append(p)
            states.append(dtx.TransactionState(
                error_code=0, transactional_id=tid, transaction_state=meta.state,
                transaction_timeout_ms=meta.timeout_ms,
                transaction_start_time_ms=meta.start_time_ms,
                producer_id=meta.producer_id, producer_epoch=meta.epoch,
                topics=tuple(dtx.TopicData(topic=t, partitions=tuple(ps))
                             for t, ps in by_topic.items())))
            continue
        states.append(dtx.TransactionState(error_code=int(code), transactional_id=tid))
    return dtx.DescribeTransactionsResponse(transaction_states=tuple(states))

def list_transactions(txn: TransactionCoordinator, node_id: int, version: int,
                      request: ltx.ListTransactionsRequest,
                      injected: int | None = None) -> ltx.ListTransactionsResponse:
    """ListTransactions: the ids this broker coordinates, filtered by state, producer id,
    duration (v1+: open at least that long; never started counts) and id pattern (v2+)."""
    if injected is not None:
        return ltx.ListTransactionsResponse(error_code=injected)
    unknown = tuple(s for s in request.state_filters if s not in STATES)
    wanted_states = set(request.state_filters)
    pids = set(request.producer_id_filters)
    pattern = None
    if version >= 2 and request.transactional_id_pattern is not None:
        try:
            pattern = re.compile(request.transactional_id_pattern)
        except re.error:
            return ltx.ListTransactionsResponse(error_code=int(ErrorCode.INVALID_REQUEST))
    duration = request.duration_filter if version >= 1 else -1
    now = now_ms()
    out = []
    for tid, meta in sorted(txn.transactions.items()):
        if txn.not_coordinator(node_id, tid):
            continue
        if wanted_states and meta.state not in wanted_states:
            continue
        if pids and meta.producer_id not in pids:
            continue
        if duration >= 0 and now - meta.start_time_ms < duration:
            continue
        if pattern is not None and not pattern.fullmatch(tid):
            continue
        out.append(ltx.TransactionState(transactional_id=tid, producer_id=meta.producer_id,
                                        transaction_state=meta.state))
    return ltx.ListTransactionsResponse(unknown_state_filters=unknown,
                                        transaction_states=tuple(out))
