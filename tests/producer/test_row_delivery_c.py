"""The rows' C helpers (``_delivery.run_metadata``, ``row_metadata``, ``new_row``)
give what their pure-Python twins in ``send_rows.py`` give (the scenario tests in
tests/scenarios/test_send_rows.py run whole schedules on both paths)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.producer import message, send_rows
from pipeline.producer.message import FAILED, OK, RecordMetadata
from pipeline.producer.rows import RowChunk, RowRun

c: Any = message._c
pytestmark = pytest.mark.skipif(c is None, reason="pipeline.producer._delivery is not built")


@pytest.mark.parametrize(("base", "append_time"), [(7, -1), (0, -1), (-1, -1), (7, 99), (-1, 99)])
def test_run_metadata_is_its_twins(base: int, append_time: int) -> None:
    stamps = [1000, 1001, 1002]
    got = c.run_metadata("t", 2, base, stamps, append_time)
    want = list(send_rows._run_metadata_py("t", 2, base, stamps, append_time))
    assert got == want and all(type(m) is RecordMetadata for m in got)
    assert [m.offset_known for m in got] == [base >= 0] * 3


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
    return c.new_row(rows, row)


@pytest.mark.parametrize(("offset", "append_time"), [(40, -1), (0, -1), (-1, -1), (40, 77)])
def test_row_metadata_is_its_twins(offset: int, append_time: int) -> None:
    d = _settled_row(OK, offset, append_time, 3)
    assert type(d) is send_rows.RowDelivery
    assert c.row_metadata(d) == send_rows._row_metadata_py(d) == d.record_metadata()
    assert c.row_metadata(d).offset == (offset + 1 if offset >= 0 else -1)


def test_row_metadata_is_none_unless_settled_ok() -> None:
    assert c.row_metadata(_settled_row(FAILED, 40, -1, 3)) is None
    assert c.row_metadata(_settled_row(OK, 40, -1, 0)) is None  # row 0: pending
    with pytest.raises(TypeError, match="expected a"):
        c.row_metadata(object())


def test_new_row_takes_two_arguments() -> None:
    with pytest.raises(TypeError, match="takes 2 arguments"):
        c.new_row(None)
