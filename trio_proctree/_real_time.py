"""Time bounds in real seconds, whatever clock the trio run keeps.

trio's timeouts follow the run's clock. ``trio.testing.MockClock`` with autojump
(pytest-trio's ``autojump_clock``, common in trio projects' tests) moves that clock on
whenever every task waits: a grace measured on it ran out the moment cleanup waited, so a
tree that stops on SIGTERM in 50 ms was SIGKILLed without it, and one still dying a few
ms after SIGKILL raised CleanupError ("outlived SIGKILL"); a mock clock nobody moves on
let a grace run for ever. A tree's processes run in real time, so their bounds are real
seconds: under any clock but trio's own, each is a cancel scope that one timer thread of
the process cancels once that many real seconds have passed. Under trio's own clock, a
plain deadline, at no extra cost.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from types import TracebackType

import trio

logger = logging.getLogger("trio_proctree")


def clock_is_virtual() -> bool:
    """Whether the current trio run keeps a clock other than trio's own (a mock clock,
    whose time is not real time; any other is treated alike: real seconds stay right)."""
    clock = type(trio.lowlevel.current_clock())
    return not (clock.__name__ == "SystemClock" and clock.__module__.startswith("trio."))


def now(*, virtual: bool) -> float:
    """Seconds on a real clock: the run's own, unless it is not trio's (`clock_is_virtual`)."""
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
    """A cancel scope that the timer thread cancels ``seconds`` real seconds after entry.

    Entered, it is the `trio.CancelScope` it stands for (``with ... as scope``). A thread,
    not a task: the bound must hold wherever the scope is entered, also where trio takes
    no new task (a generator closed as the run ends, a system task after the main one
    returned), and one thread serves every scope (a thread per scope, each sleeping its
    whole bound, made a hundred for a hundred trees). The thread hands the cancellation to
    the run (`trio.lowlevel.TrioToken.run_sync_soon`), which accepts it until it ends.
    """

    def __init__(self, seconds: float, *, shield: bool = False) -> None:
        self._seconds = seconds
        self._scope = trio.CancelScope(shield=shield)
        self._timer: _Timer | None = None

    def __enter__(self) -> trio.CancelScope:
        if self._seconds < math.inf:
            deadline = time.monotonic() + max(self._seconds, 0.0)
            try:
                self._timer = _timers.add(deadline, self._scope)
            except RuntimeError as exc:  # no thread can start (a pids limit, say)
                # On the run's clock instead: wrong in time (and for ever, on a mock clock
                # nobody moves on), but the best there is; each bound tries again.
                logger.warning("no real-time bound (%s): on the run's clock instead", exc)
                self._scope.deadline = trio.current_time() + self._seconds
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        if self._timer is not None:
            # Left for the thread to drop, unfired; or, if it was firing just then, its
            # cancel reaches this scope once it has exited, where it does nothing.
            _timers.end(self._timer)
        return self._scope.__exit__(exc_type, exc, traceback)


class _Timer:
    """One bound: the run to hand its cancellation to, and whether it is done with (its
    scope ended first, or it fired)."""

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.token = trio.lowlevel.current_trio_token()
        self.done = False

    def fire(self) -> None:
        try:
            self.token.run_sync_soon(self.scope.cancel)
        except trio.RunFinishedError:
            pass  # the run has ended, and the scope with it


class _Timers:
    """The timer thread and its deadlines (a heap), started with the first bound and
    ended after a while with none (as trio's own worker threads are: a thread left for
    good makes every later ``os.fork()`` warn, on Python 3.12+)."""

    #: Seconds the thread waits at most at a time: a bound of centuries (an accepted
    #: grace of 1e10 s) made a longer wait overflow, and the thread died with every
    #: later bound unended. It looks again instead.
    LONGEST_WAIT = 3600.0
    #: Seconds it stays with no bound before it ends.
    IDLE = 10.0

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, _Timer]] = []
        self._ended = 0  # (timers in the heap whose scope ended first)
        self._order = itertools.count()  # (ties: never compare timers)
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, scope: trio.CancelScope) -> _Timer:
        timer = _Timer(scope)
        with self._changed:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, name="trio_proctree real-time bounds", daemon=True
                )
                thread.start()  # (raises RuntimeError if no thread can start)
                self._thread = thread
            heapq.heappush(self._due, (deadline, next(self._order), timer))
            self._changed.notify()
        return timer

    def end(self, timer: _Timer) -> None:
        """The scope of ``timer`` has ended: it must not fire. Dropped when it comes up,
        or, once most of the heap is such timers (short bounds behind a long one), all
        at once."""
        with self._changed:
            if timer.done:
                return  # (fired already, and out of the heap)
            timer.done = True
            self._ended += 1
            if self._ended > 64 and self._ended * 2 > len(self._due):
                self._due = [entry for entry in self._due if not entry[2].done]
                heapq.heapify(self._due)
                self._ended = 0

    def _run(self) -> None:
        # (run_sync_soon under our lock: the run takes no lock of ours, so no cycle.)
        with self._changed:
            while True:
                while self._due and self._due[0][2].done:
                    heapq.heappop(self._due)
                    self._ended -= 1
                if not self._due:
                    if not self._changed.wait(self.IDLE) and not self._due:
                        self._thread = None  # (the next bound starts another)
                        return
                    continue
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._changed.wait(min(left, self.LONGEST_WAIT))
                    continue
                timer = heapq.heappop(self._due)[2]
                timer.fire()
                timer.done = True  # (out of the heap: its scope's end has nothing to drop)


_timers = _Timers()


def _renew() -> None:
    # A forked child has no timer thread (only the forking thread goes on), and maybe a
    # condition another thread held: it gets its own, started with its first bound.
    global _timers  # noqa: PLW0603 - the one instance, per process
    _timers = _Timers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew)
