"""A coroutine wrapper whose task, cancelled before its first step, still runs it (asyncio).

A module of its own: asyncio keeps every coroutine type it has seen for good (its cache
of coroutine types), and with a class the globals of the module that defines it. Defined
in the asyncio driver, the class kept that module's running cleanups, and with them every
task of a closed loop, from the last collection at interpreter exit: asyncio's "Task was
destroyed but it is pending!" went unsaid, for the program's own tasks too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Generator
from types import CodeType, FrameType
from typing import Any


def _not_told(cancellation: asyncio.CancelledError) -> None:
    pass


class BeginsAnyway(Coroutine[Any, Any, None]):
    """``cleanup``, made to begin even if its task is cancelled before its first step.

    asyncio throws a cancellation that comes before a task's first step into a coroutine
    that has not started, which ends it without running a line of it; and asyncio.run's
    shutdown cancels every task, the cleanup that a shutdown hook has just started with
    aclose() included. Starting another task instead was tried: it came after the
    shutdown had listed the tasks to wait for, and was abandoned when the loop closed (the
    tree ran on, its outcome never made). Here that cancellation is told to
    ``on_cancel`` (which may read a Ctrl-C in it) and dropped, and the cleanup begins in
    the task the shutdown waits for; from then on it takes each cancellation itself.
    """

    def __init__(
        self,
        cleanup: Coroutine[Any, Any, None],
        on_cancel: Callable[[asyncio.CancelledError], None],
    ) -> None:
        self._cleanup = cleanup
        self._on_cancel = on_cancel
        self._begun = False
        # What the task's repr shows (asyncio reads them off the coroutine).
        self.__name__ = getattr(cleanup, "__name__", "cleanup")
        self.__qualname__ = getattr(cleanup, "__qualname__", self.__name__)

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            # Of no use once begun; kept, it held (through the task, which the tree keeps)
            # the tree itself, and a closed tree with what its readers took in waited for
            # the cycle collector (helper-104: up to ~290 of them in a soak).
            self._on_cancel = _not_told

    def send(self, value: None) -> Any:
        self._begin()
        return self._cleanup.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        cancellation = typ if val is None else val
        if not self._begun and isinstance(cancellation, asyncio.CancelledError):
            if cancellation.__context__ is None:
                # As raising it in a coroutine would: the exception being handled where it
                # came (a Ctrl-C that set off the loop's shutdown, say) is its context.
                cancellation.__context__ = sys.exc_info()[1]
            self._on_cancel(cancellation)
            return self.send(None)
        self._begin()
        if val is None and tb is None:  # (the three-argument form is deprecated from 3.12)
            return self._cleanup.throw(typ)
        return self._cleanup.throw(typ, val, tb)  # pragma: no cover - asyncio passes one

    def close(self) -> None:
        self._cleanup.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self

    def __iter__(self) -> Generator[Any, None, None]:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    # What asyncio reads off a coroutine to show where a task is (its repr, get_stack(),
    # print_stack()): the cleanup's own.
    @property
    def cr_frame(self) -> FrameType | None:
        return getattr(self._cleanup, "cr_frame", None)

    @property
    def cr_code(self) -> CodeType | None:
        return getattr(self._cleanup, "cr_code", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._cleanup, "cr_running", False))

    @property
    def cr_await(self) -> Any:
        return getattr(self._cleanup, "cr_await", None)
