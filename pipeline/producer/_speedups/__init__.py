"""The producer's compiled speedups, and the one loader that honours ``PIPELINE_PURE_PYTHON``.

Two small CPython extensions make the hottest calls cheaper; each has a pure-Python
twin that defines the behaviour and runs when the extension is not built (no compiler
at install time) or ``PIPELINE_PURE_PYTHON=1`` is set:

* ``_send.c``: ``await producer.send(topic, value)`` appending a row to the open
  columnar burst without a coroutine. Twin: ``Intake.send`` (``_intake/intake.py``);
  chosen per producer by ``_intake/send_path.py``. Also ``Sender.pump``: SyncProducer's
  queued plain calls through the same branch, and ``untracked`` for their handles. Twin:
  the pump's awaited ``send()`` (``_sync.py``).
* ``_delivery.c``: awaiting a settled delivery without Python frames, row metadata,
  row callbacks. Twins: ``_outcomes/delivery.py`` and ``_columnar/burst.py``,
  ``_columnar/row_outcomes.py``; switched process-wide by ``delivery._use``. Also
  ``ProducerMessage(...)`` itself (the class's call and ``__init__``, installed when
  ``_message.py`` is imported). Twin: ``ProducerMessage.__init__`` (``_message.init_py``).

What C may read and write of the Python objects is declared once, in ``fields.py``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load", "pure_python"]


def pure_python() -> bool:
    """True when ``PIPELINE_PURE_PYTHON`` asks for the twins only."""
    return os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The extension ``name`` (``"_send"``, ``"_delivery"``), or None when it is not
    built or ``PIPELINE_PURE_PYTHON`` is set: the caller then runs its twin."""
    if pure_python():
        return None
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:  # not built (no compiler at install time): the twin
        return None
