"""Time bounds in real seconds, whatever clock the trio run keeps.

trio's timeouts follow the run's clock. ``trio.testing.MockClock`` with autojump
(pytest-trio's ``autojump_clock``, common in trio projects' tests) moves that clock on
whenever every task waits: a grace measured on it ran out the moment cleanup waited, so a
tree that stops on SIGTERM in 50 ms was SIGKILLed without it, and one still dying a few
ms after SIGKILL raised CleanupError ("outlived SIGKILL"). A tree's processes run in real
time, so their bounds are real seconds: under a mock clock, each is a cancel scope that
a system task cancels once that many real seconds have passed (a worker thread sleeps
them). Under trio's own clock, a plain deadline, at no extra cost.
"""

from __future__ import annotations

import math
import sys
import time
from types import TracebackType

import trio


def clock_is_virtual() -> bool:
    """Whether the current trio run keeps a mock clock, whose time is not real time."""
    testing = sys.modules.get("trio.testing")  # (not imported: no mock clock exists)
    return testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock)


def now(*, virtual: bool) -> float:
    """Seconds on a real clock: the run's own, unless it is a mock (`clock_is_virtual`)."""
    return time.monotonic() if virtual else trio.current_time()


def bound(
    seconds: float, *, virtual: bool, shield: bool = False
) -> trio.CancelScope | RealTimeScope:
    """A cancel scope (to enter with ``with ... as scope``) cancelled ``seconds`` real
    seconds after it is entered."""
    if not virtual:
        return trio.CancelScope(shield=shield, deadline=trio.current_time() + seconds)
    return RealTimeScope(seconds, shield=shield)


class RealTimeScope:
    """A cancel scope that a system task cancels ``seconds`` real seconds after entry.

    Entered, it is the `trio.CancelScope` it stands for (``with ... as scope``). A system
    task, not one of the caller's: the bound must hold wherever the scope is entered, with
    no nursery at hand. Its timer ends with the scope, and the sleeping worker thread is
    left to end on its own (its own limiter: no token of the program's is held meanwhile).
    """

    def __init__(self, seconds: float, *, shield: bool = False) -> None:
        self._seconds = seconds
        self._scope = trio.CancelScope(shield=shield)
        self._timer = trio.CancelScope()

    def __enter__(self) -> trio.CancelScope:
        if self._seconds < math.inf:
            trio.lowlevel.spawn_system_task(self._cancel_later)
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._timer.cancel()
        return self._scope.__exit__(exc_type, exc, traceback)

    async def _cancel_later(self) -> None:
        with self._timer:
            await trio.to_thread.run_sync(
                time.sleep,
                max(self._seconds, 0.0),
                abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1),
            )
            self._scope.cancel()
