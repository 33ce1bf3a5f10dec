"""Rows of a columnar burst, by hand: the C helpers (``_delivery.call_back_ok``,
``row_metadata``, ``new_row``) give what their pure-Python twins in ``_burst.py``
give, and waiters of pending rows are woken (the scenario tests in
tests/scenarios/test_send_rows.py run whole schedules on both paths)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.producer._columnar import burst as _burst
from pipeline.producer._columnar import row_outcomes
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._message import FAILED, OK, RecordMetadata
from pipeline.producer._outcomes import delivery as _delivery

c: Any = _delivery._c
needs_c = pytest.mark.skipif(c is None, reason="pipeline.producer._speedups._delivery is not built")


def _call_back_oks() -> list[Any]:
    """The C ``call_back_ok`` (when built) and its Python twin."""
    return [_burst._call_back_ok_py] + ([c.call_back_ok] if c is not None else [])


@pytest.mark.parametrize("call_back_ok", _call_back_oks())
@pytest.mark.parametrize(("base", "append_time"), [(7, -1), (0, -1), (-1, -1), (7, 99), (-1, 99)])
def test_call_back_ok_hands_each_row_its_metadata(call_back_ok: Any, base: int,
                                                   append_time: int) -> None:
    """Row i hears (RecordMetadata(offset base + i, or -1 unknown; timestamp
    LogAppendTime or its own), None), in row order; a row without a callback
    is skipped, not shifted."""
    heard: list[tuple[str, Any, Any]] = []

    def fn(name: str) -> Any:
        return lambda meta, error: heard.append((name, meta, error))

    call_back_ok([fn("a"), None, fn("c")], "t", 2, base, [1000, 1001, 1002], append_time,
                 _never_failed)
    known = base >= 0
    want = [RecordMetadata("t", 2, base + i if known else -1,
                           append_time if append_time >= 0 else 1000 + i, known)
            for i in (0, 2)]
    assert heard == [("a", want[0], None), ("c", want[1], None)]
    assert all(type(meta) is RecordMetadata for _, meta, _ in heard)


@pytest.mark.parametrize("call_back_ok", _call_back_oks())
def test_call_back_ok_never_changes_a_metadata_someone_kept(call_back_ok: Any) -> None:
    """The C loop refills the row before's tuple when nobody kept it: a
    callback that keeps its metadata keeps what it was given, whatever the
    rows after it hear; one that only reads sees its own row each time."""
    kept: list[Any] = []
    read: list[tuple[int, int]] = []

    def keep(meta: Any, error: Any) -> None:
        kept.append(meta)

    def look(meta: Any, error: Any) -> None:
        read.append((meta.offset, meta.timestamp))

    call_back_ok([look, look, keep, look, keep, keep, look], "t", 1, 20,
                 [100, 101, 102, 103, 104, 105, 106], -1, _never_failed)
    assert read == [(20, 100), (21, 101), (23, 103), (26, 106)]
    assert kept == [RecordMetadata("t", 1, 22, 102, True), RecordMetadata("t", 1, 24, 104, True),
                    RecordMetadata("t", 1, 25, 105, True)]


def _never_failed(fn: Any, what: Any) -> None:
    raise AssertionError(f"failed({fn!r}, {what!r}) was not expected")


@pytest.mark.parametrize("call_back_ok", _call_back_oks())
def test_call_back_ok_reports_a_raising_callback_and_goes_on(call_back_ok: Any) -> None:
    """A callback's Exception goes to failed(fn, meta) while it is the exception
    being handled (what logging's exc_info reads), with its traceback; the next
    row still hears; afterwards no exception is left being handled."""
    heard: list[int] = []
    reports: list[tuple[Any, Any, Any]] = []

    def boom(meta: Any, error: Any) -> None:
        raise ValueError(f"bad row {meta.offset}")

    def failed(fn: Any, what: Any) -> None:
        exc = sys.exc_info()[1]
        assert exc is not None and exc.__traceback__ is not None
        reports.append((fn, what.offset, str(exc)))

    call_back_ok([boom, lambda meta, error: heard.append(meta.offset)], "t", 0, 10, [5, 6], -1,
                 failed)
    assert reports == [(boom, 10, "bad row 10")]
    assert heard == [11]
    assert sys.exc_info() == (None, None, None)


@pytest.mark.parametrize("call_back_ok", _call_back_oks())
def test_call_back_ok_lets_base_exceptions_and_failed_errors_through(call_back_ok: Any) -> None:
    """Not an Exception (KeyboardInterrupt) is not the user's bug to count: it
    propagates, as an exception from failed() itself does; the rows after it
    are not called."""
    heard: list[int] = []

    def interrupt(meta: Any, error: Any) -> None:
        raise KeyboardInterrupt

    def boom(meta: Any, error: Any) -> None:
        raise ValueError("bad")

    def failing(fn: Any, what: Any) -> None:
        raise RuntimeError("the report failed")

    rest = [lambda meta, error: heard.append(meta.offset)]
    with pytest.raises(KeyboardInterrupt):
        call_back_ok([interrupt, *rest], "t", 0, 10, [5, 6], -1, _never_failed)
    with pytest.raises(RuntimeError, match="the report failed"):
        call_back_ok([boom, *rest], "t", 0, 10, [5, 6], -1, failing)
    assert heard == []


@pytest.mark.parametrize("call_back_ok", _call_back_oks())
def test_call_back_ok_refuses_callbacks_and_rows_of_different_lengths(call_back_ok: Any) -> None:
    # (the C loop's message, or zip(strict=True)'s)
    unequal = r"callbacks for .* rows|zip\(\) argument \d is (longer|shorter)"
    with pytest.raises(ValueError, match=unequal):
        call_back_ok([None, None], "t", 2, 0, [1], -1, _never_failed)
    with pytest.raises(ValueError, match=unequal):
        call_back_ok([None], "t", 2, 0, [1, 2], -1, _never_failed)


@pytest.mark.parametrize("stamps", [
    [1_700_000_000_000] * 3 + [1_700_000_000_001] * 2,  # a wall clock's: pack_ints
    [5, -1, 7, 1 << 62, 0],  # an injected clock's odd value (-1): array's own loop
])
def test_a_sealed_burst_packs_its_timestamps_as_int64(stamps: list[int]) -> None:
    """``RowBurst.seal``: the run's timestamp column is the rows' timestamps as
    int64, whichever way it was packed (the kernel's ``pack_ints``, or
    ``array`` for what it refuses), and the packed bytes are counted."""
    chunk = RowChunk(None, 0)
    burst = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = _burst.RowBurst("t", burst, chunk)
    rows.values, rows.timestamps = [b"v%d" % i for i in range(5)], list(stamps)
    nbytes = rows.seal()
    assert burst.columns.timestamps is not None
    assert burst.columns.timestamps.format == "q"
    assert burst.columns.timestamps.tolist() == stamps and burst.count == 5
    assert nbytes == 8 * 6 + len(b"".join(rows.values)) + 8 * 5


def test_a_failed_run_calls_back_only_the_rows_that_have_a_callback() -> None:
    """A burst's rows with and without callbacks, its run failed: each row with
    one hears (None, its error naming its value), in row order; a row without
    one is skipped, and nothing counts as a callback error."""
    chunk = RowChunk(None, 0)
    burst = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = _burst.RowBurst("t", burst, chunk)
    heard: list[tuple[Any, bytes]] = []
    rows.values, rows.timestamps = [b"a", b"b", b"c", b"d"], [10, 11, 12, 13]
    rows.on_delivery = [None, lambda m, e: heard.append((m, e.message.value)), None,
                        lambda m, e: heard.append((m, e.message.value))]
    outcomes = _burst.RowOutcomes(rows)
    run = RowRun("t", None, range(0, 4), 4, 0, chunk, 0)  # type: ignore[arg-type]
    run._state, run._outcome, run.partition = FAILED, RuntimeError("no"), 1
    outcomes.record(run)
    outcomes.call_back(run, _never_failed)
    assert heard == [(None, b"b"), (None, b"d")]


@needs_c
def test_call_back_ok_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="fns and stamps must be lists"):
        c.call_back_ok([None], "t", 2, 0, (1,), -1, _never_failed)
    with pytest.raises(ValueError, match="2 callbacks for 1 rows"):
        c.call_back_ok([None, None], "t", 2, 0, [1], -1, _never_failed)
    with pytest.raises(TypeError, match="takes 7 arguments"):
        c.call_back_ok([None], "t", 2, 0, [1], -1)


@needs_c
def test_row_delivery_is_no_gc_object_and_frees_its_burst() -> None:
    """RowDelivery's instances are not GC objects (``_delivery.make_untracked``):
    allocating one does not count toward a collection, and dropping it drops
    its burst (RowAwait's dealloc). Its ``_row`` is a C integer, read and
    written as an int."""
    import gc
    import weakref

    class Burst:  # stands for RowBurst: anything that can be weakly referenced
        pass

    burst = Burst()
    gone = weakref.ref(burst)
    d = _burst.new_row(burst, 300)  # type: ignore[arg-type]
    assert not gc.is_tracked(d) and gc.get_referents(d) == []
    assert d._row == 300 and d._rows is burst
    d._row = 301
    assert d._row == 301
    gc.collect()
    before = gc.get_count()[0]
    kept = [_burst.new_row(burst, i) for i in range(1000)]  # type: ignore[arg-type]
    assert gc.get_count()[0] - before < 10  # (a GC allocation would count 1000)
    del burst, d, kept
    assert gone() is None


@needs_c
def test_a_row_class_of_another_layout_stays_a_gc_class_and_its_rows_are_untracked() -> None:
    """``make_untracked`` changes only a class of exactly RowAwait's layout: one
    with a ``__dict__`` stays a GC class (its rows untracked one by one by
    ``new_row``); a class that is no RowAwait is refused."""
    import gc

    bind = _burst._setup_rows

    with_dict = type("WithDict", (c.RowAwait,), {})
    try:
        bind(with_dict)
        assert with_dict.__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC: unchanged
        d = c.new_row(object(), 1)
        assert type(d) is with_dict and gc.is_tracked(d) is False and d._row == 1
        d.note = "a dict of its own"  # (the layout make_untracked refused)
        with pytest.raises(TypeError, match="subclass of RowAwait"):
            bind(_burst.RowBurst)
    finally:
        bind(_burst.RowDelivery)
    assert not _burst.RowDelivery.__flags__ & (1 << 14)


def _settled_row(state: int, offset: int, append_time: int, row: int) -> Any:
    chunk = RowChunk(None, 0)
    run = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = _burst.RowBurst("t", run, chunk)
    rows.values, rows.timestamps = [b"a", b"b", b"c", b"d"], [10, 11, 12, 13]
    rows.outcomes = _burst.RowOutcomes(rows)
    part = RowRun("t", None, range(2, 4), 2, 0, chunk, 2)  # type: ignore[arg-type]
    part._state, part.offset, part.timestamp, part.partition = state, offset, append_time, 5
    rows.outcomes.record(part)
    return _burst.new_row(rows, row)


@needs_c
@pytest.mark.parametrize(("offset", "append_time"), [(40, -1), (0, -1), (-1, -1), (40, 77)])
def test_row_metadata_is_its_twins(offset: int, append_time: int) -> None:
    d = _settled_row(OK, offset, append_time, 3)
    assert type(d) is _burst.RowDelivery
    assert c.row_metadata(d) == _burst._row_metadata_py(d) == d.record_metadata()
    assert c.row_metadata(d).offset == (offset + 1 if offset >= 0 else -1)


@needs_c
@pytest.mark.parametrize(("first", "then"), [
    (2**31, 1000),   # a two-digit int in the spare, then a one-digit value
    (1000, 2**31),   # a one-digit int, then a value that needs two digits
    (1000, 4),       # then a small int: the shared singleton, never a rewritten one
    (1000, 2000),    # rewritten in place: nobody else holds the spare or its int
])
def test_a_dropped_results_offset_int_is_reused_only_where_nobody_can_tell(
    first: int, then: int
) -> None:
    """offset_int (_delivery.c): the spare RecordMetadata's offset int is rewritten
    for the next result only when nothing else holds it and the value fits its
    one digit above the small ints; a kept int or tuple never changes."""
    a, b = _settled_row(OK, first, -1, 3), _settled_row(OK, then, -1, 3)
    c.row_metadata(a)  # dropped: the spare holds its int alone
    meta = c.row_metadata(b)
    assert meta.offset == then + 1
    if then + 1 <= 256:
        assert meta.offset is int(str(then + 1))  # the small int itself
    kept_int = meta.offset
    del meta
    again = c.row_metadata(a)  # the tuple was free again, its int is not: a new int
    assert (kept_int, again.offset) == (then + 1, first + 1)
    kept_meta = again
    assert c.row_metadata(b).offset == then + 1 and kept_meta.offset == first + 1


@needs_c
@pytest.mark.parametrize("seed", range(6))
def test_each_row_finds_its_own_runs_span_in_any_order_of_settling_and_reading(
    seed: int,
) -> None:
    """A burst of 60 rows cut into runs of 1-9 rows; the runs settle in a
    shuffled order (one of them FAILED). After each, every row is read forwards,
    backwards and shuffled (so the C lookup's hint is right, stale, or out of
    range): C and its twin agree with the truth: a row in a settled OK run has
    that run's partition and its offset base + its place in the run; a row in
    a failed run, or in a run not settled yet (before, between or after the
    settled spans), has no metadata."""
    import random

    rng = random.Random(seed)
    chunk = RowChunk(None, 0)
    burst = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = _burst.RowBurst("t", burst, chunk)
    rows.values, rows.timestamps = [b"v"] * 60, list(range(1000, 1060))
    rows.outcomes = _burst.RowOutcomes(rows)
    runs, start = [], 0
    while start < 60:
        stop = min(60, start + rng.randint(1, 9))
        run = RowRun("t", None, range(start, stop), stop - start, 0, chunk, start)  # type: ignore[arg-type]
        run._state, run.offset, run.timestamp, run.partition = OK, 100 * len(runs), -1, len(runs)
        runs.append(run)
        start = stop
    runs[rng.randrange(len(runs))]._state = FAILED
    deliveries = [_burst.new_row(rows, row) for row in range(60)]
    settled: list[RowRun] = []
    for run in rng.sample(runs, len(runs)):
        rows.outcomes.record(run)
        settled.append(run)
        for order in (range(60), range(59, -1, -1), rng.sample(range(60), 60)):
            for row in order:
                d = deliveries[row]
                [mine] = [r for r in runs if row in r.rows]
                if mine in settled and mine._state == OK:
                    want = RecordMetadata("t", mine.partition,
                                          mine.offset + row - mine.rows.start, 1000 + row, True)
                else:
                    want = None
                assert c.row_metadata(d) == want, (row, order)
                assert (_burst._row_metadata_py(d) if want else None) == want
                assert d._run() is (mine if mine in settled else None)


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
    """``_delivery._use`` switches the rows with the messages (burst.py's hook):
    C allocator, metadata builder and await slot, or their Python twins."""
    before = _delivery.DELIVERY_AWAIT
    try:
        _delivery._use("c")
        assert _burst.new_row is c.new_row and row_outcomes.call_back_ok is c.call_back_ok
        assert row_outcomes.map_rows is c.map_rows
        assert "__await__" not in _burst.RowDelivery.__dict__  # RowAwait's am_await
        _delivery._use("python")
        assert _burst.new_row is _burst._new_row_py
        assert row_outcomes.call_back_ok is _burst._call_back_ok_py
        assert row_outcomes.map_rows is row_outcomes._map_rows_py
        assert _burst.RowDelivery.__await__ is _burst._row_await_py  # type: ignore[comparison-overlap]
        _delivery._use("c")
        assert "__await__" not in _burst.RowDelivery.__dict__
    finally:
        _delivery._use(before)


async def test_every_task_awaiting_a_pending_row_is_woken(await_path: str) -> None:
    """Two tasks await a row before its burst is sealed (both on the seal
    event), then both and a third (on another row) wait for the outcomes: the
    run settling wakes all three, each with its own row's metadata. An event a
    task waits on is never replaced by a later waiter's."""
    from pipeline.producer._columnar.rows import RowChunk, RowRun

    chunk = RowChunk(None, 0)
    burst = RowRun("t", None, None, 0, 0, chunk, 0)  # type: ignore[arg-type]
    rows = _burst.RowBurst("t", burst, chunk)
    rows.values, rows.timestamps, rows.size = [b"a", b"b"], [10, 11], 2
    first, second = _burst.new_row(rows, 0), _burst.new_row(rows, 1)
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


def _map_rows() -> list[Any]:
    """The C ``map_rows`` (when built) and its Python twin."""
    return [row_outcomes._map_rows_py] + ([c.map_rows] if c is not None else [])


@pytest.mark.parametrize("map_rows", _map_rows())
@pytest.mark.parametrize("seed", range(4))
def test_map_rows_writes_each_rows_wire_position(map_rows: Any, seed: int) -> None:
    """positions[rows[k]] = place + k for a keyed run's rows (any subset of the
    burst's rows, in any order), and nothing else is written; a row outside the
    burst raises ValueError naming it."""
    import random
    from array import array

    rng = random.Random(seed)
    n = rng.randrange(1, 300)
    rows = rng.sample(range(n), rng.randrange(0, n + 1))
    place = rng.randrange(0, 50)
    positions = memoryview(bytearray(b"\xff" * (8 * n))).cast("q")
    map_rows(positions, memoryview(array("q", rows)), place)
    want = [-1] * n
    for k, row in enumerate(rows):
        want[row] = place + k
    assert positions.tolist() == want
    for bad in (n, -1):
        with pytest.raises(ValueError, match=f"row {bad} is outside 0..{n - 1}"):
            map_rows(positions, memoryview(array("q", [0, bad])), place)


@pytest.mark.skipif(c is None, reason="pipeline.producer._speedups._delivery is not built")
def test_map_rows_refuses_buffers_that_are_not_int64() -> None:
    from array import array

    with pytest.raises(ValueError, match="int64 buffers"):
        c.map_rows(bytearray(12), memoryview(array("q", [0])), 0)
    with pytest.raises(BufferError, match="not writable"):
        c.map_rows(bytes(16), memoryview(array("q", [0])), 0)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        c.map_rows(bytearray(16), memoryview(array("q", [0])))
