"""Cleanup when the program itself is stopping: every task cancelled at once (asyncio.run's
shutdown), Ctrl-C during a grace, a task cancelled while an exception leaves its block."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import inspect
import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures.thread import BrokenThreadPool
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import trio_proctree.asyncio
from trio_proctree import _leader
from trio_proctree.asyncio import open_process_tree

from . import procs
from .conftest import Tracked
from .test_asyncio_close_path import held_until_a_hook

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

SLEEPS = ["sh", "-c", "sleep 60 & sleep 61 & wait"]
IGNORES_TERM = ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]


class Flaky(Exception):
    pass


@contextlib.asynccontextmanager
async def failing_once_ready(contained: dict[str, Any]) -> AsyncIterator[None]:
    """A block whose tree ignores SIGTERM (its cleanup takes the whole 0.3 s grace): the
    body runs once the tree is ready, then the block fails (`Flaky`)."""
    async with open_process_tree(
        IGNORES_TERM, grace=0.3, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        assert await tree.stdout.readline() == b"ready\n"
        yield
        raise Flaky


def cancel_every_other_task() -> None:
    """What asyncio.run does to what is left at its end (and a blanket shutdown does)."""
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()


def test_a_spawn_whose_tasks_are_all_cancelled_leaves_no_tree(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutant: awaiting the spawn's worker thread directly (its result lost on cancel).
    forked = threading.Event()
    real_start_tree = trio_proctree.asyncio.start_tree  # type: ignore[attr-defined]

    def slow_start_tree(*args: Any) -> Any:
        started = real_start_tree(*args)
        forked.set()  # the leader runs; the cancellation comes while this thread returns
        time.sleep(0.1)
        return started

    monkeypatch.setattr(trio_proctree.asyncio, "start_tree", slow_start_tree)

    async def main() -> None:
        async def opener() -> None:
            async with open_process_tree(SLEEPS, grace=0.2, **contained):
                await asyncio.sleep(60)  # pragma: no cover - never entered

        task = asyncio.get_running_loop().create_task(opener())
        await asyncio.get_running_loop().run_in_executor(None, forked.wait)
        cancel_every_other_task()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tracked.survivors() == []  # now, not at interpreter exit

    asyncio.run(main())


def test_a_cleanup_cancelled_before_its_first_step_runs_all_the_same(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Mutant: callers waiting on the cleanup task itself (not restarted when cancelled
    # before it began): the caller got a CancelledError nobody sent it, the tree lived on.
    loop_errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: loop_errors.append(context)
        )
        async with open_process_tree(SLEEPS, grace=0.2, **contained) as tree:
            closing = tree.aclose()  # the cleanup task is created here...
            cancel_every_other_task()  # ...and cancelled before its first step
            await closing
            assert tree.outcome is not None
            assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
            assert tracked.survivors() == []

    asyncio.run(main())
    assert loop_errors == []


def test_a_timeout_that_an_exception_passes_on_its_way_out_leaves_no_stray_cancel(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The cancellation is the timeout's: absorbed in the cleanup, it must not come back
    # after the timeout has let the block's exception through (it did, when cancellations
    # were delivered again later).
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is Python 3.11+")

    async def main() -> str:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as deadline, failing_once_ready(contained):
                deadline.reschedule(loop.time() + 0.05)  # expires during the cleanup
        except Flaky:
            await asyncio.sleep(0.05)  # the timeout's cancellation stayed inside it
            current = asyncio.current_task()
            assert current is not None
            assert current.cancelling() == 0
            return "handled"

    assert asyncio.run(main()) == "handled"
    assert tracked.survivors() == []


async def the_next_wait_after(block: Callable[[asyncio.Task[Any]], Awaitable[None]]) -> str:
    """Run ``block`` (given the current task), which fails with `Flaky`, handled here as a
    program that retries would; then wait: "cancelled" if a cancellation comes at that
    wait, "ran on" if none does."""
    current = asyncio.current_task()
    assert current is not None
    try:
        await block(current)
    except Flaky:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "cancelled"
    return "ran on"


def test_a_cancellation_pending_as_the_block_raises_comes_at_the_next_wait(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Requested while the block's code ran (as asyncio.run's Ctrl-C handler does, between
    # two lines of busy code), then the block failed: the cleanup's wait took it, and it
    # was counted as one being handled. Red before (helper-56): the next wait slept on,
    # and a program retrying on that error ran on after a Ctrl-C.
    if sys.version_info < (3, 11):
        pytest.skip("asyncio counts cancellations (Task.cancelling) from Python 3.11")

    async def block(current: asyncio.Task[Any]) -> None:
        async with failing_once_ready(contained):
            current.cancel()  # pending: nothing has awaited since

    assert asyncio.run(the_next_wait_after(block)) == "cancelled"
    assert tracked.survivors() == []


def test_a_pending_cancellation_is_not_hidden_by_a_timeout_taken_back_during_the_cleanup(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The same pending cancellation, and a timeout around the block that expires during
    # the cleanup and is taken back as the block's error leaves it. Red before
    # (helper-57): the count of requests, read once the cleanup was over, held the
    # timeout's too, and the pending one was taken for one being handled, and lost.
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is Python 3.11+")

    async def block(current: asyncio.Task[Any]) -> None:
        async with asyncio.timeout(None) as deadline, failing_once_ready(contained):
            deadline.reschedule(asyncio.get_running_loop().time() + 0.1)  # in the grace
            current.cancel()  # pending: nothing has awaited since

    assert asyncio.run(the_next_wait_after(block)) == "cancelled"
    assert tracked.survivors() == []


def test_a_cancellation_during_an_inner_blocks_cleanup_survives_the_outer_blocks(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The inner block's cleanup takes the cancellation and delivers it again at the task's
    # next wait: the outer block's cleanup, where it is delivered and taken once more.
    # Red before (helper-56 found the single block's case): counted there as requested
    # before that cleanup began, it was lost.
    if sys.version_info < (3, 11):
        pytest.skip("asyncio counts cancellations (Task.cancelling) from Python 3.11")

    async def block(current: asyncio.Task[Any]) -> None:
        async with (
            open_process_tree(IGNORES_TERM, grace=0.3, **contained),  # the outer block
            failing_once_ready(contained),  # the inner block
        ):
            asyncio.get_running_loop().call_later(0.05, current.cancel)  # in its grace

    assert asyncio.run(the_next_wait_after(block)) == "cancelled"
    assert tracked.survivors() == []


def test_a_task_group_ends_a_child_cancelled_while_its_failing_block_cleans_up(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A sibling fails while the child's block, which failed too, stops its tree: the
    # group's cancellation of the child must not be lost in that cleanup. Red before
    # (helper-24): absorbed there, it let the child catch its error and try again, and
    # the group waited for every attempt (for ever, with no cap on them).
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.TaskGroup is Python 3.11+")
    attempts = []
    stopping = asyncio.Event()

    async def retrying() -> None:
        while len(attempts) < 3:
            attempts.append(len(attempts) + 1)
            try:
                async with failing_once_ready(contained):
                    stopping.set()  # the cleanup begins now, and takes the whole grace
            except Flaky:
                await asyncio.sleep(0)  # and tries again

    async def failing_sibling() -> None:
        await stopping.wait()
        raise ValueError("sibling failed")

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(retrying())
            group.create_task(failing_sibling())

    with pytest.raises(BaseExceptionGroup) as raised:
        asyncio.run(main())
    assert [type(exc) for exc in raised.value.exceptions] == [ValueError]
    assert attempts == [1]
    assert tracked.survivors() == []


CANCELLED_WHILE_AN_EXCEPTION_LEAVES = procs.ALIVE_IN_A_CHILD + textwrap.dedent(
    """
    import asyncio, json, sys
    from trio_proctree.asyncio import open_process_tree

    class Flaky(Exception):
        pass

    report, pids = {}, Pids()

    async def worker(ready):
        command = ["sh", "-c", "trap '' TERM; echo $$; sleep 60"]
        try:
            async with open_process_tree(
                command, grace=0.3, stdout=-1, containment=sys.argv[1]
            ) as tree:
                pids.append(int(await tree.stdout.readline()))
                ready.set()
                raise Flaky
        except Flaky:
            report["seen"] = "Flaky"
        try:
            await asyncio.sleep(5)
            report["next_wait"] = "slept"
        except asyncio.CancelledError:
            report["next_wait"] = "cancelled"
            raise

    async def main():
        ready = asyncio.Event()
        task = asyncio.create_task(worker(ready))
        await ready.wait()
        await asyncio.sleep(0.05)  # into the cleanup's grace
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    report["alive"] = [pid for pid in pids if alive(pid)]
    print(json.dumps(report))
    """
)


def test_a_cancelled_task_that_handles_its_blocks_error_is_cancelled_at_its_next_wait(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # task.cancel() while the block's exception leaves it: the exception is what the task
    # sees, and the cancellation comes at its next wait, as trio's would. (Python 3.10
    # does not count cancellations, and cannot tell a timeout scope's from one that
    # stands: there it stays absorbed, as documented.)
    if sys.version_info < (3, 11):
        pytest.skip("asyncio counts cancellations (Task.cancelling) from Python 3.11")
    report = json.loads(
        procs.run_python(
            CANCELLED_WHILE_AN_EXCEPTION_LEAVES, contained["containment"], env=tracked.env
        )
    )
    assert report == {"seen": "Flaky", "next_wait": "cancelled", "alive": []}
    assert tracked.survivors() == []


def test_a_ctrl_c_while_the_blocks_exception_leaves_it_is_not_lost(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # asyncio.run turns a Ctrl-C into a cancellation of the main task; one that came
    # while the block's exception left it was absorbed there, and the program that
    # handled that exception ran on and exited 0 (red before, helper-24).
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.run turns Ctrl-C into a cancellation from Python 3.11")
    report = json.loads(
        procs.run_python(
            CTRL_C_WHILE_AN_EXCEPTION_LEAVES, contained["containment"], env=tracked.env
        )
    )
    assert report == {"seen": "Flaky", "ran_on": False, "interrupted": True, "alive": []}
    assert tracked.survivors() == []


# A child's code: ``press_ctrl_c(presses)`` in a thread presses Ctrl-C that many times,
# 0.1 s apart, from a moment after cleanup sent its SIGTERM.
CTRL_C_IN_THE_GRACE = textwrap.dedent(
    """
    import logging, os, signal, threading, time

    # Ctrl-C as at a terminal: a background job (CI, nohup) inherits SIGINT ignored, and
    # then Python installs no KeyboardInterrupt for it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    grace_began = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record):
            if "sending SIGTERM" in record.getMessage():
                grace_began.set()

    log = logging.getLogger("trio_proctree")
    log.addHandler(Watch())
    log.setLevel(logging.DEBUG)

    def press_ctrl_c(presses):
        grace_began.wait()
        for _ in range(presses):
            time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGINT)
    """
)

# Holds a tree whose members ignore SIGTERM, ends its block (cleanup: a 5 s grace), and is
# interrupted once (one Ctrl-C) a moment into that grace. Reports before it exits, so
# that the net at interpreter exit cannot hide a tree the cleanup left behind.
INTERRUPTED_DURING_THE_GRACE = (
    procs.ALIVE_IN_A_CHILD
    + CTRL_C_IN_THE_GRACE
    + textwrap.dedent(
        """
    import json, sys, time, trio
    from trio_proctree import open_process_tree

    threading.Thread(target=press_ctrl_c, args=(1,), daemon=True).start()
    trees, pids, warned = [], Pids(), []

    class Warned(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warned.append(record.getMessage())

    log.addHandler(Warned())

    async def main():
        command = ["sh", "-c", "trap '' TERM; sleep 60 & echo $$ $!; wait"]
        async with open_process_tree(
            command, grace=5.0, stdout=-1, containment=sys.argv[1]
        ) as tree:
            trees.append(tree)
            line = b""
            while not line.endswith(b"\\n"):
                line += await tree.stdout.receive_some()
            pids.extend(int(pid) for pid in line.split())

    began = time.monotonic()
    try:
        trio.run(main)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    outcome = trees[0].outcome

    print(json.dumps({
        "interrupted": interrupted,
        "seconds": time.monotonic() - began,
        "signals": None if outcome is None else [int(s) for s in outcome.signals],
        "grace_expired": None if outcome is None else outcome.grace_expired,
        "returncode": None if outcome is None else outcome.returncode,
        "alive": [pid for pid in pids if alive(pid)],
        "pids": pids,
        "warned": warned,
    }))
    """
    )
)


def test_ctrl_c_during_the_grace_kills_the_tree_now_then_interrupts(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Mutant: letting the KeyboardInterrupt out of the cleanup's wait (trio raises it in
    # the main task's checkpoint, shielded or not): the tree was left signalled, alive,
    # until the cleanup itself held such an interrupt (stop 33); now the log tells.
    report = json.loads(
        procs.run_python(
            INTERRUPTED_DURING_THE_GRACE, contained["containment"], env=contained["env"]
        )
    )
    assert report["interrupted"]
    assert len(report["pids"]) == 2  # the shell and its sleep
    assert report["alive"] == []
    assert report["signals"] == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert report["grace_expired"] is False  # (cut short, not run out)
    assert report["returncode"] == -signal.SIGKILL
    assert report["seconds"] < 4  # the 5 s grace was cut short
    # Held by the driver's wait, the interrupt cuts that grace short, and the log says
    # how far into it. (Let out of the wait, it is held by the cleanup as one raised in
    # the middle of a step: the tree is stopped all the same, but the log cannot say.)
    [cut] = [line for line in report["warned"] if "interrupted (Ctrl-C)" in line]
    assert "still running when cleanup was interrupted (Ctrl-C) " in cut
    assert cut.endswith("s after SIGTERM; sending SIGKILL to the tree")
    assert tracked.survivors() == []


# The same, with a cleanup that fails: the stream the program put in place of the tree's
# stdin cannot close. Reports what reached the program, and what it carried.
INTERRUPTED_DURING_A_FAILING_CLEANUP = (
    procs.ALIVE_IN_A_CHILD
    + CTRL_C_IN_THE_GRACE
    + textwrap.dedent(
        """
    import json, sys, trio
    from trio_proctree import open_process_tree

    class FailsToClose(trio.abc.SendStream):
        def __init__(self, inner):
            self.inner = inner
        async def send_all(self, data):
            await self.inner.send_all(data)
        async def wait_send_all_might_not_block(self):
            pass
        async def aclose(self):
            await trio.aclose_forcefully(self.inner)
            raise ValueError("could not close (injected)")

    threading.Thread(target=press_ctrl_c, args=(1,), daemon=True).start()
    pids = Pids()

    async def main():
        command = ["sh", "-c", "trap '' TERM; sleep 60 & echo $$ $!; wait"]
        async with open_process_tree(
            command, grace=5.0, stdin=-1, stdout=-1, containment=sys.argv[1]
        ) as tree:
            tree.stdin = FailsToClose(tree.stdin)
            line = b""
            while not line.endswith(b"\\n"):
                line += await tree.stdout.receive_some()
            pids.extend(int(pid) for pid in line.split())

    try:
        trio.run(main)
        reached = None
    except BaseException as exc:
        reached = exc
    print(json.dumps({
        "reached": type(reached).__name__,
        "carried": repr(reached.__cause__) + " ".join(getattr(reached, "__notes__", [])),
        "alive": [pid for pid in pids if alive(pid)],
    }))
    """
    )
)


def test_a_cleanup_error_never_replaces_a_ctrl_c(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The interrupt wins, as a cancellation does, and carries the error (helper-35: a
    # mutant that raised the cleanup's error instead lived).
    report = json.loads(
        procs.run_python(
            INTERRUPTED_DURING_A_FAILING_CLEANUP, contained["containment"], env=contained["env"]
        )
    )
    assert report["reached"] == "KeyboardInterrupt"
    assert "could not close (injected)" in report["carried"]
    assert report["alive"] == []
    assert tracked.survivors() == []


# The asyncio twin: Ctrl-C at a slow stop under asyncio.run (or uvloop.run). From 3.11
# the first Ctrl-C cancels the main task, whose cleanup runs its course; a second raises
# KeyboardInterrupt out of the loop, whose shutdown cancels the cleanup's task. Python
# 3.10's asyncio.run takes no Ctrl-C of its own: the first raises at once.
INTERRUPTED_DURING_AN_ASYNCIO_GRACE = (
    procs.ALIVE_IN_A_CHILD
    + CTRL_C_IN_THE_GRACE
    + textwrap.dedent(
        """
    import asyncio, json, sys, time
    from trio_proctree.asyncio import open_process_tree

    presses = 2 if sys.version_info >= (3, 11) else 1
    threading.Thread(target=press_ctrl_c, args=(presses,), daemon=True).start()
    trees, pids = [], Pids()

    async def main():
        command = ["sh", "-c", "trap '' TERM; sleep 60 & echo $$ $!; wait"]
        async with open_process_tree(
            command, grace=5.0, stdout=-1, containment=sys.argv[1]
        ) as tree:
            trees.append(tree)
            pids.extend(int(pid) for pid in (await tree.stdout.readline()).split())

    if sys.argv[2] == "uvloop.run":
        import uvloop
        run = uvloop.run
    else:
        run = asyncio.run
    began = time.monotonic()
    try:
        run(main())
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    outcome = trees[0].outcome

    print(json.dumps({
        "interrupted": interrupted,
        "seconds": time.monotonic() - began,
        "signals": None if outcome is None else [int(s) for s in outcome.signals],
        "grace_expired": None if outcome is None else outcome.grace_expired,
        "alive": [pid for pid in pids if alive(pid)],
        "pids": pids,
    }))
    """
    )
)


@pytest.mark.parametrize("runner", ["asyncio.run", "uvloop.run"])
def test_ctrl_c_at_an_asyncio_programs_end_cuts_the_grace_short(
    tracked: Tracked, contained: dict[str, Any], runner: str
) -> None:
    # The shutdown's cancellation of the cleanup's task comes with the KeyboardInterrupt
    # as its context: the user pressed Ctrl-C again. Red before: the 5 s grace ran out.
    if runner == "uvloop.run":
        pytest.importorskip("uvloop")
    report = json.loads(
        procs.run_python(
            INTERRUPTED_DURING_AN_ASYNCIO_GRACE,
            contained["containment"],
            runner,
            env=contained["env"],
        )
    )
    assert report["interrupted"]
    assert len(report["pids"]) == 2  # the shell and its sleep
    assert report["alive"] == []
    assert report["signals"] == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert report["grace_expired"] is False  # (cut short, not run out)
    assert report["seconds"] < 4  # the 5 s grace was cut short
    assert tracked.survivors() == []


@pytest.mark.parametrize("runner", ["asyncio.run", "uvloop.run"])
def test_a_shutdown_run_while_an_earlier_ctrl_c_is_handled_keeps_its_grace(
    tracked: Tracked, contained: dict[str, Any], runner: str
) -> None:
    # "except KeyboardInterrupt: asyncio.run(shut_down())": every exception raised while
    # that handler runs has the old interrupt as its context, the shutdown's cancellation
    # of a cleanup under way included. Red before: that was taken for a new Ctrl-C, and a
    # tree that needed a moment to stop was SIGKILLed at once.
    run = pytest.importorskip("uvloop").run if runner == "uvloop.run" else asyncio.run
    # (Its members are short: one forked as the SIGTERM lands may miss it, and must not
    # outlast the grace for that.)
    stops_in_a_moment = [
        "sh", "-c", "trap 'sleep 0.2; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    ]  # fmt: skip
    trees: list[trio_proctree.asyncio.ProcessTree] = []

    async def shut_down() -> None:
        ready = asyncio.Event()

        async def stop_a_tree() -> None:
            async with open_process_tree(
                stops_in_a_moment, grace=2.0, stdout=subprocess.PIPE, **contained
            ) as tree:
                trees.append(tree)
                assert tree.stdout is not None
                assert await tree.stdout.readline() == b"ready\n"
                ready.set()
                await tree.aclose()  # under way when this program returns

        task = asyncio.get_running_loop().create_task(stop_a_tree())
        await ready.wait()
        await asyncio.sleep(0.05)  # the cleanup's SIGTERM is out
        assert not task.done()
        # Returning: the runner's shutdown cancels what is left, the cleanup's task too.

    try:
        raise KeyboardInterrupt  # noqa: TRY301 - an earlier Ctrl-C, which the program handles:
    except KeyboardInterrupt:
        run(shut_down())
    outcome = trees[0].outcome
    assert outcome is not None
    assert outcome.signals == (signal.SIGTERM, signal.SIGCONT), outcome
    assert not outcome.grace_expired
    assert outcome.returncode == 0  # its trap ran to the end
    assert tracked.survivors() == []


@pytest.mark.parametrize("runner", ["asyncio.run", "uvloop.run"])
def test_a_ctrl_c_before_the_cleanups_first_step_cuts_its_grace_short(
    tracked: Tracked, contained: dict[str, Any], runner: str
) -> None:
    # A shutdown hook starts the cleanup, and a Ctrl-C comes before the cleanup's task
    # has run a step: the loop's shutdown cancels that task with the interrupt as the
    # context. Red before: the cancellation, dropped so that the cleanup begins all the
    # same, was never looked at, and the whole grace ran.
    run = pytest.importorskip("uvloop").run if runner == "uvloop.run" else asyncio.run
    trees: list[trio_proctree.asyncio.ProcessTree] = []

    def shut_down_then_ctrl_c(tree: trio_proctree.asyncio.ProcessTree) -> None:
        tree.aclose().close()  # the cleanup's task is made, not yet run
        raise KeyboardInterrupt  # what Python's SIGINT handler raises

    with pytest.raises(KeyboardInterrupt):
        run(held_until_a_hook(shut_down_then_ctrl_c, trees, grace=3.0, contained=contained))
    outcome = trees[0].outcome
    assert outcome is not None
    assert outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
    assert outcome.grace_expired is False  # cut short
    assert outcome.duration < 2  # of a 3 s grace
    assert tracked.survivors() == []


# Presses Ctrl-C the moment the block's exit enters the given function of the trio driver
# (a trace hook), then reports whether the tree's cleanup ran and what is left alive.
INTERRUPTED_AS_THE_BLOCK_EXITS = procs.ALIVE_IN_A_CHILD + textwrap.dedent(
    """
    import json, signal, sys, trio
    from trio_proctree import open_process_tree

    signal.signal(signal.SIGINT, signal.default_int_handler)  # (as at a terminal)
    where, fails = sys.argv[2], sys.argv[3] == "fails"
    pressed = []

    def press_ctrl_c_on_entry(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == where and code.co_filename.endswith("_trio.py"):
            if not pressed:
                pressed.append(True)
                signal.raise_signal(signal.SIGINT)
        return None

    trees, pids = [], Pids()

    async def main():
        command = ["sh", "-c", "sleep 60 & echo $$ $!; wait"]
        async with open_process_tree(
            command, grace=0.5, stdout=-1, containment=sys.argv[1]
        ) as tree:
            trees.append(tree)
            line = b""
            while not line.endswith(b"\\n"):
                line += await tree.stdout.receive_some()
            pids.extend(int(pid) for pid in line.split())
            sys.settrace(press_ctrl_c_on_entry)
            if fails:
                raise ValueError("the block fails")

    try:
        trio.run(main)
        raised = None
    except BaseException as exc:
        raised = type(exc).__name__
    sys.settrace(None)
    print(json.dumps({
        "pressed": bool(pressed),
        "raised": raised,
        "cleaned_up": trees[0].outcome is not None,
        "alive": [pid for pid in pids if alive(pid)],
        "pids": pids,
    }))
    """
)


@pytest.mark.parametrize(
    ("where", "block"),
    [("__aexit__", "ends"), ("__aexit__", "fails"), ("_aclose_under", "fails")],
)
def test_ctrl_c_as_the_block_exits_still_stops_the_tree(
    tracked: Tracked, contained: dict[str, Any], where: str, block: str
) -> None:
    # Red before: the scope's __aexit__ and the exception path's _aclose_under were not
    # protected from KeyboardInterrupt, which trio raised right there, before cleanup
    # began: the tree ran on (until the net at interpreter exit, in a program that catches
    # the interrupt and goes on: a REPL, a service loop).
    report = json.loads(
        procs.run_python(
            INTERRUPTED_AS_THE_BLOCK_EXITS,
            contained["containment"],
            where,
            block,
            env=contained["env"],
        )
    )
    assert report["pressed"]
    assert len(report["pids"]) == 2  # the shell and its sleep
    assert report["cleaned_up"]
    assert report["alive"] == []
    assert report["raised"] == "KeyboardInterrupt"  # kept, and raised once the tree is gone
    assert tracked.survivors() == []


def test_an_anyio_task_group_around_a_failing_block_keeps_every_exception(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red when a cancellation absorbed in the cleanup was delivered again later: it came
    # back carrying the task group's own cancel-scope message at the group's exit, and
    # the group took it for its own and swallowed both exceptions.
    anyio = pytest.importorskip("anyio")

    async def fail_soon() -> None:
        await anyio.sleep(0.1)
        raise ValueError("child failed")

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(fail_soon)
            async with failing_once_ready(contained):
                pass

    with pytest.raises(BaseExceptionGroup) as raised:
        anyio.run(main, backend="asyncio")
    kinds = sorted(type(exc).__name__ for exc in raised.value.exceptions)
    assert kinds == ["Flaky", "ValueError"]
    assert tracked.survivors() == []


# Ends a block with an error while its tree ignores SIGTERM (a 0.5 s grace), a Ctrl-C
# coming in that grace; handles the error and waits on.
CTRL_C_WHILE_AN_EXCEPTION_LEAVES = (
    procs.ALIVE_IN_A_CHILD
    + CTRL_C_IN_THE_GRACE
    + textwrap.dedent(
        """
    import asyncio, json, sys
    from trio_proctree.asyncio import open_process_tree

    class Flaky(Exception):
        pass

    threading.Thread(target=press_ctrl_c, args=(1,), daemon=True).start()
    report, pids = {"ran_on": False}, Pids()

    async def main():
        command = ["sh", "-c", "trap '' TERM; echo $$; sleep 60"]
        try:
            async with open_process_tree(
                command, grace=0.5, stdout=-1, containment=sys.argv[1]
            ) as tree:
                pids.append(int(await tree.stdout.readline()))
                raise Flaky
        except Flaky:
            report["seen"] = "Flaky"
        await asyncio.sleep(5)
        report["ran_on"] = True

    try:
        asyncio.run(main())
        report["interrupted"] = False
    except KeyboardInterrupt:
        report["interrupted"] = True
    report["alive"] = [pid for pid in pids if alive(pid)]
    print(json.dumps(report))
    """
    )
)


def test_an_anyio_scopes_cancellation_never_lands_in_a_shielded_scope_after_the_block(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The scope's cancellation came while the block's exception left it; the handler
    # then waits, shielded, inside that scope: anyio holds its cancellation back there,
    # and it must not come from us instead.
    anyio = pytest.importorskip("anyio")

    async def main() -> str:
        with anyio.CancelScope() as scope:
            try:
                async with failing_once_ready(contained):
                    asyncio.get_running_loop().call_later(0.05, scope.cancel)
            except Flaky:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.05)
                return "slept, shielded"
        return "cancelled"

    assert anyio.run(main, backend="asyncio") == "slept, shielded"
    assert tracked.survivors() == []


async def _fails_while_cancelled_by(
    message: str | None, contained: dict[str, Any], handled: list[str]
) -> None:
    """A block that fails while its task is cancelled (with ``message``) during its
    cleanup; the error handled, then a wait."""
    try:
        async with failing_once_ready(contained):
            task = asyncio.current_task()
            assert task is not None
            asyncio.get_running_loop().call_later(0.05, task.cancel, message)
    except Flaky:
        handled.append("Flaky")
    await asyncio.sleep(0.05)
    handled.append("slept")


def test_a_cancellation_worded_as_anyios_before_4_11_is_left_to_anyio(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # anyio before 4.11 says "Cancelled by cancel scope", since "via": either is anyio's
    # own to deliver again (ours, on an anyio task group's, let the group swallow every
    # exception in it: helper-28, with anyio 4.10).
    if sys.version_info < (3, 11):
        pytest.skip("no cancellation is delivered again before Python 3.11")
    handled: list[str] = []
    asyncio.run(_fails_while_cancelled_by("Cancelled by cancel scope 7f00d00d", contained, handled))
    assert handled == ["Flaky", "slept"]
    assert tracked.survivors() == []


def test_a_cancellation_requested_before_the_block_failed_is_not_delivered_again(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Shutdown code run in ``except CancelledError:`` has a cancellation requested already:
    # a timeout of its own that expires during the cleanup, and is taken back as the
    # block's error leaves it, leaves no cancellation of this cleanup's standing. Red
    # before (helper-28): the count was compared with 0, and a stray CancelledError hit
    # the next step of the shutdown.
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is Python 3.11+")
    steps: list[str] = []

    async def worker() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            try:
                async with asyncio.timeout(None) as deadline, failing_once_ready(contained):
                    # Expires in the cleanup's 0.3 s grace, however long the setup took
                    # (a timeout of 0.05 s from the start expired in the setup under load).
                    deadline.reschedule(asyncio.get_running_loop().time() + 0.05)
            except Flaky:
                steps.append("Flaky")
            await asyncio.sleep(0.05)  # the next step of the shutdown
            steps.append("next step ran")
            raise

    async def main() -> None:
        task = asyncio.create_task(worker())
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert steps == ["Flaky", "next step ran"]
    assert tracked.survivors() == []


# Presses Ctrl-C as open_process_tree() is about to read the executable (the exec check),
# then reports whether that synchronous setup ran to its end, what trio.run raised, and
# what of the tree is left alive.
INTERRUPTED_IN_THE_SETUP = procs.ALIVE_IN_A_CHILD + textwrap.dedent(
    """
    import json, os, signal, sys, trio
    from trio_proctree import _spawn, open_process_tree

    signal.signal(signal.SIGINT, signal.default_int_handler)  # (as at a terminal)
    reading = _spawn.refusal

    def pressed_while_reading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # (Python's handler runs before this returns)
        return reading(*args, **kwargs)

    _spawn.refusal = pressed_while_reading
    set_up, pids = [], []

    async def main():
        scope = open_process_tree(["sleep", "60"], grace=0.2, containment=sys.argv[1])
        set_up.append(True)
        async with scope as tree:
            pids.append(tree.pid)
            await trio.sleep_forever()

    try:
        trio.run(main)
        raised = None
    except BaseException as exc:
        raised = type(exc).__name__
    print(json.dumps({
        "set_up": bool(set_up),
        "raised": raised,
        "alive": [pid for pid in pids if alive(pid)],
    }))
    """
)


def test_a_ctrl_c_in_the_setup_waits_for_its_end_then_interrupts(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before: trio raised the KeyboardInterrupt right inside open_process_tree()'s
    # synchronous setup, which was not protected from it, and the exec check's file was
    # left for the garbage collector to close (a ResourceWarning). Protected, the setup
    # ends, and the interrupt comes at the next checkpoint, as a cancellation would.
    report = json.loads(
        procs.run_python(INTERRUPTED_IN_THE_SETUP, contained["containment"], env=tracked.env)
    )
    assert report["set_up"]
    assert report["raised"] == "KeyboardInterrupt"
    assert report["alive"] == []
    assert tracked.survivors() == []


def test_a_ctrl_c_raised_inside_the_cleanups_own_step_still_stops_the_tree_at_once(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # asyncio raises a second Ctrl-C wherever Python runs, here inside a log call of the
    # escalation machine's, as the stop signal is about to go (helper-46: 3 runs in 40
    # with real SIGINTs). Red before: the cleanup ended half done, the machine with it,
    # and the whole tree ran on after asyncio.run had raised, until interpreter exit.
    trees: list[trio_proctree.asyncio.ProcessTree] = []

    async def main() -> None:
        async with open_process_tree(SLEEPS, grace=3.0, **contained) as tree:
            trees.append(tree)

    _ctrl_c_as_the_stop_signal_goes(main)
    assert tracked.survivors() == []  # gone before asyncio.run raised
    outcome = trees[0].outcome
    assert outcome is not None
    assert outcome.signals[-1] == signal.SIGKILL
    assert outcome.duration < 2  # of a 3 s grace: the hard stop at once


def _interrupt_at_the_end_of(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, *, awaited: bool = False
) -> list[bool]:
    """Raise a KeyboardInterrupt as ``owner.name`` returns, once: where Python's SIGINT
    handler can run, in the main thread, between two lines of the library's own code.
    The list it returns says, once the interrupt was raised, whether the tree (the
    method's ``self`` or its result) was running then."""
    original = getattr(owner, name)
    raised: list[bool] = []

    def interrupt(tree: trio_proctree.asyncio.ProcessTree) -> None:
        if not raised:
            raised.append(procs.running(tree.pid))
            raise KeyboardInterrupt

    if awaited:

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            interrupt(result)
            return result

        monkeypatch.setattr(owner, name, wrapped_async)
    else:

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            interrupt(args[0])
            return result

        monkeypatch.setattr(owner, name, wrapped)
    return raised


@contextlib.contextmanager
def _loop_run_by_hand() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop the test runs by hand (a program that does not shut its loop down sees an
    interrupt as it surfaces); afterwards, what asyncio.run would do next: every task left
    cancelled and run to its end (within 10 s: more is a hang, and the test fails), the
    default executor shut down, the loop closed."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            _, pending = loop.run_until_complete(asyncio.wait(left, timeout=10))
            assert pending == set()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _ctrl_c_as_the_stop_signal_goes(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` with a Ctrl-C raised inside the cleanup's own code, in a log call of
    the escalation machine's as the stop signal is about to go (what Python's SIGINT
    handler raises, where asyncio lets it land); it must leave asyncio.run."""
    pressed: list[bool] = []

    class CtrlCInTheCleanup(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not pressed and "sending SIGTERM" in record.getMessage():
                pressed.append(True)
                raise KeyboardInterrupt

    logger = logging.getLogger("trio_proctree")
    handler, level = CtrlCInTheCleanup(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(main())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert pressed


async def _sleeping_in_a_tree(contained: dict[str, Any]) -> None:
    async with open_process_tree(SLEEPS, grace=0.3, stdout=subprocess.PIPE, **contained):
        await asyncio.sleep(60)  # pragma: no cover - the interrupt comes before


@pytest.mark.parametrize(
    ("owner", "name", "awaited"),
    [
        # In the spawn's own task, right after the fork: the tree is made, not yet the
        # block's (its streams not connected).
        (trio_proctree.asyncio.ProcessTree, "__init__", False),
        # In the entering task, once the spawn's task handed the tree over, before the
        # block has it.
        (trio_proctree.asyncio._TreeScope, "_spawn", True),
    ],
    ids=["after-the-fork", "as-the-tree-is-handed-over"],
)
def test_a_ctrl_c_while_the_tree_is_being_set_up_stops_it_before_it_is_raised(
    tracked: Tracked,
    contained: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    owner: type,
    name: str,
    awaited: bool,
) -> None:
    # asyncio raises a Ctrl-C wherever Python runs in the main thread, in the setup's own
    # code too (trio holds it back there). Red before: the tree was lost with the
    # interrupt and ran on after asyncio.run had raised, until interpreter exit. Now it is
    # held until the tree is stopped, as in the cleanup: a program that runs its loop by
    # hand, and does not shut it down, sees the interrupt once nothing of the tree runs.
    raised = _interrupt_at_the_end_of(monkeypatch, owner, name, awaited=awaited)
    with _loop_run_by_hand() as loop:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(_sleeping_in_a_tree(contained))
        assert raised == [True]
        assert tracked.survivors() == []
    # Stopped once, quietly: its pipe ends closed once (a second close hits a number that
    # may name another file by then), the interrupt not called a failed cleanup.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_ctrl_c_outside_every_task_while_the_worker_forks_stops_the_tree(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interrupt lands in the event loop's own code, before the fork's result reaches
    # the spawn's task: it leaves asyncio.run, whose shutdown cancels that task, which
    # waits for the fork through it and stops the tree.
    original = trio_proctree.asyncio._QueuedSpawn.run
    forked = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    def run_then_interrupt(spawn: trio_proctree.asyncio._QueuedSpawn) -> bool:
        started = original(spawn)
        forked.set()
        loops[0].call_soon_threadsafe(_raise_keyboard_interrupt)
        time.sleep(0.05)  # (the interrupt's callback is queued first all the same)
        return started

    monkeypatch.setattr(trio_proctree.asyncio._QueuedSpawn, "run", run_then_interrupt)

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        await _sleeping_in_a_tree(contained)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert forked.is_set()
    assert tracked.survivors() == []


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def test_a_ctrl_c_while_the_spawn_is_handed_to_a_worker_thread_stops_the_tree_first(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real Ctrl-C lands there most often (helper-47, ~95% of the trees still lost): a
    # new default executor's Thread.start() waits for its thread, after the spawn was
    # queued. Red before: the interrupt left before the spawn's task had anything to wait
    # for, the worker forked all the same, and nothing stopped that tree until exit.
    original = concurrent.futures.ThreadPoolExecutor._adjust_thread_count
    interrupted: list[bool] = []

    def queued_then_interrupted(executor: concurrent.futures.ThreadPoolExecutor) -> None:
        original(executor)  # (the spawn is queued, and a worker started for it)
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(
        concurrent.futures.ThreadPoolExecutor, "_adjust_thread_count", queued_then_interrupted
    )
    with _loop_run_by_hand() as loop:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(_sleeping_in_a_tree(contained))
        assert interrupted
        # Held until the tree it started is stopped, as everywhere in the setup.
        assert tracked.survivors() == []


def test_a_ctrl_c_that_loses_the_forks_result_in_the_loop_still_stops_the_tree(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interrupt can land in the loop's own callback that copies the worker's result
    # into the future the spawn's task waits on: the copy is lost, the future never done
    # (helper-47: 14 hangs in 2,668 real Ctrl-Cs). Red before: the shutdown that followed
    # waited for it for ever, the tree running all the while. The worker's own word that
    # it is done now ends that wait.
    original = asyncio.futures._copy_future_state  # type: ignore[attr-defined]
    lost: list[bool] = []

    def lost_on_the_way(source: Any, destination: Any) -> None:
        if not lost and isinstance(source, concurrent.futures.Future):
            lost.append(True)
            raise KeyboardInterrupt
        original(source, destination)

    monkeypatch.setattr(asyncio.futures, "_copy_future_state", lost_on_the_way)
    with _loop_run_by_hand() as loop:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(_sleeping_in_a_tree(contained))
        assert lost
    assert tracked.survivors() == []


def test_a_ctrl_c_inside_the_cleanup_of_a_failing_block_is_no_cleanup_failure(
    tracked: Tracked, contained: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The cleanup holds a Ctrl-C raised in its own code and raises it once the tree is
    # gone; asyncio sends it out of the loop from there. Red before: while the block's
    # own error propagated, it was also chained onto that error and logged as "cleanup
    # of ... failed while Flaky was propagating" (helper-47: 15 runs in 350).
    async def main() -> None:
        async with open_process_tree(SLEEPS, grace=3.0, **contained):
            raise Flaky

    _ctrl_c_as_the_stop_signal_goes(main)
    assert tracked.survivors() == []
    ours = [r for r in caplog.records if r.name == "trio_proctree"]
    assert [r.getMessage() for r in ours if r.levelno >= logging.ERROR] == []
    assert any("sending SIGKILL" in r.getMessage() for r in ours)  # (the hard stop at once)


def test_a_ctrl_c_in_the_callback_that_settles_a_cleanup_does_not_hang_its_waiters(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ctrl-C can land in the cleanup task's done-callback, which settles the future the
    # tree's waiters wait on (helper-47, once in 2,716 runs): the callback never ran. Red
    # before: every waiter, and so the shutdown that followed, waited for ever.
    original = trio_proctree.asyncio.ProcessTree._cleanup_done
    interrupted: list[bool] = []

    def interrupted_once(tree: Any, task: asyncio.Task[None]) -> None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        original(tree, task)

    monkeypatch.setattr(trio_proctree.asyncio.ProcessTree, "_cleanup_done", interrupted_once)
    trees: list[trio_proctree.asyncio.ProcessTree] = []

    async def main() -> None:
        async with open_process_tree(SLEEPS, grace=0.3, **contained) as tree:
            trees.append(tree)

    with _loop_run_by_hand() as loop:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
        assert interrupted
    assert tracked.survivors() == []
    assert trees[0].outcome is not None


def _broken_at_its_start() -> None:
    raise RuntimeError("initializer failed")


def test_a_spawn_the_executor_fails_without_running_raises_the_executors_error(
    tracked: Tracked,
) -> None:
    # An executor can fail (or cancel) queued work without running it: a thread
    # initializer that raises, shutdown(cancel_futures=True). Red before (helper-49): the
    # spawn's task took "not run" for "dropped", and the setup failed on a bare assert
    # (under python -O, the block ran with no tree).
    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=1, initializer=_broken_at_its_start)
        )
        async with open_process_tree(["sleep", "60"], env=tracked.env):
            pytest.fail("entered with no tree")  # pragma: no cover

    with pytest.raises(BrokenThreadPool):
        asyncio.run(main())
    assert tracked.survivors() == []


def test_a_result_taken_for_lost_is_still_retrieved_when_it_comes(
    tracked: Tracked,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The worker says it is done before the executor hands its result to the loop; a
    # worker thread descheduled in between (a loaded machine) makes the spawn's task take
    # the result for lost. Red before (helper-49): the spawn's error, raised from the
    # worker's own record, came to the loop's future later, unread, and asyncio logged
    # "Future exception was never retrieved".
    original = trio_proctree.asyncio._QueuedSpawn.run

    def late_to_hand_back(spawn: trio_proctree.asyncio._QueuedSpawn) -> bool:
        try:
            return original(spawn)
        finally:
            time.sleep(0.3)  # (past two checks for a lost result)

    monkeypatch.setattr(trio_proctree.asyncio._QueuedSpawn, "run", late_to_hand_back)
    workdir = tmp_path / "work"
    workdir.mkdir()

    async def main() -> None:
        scope = open_process_tree(["true"], cwd=workdir, env=tracked.env)
        workdir.rmdir()  # gone by the time the worker spawns: its error
        with pytest.raises(FileNotFoundError):
            async with scope:
                pytest.fail("entered with no working directory")  # pragma: no cover
        await asyncio.sleep(0.5)  # (the late result arrives meanwhile)

    asyncio.run(main())
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert tracked.survivors() == []


def test_a_ctrl_c_as_a_cancelled_spawn_stops_its_tree_is_held_until_it_is_stopped(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spawn's task, cancelled while the worker forked (a blanket "cancel every
    # task"), stops the tree it gets; a Ctrl-C landing as that stop begins (here as its
    # cleanup's loop plumbing is made) must be held like one anywhere else in the setup.
    # Red before (helper-49): it left with the tree running, until the loop's shutdown.
    forked = threading.Event()
    original_run = trio_proctree.asyncio._QueuedSpawn.run

    def slow_to_hand_back(spawn: trio_proctree.asyncio._QueuedSpawn) -> bool:
        started = original_run(spawn)
        forked.set()
        time.sleep(0.1)  # (the cancellation comes meanwhile)
        return started

    monkeypatch.setattr(trio_proctree.asyncio._QueuedSpawn, "run", slow_to_hand_back)
    original_io = trio_proctree.asyncio._AsyncioIO.__init__
    pressed: list[bool] = []

    def interrupted_once(io: Any, tree: Any) -> None:
        original_io(io, tree)
        if not pressed:
            pressed.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(trio_proctree.asyncio._AsyncioIO, "__init__", interrupted_once)

    async def main() -> None:
        entering = asyncio.get_running_loop().create_task(_sleeping_in_a_tree(contained))
        while not forked.is_set():
            await asyncio.sleep(0.005)
        cancel_every_other_task()
        await entering

    with _loop_run_by_hand() as loop:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
        assert pressed
        assert tracked.survivors() == []


# A Ctrl-C, as asyncio raises it wherever Python runs, on the first line after the reap's
# waitid: prints what was raised, the leader's status and whether the tree was cleaned up.
CTRL_C_RIGHT_AFTER_THE_REAP = textwrap.dedent(
    """
    import asyncio, inspect, json, logging, sys
    from trio_proctree import _leader
    from trio_proctree.asyncio import open_process_tree

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    source, first = inspect.getsourcelines(_leader.Leader.reap)
    waitid = first + next(i for i, line in enumerate(source) if "os.waitid(" in line)
    pressed = []

    def after_the_reap(frame, event, arg):
        def lines(frame, event, arg):
            if event == "line" and frame.f_lineno > waitid and not pressed:
                pressed.append(frame.f_lineno)
                raise KeyboardInterrupt
            return lines
        return lines if frame.f_code is _leader.Leader.reap.__code__ else None

    trees = []

    async def main():
        async with open_process_tree(["sleep", "60"], grace=0.5) as tree:
            trees.append(tree)
            sys.settrace(after_the_reap)

    try:
        asyncio.run(main())
        raised = None
    except BaseException as exc:
        raised = type(exc).__name__
    sys.settrace(None)
    print(json.dumps({"pressed": bool(pressed), "raised": raised, "status": trees[0].returncode}))
    """
)


def test_a_ctrl_c_right_after_the_leaders_reap_keeps_its_status(tracked: Tracked) -> None:
    # Red before (helper-73, once in ~60 Ctrl-Cs on 3.10, where asyncio.run lets Python
    # raise it anywhere): the reap was done but not noted, and the next look took the
    # leader for reaped by someone else: "its exit status is lost", logged as a WARNING.
    said = procs.run_python(CTRL_C_RIGHT_AFTER_THE_REAP, env=tracked.env).splitlines()
    [report] = [json.loads(line) for line in said if line.startswith("{")]
    assert report == {"pressed": True, "raised": "KeyboardInterrupt", "status": -signal.SIGTERM}
    # Nothing logged: the status, read before the reap, survived its loss (a full run of
    # the mutants found the report alone blind to the "reaped by someone else" warning).
    logged = [line for line in said if not line.startswith("{")]
    assert logged == []  # no "reaped by someone else", then or at exit
    assert tracked.survivors() == []


@pytest.mark.parametrize("next_look", ["reap", "pins_group"])
def test_a_reap_of_ours_cut_short_is_not_taken_for_someone_elses(
    caplog: pytest.LogCaptureFixture, next_look: str
) -> None:
    # The test above reaches the leader's next look through cleanup, which happens to
    # peek first; the net at interpreter exit reaps again at once. Either look must find
    # the reap cut short (by a Ctrl-C after its waitid) ours: the status kept, not "lost"
    # (which would also say its group can no longer be reached).
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 7"], os.environ)
    leader = _leader.Leader(pid, None, os.pidfd_open(pid))
    try:
        select.select([leader.pidfd], [], [])  # (exited: readable)
        source, first = inspect.getsourcelines(_leader.Leader.reap)
        waitid = first + next(i for i, line in enumerate(source) if "os.waitid(" in line)

        def after_the_waitid(frame: FrameType, event: str, arg: object) -> Any:
            def lines(frame: FrameType, event: str, arg: object) -> Any:
                if event == "line" and frame.f_lineno > waitid:
                    sys.settrace(None)
                    raise KeyboardInterrupt
                return lines

            return lines if frame.f_code is _leader.Leader.reap.__code__ else None

        sys.settrace(after_the_waitid)
        with pytest.raises(KeyboardInterrupt):
            leader.reap()
        sys.settrace(None)
        assert (leader.reaped, leader.lost) == (False, False)  # (cut short before the note)
        with caplog.at_level(logging.DEBUG, logger="trio_proctree"):
            if next_look == "reap":
                assert leader.reap() == 7
            else:
                assert not leader.pins_group
        assert (leader.reaped, leader.lost, leader.poll()) == (True, False, 7)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        sys.settrace(None)
        with contextlib.suppress(ChildProcessError):  # (by its pidfd: never another's)
            os.waitid(os.P_PIDFD, leader.pidfd, os.WEXITED)
        os.close(leader.pidfd)


# One Ctrl-C that trio holds back: it comes while the block's task waits on a worker
# thread (or, with argv[2] == "busy", runs code with no checkpoint, as trio is told to
# raise it only at one), and the block then ends. Prints what was raised and what the
# cleanup did.
CTRL_C_HELD_BACK_AS_THE_BLOCK_ENDS = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time, trio
    from trio_proctree import open_process_tree

    containment, how = sys.argv[1], sys.argv[2]
    stops_slowly = 'trap "sleep 0.2; exit 3" TERM; echo ready; while :; do sleep 0.05; done'

    def ctrl_c_while_waiting():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # (trio takes it meanwhile, and holds it for the task)

    trees = []

    async def main():
        async with open_process_tree(
            ["sh", "-c", stops_slowly], grace=5, stdout=-1, containment=containment
        ) as tree:
            trees.append(tree)
            assert await tree.stdout.receive_some() == b"ready\\n"
            if how == "thread":
                await trio.to_thread.run_sync(ctrl_c_while_waiting)
            else:
                # (Sent from another thread: Python runs the handler in this one, in
                # the loop below, where trio may not raise it.)
                threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
                deadline = time.monotonic() + 0.3
                while time.monotonic() < deadline:
                    pass  # no checkpoint

    try:
        trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)
        raised = None
    except BaseException as exc:
        raised = type(exc).__name__
    outcome = trees[0].outcome
    print(json.dumps({
        "raised": raised,
        "signals": [signal.Signals(sig).name for sig in outcome.signals],
        "status": outcome.returncode,
    }))
    """
)


@pytest.mark.parametrize("how", ["thread", "busy"])
def test_a_ctrl_c_held_back_until_the_block_ends_still_gets_the_graceful_stop(
    tracked: Tracked, contained: dict[str, Any], how: str
) -> None:
    # A first Ctrl-C gets the graceful stop; only one during cleanup cuts it short. Red
    # before (helper-74): trio held this one back until the cleanup's first wait, where
    # it was taken for one during cleanup: SIGKILL 2 ms after SIGTERM, no grace at all.
    said = procs.run_python(
        CTRL_C_HELD_BACK_AS_THE_BLOCK_ENDS, contained["containment"], how, env=tracked.env
    )
    graceful = {"raised": "KeyboardInterrupt", "signals": ["SIGTERM", "SIGCONT"], "status": 3}
    assert json.loads(said) == graceful
    assert tracked.survivors() == []
