"""One rule for trio's exception groups at the library's public boundaries.

trio nurseries wrap every error that escapes them in a ``BaseExceptionGroup``,
one level per nursery, so an error raised three nurseries deep arrives as a
group inside a group inside a group. Where the library hands an error to a
user (``open_producer``, ``consume``, a Spark task, the CLI) it applies this
one rule, which keeps every error:

* the *real* errors are the group's leaves, depth first, in order, without
  ``trio.Cancelled``: a Cancelled next to a real error is only the nursery
  stopping the failed task's siblings (trio's own cancel scopes drop it the
  same way). A group of nothing but Cancelled leaves is all cancellation and is
  left as it is, for the cancel scope that caused it.
* exactly one real error: it is raised *as itself*, with its own ``__cause__``,
  ``__context__`` and traceback, so ``except BrokerConnectionError:`` works and
  a user's own exception comes out unchanged;
* several: the original group is raised unchanged (nesting and tracebacks
  intact), for ``except*``; nothing is dropped.

``leaves`` and ``real_errors`` are for boundaries that must *describe* the
errors (the CLI prints each one; a Spark task reports all of them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["collapse", "leaves", "real_errors", "unwrap_single_errors"]


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc``, depth first, in order (``[exc]`` if not a group)."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    out: list[BaseException] = []
    for inner in exc.exceptions:
        out.extend(leaves(inner))
    return out


def real_errors(exc: BaseException) -> list[BaseException]:
    """``leaves(exc)`` without ``trio.Cancelled``, unless every leaf is one."""
    found = leaves(exc)
    real = [e for e in found if not isinstance(e, trio.Cancelled)]
    return real or found


def collapse(exc: BaseException) -> BaseException:
    """What to raise for ``exc``: its one real error, else ``exc`` itself (see module doc)."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    errors = real_errors(exc)
    return errors[0] if len(errors) == 1 else exc


@contextmanager
def unwrap_single_errors() -> Iterator[None]:
    """Re-raise a group escaping the block by the rule above.

    The single error is raised with the ``__cause__``, ``__context__`` and
    ``__suppress_context__`` it had, not chained to the group that carried it
    (raising it inside this ``except`` would make the group its context).
    """
    try:
        yield
    except BaseExceptionGroup as group:
        error = collapse(group)
        if error is group:
            raise
        cause, context = error.__cause__, error.__context__
        suppress = error.__suppress_context__
        try:
            raise error
        finally:
            error.__cause__, error.__context__ = cause, context
            error.__suppress_context__ = suppress
