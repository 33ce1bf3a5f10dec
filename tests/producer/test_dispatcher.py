"""The dispatcher's inbox at shutdown (``Dispatcher.leftovers``)."""

from __future__ import annotations

from pipeline.producer._message import ProducerMessage
from pipeline.producer._stages.dispatcher import Dispatcher
from pipeline.producer._stages.envelopes import FlushMark


def test_leftovers_release_flush_marks_and_hand_back_only_raw_input_messages() -> None:
    """After the pipeline was cancelled: a flush mark still in the inbox is released
    (its ``flush()`` caller must not wait for a dispatcher that is gone), an accepted
    list stays with the ledger that holds it, and the raw ``producer.input`` messages,
    never accepted, are handed back in order."""
    dispatcher = Dispatcher(lambda topic: None, 8)  # type: ignore[arg-type,return-value]
    first, second = FlushMark(), FlushMark()
    raw = [ProducerMessage("t", b"a"), ProducerMessage("t", b"b")]
    for item in (first, [ProducerMessage("t", b"listed")], raw[0], second, raw[1]):
        dispatcher.inbox.send_nowait(item)  # type: ignore[arg-type]
    assert dispatcher.leftovers() == raw
    assert first.reached.is_set()
    assert second.reached.is_set()
    assert dispatcher.leftovers() == []
