# Stub of the C extension pipeline/producer/_speedups/_delivery.c (see its header comment).
# Its pure-Python twins are in pipeline/producer/_outcomes/delivery.py (_await_py,
# _metadata_py, _schedule_due_py) and _columnar/burst.py (the rows); tests run both.
from collections.abc import Callable, Generator
from typing import Any

class SettledAwait:
    """Mixin of Delivery: its am_await is the settled-await fast path."""

def setup(
    *,
    message_type: type,
    message_fields: tuple[str, ...],
    metadata_type: type,
    python_await: Callable[[Any], Generator[Any, None, Any]],
    settled_checkpoint: Callable[[Any, bool], Generator[Any, None, Any]],
    run_context: Any,
    ok: int,
    schedule_every: int,
) -> None: ...
def metadata(msg: Any, /) -> Any: ...
def schedule_due() -> bool: ...
def restart_schedule() -> None: ...
def set_run_context(run_context: Any, /) -> Any: ...
def install_message_init(cls: type, fields: tuple[str, ...], defaults: tuple[Any, ...], /
                         ) -> None: ...
