"""SyncProducer: the trio pipeline for plain blocking code.

A background thread runs ``trio.run`` with one ``open_producer`` block; each
call hops into it with ``trio.from_thread.run``. ``send`` blocks until the
message's outcome (sarama's SyncProducer semantics); ``send_many`` is the
fast path for bulk callers.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._api import Producer, open_producer
from pipeline.producer._config import ProducerConfig
from pipeline.producer._errors import ProducerClosed
from pipeline.producer._message import ProducerMessage, RecordMetadata
from pipeline.producer._outcomes.delivery import GroupResult
from pipeline.producer._stages.transactions import State


class SyncProducer:
    """A blocking producer. Use as a context manager or call ``close()``.

    Example::

        with SyncProducer("127.0.0.1:9092", acks="all") as producer:
            meta = producer.send("events", b"value", key=b"k")
    """

    def __init__(
        self, bootstrap: str | Sequence[str], config: ProducerConfig | None = None, **options: Any
    ) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._producer: Producer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=trio.run,
            args=(functools.partial(self._main, bootstrap, config, options),),
            name="pipeline-sync-producer",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(
        self, bootstrap: str | Sequence[str], config: ProducerConfig | None, options: dict[str, Any]
    ) -> None:
        try:
            async with open_producer(bootstrap, config, **options) as producer:
                self._producer = producer
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
        if self._closed or self._producer is None:
            raise ProducerClosed("the SyncProducer is closed")
        return trio.from_thread.run(
            functools.partial(afn, *args, **kwargs), trio_token=self._token
        )

    def send(self, topic: str, value: bytes | str | None, **kwargs: Any) -> RecordMetadata:
        """Send one message and block until it is acknowledged (or raise ``ProducerError``)."""
        assert self._producer is not None
        result: RecordMetadata = self._call(self._producer.send_and_wait, topic, value, **kwargs)
        return result

    def send_many(self, messages: Iterable[ProducerMessage]) -> GroupResult:
        """Send many messages and block until all have an outcome."""
        assert self._producer is not None
        producer = self._producer

        async def run() -> GroupResult:
            group = await producer.send_many(list(messages))
            return await group.wait()

        result: GroupResult = self._call(run)
        return result

    def flush(self) -> None:
        assert self._producer is not None
        self._call(self._producer.flush)

    # -- transactions (transactional_id=...): the async producer's, blocking -------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncProducer]:
        """Begin a transaction; commit it when the block ends normally, abort it when
        the block raises, or its commit fails while the transaction can still be
        aborted (the exception then propagates)."""
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            self._abort_for(exc)
            raise
        try:
            self.commit_transaction()
        except BaseException as exc:
            assert self._producer is not None
            if self._producer._transactions().state in (State.IN_TRANSACTION, State.ABORTABLE):
                self._abort_for(exc)
            raise

    def _abort_for(self, exc: BaseException) -> None:
        try:
            self.abort_transaction()
        except KafkaError as abort_error:
            exc.add_note(f"(aborting the transaction failed too: {abort_error!r})")

    def begin_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._producer.begin_transaction)

    def commit_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._producer.commit_transaction)

    def abort_transaction(self) -> None:
        assert self._producer is not None
        self._call(self._producer.abort_transaction)

    def send_offsets_to_transaction(self, offsets: Mapping[Any, int], group_metadata: Any) -> None:
        assert self._producer is not None
        self._call(self._producer.send_offsets_to_transaction, offsets, group_metadata)

    def close(self) -> None:
        """Flush (up to ``close_timeout``) and stop the background thread."""
        if self._closed:
            return
        self._closed = True
        stop = self._stop
        if stop is not None:
            trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
