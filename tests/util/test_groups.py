"""pipeline.util.groups: the one exception-group rule, and the boundaries using it.

Before it, unwrapping was written five times with different meanings; two of
them (the CLI, the consumer, the Spark export's topic check, the Spark task)
kept only the first error of a group and dropped the rest.
"""

from __future__ import annotations

import pytest
import trio

from pipeline.cli._common import UserError, run_guarded
from pipeline.cluster.errors import BrokerConnectionError, UnknownTopicError
from pipeline.spark.partition import ExportTaskError, PartitionStatus, _from_group
from pipeline.util.groups import collapse, leaves, real_errors, unwrap_single_errors


def cancelled() -> trio.Cancelled:
    async def catch() -> trio.Cancelled:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.sleep(1)
            except trio.Cancelled as exc:
                return exc
        raise AssertionError("not cancelled")

    return trio.run(catch)


def test_leaves_are_depth_first_in_order() -> None:
    a, b, c = ValueError("a"), KeyError("b"), OSError("c")
    group = BaseExceptionGroup("outer", [ExceptionGroup("inner", [a, b]), c])
    assert leaves(group) == [a, b, c]
    assert leaves(a) == [a]


def test_cancelled_next_to_a_real_error_is_not_one() -> None:
    error, cancel = BrokerConnectionError("down"), cancelled()
    group = BaseExceptionGroup("g", [cancel, BaseExceptionGroup("h", [error])])
    assert real_errors(group) == [error]
    assert collapse(group) is error
    only_cancels = BaseExceptionGroup("g", [cancel, cancelled()])
    assert real_errors(only_cancels) == leaves(only_cancels)
    assert collapse(only_cancels) is only_cancels  # left for the cancel scope


def test_one_error_is_itself_several_stay_the_group() -> None:
    one = ExceptionGroup("a", [ExceptionGroup("b", [ValueError("x")])])
    assert isinstance(collapse(one), ValueError)
    two = ExceptionGroup("a", [ValueError("x"), ExceptionGroup("b", [KeyError("y")])])
    assert collapse(two) is two


def test_unwrap_keeps_the_errors_own_cause_and_context() -> None:
    async def fail() -> None:
        try:
            raise KeyError("root cause")
        except KeyError as exc:
            raise UnknownTopicError("t") from exc

    async def main() -> None:
        with unwrap_single_errors():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail)
                nursery.start_soon(trio.sleep_forever)

    with pytest.raises(UnknownTopicError) as info:
        trio.run(main)
    assert isinstance(info.value.__cause__, KeyError)
    # Not chained to the group that carried it (the old `raise leaf from None`
    # dropped the cause; a plain re-raise would make the group its context).
    assert not isinstance(info.value.__context__, BaseExceptionGroup)


def test_unwrap_keeps_every_error_of_several() -> None:
    async def fail(text: str) -> None:
        raise BrokerConnectionError(text)

    async def main() -> None:
        with unwrap_single_errors():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail, "one")
                nursery.start_soon(fail, "two")

    with pytest.raises(ExceptionGroup) as info:
        trio.run(main)
    assert sorted(str(e) for e in leaves(info.value)) == ["one", "two"]


def test_cli_reports_every_error_of_a_group(capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: the CLI printed the group's first error only.
    def run() -> int:
        raise ExceptionGroup("g", [BrokerConnectionError("broker 1 down"), UserError("bad file")])

    assert run_guarded(run) == 1
    err = capsys.readouterr().err
    assert "error: broker 1 down" in err
    assert "error: bad file" in err


def test_cli_still_raises_a_bug_hidden_in_a_group() -> None:
    def run() -> int:
        raise ExceptionGroup("g", [BrokerConnectionError("down"), ZeroDivisionError("bug")])

    with pytest.raises(ExceptionGroup):
        run_guarded(run)


def test_spark_task_error_names_every_error() -> None:
    # Regression: the task reported the first error (or the first ExportTaskError) only.
    status = PartitionStatus(partition=3, attempt=1, pid=1)
    group = ExceptionGroup("g", [OSError("disk"), ExceptionGroup("h", [ValueError("bad row")])])
    error = _from_group(group, status)
    assert isinstance(error, ExportTaskError)
    assert str(error) == (
        "export of Spark partition 3 (attempt 1) failed: OSError: disk; ValueError: bad row"
    )
    task = ExportTaskError("2 row(s) not delivered")
    assert _from_group(ExceptionGroup("g", [task]), status) is task
    both = _from_group(ExceptionGroup("g", [task, OSError("disk")]), status)
    assert str(both) == "2 row(s) not delivered; also OSError: disk"
    interrupt = KeyboardInterrupt()
    assert _from_group(BaseExceptionGroup("g", [interrupt]), status) is interrupt
