"""The report task: channel-mode outcomes to ``producer.successes`` / ``errors``.

Messages put on ``producer.input`` report their outcome on two channels (the
sarama API): failures always on ``errors``, successes on ``successes`` when
``return_successes``. The ledger queues those outcomes (``Ledger.reports``)
when it settles such a message; this task hands them over, blocking on the
user if they do not read. A message's buffer bytes stay reserved until the
user has taken its outcome, so a user who never reads gets backpressure,
not unbounded memory. The ``Reporter`` owns the send sides of both channels.
"""

from __future__ import annotations

import logging

import trio

from pipeline.producer.ledger import Ledger
from pipeline.producer.message import OK, ProducerError, ProducerMessage

log = logging.getLogger("pipeline.producer")


class Reporter:
    def __init__(self, ledger: Ledger, channel_capacity: int) -> None:
        self._ledger = ledger
        self._successes, self.successes = trio.open_memory_channel[ProducerMessage](
            channel_capacity
        )
        self._errors, self.errors = trio.open_memory_channel[ProducerError](channel_capacity)

    async def run(self) -> None:
        """Hand outcomes over as the ledger queues them (until cancelled)."""
        ledger = self._ledger
        while True:
            await ledger.wait_reports()
            while ledger.reports:
                # Popped before the send: trio's send() hands the item over and
                # then yields, and shutdown's close() must not see it again.
                msg = ledger.reports.popleft()
                try:
                    if msg._state == OK:
                        await self._successes.send(msg)
                    else:
                        await self._errors.send(ledger.error_for(msg))
                except BaseException:
                    ledger.reports.appendleft(msg)  # a failed trio send() delivered nothing
                    raise
                ledger.release(msg._size)

    def close(self) -> None:
        """At shutdown (``run`` is cancelled): hand over what fits without
        waiting, count the rest as lost (logged), release every byte, and
        close both channels (readers see the end)."""
        ledger = self._ledger
        lost = 0
        while ledger.reports:
            msg = ledger.reports.popleft()
            try:
                if msg._state == OK:
                    self._successes.send_nowait(msg)
                else:
                    self._errors.send_nowait(ledger.error_for(msg))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                lost += 1
            ledger.release(msg._size)
        if lost:
            log.warning(
                "%d outcomes could not be handed over: producer.successes/errors were not drained",
                lost,
            )
        self._successes.close()
        self._errors.close()
