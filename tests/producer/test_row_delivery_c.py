"""Rows of a columnar burst, by hand: the C helpers (``_delivery.run_metadata``,
``row_metadata``, ``new_row``) give what their pure-Python twins in ``send_rows.py``
give, and waiters of pending rows are woken (the scenario tests in
tests/scenarios/test_send_rows.py run whole schedules on both paths)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from pipeline.producer import message, send_rows
from pipeline.producer.message import FAILED, OK, RecordMetadata
from pipeline.producer.rows import RowChunk, RowRun

c: Any = message._c
needs_c = pytest.mark.skipif(c is None, reason="pipeline.producer._delivery is not built")


@needs_c
@pytest.mark.parametrize(("base", "append_time"), [(7, -1), (0, -1), (-1, -1), (7, 99), (-1, 99)])
def test_run_metadata_is_its_twins(base: int, append_time: int) -> None:
    stamps = [1000, 1001, 1002]
    got = c.run_metadata("t", 2, base, stamps, append_time)
    want = list(send_rows._run_metadata_py("t", 2, base, stamps, append_time))
    assert got == want and all(type(m) is RecordMetadata for m in got)
    assert [m.offset_known for m in got] == [base >= 0] * 3


@needs_c
def test_run_metadata_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="stamps must be a list"):
        c.run_metadata("t", 2, 0, (1, 2), -1)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        c.run_metadata("t", 2, 0, [1])


def _settled_row(state: int, offset: int, append_time: int, row: int) -> Any:
    chunk = RowChunk(None, 0)
    run = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = send_rows.SendRows("t", run, chunk)
    rows.values, rows.timestamps = [b"a", b"b", b"c", b"d"], [10, 11, 12, 13]
    rows.outcomes = send_rows.RowOutcomes(4, rows)
    part = RowRun("t", None, range(2, 4), 2, 0, chunk, 0)  # type: ignore[arg-type]
    part._state, part.offset, part.timestamp, part.partition = state, offset, append_time, 5
    rows.outcomes.record(part)
    return send_rows.new_row(rows, row)


@needs_c
@pytest.mark.parametrize(("offset", "append_time"), [(40, -1), (0, -1), (-1, -1), (40, 77)])
def test_row_metadata_is_its_twins(offset: int, append_time: int) -> None:
    d = _settled_row(OK, offset, append_time, 3)
    assert type(d) is send_rows.RowDelivery
    assert c.row_metadata(d) == send_rows._row_metadata_py(d) == d.record_metadata()
    assert c.row_metadata(d).offset == (offset + 1 if offset >= 0 else -1)


@needs_c
def test_row_metadata_is_none_unless_settled_ok() -> None:
    assert c.row_metadata(_settled_row(FAILED, 40, -1, 3)) is None
    assert c.row_metadata(_settled_row(OK, 40, -1, 0)) is None  # row 0: pending
    with pytest.raises(TypeError, match="expected a"):
        c.row_metadata(object())


@needs_c
def test_new_row_takes_two_arguments() -> None:
    with pytest.raises(TypeError, match="takes 2 arguments"):
        c.new_row(None)


@needs_c
def test_the_c_row_path_is_used_when_built_and_the_twins_otherwise() -> None:
    """``message._use`` switches the rows with the messages (send_rows' hook):
    C allocator, metadata builder and await slot, or their Python twins."""
    before = message.DELIVERY_AWAIT
    try:
        message._use("c")
        assert send_rows.new_row is c.new_row and send_rows.run_metadata is c.run_metadata
        assert "__await__" not in send_rows.RowDelivery.__dict__  # RowAwait's am_await
        message._use("python")
        assert send_rows.new_row is send_rows._new_row_py
        assert send_rows.run_metadata is send_rows._run_metadata_py
        assert send_rows.RowDelivery.__await__ is send_rows._row_await_py  # type: ignore[comparison-overlap]
        message._use("c")
        assert "__await__" not in send_rows.RowDelivery.__dict__
    finally:
        message._use(before)


async def test_every_task_awaiting_a_pending_row_is_woken(await_path: str) -> None:
    """Two tasks await a row before its burst is sealed (both on the seal
    event), then both and a third (on another row) wait for the outcomes: the
    run settling wakes all three, each with its own row's metadata. An event a
    task waits on is never replaced by a later waiter's."""
    from pipeline.producer.rows import RowChunk, RowRun

    chunk = RowChunk(None, 0)
    burst = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = send_rows.SendRows("t", burst, chunk)
    rows.values, rows.timestamps, rows.size = [b"a", b"b"], [10, 11], 2
    first, second = send_rows.new_row(rows, 0), send_rows.new_row(rows, 1)
    got: list[tuple[str, int]] = []

    async def wait(name: str, d: Any) -> None:
        got.append((name, (await d).offset))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "unsealed-a", first)
            nursery.start_soon(wait, "unsealed-b", first)
            await trio.testing.wait_all_tasks_blocked()
            rows.seal()
            await trio.testing.wait_all_tasks_blocked()  # both wait for the outcomes now
            nursery.start_soon(wait, "sealed", second)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            run = RowRun("t", None, range(0, 2), 2, 0, chunk, 0)  # type: ignore[arg-type]
            run._state, run.offset, run.timestamp, run.partition = OK, 5, -1, 0
            assert rows.outcomes is not None
            rows.outcomes.record(run)
    assert sorted(got) == [("sealed", 6), ("unsealed-a", 5), ("unsealed-b", 5)]
