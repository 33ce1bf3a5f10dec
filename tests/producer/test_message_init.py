"""``ProducerMessage(...)`` in C (``_delivery.c``'s ``message_new`` / ``message_init``)
against its twin, ``ProducerMessage.__init__`` (``_message.init_py``): every slot of
``fields.MESSAGE_INIT`` the same after the same call, and the same ``TypeError`` for a
call Python would refuse. A message whose fields are all atomic is no GC object (C only)
until a store could put it in a cycle."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from pipeline.producer import _message
from pipeline.producer._message import PENDING, ProducerMessage
from pipeline.producer._speedups import fields

pytestmark = pytest.mark.skipif(
    ProducerMessage.__init__ is _message.init_py, reason="the C speedups are not loaded")

META = object()
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("t", b"v"), {}),
    (("t", None), {}),
    (("t", "text", "key"), {}),
    (("t", b"v", b"k", [("a", b"1"), ("b", None)], 3, 1_700_000_000_000, META), {}),
    (("t", b"v"), {"headers": {"a": b"1"}, "partition": 0}),
    (("t",), {"value": b"v", "key": b"k", "headers": None, "metadata": META}),
    ((), {"topic": "t", "value": b"v", "timestamp": 5}),
    (("t", b"v", None, ()), {"partition": None}),
]
BAD: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    (("t",), {}),
    ((), {"value": b"v"}),
    (("t", b"v", None, None, None, None, None, "extra"), {}),
    (("t", b"v"), {"bogus": 1}),
    (("t", b"v"), {"topic": "u"}),
    (("t", b"v", b"k"), {"key": b"k"}),
]


def twin(*args: Any, **kwargs: Any) -> ProducerMessage:
    msg = object.__new__(ProducerMessage)
    _message.init_py(msg, *args, **kwargs)
    return msg


def state(msg: ProducerMessage) -> list[tuple[str, Any, str]]:
    return [(f.name, getattr(msg, f.name), type(getattr(msg, f.name)).__name__)
            for f in fields.MESSAGE_INIT]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_a_new_message_holds_what_the_twin_stores(args: tuple[Any, ...],
                                                  kwargs: dict[str, Any]) -> None:
    msg = ProducerMessage(*args, **kwargs)
    expected = twin(*args, **kwargs)
    assert state(msg) == state(expected)
    for f in fields.MESSAGE_INIT[:7]:  # the arguments themselves, not copies
        if f.name == "headers" and type(args[3] if len(args) > 3 else kwargs.get("headers")) is list:
            continue  # (a list of pairs is kept as a tuple: the next test)
        assert getattr(msg, f.name) is getattr(expected, f.name) or getattr(msg, f.name) == ()
    for f in fields.MESSAGE_INIT:
        if "object" not in f.types:
            assert type(getattr(msg, f.name)).__name__ in f.types, f.name
    assert (msg._state, msg.offset, msg._id) == (PENDING, -1, 0)


@pytest.mark.parametrize(("args", "kwargs"), BAD)
def test_a_call_python_refuses_is_refused_with_the_same_words(args: tuple[Any, ...],
                                                              kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError) as python:
        twin(*args, **kwargs)
    with pytest.raises(TypeError) as c:
        ProducerMessage(*args, **kwargs)
    assert str(c.value) == str(python.value)


def test_subclasses_and_a_second_init_keep_the_twins_meaning() -> None:
    class Tagged(ProducerMessage):
        __slots__ = ("tag",)

        def __init__(self, tag: str, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tag = tag

    class Plain(ProducerMessage):
        __slots__ = ()

    tagged = Tagged("x", "t", b"v", key=b"k")
    assert tagged.tag == "x" and state(tagged) == state(twin("t", b"v", key=b"k"))
    plain = Plain("t", value=b"v", partition=2)
    assert type(plain) is Plain and state(plain) == state(twin("t", b"v", partition=2))
    msg = ProducerMessage("t", b"v", b"k", [("a", b"1")])
    msg.offset, msg._id = 7, 9
    ProducerMessage.__init__(msg, "u", b"w")  # as the twin: every field starts again
    assert state(msg) == state(twin("u", b"w"))


@pytest.mark.parametrize("make", [ProducerMessage, twin], ids=["c", "twin"])
def test_a_list_of_plain_header_pairs_is_kept_as_a_tuple_of_them(make: Any) -> None:
    """As Java's ProducerRecord copies its headers: a later change to the list does not
    reach the message. Other headers are kept as given (send() checks them)."""
    pairs = [("a", b"1"), ("b", None)]
    msg = make("t", b"v", headers=pairs)
    pairs.append(("c", b"3"))
    assert msg.headers == (("a", b"1"), ("b", None)) and type(msg.headers) is tuple
    assert make("t", b"v", headers=[]).headers == ()
    for kept in ([("a", "text")], [["a", b"1"]], [("a", b"1", b"2")], [(b"a", b"1")],
                 [("a", bytearray(b"1"))], {"a": b"1"}):
        assert make("t", b"v", headers=kept).headers is kept


class Probe:
    """Something a cycle holds; its weak reference says whether the cycle was freed."""


def test_a_message_of_atomic_fields_leaves_the_gc_until_a_store_could_make_a_cycle() -> None:
    atomic = [ProducerMessage("t", b"v"), ProducerMessage("t", "s", b"k", [("a", b"1")], 2, 5),
              ProducerMessage("t", None, headers=(("a", None),))]
    assert not any(map(gc.is_tracked, atomic))
    assert not gc.is_tracked(atomic[1].headers) and not gc.is_tracked(atomic[1].headers[0])
    for held in ({"a": b"1"}, [("a", "text")]):
        assert gc.is_tracked(ProducerMessage("t", b"v", headers=held))
    assert gc.is_tracked(ProducerMessage("t", b"v", metadata=[]))
    assert gc.is_tracked(ProducerMessage("t", b"v", metadata=(1, ([],))))  # (a list inside)
    deep: Any = ()
    for _ in range(100_000):  # (the look into tuples is bounded: no C stack overflow)
        deep = (deep,)
    assert gc.is_tracked(ProducerMessage("t", b"v", metadata=deep))
    del deep

    class Sub(ProducerMessage):
        __slots__ = ()

    assert gc.is_tracked(Sub("t", b"v"))  # (a subclass is left as Python makes it)
    msg = atomic[0]
    msg.value = b"w"
    msg.headers = (("x", b"y"),)
    assert not gc.is_tracked(msg)  # atomic stores keep it out
    probe = Probe()
    gone = weakref.ref(probe)
    msg.metadata = [msg, probe]  # a cycle through the message: back in the GC
    assert gc.is_tracked(msg)
    del msg, probe, atomic
    gc.collect()
    assert gone() is None
    again = ProducerMessage("t", b"v")
    ProducerMessage.__init__(again, "t", b"v", metadata={"self": again})
    assert gc.is_tracked(again)
    ProducerMessage.__init__(again, "t", b"v")
    assert not gc.is_tracked(again)
