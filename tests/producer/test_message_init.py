"""``ProducerMessage(...)`` in C (``_delivery.c``'s ``message_new`` / ``message_init``)
against its twin, ``ProducerMessage.__init__`` (``_message.init_py``): every slot of
``fields.MESSAGE_INIT`` the same after the same call, and the same ``TypeError`` for a
call Python would refuse."""

from __future__ import annotations

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
