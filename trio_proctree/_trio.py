"""The trio driver: process trees whose lifetime is a trio scope."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, cast

import trio

from ._after_fork import renewed_in_forked_child
from ._choose import ContainmentChoice, choose_containment, start_tree
from ._containment import Containment
from ._core import TreeCore, TreeView
from ._escalation import (
    DEFAULT_GRACE,
    DEFAULT_STOP_SIGNAL,
    Escalation,
    SignalLike,
    resolve_policy,
)
from ._outcome import chain_cleanup_error, set_context
from ._real_time import bound, clock_is_virtual, now
from ._run import DRAIN_AT_MOST, PIPE_DRAIN_TIMEOUT, HasFileno, completed, dropped, plan_run
from ._spawn import TRIO_STREAMS, Command, Spawned, SpawnPlan, plan_spawn

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # trio's own dependency on 3.10

logger = logging.getLogger("trio_proctree")

#: Held while a tree's cleanup is claimed by the task that will run it.
_starting_cleanups = threading.Lock()
renewed_in_forked_child(globals(), "_starting_cleanups")

T = TypeVar("T")


class _TrioIO:
    """What the shared cleanup needs from trio (see `LoopIO`).

    Each wait is shielded (`_kept`), so no cancellation reaches it. A KeyboardInterrupt
    does: trio raises a pending Ctrl-C in the main task at whatever it waits on, shield
    or not, and left to propagate it would abandon the tree halfway (signalled, never
    killed, never reaped). Each wait here keeps it instead; cleanup then cuts its graces
    short, kills what is left, and the interrupt is raised once the tree is gone.
    """

    def __init__(self, tree: ProcessTree) -> None:
        self._tree = tree
        self.keyboard_interrupt: KeyboardInterrupt | None = None
        #: A clock not trio's own (a mock one) keeps no real time (`_real_time`): bounds
        #: in real seconds.
        self._virtual = clock_is_virtual()
        #: Whether cleanup has waited (each wait goes through `_kept`): a schedule point.
        self.scheduled = False

    def now(self) -> float:
        return now(virtual=self._virtual)

    def interrupted(self) -> bool:
        return self.keyboard_interrupt is not None

    async def _kept(
        self, wait: Callable[..., Awaitable[T]], *args: Any, timeout: float = math.inf
    ) -> T | None:
        """``await wait(*args)``, shielded, for at most ``timeout`` seconds.

        Each wait of cleanup is shielded here, on its own, so that a cancellation can
        never cut cleanup short; one cancel scope also bounds the wait, where a shield
        around all of cleanup plus a scope per timed wait cost two (on a VM, trio's cancel
        scope code is ~50 us a scope when it has not run lately, as after a tree's idle
        time: a tenth of a cooperative teardown).
        """
        self.scheduled = True
        with bound(timeout, virtual=self._virtual, shield=True):
            try:
                return await wait(*args)
            except KeyboardInterrupt as interrupt:
                logger.debug("%s: interrupted; killing the tree without more grace", self._tree)
                if self.keyboard_interrupt is None:
                    self.keyboard_interrupt = interrupt
        return None

    async def wait_readable(self, fd: int, timeout: float) -> None:
        await self._kept(self._wait_readable, fd, timeout=timeout)

    async def _wait_readable(self, fd: int) -> None:
        if fd != self._tree._core.leader.pidfd:
            await trio.lowlevel.wait_readable(fd)
            return
        # The leader's pidfd is shared with ProcessTree.wait(), and trio lets one task
        # at a time wait on an fd: take turns. Taken without `async with` when free:
        # Lock.acquire() yields to the scheduler even then, and on a VM that round
        # trip costs as much as the leader's whole exit (~0.2 ms, measured).
        lock = self._tree._wait_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()  # a task is in wait(): it returns once the leader exits
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            lock.release()

    async def yield_now(self) -> None:
        await self._kept(trio.lowlevel.cancel_shielded_checkpoint)

    async def sleep(self, seconds: float) -> None:
        await self._kept(trio.sleep_forever, timeout=seconds)

    async def close_stdin(self, within: float) -> Exception | None:
        if not isinstance(self._tree.stdin, trio.lowlevel.FdStream | None):
            # A stream the program put in its place may flush, as it closes, to a tree that
            # writes it out: its output must flow meanwhile, or the tree blocks on a full
            # pipe and the close with it, for the step's whole wait (helper-67).
            self.keep_output_flowing()
        return await self._tree._close_stream("stdin", self, within)

    def stdin_kept_open(self) -> bool:
        given = self._tree._given_stdin
        # (An FdStream's number reads -1 once it is closed.)
        # (Taken off the tree, or another stream put in its place: cleanup leaves it.)
        return given is not None and self._tree.stdin is not given and given.fileno() >= 0

    async def close_streams(self, within: float) -> list[Exception]:
        deadline = self.now() + within
        errors = [
            await self._tree._close_stream(name, self, deadline - self.now())
            for name in ("stdin", "stdout", "stderr")
            if getattr(self._tree, name) is not None
        ]
        return [error for error in errors if error is not None]

    def forget_fd(self, fd: int) -> None:
        trio.lowlevel.notify_closing(fd)

    def keep_output_flowing(self) -> None:
        tree = self._tree
        for stream in (tree.stdout, tree.stderr, *tree._read_by_run):
            if isinstance(stream, TreeOutput) and not tree._left_to_the_caller(stream):
                stream.keep_flowing()


class ProcessTree(TreeView):
    """A running process tree: a leader and everything it starts.

    Made by `open_process_tree` and `run_process_tree`; its cleanup runs when their scope
    ends, or earlier with `aclose`.

    Cleanup closes the pipes it made (stdout and stderr once the tree is gone, reading
    what is left in them first: a task still reading, or a read after the block, the
    stream still ``tree.stdout`` as a `trio.Process` keeps its own, gets all the tree
    said as it stopped, then the end). While the tree stops, it reads
    them whenever no task of the program's does, until 1 MiB is unread, so that a program
    writing as it stops does not block on a full pipe until SIGKILL.
    A stream taken off the tree (``stdout, tree.stdout = tree.stdout, None``) is left open
    by cleanup, yours to read to its end and close, whoever still writes to it. (A stream
    you put in its place is closed by cleanup, within the policy's bound.)
    """

    _public_name = "trio_proctree.ProcessTree"

    def __init__(self, core: TreeCore, spawned: Spawned) -> None:
        self._core = core
        #: The leader's stdin, when it was ``subprocess.PIPE``.
        self.stdin: trio.abc.SendStream | None = _stream(spawned.stdin)
        #: The stream ``stdin`` was made, while it is the program's to take off the tree.
        self._given_stdin = self.stdin
        #: The leader's stdout, when it was ``subprocess.PIPE``.
        self.stdout: trio.abc.ReceiveStream | None = _output(spawned.stdout)
        #: The leader's stderr, when it was ``subprocess.PIPE``.
        self.stderr: trio.abc.ReceiveStream | None = _output(spawned.stderr)
        self._wait_lock = trio.Lock()
        #: Output streams cleanup leaves open: those `run_process_tree` handed back, the
        #: caller's to read to their end (as `trio.run_process` leaves them).
        self._left_open: list[trio.abc.ReceiveStream] = []
        #: Output streams `run_process_tree` reads (off the tree): cancelled, it reads
        #: them no more, and cleanup reads them while the tree stops, as those on it.
        self._read_by_run: list[TreeOutput] = []
        #: The run the cleanup runs in, once started (None: not started).
        self._cleanup_run: trio.lowlevel.TrioToken | None = None
        self._cleanup_done = trio.Event()
        #: The same, for a wait from another trio run (`_cleanup_under_way`): held until
        #: the cleanup is done, a waiting thread takes it and lets it go. (A lock, not a
        #: threading.Event: ~2 us less a tree, made and set on the event loop.)
        self._cleanup_finished = threading.Lock()
        self._cleanup_finished.acquire()
        self._closed_by_cleanup = {}

    async def wait(self) -> int:
        """Wait for the leader to exit and return its exit status.

        The rest of the tree may still be running; the leader is not reaped until cleanup.
        """
        leader = self._core.leader
        async with self._wait_lock:
            if self.returncode is None and not (leader.reaped or leader.lost):
                try:
                    await trio.lowlevel.wait_readable(leader.pidfd)
                except trio.ClosedResourceError:
                    pass  # cleanup reaped the leader while we waited
        returncode = self.returncode
        if returncode is None:  # the leader was reaped by someone else
            raise self._exit_status_lost()
        return returncode

    @trio.lowlevel.enable_ki_protection
    async def aclose(self) -> None:
        """Run the cleanup now: stop the tree as the escalation policy says, then reap it.

        Idempotent: later and concurrent calls wait for the first one to finish (a later
        caller's own cancellation ends its wait, never the cleanup; it raises nothing of
        the first call's errors: ``outcome.emptied`` says whether the tree was seen gone).
        The first call is shielded from cancellation; bounded by ``escalation.worst_case``
        (grace + 2 s by default). A cancellation pending once
        the cleanup is done (a deadline that passed meanwhile) is raised then, unless the
        cleanup failed: its error is raised instead, and the cancellation comes at the next
        checkpoint.

        Raises:
            CleanupError: if processes of the tree outlived SIGKILL.
            OSError: if signalling the tree failed.
        """
        if self._cleanup_run is not None:
            # Unshielded: a later caller's own cancellation may end its wait (not the cleanup).
            await self._cleanup_under_way()
            return
        # Never cut short by a cancellation (a cleanup cut short is a leaked tree): each of
        # its waits is shielded (`_TrioIO`). Bounded by the policy's worst case, which the
        # caller's own timeout therefore does not cut.
        await self._cleanup_then_cancellation()

    async def _cleanup_then_cancellation(self) -> None:
        """The cleanup, then a cancellation that came during it, if any, raised.

        With no exception in flight: the shielded cleanup holds a cancellation back, and
        without a checkpoint after it, a deadline that passed meanwhile went unsaid
        (``fail_after`` raised no TooSlowError, ``run_process_tree`` returned, or raised
        the exit status's error, past its deadline). A cleanup that failed raises its
        error instead: carried on the Cancelled, a ``move_on_after`` would swallow it (a
        leaked tree, said only in the log), and trio's cancellation is not lost meanwhile:
        it comes again at the caller's next checkpoint in that scope.
        """
        if await self._run_cleanup():
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            # A tree found empty needs no wait, and the cleanup never let another task
            # run: trio's rule is that every async call is a schedule point too (one that
            # closes many ended trees in a loop would else hold the run to itself).
            await trio.lowlevel.checkpoint()

    @trio.lowlevel.enable_ki_protection
    async def _run_cleanup(self) -> bool:
        """The cleanup, or a wait for the one under way; neither is cut short by a
        cancellation, so neither turns into a Cancelled that replaces an exception in
        flight. Whether it let other tasks run on the way (a schedule point)."""
        if self._core.forked_away:
            return False  # (the parent's, to stop: nothing of its cleanup runs here)
        with _starting_cleanups:  # (two runs in two threads must not both start it)
            started = self._cleanup_run is not None
            if not started:
                self._cleanup_run = trio.lowlevel.current_trio_token()
        if started:
            with trio.CancelScope(shield=True):
                await self._cleanup_under_way()  # (a schedule point, even once it is done)
            return True
        io = _TrioIO(self)
        # A Ctrl-C trio held back before the cleanup (it came while this task could not
        # take it: waiting on a worker thread, or running code with no checkpoint under
        # restrict_keyboard_interrupt_to_checkpoints) came at the cleanup's first wait,
        # taken for one that cuts the graces short: the tree SIGKILLed with no grace at
        # all (helper-74). Taken now, it ends the block as one raised in it would: the
        # graceful stop, then the interrupt.
        earlier = await _ctrl_c_held_back()
        try:
            await self._core.cleanup(io)
        except Exception as error:
            interrupt = io.keyboard_interrupt or earlier
            if interrupt is None:
                raise
            # The interrupt wins, as a cancellation does; the error rides along.
            chain_cleanup_error(interrupt, error, self._core.label)
        finally:
            self._cleanup_done.set()
            self._cleanup_finished.release()
        interrupt = io.keyboard_interrupt or earlier
        if interrupt is not None:
            raise interrupt
        return io.scheduled

    async def _cleanup_under_way(self) -> None:
        """Wait for the cleanup another task started, in this trio run or another."""
        if self._cleanup_run is trio.lowlevel.current_trio_token():
            await self._cleanup_done.wait()
            return
        # In another run (another thread): a trio.Event set there wakes no task of this
        # run, and this wait hung for good (helper-94). A worker thread waits instead.
        await trio.to_thread.run_sync(self._await_cleanup_finished, abandon_on_cancel=True)

    def _await_cleanup_finished(self) -> None:
        """Block until the cleanup is done (in a worker thread: see `_cleanup_under_way`)."""
        with self._cleanup_finished:
            pass  # (let go at once: every waiter, in turn, takes it)

    def _left_to_the_caller(self, stream: object) -> bool:
        """Whether ``stream`` is one `run_process_tree` handed back (`_left_open`)."""
        return any(stream is kept for kept in self._left_open)

    async def _close_stream(self, name: str, io: _TrioIO, within: float) -> Exception | None:
        stream = getattr(self, name)
        if stream is None or self._left_to_the_caller(stream):
            return None
        if self._closed_by_cleanup.get(name) is stream:
            return None  # (a stream is closed once: stdin by the close-stdin step, say)
        # Left on the tree, closed, as a trio.Process keeps its own: taken off while it
        # closed (None), a task of the program's that looked it up meanwhile met an
        # AttributeError, not the closed stream's own error (helper-85).
        self._closed_by_cleanup[name] = stream
        try:
            if isinstance(stream, TreeOutput):
                if stream.flowing:
                    await io._kept(stream.stop_flowing)
                stream.drain_and_close()
            elif isinstance(stream, trio.lowlevel.FdStream):
                # Closed without aclose()'s checkpoint: cleanup yields when it waits, and a
                # scheduler round trip per pipe was a tenth of a cooperative teardown.
                stream.close()
            else:  # a stream the program put in its place
                # Bounded: its aclose() may flush to a peer that never reads (a trio
                # stream's aclose closes it at once when cancelled).
                await io._kept(stream.aclose, timeout=max(within, 0.0))
        except trio.ClosedResourceError:
            pass
        except Exception as exc:  # noqa: BLE001 - kept and raised after cleanup
            return exc
        return None

    # KI-protected, as every frame between the block and the cleanup: an interrupt that
    # trio raised here, before the cleanup began, would leave the whole tree running.
    @trio.lowlevel.enable_ki_protection
    async def _aclose_under(self, exc: BaseException) -> None:
        """Clean up while ``exc`` propagates: a cleanup error rides along, never replaces it."""
        try:
            await self._run_cleanup()
        except Exception as error:  # noqa: BLE001
            chain_cleanup_error(exc, error, self._core.label)


async def _ctrl_c_held_back() -> KeyboardInterrupt | None:
    """A Ctrl-C trio holds back for this task (the run's main task), taken; else None,
    at the cost of two attribute reads. trio keeps it on its runner (``ki_pending``, not
    public): where a later trio keeps it elsewhere, None, and such a Ctrl-C comes at the
    cleanup's first wait as before. (Only then is a cancel scope made: shielded, as a
    cleanup often runs in a cancelled scope, so that only the Ctrl-C is taken.)"""
    task = trio.lowlevel.current_task()
    runner = getattr(task, "_runner", None)
    if not (getattr(runner, "ki_pending", False) and getattr(runner, "main_task", None) is task):
        return None
    with trio.CancelScope(shield=True):
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except KeyboardInterrupt as held:
            return held
    return None


def _stream(fd: int | None) -> trio.lowlevel.FdStream | None:
    return None if fd is None else trio.lowlevel.FdStream(fd)


def _output(fd: int | None) -> TreeOutput | None:
    return None if fd is None else TreeOutput(fd)


class TreeOutput(trio.abc.ReceiveStream):
    """The tree's stdout or stderr: its pipe, which cleanup closes once the tree is gone.

    While the tree stops, cleanup reads the pipe whenever no task of the program is in a
    read of it (`keep_flowing`): a program that writes as it stops (its last log lines, a
    CLI's result on EOF) into a pipe nobody reads any more would block, unable to act on
    the stop signal, and get SIGKILL at the grace's end. What cleanup read, the stream
    gives first (up to `DRAIN_AT_MOST` unread: past that, cleanup reads no more, and the
    tree is stopped as before), then the pipe, then, once cleanup closed it, its end. A
    task still reading (a log reader, outside the block) so gets all the tree said, then
    EOF, as the asyncio driver's readers do: closed under it, its next read raised
    ClosedResourceError, and those last words were lost (helper-64). So does a stream
    the program kept to read only after the block (a CLI's result once its input ends,
    as the asyncio driver gives it: it kept nothing, helper-70). Not where its descriptor was
    handed on (``stdin=tree.stdout`` for another process: a pipeline): read here, what the
    other process had still to read was taken from it (helper-66).
    """

    def __init__(self, fd: int) -> None:
        self._pipe = trio.lowlevel.FdStream(fd)
        #: What cleanup read from the pipe, not given yet.
        self._rest = bytearray()
        #: Whether cleanup closed the pipe: the stream ends once ``_rest`` is given.
        self._ended = False
        self._closed = False
        self._receiving = False
        #: Whether its descriptor was asked for (handed on to another process).
        self._handed_on = False
        #: Set while no task of the program's is in a read of the pipe itself.
        self._pipe_free = _set_event()
        #: Cleanup's reader while the tree stops (`keep_flowing`), and its end.
        self._flowing: trio.CancelScope | None = None
        self._flowed = _set_event()
        #: Set, and replaced, each time cleanup's reader reads or ends: a receive waits on it.
        self._more = trio.Event()

    def fileno(self) -> int:
        self._handed_on = True
        return self._pipe.fileno()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:  # (as FdStream says it, for the pipe)
            raise trio.BusyResourceError("another task is using this stream for receive")
        self._receiving = True
        try:
            while True:
                if self._closed:
                    await trio.lowlevel.checkpoint()  # (a receive is one, even refused)
                    raise trio.ClosedResourceError("the stream was closed")
                if self._rest or self._ended:
                    return await self._give(max_bytes)
                if self._flowing is not None:
                    await self._more.wait()  # (cleanup's reader reads, or ends)
                    continue
                try:
                    return await self._from_pipe(max_bytes)
                except trio.ClosedResourceError:
                    if not self._ended:
                        raise  # (closed by the program)
        finally:
            self._receiving = False

    async def _from_pipe(self, max_bytes: int | None) -> bytes:
        self._pipe_free = trio.Event()
        try:
            return await self._pipe.receive_some(max_bytes)
        finally:
            self._pipe_free.set()

    async def _give(self, max_bytes: int | None) -> bytes:
        """What cleanup read, first; b"" once it is all given and cleanup closed the pipe."""
        await trio.lowlevel.checkpoint()  # (every receive is one, as trio's rule is)
        if self._closed:  # (by another task, meanwhile)
            raise trio.ClosedResourceError("the stream was closed")
        rest = self._rest
        size = len(rest) if max_bytes is None else max_bytes
        chunk = bytes(rest[:size])
        del rest[:size]
        return chunk  # (b"" once all is given and the pipe closed: the end)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        self._closed = True
        self._rest = bytearray()
        self._stop_flowing()
        self._pipe.close()

    def keep_flowing(self) -> None:
        """Read the pipe while the tree stops, whenever no task of the program's is in a
        read of it (see the class's docstring); until `drain_and_close`. In a system task:
        cleanup runs in the program's task, which has no nursery to lend, and a task of
        the run's own takes neither the program's cancellations nor its Ctrl-C."""
        if self._flowing is not None or self._handed_on or self._pipe.fileno() < 0:
            return
        scope = trio.CancelScope()
        try:
            trio.lowlevel.spawn_system_task(self._flow, scope, name=_FLOW_TASK)
        except RuntimeError:
            # The run is ending (cleanup in an async generator that trio finalises after
            # its system tasks): no reader, as before there was one.
            return
        self._flowing = scope
        self._flowed = trio.Event()

    async def _flow(self, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self._pipe_free.wait()  # (a read of the program's ends first)
                await self._read_while_it_stops()
        except trio.ClosedResourceError:
            pass  # (closed by the program)
        except Exception:  # (a system task's error would end the whole run)
            # (The pipe is in a state its last read will report.)
            logger.debug("reading %r as its tree stops failed", self, exc_info=True)
        finally:
            self._flowing = None
            self._flowed.set()
            self._wake()

    async def _read_while_it_stops(self) -> None:
        fd = self._pipe.fileno()
        while len(self._rest) < DRAIN_AT_MOST:
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                return  # (every writer is gone: the rest is the end, as cleanup closes it)
            self._rest += data
            self._wake()
        logger.debug(
            "%d bytes of a stopping tree's output read and not yet taken: reading no more",
            len(self._rest),
        )

    def _wake(self) -> None:
        self._more.set()
        self._more = trio.Event()

    def _stop_flowing(self) -> None:
        if self._flowing is not None:
            self._flowing.cancel()

    @property
    def flowing(self) -> bool:
        """Whether cleanup's reader (`keep_flowing`) is on."""
        return self._flowing is not None

    async def stop_flowing(self) -> None:
        """End `keep_flowing`'s reading, and wait for it to be over."""
        self._stop_flowing()
        await self._flowed.wait()

    def drain_and_close(self) -> None:
        """Unless handed on, read what the pipe still holds, without waiting
        (the tree, gone, writes no more: at most `DRAIN_AT_MOST`, from a writer outside
        it, on top of what cleanup's reader took: with one budget for both, a tree that
        wrote a little past it as it stopped lost its last bytes, unsaid, helper-69);
        then close it. Cleanup's reader is over by now (`stop_flowing`)."""
        fd = self._pipe.fileno()
        if fd < 0:
            return  # (closed by the program)
        if self._handed_on:
            self._rest = bytearray()  # (the other process's to read)
            self._pipe.close()
            return
        self._ended = True
        rest, taken = self._rest, 0
        with contextlib.suppress(BlockingIOError):  # (non-blocking: all there is, was read)
            while taken < DRAIN_AT_MOST and (data := os.read(fd, 65536)):
                rest += data
                taken += len(data)
        if taken >= DRAIN_AT_MOST:
            dropped(taken)
        self._pipe.close()
        self._wake()


TRIO_STREAMS.append(TreeOutput)  # (its pipe is trio's, non-blocking: see `_blocking_view`)


def _set_event() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


_FLOW_TASK = "trio_proctree: reading the output of a stopping tree"

#: Each trio run's spawns in flight at once (`_spawn_slots`).
_SPAWN_SLOTS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "trio_proctree spawn slots"
)


def _spawn_slots() -> trio.CapacityLimiter:
    """How many spawns run at once, each in a worker thread: one per CPU this process may
    use, two at least. A spawn is mostly Python, run with the GIL held; more threads at it
    than cores only take the GIL from each other. 100 trees started at once in trio's
    default 40 threads cost our process ~1.05 ms of CPU each, and ~0.6 ms two at a time,
    on two cores (bench/HISTORY.md). Waiting for a slot forks nothing: a cancellation
    there is taken at once."""
    try:
        return _SPAWN_SLOTS.get()
    except LookupError:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - (not on Linux)
            cpus = os.cpu_count() or 2
        slots = trio.CapacityLimiter(max(2, cpus))
        _SPAWN_SLOTS.set(slots)
        return slots


class _TreeScope:
    """The async context manager `open_process_tree` returns."""

    def __init__(self, plan: SpawnPlan, policy: Escalation, containment: ContainmentChoice) -> None:
        self._plan = plan
        self._policy = policy
        self._containment = containment
        self._tree: ProcessTree | None = None
        self._entered = False

    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> ProcessTree:
        # Marked before the spawn, not once it is done: two tasks entering one scope at
        # once each started a tree, and the first, its record overwritten, was never stopped.
        _require_trio("open_process_tree")
        if self._entered:
            raise RuntimeError("this open_process_tree() scope was already entered")
        self._entered = True
        try:
            # Not abandoned on cancel: a cancellation that arrives while the worker thread
            # forks waits for the spawn, so the process is never lost...
            spawned, containment = await trio.to_thread.run_sync(
                _start_tree_in_worker, self._plan, self._containment, limiter=_spawn_slots()
            )
            core = TreeCore(spawned, containment, self._plan, self._policy)
            tree = self._tree = ProcessTree(core, spawned)
            # ...and is delivered here, with the tree already in hand: the block does not
            # run and the tree is stopped before the Cancelled goes on.
            try:
                await trio.lowlevel.checkpoint_if_cancelled()
            except BaseException as exc:
                await tree._aclose_under(exc)
                raise
        except BaseException:
            # Nothing of it runs (a spawn that failed started nothing; a tree cancelled
            # here was stopped): the scope may be entered again, as before it was.
            self._entered = False
            raise
        return tree

    @trio.lowlevel.enable_ki_protection  # (see _aclose_under)
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
        if exc is None:
            await self._tree._cleanup_then_cancellation()
        else:
            await self._tree._aclose_under(exc)


# Protected: a Ctrl-C raised inside the synchronous setup could land between an open()
# of the exec check and its `with`, the file then left to the garbage collector (a
# ResourceWarning); deferred, it comes at the next checkpoint, as a cancellation would.
@trio.lowlevel.enable_ki_protection
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

    However the block ends — normally, by an exception, or by cancellation — cleanup
    stops whatever of the tree is still running: ``stop_signal`` to every process, SIGCONT,
    up to ``grace`` seconds for the tree to empty, then SIGKILL, then the leader is reaped.
    Lingering descendants are stopped even after the leader has exited.

    Cleanup is shielded from cancellation, so it can outlast the caller's own timeout: by
    at most ``grace`` + 2 s with the defaults (``escalation.worst_case`` in general). A
    timeout that runs out meanwhile is raised once the cleanup is done.

    Args:
      command: a sequence of arguments, or a string with ``shell=True``.
      grace: seconds between the stop signal and SIGKILL.
      stop_signal: the first signal cleanup sends.
      escalation: a full `Escalation` policy instead of ``grace`` and ``stop_signal``.
      containment: ``"auto"`` (the strongest available here), ``"cgroup"``,
        ``"subreaper"`` or ``"group"``; ``tree.containment`` says which it got.
      **options: as for `trio.lowlevel.open_process` (``stdin``, ``stdout``, ``stderr``,
        ``cwd``, ``env``, ...). The tree starts in a new session; pass
        ``start_new_session=False`` to keep the caller's session (and controlling
        terminal) but still get a process group of its own.

    Bad input is refused before anything is started.

    Raises:
      ValueError: empty command, bad ``grace``, invalid ``stop_signal``.
      TypeError: a string command without ``shell=True``, an option
        `trio.lowlevel.open_process` does not take, or text mode (the streams are bytes).
      FileNotFoundError: the executable does not exist.
      PermissionError: the executable is not executable.
      OSError: (``ENOEXEC``, when the block is entered) the executable is a file of no
        format Linux runs (a text file with no ``#!`` line, say), as `subprocess` raises it.
      ContainmentUnavailable: the ``containment`` asked for is not available here (none
        is under a /proc of another pid namespace).
      RuntimeError: this process ignores SIGCHLD (Linux would reap the leader at once,
        its exit status with it).
      NotImplementedError: on platforms other than Linux.
    """
    policy = resolve_policy(grace, stop_signal, escalation)
    plan = plan_spawn(command, options)
    choice = choose_containment(containment, changes_user=plan.changes_user)
    return _TreeScope(plan, policy, choice)


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
    task_status: trio.TaskStatus[ProcessTree] = trio.TASK_STATUS_IGNORED,
    **options: Any,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` as a process tree to completion, like `trio.run_process`.

    When the leader exits, whatever it left running is stopped (the escalation), so the
    call returns once the whole tree is gone. Cancellation stops the tree the same way.
    With ``tree = await nursery.start(run_process_tree, cmd)`` the `ProcessTree` is handed
    back as soon as the leader runs, and cancelling the nursery tears the tree down.

    Cleanup is shielded from cancellation: a cancelled call can take up to
    ``escalation.worst_case`` (``grace`` + 2 s by default) to return, and a deadline that
    passes during it is raised then, even once the command has exited. After the tree is
    gone, output still held open by something outside it is read for at most
    `PIPE_DRAIN_TIMEOUT` seconds.

    Pipes handed back with the tree (``stdout=subprocess.PIPE`` or
    ``stderr=subprocess.PIPE``, with ``nursery.start``) are yours, as with
    `trio.run_process`: left open when the run ends, to be read to their end and closed.
    (Its ``stdin=subprocess.PIPE`` is closed by cleanup, as the close-stdin step needs.)

    Args:
      stdin: bytes to feed to the leader's stdin (then closed), or what
        `trio.lowlevel.open_process` accepts (``None`` inherits ours).
      capture_stdout, capture_stderr: collect the output into the result.
      check: raise `subprocess.CalledProcessError` if the leader exits non-zero.
      grace, stop_signal, escalation, containment, options: as for `open_process_tree`.

    Returns:
      `subprocess.CompletedProcess` with the leader's exit status and captured output.
    """
    _require_trio("run_process_tree")
    request = plan_run(
        stdin,
        capture_stdout,
        capture_stderr,
        options,
        task_status=task_status,
        hand_back="nursery.start()",
    )
    outputs: dict[str, list[bytes]] = {name: [] for name in request.capture}
    readers: list[tuple[str, TreeOutput]] = []
    try:
        async with open_process_tree(
            command,
            grace=grace,
            stop_signal=stop_signal,
            escalation=escalation,
            containment=containment,
            **request.options,
        ) as tree:
            # The streams this function reads are taken off the tree, so that its cleanup
            # leaves them open to be read to the end here.
            for name in request.capture:
                readers.append((name, getattr(tree, name)))
                setattr(tree, name, None)
            tree._read_by_run.extend(stream for _, stream in readers)
            # Output pipes handed back (nursery.start) are the caller's, to read to their
            # end after the run: its cleanup leaves them open.
            tree._left_open.extend(
                stream for stream in (tree.stdout, tree.stderr) if stream is not None
            )
            stdin_stream = tree.stdin if request.feed is not None else None
            if request.feed is not None:
                # Fed here, and closed once fed: off the tree, as a stream the program takes
                # is. Its cleanup's close-stdin step then waits for the input to be taken
                # in full, and says whether it was (``stdin_closed``). Cut short as the
                # leader exits, it was lost, unsaid, to what the leader left reading it.
                tree.stdin = None
            await _run_to_end(tree, request.feed, stdin_stream, readers, outputs, task_status)
    finally:
        # Closed only after the tree's cleanup: on cancellation the tree is stopped by the
        # escalation, not by SIGPIPE from pipes we closed under it.
        for _, stream in readers:
            stream.close()

    outcome = tree.outcome
    assert outcome is not None
    return completed(tree.args, outcome.returncode, outputs, request, check=check)


async def _run_to_end(  # noqa: PLR0917 - one private call site
    tree: ProcessTree,
    feed: bytes | None,
    stdin_stream: trio.abc.SendStream | None,
    readers: list[tuple[str, TreeOutput]],
    outputs: Mapping[str, list[bytes]],
    task_status: trio.TaskStatus[ProcessTree],
) -> None:
    drained = [trio.Event() for _ in readers]
    with unwrapped():
        async with trio.open_nursery() as nursery:
            if stdin_stream is not None and feed is not None:
                nursery.start_soon(_feed, stdin_stream, feed)
            for (name, stream), done in zip(readers, drained, strict=True):
                nursery.start_soon(_read_all, stream, outputs[name], done)
            task_status.started(tree)
            await tree.wait()
            # The leader is done: stop what it left behind, so the pipes reach EOF.
            await tree.aclose()
            with bound(PIPE_DRAIN_TIMEOUT, virtual=clock_is_virtual()) as drain:
                for done in drained:
                    await done.wait()
            if drain.cancelled_caught:
                logger.warning(
                    "%s: output pipe still open %gs after the tree ended (held by a process "
                    "outside it); returning what was read",
                    tree._core.label,
                    PIPE_DRAIN_TIMEOUT,
                )
            # What is left would wait for ever: a reader on a pipe that a process outside
            # the tree holds open, a feeder whose input the tree never read.
            nursery.cancel_scope.cancel()


#: Signals the worker thread that spawned a tree blocks once it has (`main_thread_only`).
_kept_from_workers: frozenset[int] = frozenset()
#: Every signal ever kept so: a worker that blocked them lives on (trio keeps idle workers
#: for seconds), and unblocks them before each spawn of a tree, whoever asks for it.
_ever_kept: set[int] = set()


@contextlib.contextmanager
def main_thread_only(signals: Iterable[int]) -> Generator[None]:
    """Within, a worker thread that spawns a tree blocks ``signals`` once it has, for the
    rest of its life, so that only the main thread takes them: for a program (the ``run``
    tool) that answers them and runs nothing else in worker threads.

    The kernel hands a signal to any thread that does not block it, and Python runs its
    handler in the main thread only once the thread that took it has set its flag: a
    worker descheduled in between, for milliseconds under load, had its signal answered
    after one sent later (bash's ``kill %1`` on a stopped job sends SIGTERM, then
    SIGCONT). The worker forks with them unblocked: a child inherits the mask of the
    thread that forked it, and the tree must get every signal sent to it.

    Such a worker keeps them blocked after the block, as long as trio keeps it: a later
    tree's spawn there unblocks them first, but other code's spawns from it (a
    ``trio.run_process`` in the same program) would start children with them blocked.
    For a program that exits after the block, as the run tool does.
    """
    global _kept_from_workers  # noqa: PLW0603 - the run tool's, for its whole life
    _kept_from_workers = frozenset(signals)
    _ever_kept.update(_kept_from_workers)
    try:
        yield
    finally:
        _kept_from_workers = frozenset()


def _require_trio(entry: str) -> None:
    """Where no trio run is, but an asyncio loop is (anyio's asyncio backend, say): an
    error that names the twin to use, not trio's "must be called from async context"."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        asyncio = sys.modules.get("asyncio")  # (no loop can run if it was never imported)
        if asyncio is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # (no event loop at all: trio's own error says it)
        raise RuntimeError(
            f"trio_proctree.{entry} runs under trio; under asyncio (anyio's asyncio "
            f"backend too), use trio_proctree.asyncio.{entry}"
        ) from None


def _start_tree_in_worker(
    plan: SpawnPlan, choice: ContainmentChoice
) -> tuple[Spawned, Containment]:
    kept = _kept_from_workers
    if not _ever_kept:
        return start_tree(plan, choice)
    # (A worker that blocked them before: the tree must get every signal sent to it.)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _ever_kept)
    try:
        return start_tree(plan, choice)
    finally:
        if kept:
            signal.pthread_sigmask(signal.SIG_BLOCK, kept)


@contextlib.contextmanager
def unwrapped() -> Generator[None]:
    """The one exception out of a nursery inside, as itself: that nursery is an
    implementation detail, and callers see the exception (a Cancelled, say) as if there
    were no nursery. A group of several stays a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        single = _single_exception(group)
        if single is None:
            raise
        # Raised here, it would take the group for its context (shown in tracebacks as
        # "during handling of"): its own is put back.
        context = single.__context__
        try:
            raise single
        finally:
            set_context(single, context)  # (a frozen dataclass's too)


def _single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The exception a group stands for: its first Cancelled if it holds nothing else,
    its only other exception if there is one, else None (keep the group)."""
    cancelled, rest = group.split(trio.Cancelled)
    if rest is None:
        return next(_leaves(group)) if cancelled is not None else None
    leaves = list(_leaves(rest))
    return leaves[0] if len(leaves) == 1 else None


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        group = cast("BaseExceptionGroup[BaseException]", exc)
        for inner in group.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


async def _feed(stream: trio.abc.SendStream, data: bytes) -> None:
    async with stream:
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the tree stopped reading: what it did not take is not ours to report


async def _read_all(stream: trio.abc.ReceiveStream, chunks: list[bytes], done: trio.Event) -> None:
    async for chunk in stream:
        chunks.append(bytes(chunk))
    done.set()
