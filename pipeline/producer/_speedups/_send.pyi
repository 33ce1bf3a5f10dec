# Stub of the C extension pipeline/producer/_speedups/_send.c (see its header comment).
# Its pure-Python twin is Intake.send (pipeline/producer/_intake/intake.py); tests run both.
from collections.abc import Callable, Generator
from typing import Any

class SendCall:
    """The awaitable of ``send(topic, value)``: lazy, like the coroutine it stands for."""
    def __await__(self) -> Generator[Any, None, Any]: ...
    def send(self, value: Any, /) -> Any: ...
    def throw(self, typ: Any, val: Any = ..., tb: Any = ..., /) -> Any: ...
    def close(self) -> None: ...

class Sender:
    """``producer.send``: the row branch in C, else ``slow`` (``Intake.send``)."""
    def __init__(self, intake: Any, slow: Callable[..., Any]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def atomic_list() -> list[Any]: ...
def setup(
    *,
    intake_type: type,
    intake_fields: tuple[str, ...],
    ledger_type: type,
    ledger_fields: tuple[str, ...],
    rows_type: type,
    rows_fields: tuple[str, ...],
    size_base: int,
    intake_globals: dict[str, Any],
    rows_globals: dict[str, Any],
    wall_time: Callable[[], float],
) -> None: ...
