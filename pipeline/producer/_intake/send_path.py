"""What ``producer.send`` is: ``Intake.send`` itself, or its row branch in C.

``_send.c`` (see its header) runs the common call, ``await producer.send(topic, value)``
appending a row to the open columnar burst, without a coroutine or a bytecode of
Python; every other call, and every call whose conditions do not all hold, runs
``Intake.send`` (``intake.py``), the twin that defines the behaviour. Both share the
intake's, the ledger's and the burst's fields (their ``__slots__``), so they can
alternate call by call.

The C path is used when the extension is built and ``PIPELINE_PURE_PYTHON`` is not
set. ``use("python")`` switches the process to the twin (tests run both and compare).
"""

from __future__ import annotations

import collections.abc
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pipeline.producer import _speedups
from pipeline.producer._columnar import burst as _burst
from pipeline.producer._columnar import messages as _messages
from pipeline.producer._intake import intake as _intake
from pipeline.producer._intake.normalize import SIZE_BASE
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import names

__all__ = ["SEND_PATH", "entry", "use"]


def _load_c() -> ModuleType | None:
    _send = _speedups.load("_send")
    if _send is None:  # not built, or PIPELINE_PURE_PYTHON=1: Intake.send alone
        return None
    _send.setup(
        intake_type=_intake.Intake, intake_fields=names(fields.SEND_INTAKE),
        ledger_type=Ledger, ledger_fields=names(fields.SEND_LEDGER),
        rows_type=_burst.RowBurst, rows_fields=names(fields.SEND_BURST),
        size_base=SIZE_BASE, intake_globals=vars(_intake), rows_globals=vars(_burst),
        wall_time=time.time,
    )
    # A coroutine to trio (nursery.start_soon(producer.send, ...)): it has no frame, so
    # trio wraps it in one, as it does for coroutines written in C or Cython.
    collections.abc.Coroutine.register(_send.SendCall)
    _burst.new_column = _send.atomic_list
    _send.setup_messages(message_type=ProducerMessage,
                         message_fields=names(fields.SEND_MESSAGE), size_base=SIZE_BASE)
    return _send


_c: ModuleType | None = _load_c()
#: The path new producers take: ``"c"`` when the extension is loaded, else ``"python"``.
SEND_PATH = "c" if _c is not None else "python"
_messages._use(_c)


def use(kind: str) -> None:
    """Switch the send path of producers opened from now on (``"c"``, ``"python"``), and
    ``send_many``'s message steps (``_columnar/messages.py``) of every producer."""
    global SEND_PATH
    if kind not in ("c", "python"):
        raise ValueError(f"send path must be 'c' or 'python', not {kind!r}")
    if kind == "c" and _c is None:
        raise RuntimeError("pipeline.producer._speedups._send is not built or is disabled")
    SEND_PATH = kind
    _messages._use(_c if kind == "c" else None)  # (send_many's rows: stateless, at once)


def entry(intake: _intake.Intake) -> Callable[..., Any]:
    """``producer.send`` for a producer whose intake is ``intake``."""
    if SEND_PATH == "c" and _c is not None:
        return _c.Sender(intake, intake.send)  # type: ignore[no-any-return]
    return intake.send
