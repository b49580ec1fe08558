"""The asyncio driver: process trees whose lifetime is an asyncio scope (anyio on asyncio too).

The same escalation policy, containment and cleanup as the trio driver (they are shared,
not copied); no trio event loop is needed. What is specific to asyncio is the close path
under cancellation, where each of these once shipped broken in a real SDK:

- the cleanup runs in a task of its own, started the moment `ProcessTree.aclose` is
  *called*, so a caller cancelled before its first step still gets the tree reaped, and a
  caller cancelled again and again does not restart it;
- the caller waits for that task in a loop that records each cancellation and raises it
  once the cleanup is over; under anyio the loop is shielded from the cancel scope, which
  would otherwise re-deliver the cancellation on every iteration (a hot spin);
- a pending cancellation wins over a cleanup error (which rides along as its
  ``__cause__``), so ``asyncio.timeout`` can still turn it into ``TimeoutError``; but
  not an anyio cancel scope's alone, which anyio delivers again (as trio does its own):
  the error goes first, or a ``move_on_after`` would swallow it with the cancellation;
- the wait is ``asyncio.wait({task})``, never ``asyncio.shield``, which on Python 3.14
  reports "exception in shielded future" to the loop for an error the caller already holds;
- a cancellation that arrives while the block's exception leaves it does not replace that
  exception, and is not lost either: it comes again at the task's next wait, if still
  requested then (asyncio delivers each once, where trio's are scoped; Python 3.11+).

Cleanup cannot be cut short by the caller's timeout: it is bounded by the policy's
``worst_case`` (grace + 2 s by default) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import inspect
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Coroutine, Generator, Iterable
from types import TracebackType
from typing import Any, SupportsIndex, TypeVar

from ._begins_anyway import BeginsAnyway
from ._choose import ContainmentChoice, ContainmentUnavailable, choose_containment, start_tree
from ._containment import ContainmentLost
from ._core import TreeCore, TreeView, open_trees
from ._escalation import (
    DEFAULT_GRACE,
    DEFAULT_STOP_SIGNAL,
    Escalation,
    SignalLike,
    Step,
    resolve_policy,
)
from ._outcome import CleanupError, CleanupOutcome, chain_cleanup_error
from ._run import (
    DRAIN_AT_MOST,
    PIPE_DRAIN_TIMEOUT,
    TASK_STATUS_IGNORED,
    HasFileno,
    TaskStatus,
    completed,
    dropped,
    plan_run,
)
from ._spawn import Command, Spawned, SpawnPlan, plan_spawn

# The package's values and errors too, as the package has them: an asyncio program needs
# no second import for its policy or its except clauses.
__all__ = [
    "PIPE_DRAIN_TIMEOUT",
    "TASK_STATUS_IGNORED",
    "CleanupError",
    "CleanupOutcome",
    "ContainmentLost",
    "ContainmentUnavailable",
    "Escalation",
    "ProcessTree",
    "Step",
    "TaskStatus",
    "open_process_tree",
    "run_process_tree",
]

logger = logging.getLogger("trio_proctree")

T = TypeVar("T")

#: Cleanup tasks still running: the loop keeps only weak references to tasks.
_cleanups: set[asyncio.Task[None]] = set()
#: Seconds between looks at a worker's own word that its fork is done, while the loop's
#: future for it is not (`_QueuedSpawn.until_forked`).
_LOST_RESULT_CHECK = 0.05
#: Seconds between looks at a worker still forking, once a Ctrl-C has left the setup
#: (`_QueuedSpawn.stop_under`).
_FORK_CHECK = 0.001


def _anyio_shield() -> contextlib.AbstractContextManager[Any]:
    """A shield from anyio's cancel scopes, if anyio is in use; else nothing.

    anyio's cancel scope on asyncio re-delivers its cancellation on every loop iteration,
    so a loop that waits through cancellations would spin (23,372 times in 5 s, measured).
    anyio is an optional extra: until its asyncio backend is imported (anyio.run, or its
    first cancel scope on asyncio), there is no anyio scope to shield from. Asking for a
    shield before that would import the backend: ~120 ms, the loop blocked, in a program
    that only has anyio imported (httpx does).
    """
    anyio = _anyio_in_use()
    if anyio is None:
        return contextlib.nullcontext()
    return anyio.CancelScope(shield=True)  # type: ignore[no-any-return]


def _anyio_in_use() -> Any:
    """anyio, once its asyncio backend is in use; else None."""
    if _ANYIO_ON_ASYNCIO not in sys.modules:
        return None
    return sys.modules.get("anyio")


_ANYIO_ON_ASYNCIO = "anyio._backends._asyncio"


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _inspected_as_async(method: _Method) -> _Method:
    """``method``, a plain function that returns a coroutine, marked as a coroutine
    function for code that tells async callables from sync ones by inspecting them
    (Starlette's ``BackgroundTask``): unmarked, it was run in a worker thread, with no
    event loop. ``inspect`` honours the mark from Python 3.12; before, only
    ``asyncio.iscoroutinefunction`` can be told, through asyncio's own marker."""
    if sys.version_info >= (3, 12):
        inspect.markcoroutinefunction(method)
    else:
        method._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
    return method


class _Rounds:
    """Counts the rounds of a wait through cancellations (a spin shows up here)."""

    def __init__(self) -> None:
        self.count = 0


async def _through_cancellation(
    future: asyncio.Future[T],
    rounds: _Rounds | None = None,
    *,
    drop: Callable[[], bool] | None = None,
    settled_by: tuple[asyncio.Future[Any], Callable[[Any], None]] | None = None,
    on_cancel: Callable[[asyncio.CancelledError], None] | None = None,
) -> asyncio.CancelledError | None:
    """Wait until ``future`` is done, whatever cancellations arrive; the last one, if any.

    ``asyncio.wait`` neither cancels the future when we are cancelled (the cleanup goes on)
    nor raises its exception (we decide below which error the caller gets). ``drop``: on a
    cancellation, whether the work behind ``future`` can be dropped instead of awaited
    (then this returns at once, ``future`` not done). ``settled_by``: the task whose
    done-callback (given) settles ``future``; a Ctrl-C can land in that callback, which
    then never settles it (helper-47: every waiter, and the shutdown, waited for ever), so
    the task is watched too, and the callback called here if it did not do its work.
    ``on_cancel``: called with each cancellation as it is taken.
    """
    cancelled = None
    if drop is not None:
        # Unshielded, the first wait: an anyio scope's cancellation must reach it, or
        # nothing could be dropped under anyio. Once that work cannot be dropped, the
        # waits below are shielded (a re-delivered anyio cancellation would spin them).
        try:
            await asyncio.wait({future})
        except asyncio.CancelledError as exc:
            cancelled = exc
            if on_cancel is not None:
                on_cancel(exc)
            if drop():
                return cancelled
    waits = {future} if settled_by is None else {future, settled_by[0]}
    with _anyio_shield():
        while not future.done():
            if rounds is not None:
                rounds.count += 1
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if settled_by is not None and settled_by[0].done() and not future.done():
                    await asyncio.sleep(0)  # (its callback, run next as a rule, settles it)
                    if not future.done():
                        settled_by[1](settled_by[0])
            except asyncio.CancelledError as exc:
                cancelled = exc
                if on_cancel is not None:
                    on_cancel(exc)
    anyio = _anyio_in_use()
    if cancelled is None and anyio is not None:
        # The shield held back an anyio scope's cancellation: collect it now, as trio's
        # driver does after its cleanup, so that this call raises it (a deadline that
        # passed meanwhile: fail_after's TimeoutError), after a cleanup error (`_settle`).
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except asyncio.CancelledError as exc:
            cancelled = exc
            if on_cancel is not None:
                on_cancel(exc)
    return cancelled


async def _left_to_its_owner() -> None:
    """What ``aclose()`` returns in a child forked from the process that started the tree
    (`TreeCore.forked_away`): nothing to do there."""


def _running_loop(entry: str) -> asyncio.AbstractEventLoop:
    """The running event loop; where none runs but a trio run does (anyio's trio backend,
    say), an error that names the trio entry point to use, not "no running event loop"."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        if not _in_a_trio_run():
            raise  # (no event loop at all: asyncio's own error says it)
        raise RuntimeError(
            f"trio_proctree.asyncio.{entry} runs under asyncio; under trio (anyio's trio "
            f"backend too), use trio_proctree.{entry}"
        ) from None


def _in_a_trio_run() -> bool:
    trio = sys.modules.get("trio")  # (imported by the package: its trio half)
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


def _still_open(other: asyncio.AbstractEventLoop, tree: ProcessTree) -> None:
    """A tree belongs to one event loop at a time: refuse to use it from another while
    the loop it was used in is still open (its futures and readers are that loop's)."""
    if other is not asyncio.get_running_loop() and not other.is_closed():
        raise RuntimeError(f"{tree} is in use in another event loop, still open")


def _cancellations_requested() -> int:
    """How many cancellations of the current task are requested and not taken back
    (``cancelling()``; 0 where asyncio does not count them, before 3.11)."""
    if sys.version_info >= (3, 11) and (task := asyncio.current_task()) is not None:
        return task.cancelling()
    return 0


def _deliver_again_unless_withdrawn(cancelled: asyncio.CancelledError, before: int) -> None:
    """Cancel the current task again at its next wait, if more cancellations of it are
    requested then than ``before`` the cleanup (3.11+).

    Not at once: it may belong to a scope (``asyncio.timeout``) that the exception in
    flight passes on its way out, and that scope's exit takes its cancellation back
    (``uncancel()``); met there again, it was taken for the scope's own (delivering it at
    once was tried). By the task's next wait, such exits have run, and the count of
    cancellations requested (``cancelling()``) says whether one that came during the
    cleanup still stands: a task group's, ``asyncio.run``'s for a Ctrl-C, a plain
    ``task.cancel()``. Counted against the count before the cleanup: one requested earlier
    and being handled (shutdown code in ``except CancelledError:``), or swallowed and never
    taken back (Python 3.11's and 3.12's TaskGroup leave one so), is none of this
    cleanup's. It comes as the same request, not a new one (the count unchanged), so that
    those who asked still recognise it as theirs. An anyio cancel scope's is left to
    anyio, which delivers it again itself while the scope is cancelled (and never inside a
    shielded scope, where ours would land). Python 3.10 does not count them, and cannot
    tell a scope's (``async_timeout``'s) from one that stands: there it stays absorbed.
    """
    task = asyncio.current_task()
    message = cancelled.args[0] if cancelled.args else None
    if sys.version_info < (3, 11) or task is None or _of_an_anyio_scope(cancelled):
        return

    def again() -> None:
        if not task.done() and task.cancelling() > before:
            task.cancel(message)
            task.uncancel()  # (the same request again: not counted twice)

    task.get_loop().call_soon(again)


#: How anyio's asyncio backend words the cancellations of its cancel scopes (it tells its
#: own from others by it too): "by" before anyio 4.11, "via" since.
_ANYIO_SCOPES = ("Cancelled via cancel scope ", "Cancelled by cancel scope ")


def _of_an_anyio_scope(cancelled: asyncio.CancelledError) -> bool:
    """Whether ``cancelled`` is an anyio cancel scope's, which anyio delivers again at each
    wait while the scope is cancelled (as trio does): a plain asyncio one comes once."""
    message = cancelled.args[0] if cancelled.args else None
    return isinstance(message, str) and message.startswith(_ANYIO_SCOPES)


class _PlainTaken:
    """Whether a wait took a plain asyncio cancellation, which comes once: one that is no
    anyio scope's (`_through_cancellation`'s ``on_cancel``)."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, cancelled: asyncio.CancelledError) -> None:
        self.seen |= not _of_an_anyio_scope(cancelled)


def _settle(
    future: asyncio.Future[T],
    cancelled: asyncio.CancelledError | None,
    label: str,
    *,
    report: bool,
    comes_again: bool = False,
) -> T | None:
    """The caller's result: a cancellation wins and carries the future's error as its
    ``__cause__``; without one, the future's error itself (the very object) or result.

    With ``report`` False (the error already went to an earlier caller), the error is not
    raised again: a later ``aclose()`` just returns. ``comes_again``: each cancellation the
    wait took was an anyio scope's; then the error wins (see below).
    """
    error = None if future.cancelled() else future.exception()
    if cancelled is not None:
        if isinstance(error, Exception) and report and comes_again:
            # anyio delivers its scope's cancellation again at the caller's next wait in
            # the scope, as trio does: nothing is lost if the error goes first, as under
            # trio. Carried on the cancellation instead, a move_on_after swallowed both:
            # a tree that outlived its cleanup was said only in the log, where the same
            # code on anyio's trio backend raised it (helper-100).
            raise error
        if isinstance(error, Exception) and report:
            # (Not a Ctrl-C: a task that raised one sent it out of the loop at once, and
            # this cancellation is the shutdown that followed. No error to chain.)
            chain_cleanup_error(cancelled, error, label)
        raise cancelled
    if error is not None and not report:
        return None
    return future.result()


class _AsyncioIO:
    """What the shared cleanup needs from asyncio (see `LoopIO`)."""

    def __init__(self, tree: ProcessTree) -> None:
        self._tree = tree
        self._loop = asyncio.get_running_loop()
        self._interrupted = False
        #: The KeyboardInterrupt being handled where the cleanup began, if any: a program
        #: that runs its shutdown in ``except KeyboardInterrupt:`` gives it as context to
        #: every exception raised meanwhile, and it is no Ctrl-C during this cleanup.
        handled = sys.exc_info()[1]
        self._interrupt_before = handled if isinstance(handled, KeyboardInterrupt) else None

    @contextlib.contextmanager
    def _finishing(self) -> Generator[None]:
        """Absorb a cancellation of the cleanup's task, noting a Ctrl-C that came with it.

        Only the loop's shutdown (asyncio.run cancelling what is left) or a blanket
        "cancel every task" reaches the cleanup task; stopping halfway would leak the
        tree, and the loop waits for cancelled tasks to finish: so finish. A shutdown
        that a KeyboardInterrupt set off (a second Ctrl-C from 3.11, the first before)
        cancels it with that interrupt as the cancellation's context: the user asked
        for it to end now, so the graces are cut short, as under trio. Only an interrupt
        raised since the cleanup began: one handled already (a shutdown run in ``except
        KeyboardInterrupt:``) asked for the graceful stop under way, as a Ctrl-C that ends
        a trio block does.
        """
        try:
            yield
        except asyncio.CancelledError as exc:
            self.note_cancellation(exc)

    def note_cancellation(self, exc: asyncio.CancelledError) -> None:
        """A cancellation of the cleanup's task, absorbed: note a Ctrl-C that came with it
        (see `_finishing`; also one that came before the cleanup's first step)."""
        context = exc.__context__
        self._interrupted |= (
            isinstance(context, KeyboardInterrupt) and context is not self._interrupt_before
        )
        logger.debug(
            "%s: cleanup task cancelled%s; finishing the cleanup",
            self._tree,
            " by Ctrl-C" if self._interrupted else "",
        )

    def now(self) -> float:
        return self._loop.time()

    async def wait_readable(self, fd: int, timeout: float) -> None:
        if fd == self._tree._core.leader.pidfd:
            # The leader's pidfd is shared with ProcessTree.wait(), and a loop has one
            # reader per fd: wait on the same future.
            with self._finishing():
                await asyncio.wait({self._tree._leader_exited()}, timeout=timeout)
            return
        woken = self._loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        self._loop.add_reader(fd, wake)
        timer = self._loop.call_later(timeout, wake)
        try:
            with self._finishing():
                await woken
        finally:
            self._loop.remove_reader(fd)
            timer.cancel()

    async def yield_now(self) -> None:
        await self.sleep(0)

    def interrupted(self) -> bool:
        # asyncio.run turns Ctrl-C into a cancellation of the main task, which waits for
        # the cleanup like any other. A second one raises KeyboardInterrupt out of the
        # loop, whose shutdown cancels the cleanup task (`_finishing`): the graces are
        # then cut short. A third abandons the loop, and the net at interpreter exit
        # kills and reaps the tree.
        return self._interrupted

    async def sleep(self, seconds: float) -> None:
        with self._finishing():
            await asyncio.sleep(seconds)

    async def close_stdin(self, within: float) -> Exception | None:
        return await self._tree._close_stdin()  # (closes at once: nothing to bound)

    def stdin_kept_open(self) -> bool:
        given = self._tree._given_stdin
        # (Taken off the tree, or another writer put in its place: cleanup leaves it.)
        return given is not None and self._tree.stdin is not given and not _closed(given.transport)

    async def close_streams(self, within: float) -> list[Exception]:
        await self._tree._close_stdin()
        self._tree._abort_stdin()
        return self._tree._close_readers()

    def forget_fd(self, fd: int) -> None:
        self._tree._stop_watching_leader()

    def keep_output_flowing(self) -> None:
        for reader, transport in self._tree._read_transports.values():
            # Not a reader of a loop that has closed (a tree ended in the next loop): its
            # transport cannot read any more, and the resume raised (helper-67).
            if not _closed(transport):
                reader.keep_flowing(self._loop)


class ProcessTree(TreeView):
    """A running process tree (asyncio): a leader and everything it starts.

    Made by `open_process_tree` and `run_process_tree`.

    Cleanup closes the pipes it made (stdout and stderr once the tree is gone, each once
    what is still in it is in its reader): each reader, still ``tree.stdout`` after the
    block unless the program took it off the tree, holds all that the tree said as it
    stopped, to be read after cleanup.
    While the tree stops, each reader made for its pipes takes in up to 1 MiB unread, or
    twice its ``limit`` if that is more, so that a program writing as it stops does not
    block on a full pipe until SIGKILL.
    """

    _public_name = "trio_proctree.asyncio.ProcessTree"

    def __init__(self, core: TreeCore) -> None:
        self._core = core
        #: The event loop the tree belongs to: the one it started in, until that closes
        #: (`_in_its_loop`).
        self._loop = asyncio.get_running_loop()
        #: The leader's stdin, when it was ``subprocess.PIPE``.
        self.stdin: asyncio.StreamWriter | None = None
        #: The leader's stdout, when it was ``subprocess.PIPE``.
        self.stdout: asyncio.StreamReader | None = None
        #: The leader's stderr, when it was ``subprocess.PIPE``.
        self.stderr: asyncio.StreamReader | None = None
        #: The readers made for stdout and stderr, each with its pipe's transport.
        self._read_transports: dict[str, tuple[_TreeReader, asyncio.BaseTransport]] = {}
        self._stdin_transport: asyncio.WriteTransport | None = None
        self._closed_by_cleanup = {}
        #: The writer ``stdin`` was made, while it is the program's to take off the tree.
        self._given_stdin: asyncio.StreamWriter | None = None
        self._exited: asyncio.Future[None] | None = None
        #: The running cleanup, and the future callers wait on: settled when the cleanup
        #: has run.
        self._cleanup: asyncio.Task[None] | None = None
        self._cleaned: asyncio.Future[None] | None = None
        self._waiters = 0
        self._error_reported = False  # a cleanup error goes to one caller, not to each
        self._rounds = _Rounds()
        #: Our pipe ends let go of: handed to a stream, or closed (the rest are closed by
        #: `_close_unconnected`).
        self._let_go: set[int] = set()

    async def wait(self) -> int:
        """Wait for the leader to exit and return its exit status.

        The rest of the tree may still be running; the leader is not reaped until cleanup.

        Raises:
            RuntimeError: the tree is in use in another event loop, still open.
        """
        self._in_its_loop()
        if self.returncode is None and not (self._core.leader.reaped or self._core.leader.lost):
            # asyncio.wait: a cancelled waiter must not cancel the future others share.
            await asyncio.wait({self._leader_exited()})
        returncode = self.returncode
        if returncode is None:  # the leader was reaped by someone else
            raise self._exit_status_lost()
        return returncode

    def _in_its_loop(self) -> None:
        """Refuse the running loop while the tree's own is still open: its streams and
        futures are that loop's, and a wait on them from this one would never end. Once
        its own has closed (a fixture that outlived its test's loop), this one takes over.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            _still_open(self._loop, self)
            self._loop = loop

    def _leader_exited(self) -> asyncio.Future[None]:
        """A future set when the leader exits (the one reader on its pidfd)."""
        loop = asyncio.get_running_loop()
        if self._exited is not None and self._exited.get_loop() is not loop:
            # Watched from a loop that has closed since (the tree outlived an asyncio.run):
            # its reader went with its selector, and its future would never be set, so a
            # wait on it hung (helper-24). Watched anew from this one.
            _still_open(self._exited.get_loop(), self)
            self._exited = None
        if self._exited is None:
            self._exited = loop.create_future()
            loop.add_reader(self._core.leader.pidfd, self._stop_watching_leader)
        return self._exited

    def _stop_watching_leader(self) -> None:
        exited = self._exited
        if exited is None or exited.done():
            return
        # The loop that watches, not the running one: a cleanup cut off when its loop
        # closed (asyncio.run's shutdown, cut short by a second Ctrl-C) is finalised
        # later with no loop running, and its last steps (the pidfd's close) must still run.
        loop = exited.get_loop()
        if loop.is_closed():
            return  # its selector is gone, with every reader, and nobody waits any more
        loop.remove_reader(self._core.leader.pidfd)
        exited.set_result(None)

    def aclose(self) -> Coroutine[Any, Any, None]:
        """Start the cleanup now, and return an awaitable that waits for it to finish.

        A plain method, not a coroutine function: the cleanup starts when this is called,
        even if what it returns is never awaited (Python then warns of a coroutine never
        awaited), or is cancelled before its first step. What it returns is a coroutine, so
        ``asyncio.create_task(tree.aclose())`` and anyio's ``start_soon(tree.aclose)``
        work (and type-check). Idempotent: later
        calls wait for the same cleanup; its errors are raised to the first call that waits
        for it, and to no other (``outcome.emptied`` says whether the tree was seen gone).
        The caller's cancellation does not stop it: it is
        re-raised once the cleanup is over, bounded by ``escalation.worst_case`` (grace +
        2 s by default). (Cancelled before its first step, as ``asyncio.wait_for`` with no
        time left does, what this returns cannot wait: the cleanup runs on in its own task,
        and its error, if any, is logged.)

        Called outside the tree's event loop (``asyncio.run_coroutine_threadsafe(
        tree.aclose(), loop)`` from another thread, ``loop.run_until_complete(
        tree.aclose())`` from sync code), the cleanup starts when what this returns first
        runs, in the loop that runs it.

        Raises:
            asyncio.CancelledError: the caller was cancelled meanwhile (a cleanup error, if
                any, is its ``__cause__``; unless each cancellation was an anyio cancel
                scope's, which anyio delivers again at the next wait: then the cleanup
                error itself is raised).
            RuntimeError: the cleanup began in an event loop that has closed since, before
                it could finish; or the tree is in use in another loop, still open.
            CleanupError: processes of the tree outlived SIGKILL.
            OSError: signalling the tree failed.
        """
        if self._core.forked_away:
            return _left_to_its_owner()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or (loop is not self._loop and not self._loop.is_closed()):
            # Not in the tree's own loop: started here, the cleanup's task belonged to this
            # loop (a wait on it from the tree's own never woke), or, with no loop running,
            # it could not start at all. It starts where what this returns is run.
            return self._start_then_await_cleanup()
        return self._await_cleanup(self._start_cleanup())

    aclose = _inspected_as_async(aclose)

    async def _start_then_await_cleanup(self) -> None:
        await self._await_cleanup(self._start_cleanup())

    def _start_cleanup(self) -> asyncio.Future[None]:
        self._in_its_loop()
        loop = asyncio.get_running_loop()
        if self._cleanup is not None and not self._cleanup.done():
            began_in = self._cleanup.get_loop()
            _still_open(began_in, self)
            if began_in.is_closed():
                # Its task can never run again, and a wait for it hung through every
                # cancellation (helper-24): said at once. The net at interpreter exit, and
                # the watchdog, still stop the tree.
                raise RuntimeError(
                    f"the cleanup of {self} began in an event loop that has closed since, "
                    "before it could finish: it cannot go on in another (the tree is "
                    "stopped at interpreter exit)"
                )
        if self._cleaned is None:
            self._cleaned = loop.create_future()
        if self._cleanup is None:
            io = _AsyncioIO(self)
            task = loop.create_task(BeginsAnyway(self._core.cleanup(io), io.note_cancellation))
            self._cleanup = task
            _cleanups.add(task)
            task.add_done_callback(self._cleanup_done)
        return self._cleaned

    def _cleanup_done(self, task: asyncio.Task[None]) -> None:
        _cleanups.discard(task)
        cleaned = self._cleaned
        assert cleaned is not None
        if cleaned.done():  # (settled already by a waiter: see _through_cancellation)
            return
        if task.cancelled():  # pragma: no cover - the cleanup absorbs every cancellation
            cleaned.cancel()
            return
        error = task.exception()  # (also marks it retrieved: no "never retrieved" noise)
        if error is None:
            cleaned.set_result(None)
            return
        cleaned.set_exception(error)
        if self._waiters == 0 and isinstance(error, Exception):
            # Nobody is waiting to be told: say it here, never lose it. (A Ctrl-C the
            # cleanup raised once the tree was gone left the loop: no failure to tell.)
            logger.error("%s: cleanup failed", self._core.label, exc_info=error)
        cleaned.exception()  # retrieved: reported here or to the callers

    def _settler(self) -> tuple[asyncio.Future[Any], Callable[[Any], None]]:
        """The cleanup's task and the callback that settles what waiters wait on."""
        assert self._cleanup is not None
        return self._cleanup, self._cleanup_done

    async def _await_cleanup(self, task: asyncio.Future[None]) -> None:
        self._waiters += 1
        plain = _PlainTaken()
        try:
            cancelled = await _through_cancellation(
                task, self._rounds, settled_by=self._settler(), on_cancel=plain
            )
        finally:
            self._waiters -= 1
        report, self._error_reported = not self._error_reported, True
        _settle(task, cancelled, self._core.label, report=report, comes_again=not plain.seen)

    def _stop_unawaited(self) -> None:
        """Stop the tree where nothing can be awaited (`_TreeScope._closed_from_outside`).
        Its cleanup goes on in a task of its own (held until it ends), graceful as ever,
        in the tree's loop: here if it runs here, else in its own thread if it runs
        there; one already under way in a loop that has not closed finishes there when
        it runs again. With no loop to run it in, the tree is killed, its leader reaped
        and its containment let go now, as the net at interpreter exit would: the
        program may run on for long."""
        cleanup = self._cleanup
        if cleanup is not None and not cleanup.done() and not cleanup.get_loop().is_closed():
            return
        with contextlib.suppress(RuntimeError):  # (no loop running here, or not the tree's)
            self._start_cleanup()
            return
        loop = self._loop
        if loop.is_running() and not loop.is_closed():
            # (A callback that loop's end drops is not run: the net at interpreter exit,
            # and the watchdog, still stop the tree.)
            with contextlib.suppress(RuntimeError):  # (closed meanwhile)
                loop.call_soon_threadsafe(self._start_cleanup)
                return
        # Its loop, stopped but not closed, would watch the pidfd's number once reused.
        self._stop_watching_leader()
        _kill_destroyed(self._core)

    def _stop_unconnected_unawaited(self, spawned: Spawned) -> None:
        """`_stop_unawaited` for a tree whose task was destroyed in the setup; then our
        pipe ends that no stream was made of are closed (`_close_unconnected`)."""
        raw = self._unconnected_ends(spawned)
        try:
            self._stop_unawaited()
        finally:
            for fd in raw:
                os.close(fd)

    def _unconnected_ends(self, spawned: Spawned) -> list[int]:
        """Our pipe ends that no stream was made of, marked ours no more before they are
        closed: a second call must not close numbers that may name other files by then."""
        ends = (spawned.stdin, spawned.stdout, spawned.stderr)
        raw = [fd for fd in ends if fd is not None and fd not in self._let_go]
        self._let_go.update(raw)
        return raw

    async def _close_under(self, exc: BaseException) -> None:
        """Clean up while ``exc`` propagates: a cleanup error rides along, never replaces it."""
        task = self._start_cleanup()
        requested = _cancellations_requested()
        counted: list[int] = []  # (the count of requests as the first cancellation is taken)

        def count(_: asyncio.CancelledError) -> None:
            if not counted:  # (a storm of them must not pile up here)
                counted.append(_cancellations_requested())

        self._waiters += 1
        try:
            cancelled = await _through_cancellation(
                task,
                self._rounds,
                settled_by=self._settler(),
                on_cancel=count,
            )
        finally:
            self._waiters -= 1
        error = None if task.cancelled() else task.exception()
        if isinstance(error, Exception) and not self._error_reported:
            # (Not a Ctrl-C the cleanup held and raised once the tree was gone: asyncio
            # sent that out of the loop from the cleanup's task. No failed cleanup.)
            self._error_reported = True
            chain_cleanup_error(exc, error, self._core.label)
        # A cancellation that arrived meanwhile does not replace ``exc``: ``exc`` is what the
        # caller must see. But asyncio delivers a cancellation once: absorbed for good, it
        # was lost (a Ctrl-C let the program run on and exit 0; a TaskGroup whose child
        # retried in a loop never ended). So it comes again, as trio's would, at the task's
        # next wait, unless a scope that ``exc`` left on its way out took it back first.
        if cancelled is not None and isinstance(exc, Exception):
            if requested and counted == [requested]:
                # The first taken with no request made since the cleanup began: one still
                # pending as the block raised (a Ctrl-C landing in its busy code, or one
                # delivered again by an inner tree's block), not one being handled.
                # Counted in ``requested``, it was taken for handled and lost
                # (helper-56). Asked as it is taken, not once the cleanup is over: a
                # timeout's that comes and is taken back meanwhile must not hide it
                # (helper-57).
                requested -= 1
            _deliver_again_unless_withdrawn(cancelled, requested)

    async def _connect(self, spawned: Spawned, *, limit: int) -> None:
        loop = asyncio.get_running_loop()
        for name, fd in (("stdout", spawned.stdout), ("stderr", spawned.stderr)):
            if fd is not None:
                reader = _TreeReader(limit=limit)
                pipe = self._hand(fd)
                read_transport, _ = await _closing_on_error(
                    pipe, loop.connect_read_pipe(_protocol_for(reader), pipe)
                )
                setattr(self, name, reader)
                self._read_transports[name] = (reader, read_transport)
        if spawned.stdin is not None:
            protocol = _StdinProtocol(asyncio.StreamReader())
            pipe = self._hand(spawned.stdin)
            write_transport, _ = await _closing_on_error(
                pipe, loop.connect_write_pipe(lambda: protocol, pipe)
            )
            self.stdin = self._given_stdin = asyncio.StreamWriter(
                write_transport, protocol, None, loop
            )

    def _hand(self, fd: int) -> _PipeEnd:
        """A pipe end for a transport, which owns it from now on."""
        self._let_go.add(fd)
        return _PipeEnd(fd)

    async def _close_unconnected(self, spawned: Spawned, exc: BaseException) -> None:
        """Stop a tree whose spawn was cancelled, or whose streams failed to connect, while
        ``exc`` propagates; and close our pipe ends that no stream was made of (they are
        ours alone). Stdin first: EOF is what the close-stdin step gives the tree. Its
        stdout and stderr after the tree has stopped: closed first, they would SIGPIPE
        its writers."""
        raw = self._unconnected_ends(spawned)  # (a second call: `_QueuedSpawn.stop_under`'s)
        if spawned.stdin in raw:
            os.close(spawned.stdin)
            raw.remove(spawned.stdin)
        try:
            await self._close_under(exc)
        finally:
            for fd in raw:
                os.close(fd)

    def _take_reader(self, name: str) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
        """Take a stream (and its transport) off the tree: its cleanup leaves it open."""
        setattr(self, name, None)
        return self._read_transports.pop(name)

    async def _close_stdin(self) -> Exception | None:
        writer = self.stdin
        # Left on the tree, closed (see the trio driver's `_close_stream`), and so closed
        # once: by the close-stdin step, or at the end.
        if writer is not None and self._closed_by_cleanup.get("stdin") is not writer:
            self._closed_by_cleanup["stdin"] = writer
            # Closed now; what is still buffered is written as the tree reads it. Waiting
            # for that here would hang on a tree that no longer reads its stdin.
            self._stdin_transport = writer.transport
            _close(writer.transport)
        return None

    def _abort_stdin(self) -> None:
        """Drop what is still buffered for the tree's stdin: by now the tree is gone. Not
        that of a writer the program put in its place, which may feed anything: closed,
        it writes what it holds as its reader reads (helper-98)."""
        transport, self._stdin_transport = self._stdin_transport, None
        given = self._given_stdin
        if transport is None or given is None or transport is not given.transport:
            return
        if unsent := transport.get_write_buffer_size():
            if isinstance(protocol := transport.get_protocol(), _StdinProtocol):
                protocol.dropped = unsent  # (a writer waiting in drain() is told)
            _close(transport, abort=True)

    def _close_readers(self) -> list[Exception]:
        """Close the readers' pipes, each once what is still in it is in its reader: what
        the tree wrote as it stopped, which the loop had not read yet, was lost with the
        pipe (a program that took the reader off the tree, to read it to its end, lost
        the tail). A reader has no close of its own: its pipe is not left to the program.
        The errors, if any."""
        errors: list[Exception] = []
        for name, (reader, transport) in list(self._read_transports.items()):
            del self._read_transports[name]
            if getattr(self, name) is reader:
                self._closed_by_cleanup[name] = reader  # (left on the tree, closed)
            try:
                _drain_into(reader, transport)
            except Exception as exc:  # noqa: BLE001 - kept and raised after cleanup
                errors.append(exc)
            finally:
                _close(transport)  # (whatever happened above)
        return errors


def _close(transport: asyncio.BaseTransport, *, abort: bool = False) -> None:
    """Close (or abort) a pipe's transport; one of an event loop that has closed since (a
    tree used in the next loop) cannot close itself (its loop schedules the close:
    "Event loop is closed", seen: helper-28), and its pipe is closed here instead."""
    try:
        # (By its method, not its class: uvloop's write transport is no asyncio
        # WriteTransport, and was closed instead, keeping what it had buffered: a pipe that
        # a process outside the tree held open then kept the transport, and a writer
        # waiting in its drain(), for good.)
        if abort and callable(drop := getattr(transport, "abort", None)):
            drop()
        else:
            transport.close()
    except RuntimeError:
        pipe = transport.get_extra_info("pipe")
        if pipe is None:
            raise
        pipe.close()
        if getattr(transport, "_pipe", None) is pipe:
            # (asyncio's own pipe transports: else, collected, each warns of an unclosed
            # transport, as a ResourceWarning in whatever code runs then.)
            transport._pipe = None  # type: ignore[attr-defined]


class _StdinProtocol(asyncio.StreamReaderProtocol):
    """The protocol of the tree's stdin: a writer waiting in ``drain()`` as cleanup drops
    what is still buffered (the tree gone) gets an error saying so. The transport's abort
    ends the connection with no error, and drain() returned as if the input had been
    sent, unless the loop happened to see the broken pipe first (helper-95: 8 in 60)."""

    #: Bytes cleanup dropped, unsent (`ProcessTree._abort_stdin`).
    dropped = 0

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None and self.dropped:
            exc = BrokenPipeError(
                errno.EPIPE,
                f"the tree has ended: {self.dropped} bytes written to its stdin were never sent",
            )
        elif isinstance(exc, BrokenPipeError) and not exc.args:
            # asyncio's pipe transport, finding the reading end closed with data still
            # buffered, says nothing at all: a writer in drain() got ``BrokenPipeError()``.
            exc = BrokenPipeError(
                errno.EPIPE,
                "the tree no longer reads its stdin (the pipe's reading end is closed): "
                "what was written to it and not yet sent was dropped",
            )
        super().connection_lost(exc)


def _protocol_for(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


class _TreeReader(asyncio.StreamReader):
    """A reader of the tree's stdout or stderr, whose transport, while the tree stops,
    reads on until it holds `DRAIN_AT_MOST` unread (or twice its ``limit``, if more): a program
    that writes as it stops (its last log lines, a CLI's result on EOF) into a pipe nobody
    reads any more would block, unable to act on the stop signal, and get SIGKILL at the
    grace's end. (asyncio's StreamReader has no public way to say so: its ``_limit``,
    ``_paused`` and ``_maybe_resume_transport`` have been what they are since Python 3.4.)
    """

    _flowing = False

    def keep_flowing(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on, take in up to `DRAIN_AT_MOST` unread (see the class): where
        ``loop``, the running one, is the reader's, and the program has not ended the
        reader itself (``feed_eof``: it wants no more, and each chunk read into it would
        be reported to the loop as an error, helper-67)."""
        if self._flowing or self._eof or self._loop is not loop:  # type: ignore[attr-defined]
            return
        self._flowing = True
        with self._flowing_limit():
            self._maybe_resume_transport()  # type: ignore[attr-defined]

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if not self._flowing:
            super().feed_data(data)
            return
        with self._flowing_limit():
            super().feed_data(data)

    @contextlib.contextmanager
    def _flowing_limit(self) -> Generator[None]:
        """The limit the transport pauses at is twice the reader's ``limit``."""
        limit = self._limit  # type: ignore[has-type]
        self._limit = max(limit, DRAIN_AT_MOST // 2)
        try:
            yield
        finally:
            self._limit = limit


def _closed(transport: asyncio.BaseTransport) -> bool:
    """Whether a pipe's transport is closed (or closing). uvloop's loop, as it closes,
    closes the pipe ends of transports that go on saying they are not closing."""
    pipe = transport.get_extra_info("pipe")
    return transport.is_closing() or (isinstance(pipe, _PipeEnd) and pipe.closed)


def _drain_into(reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
    """Read what is still in a reader's pipe into the reader, without waiting: the last of
    what the tree said, which the loop had not read yet. (Its transport's own reads are
    paused once the reader holds 128 KiB unread; the tree, gone, writes no more.)"""
    pipe = transport.get_extra_info("pipe")
    if pipe is None or _closed(transport):
        return  # (closed at its end already: nothing left, and its fd not ours any more)
    if getattr(reader, "_eof", False):  # (no public way to ask; since Python 3.4)
        return  # ended by the program itself (``feed_eof``): it wants no more
    left = DRAIN_AT_MOST
    with contextlib.suppress(BlockingIOError):  # (non-blocking: all there is, was read)
        while left > 0 and (data := os.read(pipe.fileno(), min(left, 65536))):
            reader.feed_data(data)
            left -= len(data)
    if left <= 0:
        dropped(DRAIN_AT_MOST)


class _PipeEnd:
    """Our end of a pipe, as the loops' pipe transports take it (``fileno()``,
    ``close()``): the transport owns it once connected, and closes it.

    Not a file object, because one cannot be let go without closing its number: uvloop
    closes the number itself (libuv does, as the transport closes, and when a connect is
    cancelled) and then calls ``close()``, which closed it again: EBADF, or another
    file that took the number since, in another thread (helper-46, helper-73).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._identity = _identity(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed pipe end")
        return self._fd

    def close(self) -> None:
        """Close it, unless its number no longer names the pipe it did (closed by the
        loop, and maybe taken by another file since): then only let it go. (Safe from
        races: while the number names our pipe, no other code frees it, and a file that
        takes it once it is free is another file.)"""
        fd, self._fd = self._fd, -1
        if fd >= 0 and self._identity is not None and _identity(fd) == self._identity:
            os.close(fd)

    def __del__(self) -> None:
        if self._fd >= 0:  # (as a file object does)
            warnings.warn(
                f"unclosed pipe end {self._fd}", ResourceWarning, stacklevel=2, source=self
            )
            self.close()


def _identity(fd: int) -> tuple[int, int] | None:
    """Which file ``fd`` names (device and inode); None for a number not open."""
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a future's error retrieved (it reached its caller another way)."""
    if not future.cancelled():
        future.exception()


class _QueuedSpawn:
    """One tree's spawn, from the queue for a worker thread until the block has the tree.

    The default executor is small and shared (``to_thread``, DNS lookups): a spawn queued
    behind other work has forked nothing, so a cancellation then need not wait for it.

    What the fork started is recorded here by the worker thread itself, which no Ctrl-C
    interrupts: asyncio raises one wherever Python runs in the main thread, so at any line
    of the setup after the fork, and from here it is found and stopped (`stop_under`).
    """

    def __init__(
        self,
        plan: SpawnPlan,
        policy: Escalation,
        containment: ContainmentChoice,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._plan, self._policy, self._containment = plan, policy, containment
        #: The loop of the task that asked for it: closed, nothing will take the tree.
        self._loop = loop
        self._lock = threading.Lock()
        # "queued", then "forking" (a worker took it) and "done"; or "dropped" (it never
        # starts); "abandoned" while forking, "stopped" once done (`stop_unawaited`).
        self._state = "queued"
        #: The leader's pipes and the running tree, once forked (set by the worker).
        self.started: tuple[Spawned, TreeCore] | None = None
        #: Set by the worker once it is done with the spawn, started or failed: its word,
        #: where the future the loop gives may never be (see `until_forked`).
        self.worker_done = threading.Event()
        #: The worker's error, if the spawn failed.
        self.failure: BaseException | None = None
        #: The task that waits for the worker and connects the pipes (`_TreeScope._start`).
        self.starting: asyncio.Task[ProcessTree | None] | None = None
        self._tree: ProcessTree | None = None

    def run(self) -> bool:
        """In the worker thread: start the tree, unless the spawn was dropped meanwhile;
        whether it started. (Also the tree's core is made here, which registers it with the
        net at interpreter exit before the main thread has anything to lose.)"""
        try:
            with self._lock:
                if self._loop.is_closed():
                    # Closed with its task pending: the task, held by this spawn, would be
                    # destroyed only once the collector meets it, the tree running till then.
                    self._state = "dropped"
                if self._state == "dropped":
                    return False
                self._state = "forking"
            spawned, containment = start_tree(self._plan, self._containment)
            self.started = spawned, TreeCore(spawned, containment, self._plan, self._policy)
            return True
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            with self._lock:
                abandoned = self._state == "abandoned" or (
                    self._state == "forking" and self._loop.is_closed()
                )
                if self._state in ("forking", "abandoned"):
                    self._state = "stopped" if abandoned else "done"
            self.worker_done.set()
            if abandoned:
                self._kill_started()  # (its task is gone: nothing else will)

    def stop_unawaited(self) -> None:
        """Stop whatever of the tree started, where nothing can be awaited: its task's
        coroutine closed where no loop runs it (`_closed_from_outside`). A spawn still
        queued is dropped; one being forked is left to its worker, which kills what it
        started as it ends (waiting for it here could wait for this very thread: the
        garbage collector runs in whatever thread allocates); a started tree is killed now.
        Once only: the spawn's task and the block's task are both destroyed."""
        with self._lock:
            if self._state in ("queued", "forking"):
                self._state = "dropped" if self._state == "queued" else "abandoned"
                return
            if self._state != "done":
                return  # (dropped, or stopped already)
            self._state = "stopped"
        self._kill_started()

    def stopped_unawaited(self) -> bool:
        """Whether `stop_unawaited` (or the worker, for a closed loop) stopped the tree."""
        with self._lock:
            return self._state in ("abandoned", "stopped")

    def _kill_started(self) -> None:
        """Kill the tree the worker started, if any, and close our pipe ends."""
        if self.started is None:
            return  # (the spawn failed: nothing started)
        spawned, core = self.started
        if self._tree is not None:
            self._tree._stop_unconnected_unawaited(spawned)
            return
        _kill_destroyed(core)
        for fd in (spawned.stdin, spawned.stdout, spawned.stderr):
            if fd is not None:
                os.close(fd)

    def drop(self) -> bool:
        """Drop the spawn if no worker has taken it yet: whether it will never start."""
        with self._lock:
            if self._state == "queued":
                self._state = "dropped"
            return self._state == "dropped"

    @property
    def spawned(self) -> Spawned:
        """The leader's pipes, once forked."""
        assert self.started is not None
        return self.started[0]

    def tree(self) -> ProcessTree:
        """The started tree, made once (in the loop's thread: it belongs to the loop)."""
        assert self.started is not None
        if self._tree is None:
            self._tree = ProcessTree(self.started[1])
        return self._tree

    async def until_forked(self, forking: asyncio.Future[bool]) -> asyncio.CancelledError | None:
        """Wait for the worker's fork, whatever cancellations arrive; the last one, if any.

        Woken by ``forking``, the loop's future for it, as a rule. But a Ctrl-C can land in
        the loop's own callback that copies the worker's result into that future: the copy
        is lost and the future never done (helper-47: the shutdown then waited for it for
        ever, the tree running all the while). So the worker's own word is looked at too,
        every `_LOST_RESULT_CHECK` seconds (also while the spawn waits in a busy executor's
        queue): once it is done and its future still is not a check later, its result is
        taken for lost, and this wait ends all the same. A guess, which a worker thread
        descheduled between its word and its result also makes true: what `outcome` says
        comes from the worker's own record all the same, and a result that comes after
        all is retrieved then (else asyncio logs "Future exception was never retrieved").
        """
        cancelled = None
        lost_unless_done_by = None
        with _anyio_shield():  # (as in _through_cancellation)
            while not forking.done():
                if self.worker_done.is_set():
                    now = forking.get_loop().time()
                    if lost_unless_done_by is None:
                        lost_unless_done_by = now + _LOST_RESULT_CHECK
                    elif now >= lost_unless_done_by:
                        break
                try:
                    await asyncio.wait({forking}, timeout=_LOST_RESULT_CHECK)
                except asyncio.CancelledError as exc:
                    cancelled = exc
        if not forking.done():
            forking.add_done_callback(_retrieved)
        elif not forking.cancelled():
            forking.exception()  # (its error, if any, is raised from `outcome`: retrieved)
        return cancelled

    def outcome(self, forking: asyncio.Future[bool]) -> bool:
        """Whether the worker started the tree; its error, if it failed, is raised, and so
        is the executor's, if it failed (or cancelled) the spawn without running it: a
        thread initializer that raised, ``shutdown(cancel_futures=True)``."""
        if not self.worker_done.is_set():
            forking.result()  # (done: `until_forked` waited for it)
        if self.failure is not None:
            raise self.failure
        return self.started is not None

    async def stop_under(self, exc: BaseException) -> None:
        """Stop whatever of the tree started, once the worker and the task that starts it
        are done with it, while ``exc`` propagates out of the setup."""
        starting = self.starting
        if starting is not None and starting is not asyncio.current_task() and not starting.done():
            if self.drop():
                return  # still queued: it will start nothing
            # The fork is under way (or done, the pipes being connected): its task is
            # waited for, bounded by that, as the tree it brings must be stopped.
            await _through_cancellation(starting)
        if not self.drop():
            # A worker took the spawn, and may still fork: the interrupt can land before
            # the spawn's task has anything to wait on (a new executor's Thread.start()
            # waits for its thread after the spawn is queued: where most real Ctrl-Cs in
            # the setup landed, helper-47). Looked at in short pauses, as nothing else
            # is sure to say it: this path only, for the length of one fork.
            with _anyio_shield():
                while not self.worker_done.is_set():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(_FORK_CHECK)
        await self.stop_started(exc)

    async def stop_started(self, exc: BaseException) -> None:
        """Stop the tree if it started, while ``exc`` propagates (see
        `ProcessTree._close_unconnected`; a second time, it waits for the first)."""
        if self.started is not None:
            await self.tree()._close_unconnected(self.spawned, exc)


async def _closing_on_error(pipe: _PipeEnd, connecting: Coroutine[Any, Any, T]) -> T:
    """Connect a pipe end to the loop; closed at once should that fail (else it would stay
    open until the garbage collector met it), unless the loop closed it already."""
    try:
        return await connecting
    except BaseException as exc:
        pipe.close()
        if (close := _the_close(exc)) is not exc:
            # Closed where its loop no longer runs, asyncio's connect fails as it closes its
            # transport. The collector may close this coroutine before the spawn's task
            # that awaits it (their cycle has no order), and the error then came out of
            # the close as "Exception ignored"; the task's own close stops the tree.
            raise close from None
        raise


class _TreeScope:
    """The async context manager `open_process_tree` returns."""

    def __init__(
        self, plan: SpawnPlan, policy: Escalation, containment: ContainmentChoice, *, limit: int
    ) -> None:
        self._plan = plan
        self._limit = limit
        self._policy = policy
        self._containment = containment
        self._tree: ProcessTree | None = None
        self._entered = False

    async def _start(self, spawn: _QueuedSpawn) -> ProcessTree | None:
        """The started tree; None if the spawn was dropped before a worker took it."""
        loop = asyncio.get_running_loop()
        try:
            forking = loop.run_in_executor(None, spawn.run)
            # This task itself may be cancelled (asyncio.run's shutdown, a blanket "cancel
            # every task"): the worker thread forks all the same, so wait for it through
            # that too, or the process it starts is nobody's.
            cancelled = await spawn.until_forked(forking)
            if not spawn.outcome(forking) or spawn.stopped_unawaited():  # (failed: raises)
                # (Stopped from outside while this task waited: its pipe ends closed.)
                return None
            tree = spawn.tree()
            if cancelled is not None:
                # Stopped here, in the handler's reach: a Ctrl-C during this stop is held
                # as anywhere else in the setup (helper-49), and the handler's own stop
                # then waits for this one.
                await spawn.stop_started(cancelled)
                raise cancelled  # noqa: TRY301 - (see above)
            await tree._connect(spawn.spawned, limit=self._limit)
        except BaseException as exc:
            if _outside(loop):
                spawn.stop_unawaited()  # (and the close goes on: nothing awaited)
                raise _the_close(exc) from None
            await spawn.stop_under(exc)
            raise
        return tree

    async def __aenter__(self) -> ProcessTree:
        # Marked before the spawn, not once it is done: two tasks entering one scope at
        # once each started a tree, and the first, its record overwritten, was never stopped.
        loop = _running_loop("open_process_tree")
        if self._entered:
            raise RuntimeError("this open_process_tree() scope was already entered")
        self._entered = True
        spawn = _QueuedSpawn(self._plan, self._policy, self._containment, loop)
        try:
            self._tree = await self._spawn(spawn)
        except BaseException as exc:
            if _outside(loop):
                # Its task destroyed where no loop runs (a loop closed with it pending):
                # an await here would raise "no running event loop" in its place, and the
                # tree run on until interpreter exit.
                spawn.stop_unawaited()
                raise _the_close(exc) from None
            # A cancellation, or a Ctrl-C on any line of the setup once the fork happened
            # (asyncio raises it wherever Python runs): whatever the spawn started is
            # stopped here, before it goes on (a tree the spawn's task stopped already,
            # having failed to connect it, is waited for). Lost with a Ctrl-C, it ran on
            # after asyncio.run had raised, until interpreter exit.
            await spawn.stop_under(exc)
            # Nothing of it runs (a spawn that failed started nothing): the scope may be
            # entered again, as before it was.
            self._entered = False
            raise
        return self._tree

    async def _spawn(self, spawn: _QueuedSpawn) -> ProcessTree:
        # The spawn runs in a task of its own, waited through cancellations: a cancellation
        # that arrives while the worker thread forks must not lose the process. It is
        # raised once the tree is in hand, and `__aenter__` stops the tree first.
        starting = spawn.starting = asyncio.get_running_loop().create_task(self._start(spawn))
        cancelled = await _through_cancellation(starting, drop=spawn.drop)
        if not starting.done():  # dropped while still queued: it will start nothing
            assert cancelled is not None
            raise cancelled
        started = _settle(starting, cancelled, self._plan.label, report=True)
        assert started is not None
        return started

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # None, not bool: type checkers then know that the block's exception always goes
        # on, so a function that returns from inside the block is not "missing a return".
        if self._tree is None:
            # (An exit stack misused, say: an assert said nothing, and is gone under -O.)
            raise RuntimeError("this open_process_tree() scope was never entered")
        if self._tree._core.forked_away:
            # The parent's, to stop. (Nothing here is awaited: in a forked child asyncio
            # runs no loop, and its "no running event loop" replaced the child's own
            # exception, helper-101.)
            return
        if exc is None:
            await self._tree.aclose()
        elif isinstance(exc, GeneratorExit) and _closed_from_outside(self._tree._loop):
            self._tree._stop_unawaited()  # (and GeneratorExit goes on: nothing awaited)
        else:
            await self._tree._close_under(exc)


def _closed_from_outside(its_loop: asyncio.AbstractEventLoop) -> bool:
    """Whether GeneratorExit on its way out of a tree's setup or block runs where nothing
    can be awaited: with no event loop running here, or with another loop than the
    tree's, its own still open. That is a coroutine closed by the garbage collector (a
    task the program did not hold: asyncio keeps tasks by weak reference) in a thread that
    runs no loop, or another loop than the tree's (the collector runs in whatever thread
    allocates), or once the loop has closed. An async generator's ``aclose()`` runs in a
    task of the tree's loop, and awaits its cleanup there, as at any exit.

    Not told apart: the collector closing it in the tree's own loop's thread. Its exit
    awaits the cleanup, which then goes on in its own task, graceful, and Python reports
    "coroutine ignored GeneratorExit" (no sure sign tells that close from an ``aclose()``:
    frames and tasks were tried, and each misjudged some)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return True
    return running is not its_loop and not its_loop.is_closed()


def _the_close(exc: BaseException) -> BaseException:
    """The GeneratorExit of a coroutine's close that ``exc`` was raised in place of, if
    any, else ``exc``. Closed where its loop no longer runs, a setup's inner cleanups
    that need that loop fail: asyncio's own connect of a pipe raises "Event loop is
    closed" as it closes its transport. Raised out of the close, that error was reported
    as "Exception ignored" (seen in CI); the tree is stopped all the same, without it."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, GeneratorExit):
            if cause is not exc:
                logger.debug("closed where its loop no longer runs: %r", exc)
            return cause
        cause = cause.__context__
    return exc


def _outside(its_loop: asyncio.AbstractEventLoop) -> bool:
    """Whether GeneratorExit on its way out of a tree's setup runs where nothing of the
    setup can be awaited: anywhere but in ``its_loop`` (its spawn's task is that loop's,
    never done in another; the block's exit can instead begin its cleanup anew in a loop
    that runs after the first closed: `_closed_from_outside`)."""
    try:
        return asyncio.get_running_loop() is not its_loop
    except RuntimeError:
        return True


def _kill_destroyed(core: TreeCore) -> None:
    """Kill a tree whose task was destroyed with no event loop to clean up in, reap its
    leader and let its containment go now, as the net at interpreter exit would: the
    program may run on for long."""
    if core in open_trees():
        logger.warning(
            "%s: the task of its block (or of its setup) was destroyed with no event loop "
            "to clean up in; killed without grace",
            core.label,
        )
        core.kill_blocking(when="as the task of its block was destroyed")


def open_process_tree(
    command: Command,
    *,
    grace: float = DEFAULT_GRACE,
    stop_signal: SignalLike = DEFAULT_STOP_SIGNAL,
    escalation: Escalation | None = None,
    containment: str = "auto",
    **options: Any,
) -> _TreeScope:
    """Start ``command`` as the leader of a new process tree, for the length of a block.

    ::

        async with open_process_tree(["make", "-j8"], grace=2.0) as tree:
            await tree.wait()

    The asyncio twin of `trio_proctree.open_process_tree`, with the same arguments and
    guarantees: however the block ends, cleanup stops the whole tree (``stop_signal``,
    SIGCONT, up to ``grace`` seconds, SIGKILL) and reaps the leader. The cleanup is not
    cut short by the caller's cancellation or timeout: it can outlast them by up to
    ``grace`` + 2 s with the defaults (``escalation.worst_case``).

    ``stdin``/``stdout``/``stderr`` set to ``subprocess.PIPE`` give an
    `asyncio.StreamWriter` / `asyncio.StreamReader` on the tree; ``limit=`` sets the
    readers' buffer (the longest line ``readline()`` reads), as for
    `asyncio.create_subprocess_exec` (64 KiB unless given).

    Bad input is refused before anything is started, with the same errors as
    `trio_proctree.open_process_tree`.
    """
    limit = _reader_limit(options.pop("limit", _DEFAULT_LIMIT))
    policy = resolve_policy(grace, stop_signal, escalation)
    plan = plan_spawn(command, options)
    choice = choose_containment(containment, changes_user=plan.changes_user)
    return _TreeScope(plan, policy, choice, limit=limit)


#: asyncio's own default for a StreamReader's buffer (``limit``), 64 KiB.
_DEFAULT_LIMIT = 2**16


def _reader_limit(limit: object) -> int:
    """``limit=``, as `asyncio.create_subprocess_exec` takes it: the buffer of the
    StreamReaders made for stdout and stderr, and so the longest line ``readline()``
    reads. Refused with the request, where asyncio would refuse it once the pipes are
    made."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit <= 0:
        raise ValueError(f"limit must be more than 0, not {limit}")
    return limit


async def run_process_tree(
    command: Command,
    *,
    stdin: bytes | bytearray | memoryview[int] | int | HasFileno | None = b"",
    capture_stdout: bool = False,
    capture_stderr: bool = False,
    check: bool = True,
    grace: float = DEFAULT_GRACE,
    stop_signal: SignalLike = DEFAULT_STOP_SIGNAL,
    escalation: Escalation | None = None,
    containment: str = "auto",
    task_status: TaskStatus[ProcessTree] = TASK_STATUS_IGNORED,
    **options: Any,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` as a process tree to completion (asyncio).

    The asyncio twin of `trio_proctree.run_process_tree`: when the leader exits, whatever
    it left running is stopped, so this returns once the whole tree is gone; cancellation
    stops the tree the same way, and is raised once it is gone (bounded by
    ``escalation.worst_case``, ``grace`` + 2 s by default). Output still held open by a
    process outside the tree is read for at most `~trio_proctree.PIPE_DRAIN_TIMEOUT` seconds.

    With ``tree = await tg.start(functools.partial(run_process_tree, cmd))`` (an anyio
    task group on asyncio) the `ProcessTree` is handed back as soon as the leader runs, and
    cancelling the task group tears the tree down: ``task_status`` is anyio's, or any
    object with a ``started()``. Output pipes asked for then (``stdout=subprocess.PIPE``)
    are left to be read to their end after the run, as the trio driver leaves them.
    """
    request = plan_run(
        stdin,
        capture_stdout,
        capture_stderr,
        options,
        task_status=task_status,
        hand_back="a task_status with started(), as anyio's task_group.start() passes",
    )
    outputs: dict[str, list[bytes]] = {name: [] for name in request.capture}
    taken: list[asyncio.BaseTransport] = []
    io_tasks: list[asyncio.Task[None]] = []
    label = "a tree of run_process_tree"  # (its own, once it started)
    loop = _running_loop("run_process_tree")
    try:
        async with open_process_tree(
            command,
            grace=grace,
            stop_signal=stop_signal,
            escalation=escalation,
            containment=containment,
            **request.options,
        ) as tree:
            label = tree._core.label
            readers: list[asyncio.Task[None]] = []
            for name in request.capture:
                reader, transport = tree._take_reader(name)
                taken.append(transport)
                readers.append(loop.create_task(_read_all(reader, outputs[name])))
                # A reader that fails closes its pipe at once: the tree would otherwise
                # block writing a pipe nobody reads, and never end. (Its error is raised
                # at the end, as the trio driver's nursery raises it.)
                readers[-1].add_done_callback(functools.partial(_close_if_failed, transport))
            io_tasks.extend(readers)
            feeder, writer = None, tree.stdin
            if request.feed is not None and writer is not None:
                # Fed here, and closed once fed: off the tree, as in the trio driver.
                tree.stdin = None
                feeder = loop.create_task(_feed(writer, request.feed))
                io_tasks.append(feeder)
            try:
                task_status.started(tree)
                await tree.wait()
            except BaseException as exc:
                if _outside(loop):
                    # (Nothing of its loop can be awaited: the block's exit stops it.)
                    raise _the_close(exc) from None
                # Left early (cancelled, say): the input stops and its pipe closes before
                # the cleanup, as the trio driver's feeder ends with its nursery, so the
                # close-stdin step gives a CLI the EOF to finish on.
                if feeder is not None and writer is not None:
                    feeder.cancel()
                    await asyncio.wait({feeder})
                    if not writer.transport.is_closing():
                        # Cancelled before its first step (the run was cancelled at once),
                        # it never ran to close the pipe: its reader would wait for ever.
                        writer.transport.abort()
                raise
            # The leader is done: stop what it left behind, so the pipes reach EOF.
            await tree.aclose()
            if readers:
                _, late = await asyncio.wait(readers, timeout=PIPE_DRAIN_TIMEOUT)
                if late:
                    logger.warning(
                        "%s: output pipe still open %gs after the tree ended (held by a "
                        "process outside it); returning what was read",
                        tree._core.label,
                        PIPE_DRAIN_TIMEOUT,
                    )
    except BaseException as exc:
        if _outside(loop):
            # (The tree stopped at the block's exit; its loop's tasks not ours to await.)
            raise _the_close(exc) from None
        # Unshielded: the tree is gone by now, and the readers and feeder, cancelled, end
        # within a loop round or two. A cancellation that comes meanwhile wins, as one
        # does, with the exception in flight as its context.
        for error in await _end_io(io_tasks, taken):
            chain_cleanup_error(exc, error, label)
        raise
    if errors := await _end_io(io_tasks, taken):
        for extra in errors[1:]:
            logger.error("%s: another input or output error", label, exc_info=extra)
        raise errors[0]
    outcome = tree.outcome
    assert outcome is not None
    return completed(tree.args, outcome.returncode, outputs, request, check=check)


async def _end_io(
    io_tasks: list[asyncio.Task[None]], taken: list[asyncio.BaseTransport]
) -> list[BaseException]:
    """End the pipe readers and the feeder; the errors that ended any of them.

    Only after the tree's cleanup: on cancellation the tree is stopped by the escalation,
    not by SIGPIPE from pipes we closed under it.
    """
    for task in io_tasks:
        task.cancel()
    for transport in taken:
        transport.close()
    if io_tasks:
        await asyncio.wait(io_tasks)  # cancelled pipe readers and writers: quick
    return [
        error
        for task in io_tasks
        if not task.cancelled() and (error := task.exception()) is not None
    ]


def _close_if_failed(transport: asyncio.BaseTransport, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        transport.close()


async def _read_all(reader: asyncio.StreamReader, chunks: list[bytes]) -> None:
    while chunk := await reader.read(65536):
        chunks.append(chunk)


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    # No high-water mark: drain() returns once all is written, not once what is left is
    # under 64 KiB. Else the rest, still buffered, looked like a cancelled feed's leftover
    # below, and was dropped: 64 KiB + 1 to 128 KiB of input reached the command cut to
    # 64 KiB, with nothing said (helper-86).
    writer.transport.set_write_buffer_limits(high=0)
    try:
        writer.write(data)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the tree stopped reading: what it did not take is not ours to report
    finally:
        if writer.transport.get_write_buffer_size():
            # Cancelled with input still to write: the tree has ended, and a close would
            # wait for a reader that may never read (a process outside the tree holding
            # the pipe), so the rest is dropped, as the trio driver drops it.
            writer.transport.abort()
        else:
            writer.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await writer.wait_closed()
