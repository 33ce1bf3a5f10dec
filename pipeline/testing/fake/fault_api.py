"""The request-level fault script of `FakeCluster`: errors, lost or delayed
responses, dropped requests, stale metadata and control hooks.

A mixin because these are part of the `FakeCluster` surface tests call
(`fake.fail_next(...)`), while the state they act on (the `FaultScript` the
server consults per request, the cluster state for metadata snapshots) stays
owned by `FakeCluster`. Each method only appends a `FaultHandle`; the server
applies it (`server.py`), so nothing here touches a connection.
"""

from __future__ import annotations

from pipeline.protocol.api import ApiKey

from .faults import ControlFn, FaultHandle, FaultScript
from .state import FakeState


class RequestFaults:
    """Fault-injection methods; the host class sets `_script` and `state`."""

    _script: FaultScript
    state: FakeState

    def _add_fault(self, handle: FaultHandle) -> FaultHandle:
        return self._script.add(handle)

    def fail_next(
        self,
        api_key: int,
        error_code: int,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Answer the next `count` requests of an API (None: all) with `error_code`,
        without applying them. With `topic`/`partition`, only requests touching them
        count, and only those partitions (or topics) get the error; the rest of the
        request is handled normally. Partition-less APIs get a top-level error."""
        return self._add_fault(
            FaultHandle(
                "error",
                api_key,
                node_id,
                topic,
                partition,
                remaining=count,
                error_code=int(error_code),
            )
        )

    def fail_after_apply(
        self,
        error_code: int,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Apply the next `count` matching Produce requests, then answer the written
        partitions with `error_code`, as Kafka answers an acks=all produce completed
        after the append (NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT)."""
        return self._add_fault(
            FaultHandle(
                "error_after_apply",
                ApiKey.PRODUCE,
                node_id,
                topic,
                partition,
                remaining=count,
                error_code=int(error_code),
            )
        )

    def omit_after_apply(
        self,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Apply the next `count` matching Produce requests, then leave the matching
        partitions out of the answer: a response that does not answer every partition
        it was asked for. Kafka's clients fail or retry such a batch (the Java
        client's "missing partition in response", sarama's ErrIncompleteResponse)."""
        return self._add_fault(
            FaultHandle("omit_after_apply", ApiKey.PRODUCE, node_id, topic, partition,
                        remaining=count)
        )

    def stale_metadata(
        self, node_id: int | None = None, *, count: int | None = None
    ) -> FaultHandle:
        """Broker `node_id` (None: all) answers the next `count` Metadata requests (None:
        until removed) with the cluster as it is now: a lagging broker metadata cache."""
        return self._add_fault(
            FaultHandle(
                "stale_metadata",
                ApiKey.METADATA,
                node_id,
                remaining=count,
                snapshot=self.state.metadata_view(),
            )
        )

    def drop_response_after_apply(
        self,
        api_key: int = ApiKey.PRODUCE,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Apply the next matching request, then close the connection instead of
        answering (the write succeeded, the ack is lost)."""
        return self._add_fault(
            FaultHandle("drop_after_apply", api_key, node_id, topic, partition, remaining=count)
        )

    def drop_next_request(
        self,
        api_key: int = ApiKey.PRODUCE,
        *,
        count: int | None = 1,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> FaultHandle:
        """Close the connection when the next matching request arrives, before applying it."""
        return self._add_fault(
            FaultHandle("drop_before_apply", api_key, node_id, topic, partition, remaining=count)
        )

    def delay_responses(
        self,
        seconds: float,
        *,
        api_key: int | None = None,
        count: int | None = None,
        node_id: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
        before_apply: bool = False,
    ) -> FaultHandle:
        """Delay matching responses by `seconds` (count None: until removed). With
        `before_apply` the request is only applied after the delay. The connection is
        busy meanwhile, as a Kafka connection is while a request is in flight."""
        return self._add_fault(
            FaultHandle(
                "delay",
                api_key,
                node_id,
                topic,
                partition,
                remaining=count,
                seconds=seconds,
                before_apply=before_apply,
            )
        )

    def control(
        self, api_key: int, fn: ControlFn, sticky: bool = False, *, node_id: int | None = None
    ) -> FaultHandle:
        """Install a hook for an API. `fn(ctx)` (sync or async) returns a response object
        to send, None to fall through (to the next hook, then normal handling), `DROP` or
        `NO_RESPONSE`. A one-shot hook is removed the first time it returns non-None."""
        return self._script.add_control(
            FaultHandle("control", api_key, node_id, remaining=None if sticky else 1, fn=fn)
        )

    def clear_faults(self) -> None:
        """Remove every scripted fault and hook."""
        self._script.clear()
