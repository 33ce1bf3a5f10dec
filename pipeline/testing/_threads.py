"""Run async code from blocking code, inside or outside a running trio loop."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

__all__ = ["run_trio"]

T = TypeVar("T")


def run_trio(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(async_fn, *args)`` on a new thread, returning its result or raising its
    exception here.

    A thread of its own because the caller may itself be inside ``trio.run`` (a trio test
    calling a blocking helper), where a nested ``trio.run`` is refused. The caller's thread
    blocks meanwhile; from trio code prefer the async API, or ``trio.to_thread.run_sync``.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(trio.run(async_fn, *args))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="pipeline-trio-call", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
