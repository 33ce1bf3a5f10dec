"""SyncConsumer: the consumer for plain blocking code.

A background thread runs ``trio.run`` with one ``open_consumer`` block; each call hops
into it with ``trio.from_thread.run``. Records come a poll at a time, as from the Java
consumer: ``consume(n)`` returns up to ``n`` records and the positions advance past all
of them, so ``commit()`` after processing a poll's records commits exactly those;
iterating the consumer takes one poll (``max_poll_records``) at a time the same way,
and rebalance changes run between two polls.

Rebalance callbacks run in the consumer's thread with the underlying async
:class:`~pipeline.consumer.Consumer`; an async callback may ``await consumer.commit()``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import trio

from pipeline.consumer._api import Consumer
from pipeline.consumer._errors import ConsumerClosedError
from pipeline.consumer._open import open_consumer
from pipeline.consumer._statistics import ConsumerStatistics
from pipeline.consumer._types import (
    ConsumedColumns,
    ConsumedRecord,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    TopicPartition,
)

__all__ = ["SyncConsumer"]


class SyncConsumer:
    """A blocking consumer. Use as a context manager or call ``close()``; the
    arguments are :func:`~pipeline.consumer.open_consumer`'s.

    Example::

        with SyncConsumer("127.0.0.1:9092", group_id="billing", topics=["orders"],
                          auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
            for record in consumer:
                handle(record)
                consumer.commit()
    """

    def __init__(self, bootstrap: str | Sequence[str], **options: Any) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._consumer: Consumer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=trio.run,
            args=(functools.partial(self._main, bootstrap, options),),
            name="pipeline-sync-consumer",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, bootstrap: str | Sequence[str], options: dict[str, Any]) -> None:
        try:
            async with open_consumer(bootstrap, **options) as consumer:
                self._consumer = consumer
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
                return
            raise

    def _call(self, afn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed or self._consumer is None:
            raise ConsumerClosedError("the SyncConsumer is closed")
        return trio.from_thread.run(functools.partial(afn, *args, **kwargs), trio_token=self._token)

    def _sync(self, fn: Any, *args: Any) -> Any:
        if self._closed or self._consumer is None:
            raise ConsumerClosedError("the SyncConsumer is closed")
        return trio.from_thread.run_sync(functools.partial(fn, *args), trio_token=self._token)

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None
        return self._consumer

    # ------------------------------------------------------------ records

    def consume(self, num_messages: int | None = None, timeout: float = math.inf
                ) -> list[ConsumedRecord]:
        """Up to ``num_messages`` records (default ``max_poll_records``), waiting at most
        ``timeout`` seconds for the first; an empty list if none came."""
        consumer = self.consumer

        async def take() -> list[ConsumedRecord]:
            with trio.move_on_after(timeout):
                return await consumer.getmany(num_messages)
            return []

        result: list[ConsumedRecord] = self._call(take)
        return result

    def consume_columns(self, max_records: int | None = None, timeout: float = math.inf
                        ) -> ConsumedColumns | None:
        """One partition's next run of records as :class:`ConsumedColumns` (at most
        ``max_records``, default ``max_poll_records``; the async ``get_columns``), or
        None if none came within ``timeout`` seconds. ``commit()`` afterwards commits
        past it, as after ``consume``."""
        consumer = self.consumer

        async def take() -> ConsumedColumns | None:
            with trio.move_on_after(timeout):
                return await consumer.get_columns(max_records)
            return None

        result: ConsumedColumns | None = self._call(take)
        return result

    def poll(self, timeout: float = math.inf) -> ConsumedRecord | None:
        """One record, or None after ``timeout`` seconds."""
        got = self.consume(1, timeout)
        return got[0] if got else None

    def __iter__(self) -> Iterator[ConsumedRecord]:
        while True:
            yield from self.consume()

    # ------------------------------------------------------------ offsets

    def commit(self, offsets: Mapping[tuple[str, int], int | OffsetAndMetadata] | None = None
               ) -> None:
        """Commit ``offsets``, by default the positions after every record returned."""
        self._call(self.consumer.commit, offsets)

    def committed(self, tps: Iterable[tuple[str, int]]
                  ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        result: dict[TopicPartition, OffsetAndMetadata | None] = self._call(
            self.consumer.committed, list(tps))
        return result

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self._call(self.consumer.seek, tp, offset)

    def position(self, tp: tuple[str, int]) -> int | None:
        result: int | None = self._sync(self.consumer.position, tp)
        return result

    def assignment(self) -> frozenset[TopicPartition]:
        result: frozenset[TopicPartition] = self._sync(self.consumer.assignment)
        return result

    def pause(self, tps: Iterable[tuple[str, int]]) -> None:
        self._sync(self.consumer.pause, list(tps))

    def resume(self, tps: Iterable[tuple[str, int]]) -> None:
        self._sync(self.consumer.resume, list(tps))

    def group_metadata(self) -> ConsumerGroupMetadata:
        result: ConsumerGroupMetadata = self._sync(self.consumer.group_metadata)
        return result

    def statistics(self) -> ConsumerStatistics:
        """The consumer's statistics now (``Consumer.statistics``), taken in its thread."""
        result: ConsumerStatistics = self._sync(self.consumer.statistics)
        return result

    @property
    def state(self) -> str:
        result: str = self._sync(lambda: self.consumer.state)
        return result

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Run pending revocations (committing with auto-commit), leave the group, and
        stop the background thread."""
        if self._closed:
            return
        self._closed = True
        stop = self._stop
        if stop is not None:
            trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
