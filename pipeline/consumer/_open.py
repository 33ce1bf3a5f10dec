"""Opening a consumer: ``open_consumer``, and the consumer it makes.

The plain ``Consumer`` (``_api.py``) when no deserializer or interceptor is set; else a
``HookedConsumer``, whose iteration runs them (``_hooks.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.pool import Cluster
from pipeline.consumer._api import Consumer, _tp
from pipeline.consumer._config import ConsumerConfig, make_config
from pipeline.consumer._errors import ConsumerError
from pipeline.consumer._handoff import Callback
from pipeline.consumer._hooks import ConsumeHooks, DeserializationError
from pipeline.consumer._statistics import ConsumerStatistics
from pipeline.consumer._types import (
    ConsumedColumns,
    ConsumedRecord,
    OffsetAndMetadata,
    TopicPartition,
)
from pipeline.util.groups import unwrap_single_errors

__all__ = ["HookedConsumer", "open_consumer"]


def _no_columns(call: str) -> ValueError:
    return ValueError(
        f"{call} hands out the raw bytes as columns, but this consumer has a "
        "key_deserializer, value_deserializer or interceptors, which work on records: "
        "use batches() for records, or open the consumer without them")


class HookedConsumer(Consumer):
    """A ``Consumer`` whose iteration runs its ``ConsumeHooks``."""

    _hooks: ConsumeHooks
    _held: list[ConsumedRecord]
    _failed: DeserializationError | None

    def _use_hooks(self, hooks: ConsumeHooks) -> None:
        self._hooks = hooks
        self._held = []  # records deserialized, not handed out yet (per-record iteration)
        self._failed = None  # raised once what came before it was handed out

    def statistics(self) -> ConsumerStatistics:
        return dataclasses.replace(Consumer.statistics(self), interceptor_errors=self._hooks.errors)

    def _on_committed(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        self._hooks.committed(offsets)

    def _next_ready(self) -> ConsumedRecord | None:
        if self._held:
            return self._held.pop(0)
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        return None

    async def __anext__(self) -> ConsumedRecord:
        ready = self._next_ready()
        if ready is not None:
            return ready
        raw = await Consumer.__anext__(self)
        out, self._failed = self._hooks.records([raw])
        self._held = out
        ready = self._next_ready()
        if ready is None:  # on_consume dropped it: the next one
            return await self.__anext__()
        return ready

    def batches(self, max_records: int | None = None, *, columns: bool = False
                ) -> Any:
        if columns:
            raise _no_columns("batches(columns=True)")
        return self._hooked_batches(max_records)

    async def get_columns(self, max_records: int | None = None) -> ConsumedColumns:
        raise _no_columns("get_columns()")

    async def _hooked_batches(self, max_records: int | None
                              ) -> AsyncIterator[list[ConsumedRecord]]:
        async for raw in Consumer.batches(self, max_records):
            out, failed = self._hooks.records(raw)
            if out:
                yield out
            if failed is not None:
                raise failed

    async def getmany(self, max_records: int | None = None) -> list[ConsumedRecord]:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        out, self._failed = self._hooks.records(await Consumer.getmany(self, max_records))
        if not out and self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        return out


@asynccontextmanager
async def open_consumer(
    bootstrap: str | Sequence[str],
    *,
    group_id: str | None = None,
    topics: Iterable[str] = (),
    partitions: Iterable[tuple[str, int]] | None = None,
    config: ConsumerConfig | ClusterConfig | None = None,
    on_assigned: Callback | None = None,
    on_revoked: Callback | None = None,
    on_lost: Callback | None = None,
    **options: Any,
) -> AsyncIterator[Consumer]:
    """Run a consumer for the duration of an ``async with`` block.

    Args:
        bootstrap: ``"host:port"``, a comma-separated list, or a sequence of them.
        group_id: the consumer group; None reads without a group (every partition of
            ``topics``, or exactly ``partitions``; nothing is committed).
        topics: the topics to subscribe to.
        partitions: without a group, the ``(topic, partition)`` pairs to read instead
            of every partition of ``topics``.
        config: a ``ConsumerConfig`` (or a ``ClusterConfig``); keyword ``options``
            (``ConsumerConfig`` fields: ``auto_offset_reset``, ``enable_auto_commit``,
            ``session_timeout``... and every cluster option) override its fields.
        on_assigned, on_revoked, on_lost: ``callback(consumer, partitions)``, plain or
            async, run inside the iteration: after partitions are assigned; before
            they are revoked (commit there what was processed); after they were lost
            (the member was removed from the group: committing is no longer possible).

    Leaving the block runs pending revocations (committing first with
    ``enable_auto_commit``) and leaves the group, within ``close_timeout``.

    Raises:
        ConfigError: an invalid option, before anything connects.
    """
    if group_id is not None:
        options["group_id"] = group_id
    cfg = make_config(config, options)
    if isinstance(topics, str):
        raise TypeError("topics must be an iterable of names, not a string")
    topic_list = tuple(dict.fromkeys(topics))
    parts = None if partitions is None else tuple(dict.fromkeys(_tp(p) for p in partitions))
    if parts is not None and cfg.group_id is not None:
        raise ConsumerError("partitions= assigns partitions without a group; with group_id "
                            "the group assigns them (give topics=)")
    if not topic_list and not parts:
        raise ConsumerError("nothing to consume: give topics= (or partitions= without a group)")
    callbacks = {"on_assigned": on_assigned, "on_revoked": on_revoked, "on_lost": on_lost}
    with unwrap_single_errors():
        async with Cluster.open(bootstrap, cfg.cluster) as cluster, trio.open_nursery() as nursery:
            hooks = ConsumeHooks.of(cfg)
            if hooks is None:
                consumer = Consumer(cluster, cfg, topic_list, parts, callbacks)
            else:
                hooked = HookedConsumer(cluster, cfg, topic_list, parts, callbacks)
                hooked._use_hooks(hooks)
                consumer = hooked
            await consumer._start(nursery)
            try:
                yield consumer
            finally:
                await consumer.aclose()
                nursery.cancel_scope.cancel()
