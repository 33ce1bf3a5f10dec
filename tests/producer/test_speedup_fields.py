"""The contract between the C speedups and the Python classes (``_speedups/fields.py``).

C reads and writes the slots ``fields.py`` declares, at their offsets. These tests
fail when the declaration and the code part ways: a declared field that is not a plain
slot of its class (renamed, or turned into a property that C would bypass), a value of
another type than declared after both paths ran, a field name spelled in C instead of
taken from the declaration, or a declared module global that is not what the active
path says.
"""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path
from typing import Any

import pytest
import trio

from pipeline.producer import _speedups
from pipeline.producer._columnar.burst import RowBurst, RowDelivery
from pipeline.producer._columnar.row_outcomes import RowOutcomes
from pipeline.producer._columnar.rows import RowRun
from pipeline.producer._intake.intake import Intake
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes import delivery as _delivery
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.producer._speedups import fields
from pipeline.producer._sync import SyncDelivery
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

#: (class, its fields) for every pair an extension's setup receives
PAIRS: list[tuple[type, tuple[fields.Field, ...]]] = [
    (Intake, fields.SEND_INTAKE),
    (Ledger, fields.SEND_LEDGER),
    (RowBurst, fields.SEND_BURST),
    (ProducerMessage, fields.DELIVERY_MESSAGE),
    (RowBurst, fields.DELIVERY_BURST),
    (RowOutcomes, fields.DELIVERY_OUTCOMES),
    (RowRun, fields.DELIVERY_RUN),
    (SyncDelivery, fields.SYNC_HANDLE),
    (ProducerMessage, fields.SEND_MESSAGE),
    (ProducerMessage, fields.MESSAGE_INIT),
]
SPEEDUPS = Path(_speedups.__file__).parent


@pytest.mark.parametrize(("cls", "declared"), PAIRS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_declared_field_is_a_plain_slot_of_its_class(
    cls: type, declared: tuple[fields.Field, ...]
) -> None:
    for field in declared:
        assert field.name in cls.__slots__, f"{cls.__name__}.{field.name} is not in __slots__"
        descriptor = cls.__dict__.get(field.name)
        assert type(descriptor) is types.MemberDescriptorType, (
            f"{cls.__name__}.{field.name} is {type(descriptor).__name__}, not a plain slot: "
            "C writes the slot and would bypass it")


def test_the_fields_are_named_once_and_c_spells_none_of_them() -> None:
    """Each tuple names a field once, and the C sources look offsets up only through
    ``member_offsets`` (the declaration), never by a name of their own."""
    for _, declared in PAIRS:
        assert len(set(fields.names(declared))) == len(declared)
    for source in ("_send.c", "_delivery.c"):
        text = (SPEEDUPS / source).read_text()
        assert re.findall(r'member_offset\s*\([^;]*"', text) == [], source
        assert "member_offsets(" in text, source


def _check_types(obj: Any, declared: tuple[fields.Field, ...], seen: set[str]) -> None:
    for field in declared:
        value = getattr(obj, field.name)
        kind = type(value).__name__
        assert kind in field.types, (
            f"{type(obj).__name__}.{field.name} holds a {kind}, declared {field.types}")
        seen.add(f"{type(obj).__name__}.{field.name}:{kind}")


async def test_live_objects_hold_the_declared_types(
    send_path: str, await_path: str, nursery: trio.Nursery
) -> None:
    """A keyed burst with callbacks, awaited and settled, on each pair of paths:
    every declared field of every object C touches holds a type ``fields.py`` allows."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 3)
    seen: set[str] = set()
    async with open_fake_producer(fake) as producer:
        intake = producer._intake
        intake._columns_next = True
        deliveries = [await producer.send("t", b"v%d" % i, key=b"k%d" % (i % 5),
                                          on_delivery=lambda m, e: None) for i in range(40)]
        rows = intake._rows
        assert isinstance(rows, RowBurst)  # the open burst, before the dispatcher takes it
        _check_types(intake, fields.SEND_INTAKE, seen)
        _check_types(intake._ledger, fields.SEND_LEDGER, seen)
        _check_types(rows, fields.SEND_BURST, seen)
        message = await producer.send("t", b"m", headers=[("h", b"x")])  # the message path
        _check_types(message, fields.DELIVERY_MESSAGE, seen)
        await producer.flush()
        for d in deliveries:
            await d
        assert all(type(d) is RowDelivery for d in deliveries)
        _check_types(rows, fields.DELIVERY_BURST, seen)
        outcomes = rows.outcomes
        assert isinstance(outcomes, RowOutcomes)
        _check_types(outcomes, fields.DELIVERY_OUTCOMES, seen)
        for run in outcomes.runs:
            _check_types(run, fields.DELIVERY_RUN, seen)
        await message
        _check_types(message, fields.DELIVERY_MESSAGE, seen)
    assert "RowOutcomes.inverse:bytearray" in seen  # keyed: the row -> position map exists


async def test_send_many_messages_hold_the_declared_types(
    send_path: str, nursery: trio.Nursery
) -> None:
    """A send_many call as rows (``messages.py``), some of its messages pinned past the
    topic's partitions: every field ``SEND_MESSAGE`` declares holds a declared type
    after take, accept and settle, on each path."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 3)
    seen: set[str] = set()
    msgs = [ProducerMessage("t", f"v{i}" if i % 2 else b"v", "k" if i % 3 else None,
                            [("h", b"x")] if i % 4 else {} if i % 5 else [],
                            7 if i == 9 else None, None if i % 2 else 5) for i in range(70)]
    async with open_fake_producer(fake) as producer:
        group = await producer.send_many(msgs)
        result = await group
        assert (result.delivered, result.failed) == (69, 1)
        for msg in msgs:
            _check_types(msg, fields.SEND_MESSAGE, seen)
    assert {"ProducerMessage._outcome:PartitionOutOfRangeError",
            "ProducerMessage.headers:tuple", "ProducerMessage.headers:dict"} <= seen


@pytest.mark.parametrize("kind", ["c", "python"])
def test_each_declared_global_is_what_the_path_says(kind: str) -> None:
    """A global the await path switches is the named C function on the C path and
    not on the Python path; one set when its extension loads is the C function
    whenever the extension is loaded; one C only reads exists in its module."""
    c_modules = {"_send": _speedups.load("_send"), "_delivery": _delivery._c}
    if kind == "c" and (c_modules["_delivery"] is None or c_modules["_send"] is None):
        pytest.skip("the extensions are not built (or PIPELINE_PURE_PYTHON is set)")
    before = _delivery.DELIVERY_AWAIT
    _delivery._use(kind)
    try:
        for g in fields.GLOBALS:
            module = importlib.import_module(g.module)
            assert hasattr(module, g.name), f"{g.module}.{g.name} is declared but missing"
            if g.when == "read":
                continue
            ext, _, attr = g.c_path.partition(".")
            c_object = getattr(c_modules[ext], attr) if c_modules[ext] is not None else None
            if g.when == "load":
                assert c_object is None or getattr(module, g.name) is c_object
            elif kind == "c":
                assert getattr(module, g.name) is c_object, f"{g.module}.{g.name}"
            else:
                assert c_object is None or getattr(module, g.name) is not c_object
    finally:
        _delivery._use(before)
