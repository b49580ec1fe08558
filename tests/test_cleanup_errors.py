"""A failing cleanup step: the tree still goes, and the error is never lost nor put in the
place of the exception already propagating.

The fault is injected into the containment's signalling (as a kill() raising EPERM on a
re-parented member would); the processes and their deaths are real.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import pytest
import trio

from trio_proctree import ProcessTree, open_process_tree

from .conftest import Tracked


def fail_first_stop_signal(tree: ProcessTree) -> PermissionError:
    """Make the tree's first SIGTERM fail with EPERM; return the error it will raise."""
    error = PermissionError(1, "Operation not permitted (injected)")
    containment: Any = tree._core.containment
    real_signal = containment.signal

    def signal_once_failing(sig: int) -> None:
        if sig == signal.SIGTERM and not getattr(containment, "_failed", False):
            containment._failed = True
            raise error
        real_signal(sig)

    containment.signal = signal_once_failing
    return error


SLEEPER = ["sh", "-c", "sleep 60 & wait"]


async def test_cleanup_error_alone_reaches_the_caller_itself(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    with pytest.raises(PermissionError) as caught:
        async with open_process_tree(SLEEPER, grace=0.2, **contained) as tree:
            injected = fail_first_stop_signal(tree)
    assert caught.value is injected
    # The escalation went on past the failed step: SIGKILL still stopped the tree.
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tracked.survivors() == []


async def test_user_exception_wins_and_carries_the_cleanup_error(
    tracked: Tracked, caplog: pytest.LogCaptureFixture, contained: dict[str, Any]
) -> None:
    mine = KeyError("the user's error")
    with pytest.raises(KeyError) as caught:
        async with open_process_tree(SLEEPER, grace=0.2, **contained) as tree:
            injected = fail_first_stop_signal(tree)
            raise mine
    assert caught.value is mine
    assert caught.value.__cause__ is injected
    assert any(r.exc_info and r.exc_info[1] is injected for r in caplog.records)
    assert tracked.survivors() == []


async def test_cancellation_wins_and_carries_the_cleanup_error(
    tracked: Tracked, caplog: pytest.LogCaptureFixture, contained: dict[str, Any]
) -> None:
    caplog.set_level(logging.ERROR, logger="trio_proctree")
    seen: list[BaseException] = []
    with trio.CancelScope() as scope:
        try:
            async with open_process_tree(SLEEPER, grace=0.2, **contained) as tree:
                injected = fail_first_stop_signal(tree)
                scope.cancel()
                await trio.sleep_forever()
        except BaseException as exc:
            seen.append(exc)
            raise
    assert scope.cancelled_caught
    [exc] = seen
    assert isinstance(exc, trio.Cancelled)
    assert exc.__cause__ is injected
    # The scope swallows the Cancelled and its __cause__ with it: the log keeps the error.
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[1] is injected]
    assert len(logged) == 1
    assert str(tree.pid) in logged[0].getMessage()
    assert tracked.survivors() == []


async def test_existing_cause_is_kept_and_the_cleanup_error_noted(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    root = OSError("root cause")
    mine = RuntimeError("wrapped")
    mine.__cause__ = root
    with pytest.raises(RuntimeError) as caught:
        async with open_process_tree(SLEEPER, grace=0.2, **contained) as tree:
            fail_first_stop_signal(tree)
            raise mine
    assert caught.value is mine
    assert caught.value.__cause__ is root
    notes = getattr(caught.value, "__notes__", None)
    if notes is not None:  # add_note is 3.11+; on 3.10 the log carries it
        assert any("Operation not permitted" in n for n in notes)
    assert tracked.survivors() == []
