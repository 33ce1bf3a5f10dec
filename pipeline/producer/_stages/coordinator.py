"""The transaction coordinator of one transactional id: found, asked, answered.

``TxnCoordinator`` finds the coordinator (FindCoordinator, key type 1), sends it the
transactional requests (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn)
and a group's coordinator TxnOffsetCommit, retries what Kafka says to retry (finding the
coordinator again after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE, CONCURRENT_TRANSACTIONS
after 20 ms as the Java client), and classifies every other answer as the error class a
caller acts on (``classify``: fenced, abortable, fatal). The state machine that decides
what to ask is ``transactions.py``.

Kafka reads the transaction protocol off each request's version (Produce v12, EndTxn v5,
TxnOffsetCommit v5 are version 2's), so every request is capped by ``version`` (the open
transaction's: ``version_cap``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from pipeline.cluster.errors import BrokerConnectionError, KafkaError, RequestTimedOutError
from pipeline.producer._errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionError,
    TransactionFatalError,
)
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.base import Request, Response
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.add_offsets_to_txn import AddOffsetsToTxnRequest
from pipeline.protocol.messages.add_partitions_to_txn import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
)
from pipeline.protocol.messages.end_txn import EndTxnRequest, EndTxnResponse
from pipeline.protocol.messages.find_coordinator import FindCoordinatorRequest
from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest
from pipeline.protocol.messages.txn_offset_commit import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)

if TYPE_CHECKING:
    from pipeline.cluster.connection import BrokerConnection
    from pipeline.cluster.pool import Cluster
    from pipeline.producer._config import ProducerConfig

log = logging.getLogger("pipeline.producer")

__all__ = ["FindCoordinatorAgain", "OutcomeUnknown", "TxnCoordinator"]

R = TypeVar("R", bound=Response)

#: The coordinator moved or is not there yet: find it again, then retry.
_FIND_AGAIN = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
#: Try the same request again after a backoff.
_RETRY = frozenset({
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_LEADER_OR_FOLLOWER,
})
#: This producer is fenced: another one with the same transactional id took over.
_FENCED = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                     ErrorCode.INVALID_PRODUCER_ID_MAPPING})
#: The transaction cannot commit, but the producer can abort it and go on.
_ABORTABLE = frozenset({
    ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.INVALID_GROUP_ID,
})
#: CONCURRENT_TRANSACTIONS clears within milliseconds (the coordinator is writing
#: markers): the Java client retries it after 20 ms instead of the retry backoff.
_CONCURRENT_BACKOFF = 0.02


class FindCoordinatorAgain(Exception):
    """Internal: the coordinator moved; look it up again."""


class OutcomeUnknown(Exception):
    """Internal: a request was written and its answer lost (or UNKNOWN_SERVER_ERROR)."""


def find_request(key: str, key_type: int, version: int) -> FindCoordinatorRequest:
    """FindCoordinator for one key (v4+ batch the keys; v0 knows only groups)."""
    if version >= 4:
        return FindCoordinatorRequest(key_type=key_type, coordinator_keys=(key,))
    return FindCoordinatorRequest(key=key, key_type=key_type)



class TxnCoordinator:
    """The coordinator of ``transactional_id`` and the requests to it."""

    def __init__(self, config: ProducerConfig, cluster: Cluster,
                 backoff: Callable[[int], float], transactional_id: str) -> None:
        self._config = config
        self._cluster = cluster
        self._backoff = backoff
        self.transactional_id = transactional_id
        self._node: int | None = None
        #: The open transaction's transaction version (1 or 2): caps request versions.
        self.version = 0

    async def connection(self) -> BrokerConnection:
        if self._node is None:
            conn = await self._cluster.any_connection()
            version = conn.version_for(ApiKey.FIND_COORDINATOR)
            response = await conn.request(
                find_request(self.transactional_id, 1, version), version=version)
            if version >= 4:
                (found,) = response.coordinators
                code, node = error_code(found.error_code), found.node_id
            else:
                code, node = error_code(response.error_code), response.node_id
            if code in _FIND_AGAIN or code in _RETRY:
                raise FindCoordinatorAgain(code.name)
            if code != ErrorCode.NONE:
                raise self.classify(code, "FindCoordinator")
            self._node = node
        try:
            return await self._cluster.connection(self._node)
        except (KafkaError, OSError):
            self._node = None
            raise

    async def call(self, build: Callable[[int], Request[R]], what: str, api: ApiKey,
                    check: Callable[[R], ErrorCode], *, lost_is_unknown: bool = False) -> R:
        """Send ``build(version)`` to the coordinator until it is answered without a
        retriable error (finding the coordinator again as needed); raise the
        classified error of any other answer. ``lost_is_unknown``: a request written
        whose answer was lost raises ``OutcomeUnknown`` instead of being sent again."""
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await self.connection()
                version = min(conn.version_for(api), self.version_cap(api))
            except FindCoordinatorAgain as exc:
                code, detail = ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)
            except (BrokerConnectionError, RequestTimedOutError, OSError) as exc:
                self._node = None
                log.info("%s: the transaction coordinator is unreachable (%s); retrying", what, exc)
                await trio.sleep(self._backoff(attempt))
                continue
            except TransactionError:
                raise
            except KafkaError as exc:
                raise self._unusable(what, exc) from exc
            else:
                try:
                    response = await conn.request(build(version), version=version)
                except (BrokerConnectionError, RequestTimedOutError, OSError) as exc:
                    self._node = None
                    if lost_is_unknown:
                        raise OutcomeUnknown(f"{what}: {exc}") from exc
                    log.info("%s to the transaction coordinator failed (%s); retrying", what, exc)
                    await trio.sleep(self._backoff(attempt))
                    continue
                except KafkaError as exc:
                    raise self._unusable(what, exc) from exc
                code = check(response)
                if code == ErrorCode.UNKNOWN_SERVER_ERROR and lost_is_unknown:
                    raise OutcomeUnknown(f"{what}: {code.name}")
                detail = code.name
            if code == ErrorCode.NONE:
                return response
            if code in _FIND_AGAIN:
                self._node = None
            elif code not in _RETRY:
                raise self.classify(code, what)
            delay = (_CONCURRENT_BACKOFF if code == ErrorCode.CONCURRENT_TRANSACTIONS
                     else self._backoff(attempt))
            log.debug("%s: %s; retrying in %.3fs", what, detail, delay)
            await trio.sleep(delay)

    def _unusable(self, what: str, exc: KafkaError) -> TransactionFatalError:
        """A coordinator this producer cannot talk to (its connection's handshake or an
        answer refused for a reason no retry changes: authentication, authorization, an
        API it lacks, an answer that does not decode): fatal, as the Java client's
        TransactionManager makes authentication and unsupported-version errors."""
        error = TransactionFatalError(
            f"{what} for transactional_id {self.transactional_id!r}: the transaction "
            f"coordinator cannot be used: {exc}")
        error.code = getattr(exc, "code", None)
        return error

    def classify(self, code: ErrorCode, what: str) -> TransactionError:
        text = f"{what} for transactional_id {self.transactional_id!r}: {code.name} ({int(code)}) {code.description}"
        error: TransactionError
        if code in _FENCED:
            error = ProducerFencedError(
                f"{text}; another producer with this transactional_id took over: close this one")
        elif code in _ABORTABLE:
            error = TransactionAbortableError(f"{text}; abort the transaction, then go on")
        elif code == ErrorCode.INVALID_TRANSACTION_TIMEOUT:
            error = TransactionFatalError(
                f"{text}; transaction_timeout={self._config.transaction_timeout}s is more than "
                "the broker allows (transaction.max.timeout.ms): lower it")
        else:
            error = TransactionFatalError(text)
        error.code = code
        return error

    def version_cap(self, api: ApiKey) -> int:
        """Kafka reads the transaction protocol off each request's version (Produce v12,
        EndTxn v5, TxnOffsetCommit v5 are version 2's): under version 1 they stay below."""
        if self.version >= 2:
            return 99
        return {ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4, ApiKey.PRODUCE: 11}.get(api, 99)

    async def init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        timeout_ms = int(self._config.transaction_timeout * 1000)

        def build(version: int) -> InitProducerIdRequest:
            return InitProducerIdRequest(
                transactional_id=self.transactional_id, transaction_timeout_ms=timeout_ms,
                producer_id=producer_id if version >= 3 else -1,
                producer_epoch=producer_epoch if version >= 3 else -1)

        response = await self.call(build, "InitProducerId", ApiKey.INIT_PRODUCER_ID,
                                    lambda r: error_code(r.error_code))
        return response.producer_id, response.producer_epoch

    async def add_partitions(self, tps: Iterable[TopicPartition], producer_id: int,
                             producer_epoch: int) -> None:
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)

        def build(version: int) -> AddPartitionsToTxnRequest:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=producer_id,
                v3_and_below_producer_epoch=producer_epoch,
                v3_and_below_topics=tuple(
                    AddPartitionsToTxnTopic(name=t, partitions=tuple(p)) for t, p in topics.items()))

        def check(response: Any) -> ErrorCode:
            worst = ErrorCode.NONE
            for topic in response.results_by_topic_v3_and_below:
                for part in topic.results_by_partition:
                    code = error_code(part.partition_error_code)
                    # OPERATION_NOT_ATTEMPTED: another partition of the request failed.
                    if code not in (ErrorCode.NONE, ErrorCode.OPERATION_NOT_ATTEMPTED):
                        if worst == ErrorCode.NONE or code not in _RETRY:
                            worst = code
            return worst

        await self.call(build, "AddPartitionsToTxn", ApiKey.ADD_PARTITIONS_TO_TXN, check)

    async def add_offsets(self, group_id: str, producer_id: int, producer_epoch: int) -> None:
        """AddOffsetsToTxn (transaction version 1: before TxnOffsetCommit)."""
        await self.call(
            lambda v: AddOffsetsToTxnRequest(
                transactional_id=self.transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, group_id=group_id),
            "AddOffsetsToTxn", ApiKey.ADD_OFFSETS_TO_TXN, lambda r: error_code(r.error_code))

    async def end_txn(self, producer_id: int, producer_epoch: int, commit: bool, *,
                      what: str = "EndTxn", lost_is_unknown: bool = False) -> EndTxnResponse:
        """EndTxn; ``lost_is_unknown``: a lost answer raises ``OutcomeUnknown``."""

        def build(version: int) -> EndTxnRequest:
            return EndTxnRequest(transactional_id=self.transactional_id, producer_id=producer_id,
                                 producer_epoch=producer_epoch, committed=commit)

        return await self.call(build, what, ApiKey.END_TXN, lambda r: error_code(r.error_code),
                               lost_is_unknown=lost_is_unknown)

    async def txn_offset_commit(self, meta: Any,
                                by_topic: dict[str, list[TxnOffsetCommitRequestPartition]],
                                producer_id: int, producer_epoch: int) -> None:
        """TxnOffsetCommit, to the *group's* coordinator."""
        request = TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=meta.group_id,
            producer_id=producer_id, producer_epoch=producer_epoch,
            generation_id=meta.generation_id, member_id=meta.member_id,
            group_instance_id=meta.group_instance_id,
            topics=tuple(TxnOffsetCommitRequestTopic(name=t, partitions=tuple(p))
                         for t, p in by_topic.items()))
        attempt = 0
        group_node: int | None = None
        while True:
            attempt += 1
            try:
                if group_node is None:
                    group_node = await self.find_group_coordinator(meta.group_id)
                conn = await self._cluster.connection(group_node)
                version = min(conn.version_for(ApiKey.TXN_OFFSET_COMMIT),
                              self.version_cap(ApiKey.TXN_OFFSET_COMMIT))
                response = await conn.request(request, version=version)
            except (BrokerConnectionError, RequestTimedOutError, OSError, FindCoordinatorAgain) as exc:
                group_node = None
                log.info("TxnOffsetCommit failed (%s); retrying", exc)
                await trio.sleep(self._backoff(attempt))
                continue
            worst = ErrorCode.NONE
            for topic in response.topics:
                for part in topic.partitions:
                    code = error_code(part.error_code)
                    if code != ErrorCode.NONE and (worst == ErrorCode.NONE or code not in _RETRY):
                        worst = code
            if worst == ErrorCode.NONE:
                return
            if worst in _FIND_AGAIN:
                group_node = None
            elif worst not in _RETRY:
                raise self.classify(worst, "TxnOffsetCommit")
            await trio.sleep(_CONCURRENT_BACKOFF if worst == ErrorCode.CONCURRENT_TRANSACTIONS
                             else self._backoff(attempt))

    async def find_group_coordinator(self, group_id: str) -> int:
        conn = await self._cluster.any_connection()
        version = conn.version_for(ApiKey.FIND_COORDINATOR)
        response = await conn.request(find_request(group_id, 0, version), version=version)
        if version >= 4:
            (found,) = response.coordinators
            code, node = error_code(found.error_code), found.node_id
        else:
            code, node = error_code(response.error_code), response.node_id
        if code != ErrorCode.NONE:
            if code in _FIND_AGAIN or code in _RETRY:
                raise FindCoordinatorAgain(code.name)
            raise self.classify(code, "FindCoordinator (group)")
        return node
