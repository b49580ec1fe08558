"""The asyncio close path under cancellation: one test per clause of the contract.

Each test names the mutant it exists to kill. They run under plain ``asyncio.run`` and
under ``anyio.run(backend="asyncio")`` (the ``run`` fixture), with real processes.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import inspect
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import pytest

from trio_proctree import Escalation
from trio_proctree.asyncio import ProcessTree, open_process_tree

from . import procs
from .conftest import Tracked
from .test_cleanup_errors import (
    IGNORES_TERM_WITH_A_MEMBER,
    FrozenJobFailed,
    fail_first_stop_signal,
    fail_hard_stops,
    let_the_hard_stop_work,
)
from .test_containment import available
from .test_teardown_paths import SAYS_EOF_AND_RUNS_ON

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup

# Ignores SIGTERM, so cleanup sits out the whole grace and needs SIGKILL.
IGNORES_TERM = ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]


class StepSeen(logging.Handler):
    """Sets an asyncio event when cleanup logs a step: cleanup has really started."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.count = 0
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.count += 1
            self.event.set()


async def started_tree(
    tracked: Tracked, contained: dict[str, Any], grace: float
) -> tuple[Any, ProcessTree]:
    scope = open_process_tree(IGNORES_TERM, grace=grace, stdout=subprocess.PIPE, **contained)
    tree = await scope.__aenter__()
    assert tree.stdout is not None
    assert await tree.stdout.readline() == b"ready\n"
    return scope, tree


@pytest.fixture
def steps() -> Any:
    """Counts the escalations started (each logs "sending SIGTERM" once)."""
    seen = StepSeen("sending SIGTERM")
    logger = logging.getLogger("trio_proctree")
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.DEBUG)
    yield seen
    logger.removeHandler(seen)
    logger.setLevel(level)


def test_one_cleanup_round_under_a_cancel_storm(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], steps: StepSeen
) -> None:
    # Mutant: waiting on the cleanup directly instead of via its own task.
    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.5)
        closer = asyncio.get_running_loop().create_task(tree.aclose())
        await steps.event.wait()  # the cleanup has really started (not merely scheduled)
        cancels = 0
        while not closer.done():
            closer.cancel()
            cancels += 1
            await asyncio.sleep(0.02)
        with pytest.raises(asyncio.CancelledError):
            await closer
        assert cancels >= 5  # the storm really hit the close, not an idle task (~25 when idle)
        assert steps.count == 1  # one escalation: never restarted
        outcome = tree.outcome
        assert outcome is not None
        assert outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
        assert outcome.duration < 0.5 + 2.0  # one grace period and the kill, not rounds of them
        await scope.__aexit__(None, None, None)

    run(main)
    assert tracked.survivors() == []


@pytest.mark.parametrize("closed_by", ["aclose", "the-block-ending"])
def test_no_hot_spin_when_an_anyio_scope_cancels_the_close(
    tracked: Tracked, contained: dict[str, Any], closed_by: str
) -> None:
    # Mutant: removing the anyio shield around the wait loop. Both ways a cleanup waits:
    # aclose(), and the block's end under the cancelled scope (its exit's own wait).
    anyio = pytest.importorskip("anyio")

    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=1.5)
        cpu = time.process_time()
        with anyio.move_on_after(0.05):  # cancelled a moment into the 1.5 s grace
            if closed_by == "aclose":
                await tree.aclose()
            else:
                try:
                    await anyio.sleep_forever()
                except BaseException as exc:  # the scope's cancellation, as the block ends
                    await scope.__aexit__(type(exc), exc, exc.__traceback__)
                    raise
        cpu = time.process_time() - cpu
        if closed_by == "aclose":
            await scope.__aexit__(None, None, None)
        # A spin would go round thousands of times and burn a core for the 1.5 s.
        assert tree._rounds.count <= 3, tree._rounds.count
        assert cpu < 0.5
        assert tree.outcome is not None
        assert tree.outcome.grace_expired

    anyio.run(main, backend="asyncio")
    assert tracked.survivors() == []


def test_cancellation_wins_over_a_cleanup_error(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], steps: StepSeen
) -> None:
    # Mutant: re-raising the cleanup error before the recorded cancellation.
    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        seen: list[BaseException] = []

        async def close() -> None:
            try:
                await tree.aclose()
            except BaseException as exc:  # what the caller of aclose() gets
                seen.append(exc)
                raise

        closer = asyncio.get_running_loop().create_task(close())
        await steps.event.wait()  # the closer is waiting for a cleanup that has started
        closer.cancel()
        with pytest.raises(asyncio.CancelledError) as awaited:
            await closer
        [caught] = seen
        assert isinstance(caught, asyncio.CancelledError)
        assert caught.__cause__ is injected
        # What a task awaiting the cancelled one gets (README): on 3.10, asyncio's new
        # CancelledError, the one that carries the cause as its context.
        assert (
            awaited.value if sys.version_info >= (3, 11) else awaited.value.__context__
        ) is caught
        await scope.__aexit__(None, None, None)

    run(main)
    assert tracked.survivors() == []


def test_a_frozen_exception_of_the_users_is_kept_when_cleanup_fails(
    run: Callable[..., Any], tracked: Tracked, caplog: pytest.LogCaptureFixture
) -> None:
    # Red before (helper-96): the cleanup error set as its cause through the class's
    # __setattr__, a frozen dataclass raised FrozenInstanceError in its place.
    mine = FrozenJobFailed(7)

    async def main() -> None:
        with pytest.raises(FrozenJobFailed) as caught:
            async with open_process_tree(
                IGNORES_TERM, grace=0.2, stdout=subprocess.PIPE, env=tracked.env
            ) as tree:
                assert tree.stdout is not None
                assert await tree.stdout.readline() == b"ready\n"
                injected = fail_first_stop_signal(tree)
                raise mine
        assert caught.value is mine
        assert mine.__cause__ is injected

    run(main)
    assert any(r.exc_info and r.exc_info[1] is mine.__cause__ for r in caplog.records)
    assert tracked.survivors() == []


def test_a_later_closer_of_a_tree_that_outlived_cleanup_is_told_by_its_outcome(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As under trio (test_cleanup_errors): one call raises the CleanupError, the others
    # nothing of it; `outcome` tells them.
    async def main() -> list[BaseException | None]:
        async with open_process_tree(
            IGNORES_TERM_WITH_A_MEMBER,
            escalation=Escalation(steps=[(signal.SIGTERM, 0.2)], kill_wait=0.2),
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            assert await asyncio.wait_for(tree.stdout.readline(), 10) == b"ready\n"
            fail_hard_stops(tree)
            results = list(
                await asyncio.gather(tree.aclose(), tree.aclose(), return_exceptions=True)
            )
            await tree.aclose()  # (a later call: it must not raise)
            results.append(None)
        let_the_hard_stop_work(tree)
        procs.kill_survivors(tracked.token)  # (what the hard stop left: ours, by token)
        assert tree.outcome is not None
        assert tree.outcome.emptied is False
        return results

    results = run(main)
    assert sorted(type(result).__name__ for result in results) == [
        "CleanupError",
        "NoneType",
        "NoneType",
    ]
    assert tracked.survivors() == []


def test_a_timeout_still_becomes_timeout_error_despite_a_cleanup_error(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Mutant: re-raising the cleanup error first (wait_for would pass the PermissionError on).
    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        # asyncio.TimeoutError: on Python 3.10 it is not yet the builtin TimeoutError.
        with pytest.raises(asyncio.TimeoutError) as caught:
            await asyncio.wait_for(tree.aclose(), 0.05)
        assert isinstance(caught.value.__cause__, asyncio.CancelledError)
        if sys.version_info >= (3, 11):
            assert caught.value.__cause__.__cause__ is injected
        # (3.10's Task re-creates the CancelledError it passes on, without the __cause__;
        # the log still has the cleanup error.)
        assert any(r.exc_info and r.exc_info[1] is injected for r in caplog.records)
        await scope.__aexit__(None, None, None)

    run(main)
    assert tracked.survivors() == []


def test_asyncio_timeout_converts_despite_a_cleanup_error(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is Python 3.11+")

    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        with pytest.raises(TimeoutError) as caught:
            async with asyncio.timeout(0.05):
                await tree.aclose()
        assert caught.value.__cause__ is not None
        assert caught.value.__cause__.__cause__ is injected
        await scope.__aexit__(None, None, None)

    run(main)
    assert tracked.survivors() == []


def test_without_cancellation_the_caller_gets_the_cleanup_error_itself(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Mutant: dropping the final cleanup_task.result() (the error would be lost).
    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        with pytest.raises(PermissionError) as caught:
            await tree.aclose()
        assert caught.value is injected
        await scope.__aexit__(None, None, None)  # idempotent: nothing more to report

    run(main)
    assert tracked.survivors() == []


def test_a_cleanup_error_nobody_waits_for_is_logged(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # aclose() starts the cleanup when called; a caller that never awaits it leaves its
    # error to nobody: it is logged then, never lost (helper-35: a mutant that dropped
    # the log lived). A later wait still gets it.
    caplog.set_level(logging.ERROR, logger="trio_proctree")

    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        tree.aclose().close()  # (started, and never awaited)
        cleanup = tree._cleanup
        assert cleanup is not None
        await asyncio.wait([cleanup])
        await asyncio.sleep(0)  # (its done-callback runs next)
        logged = [r for r in caplog.records if r.getMessage().endswith(": cleanup failed")]
        assert [r.exc_info[1] for r in logged if r.exc_info] == [injected]
        with pytest.raises(PermissionError) as caught:
            await scope.__aexit__(None, None, None)
        assert caught.value is injected

    run(main)
    assert tracked.survivors() == []


def test_close_path_reports_nothing_to_the_loop_and_builds_no_shield(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Mutant: swapping asyncio.wait back to asyncio.shield. Python 3.14's shield reports
    # "exception in shielded future" to the loop; 3.10-3.13 do not, so the spy is what
    # makes this test fail on the interpreters CI has.
    def no_shield(*args: object, **kwargs: object) -> None:
        raise AssertionError("the close path must not build a shielded future")

    monkeypatch.setattr(asyncio, "shield", no_shield)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        loop.call_soon(lambda: 1 / 0)  # control: the handler does hear the loop
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(reported) == 1
        reported.clear()

        scope, tree = await started_tree(tracked, contained, grace=0.2)
        fail_first_stop_signal(tree)
        closer = loop.create_task(tree.aclose())
        await asyncio.sleep(0)
        closer.cancel()  # the outer await is cancelled, then the cleanup fails
        with pytest.raises(asyncio.CancelledError):
            await closer
        await scope.__aexit__(None, None, None)
        del closer
        gc.collect()  # a never-retrieved task exception is reported when collected
        await asyncio.sleep(0.05)
        assert reported == []

    run(main)
    assert tracked.survivors() == []


def test_cancel_before_the_first_step_still_reaps_the_tree(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Mutant: making aclose a coroutine function that starts the cleanup lazily.
    async def main() -> None:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            task = asyncio.get_running_loop().create_task(tree.aclose())
            task.cancel()  # before it ever runs
            with pytest.raises(asyncio.CancelledError):
                await task
            # Watch, without starting anything: the cleanup runs while the loop does.
            for _ in range(500):
                if tree.outcome is not None:
                    break
                await asyncio.sleep(0.01)
            assert tree.outcome is not None
            assert procs.reaped(tree.pid)  # reaped

    run(main)
    assert tracked.survivors() == []


async def held_until_a_hook(
    hook: Callable[[ProcessTree], None],
    trees: list[ProcessTree],
    *,
    grace: float,
    contained: dict[str, Any],
) -> None:
    """Hold a tree that ignores SIGTERM (added to ``trees``) with its scope never exited,
    and call ``hook(tree)`` from the loop, as a program's signal handler would be: what
    ends the tree, and the run, is the hook's."""
    scope = open_process_tree(IGNORES_TERM, grace=grace, stdout=subprocess.PIPE, **contained)
    tree = await scope.__aenter__()
    trees.append(tree)
    assert tree.stdout is not None
    assert await tree.stdout.readline() == b"ready\n"
    asyncio.get_running_loop().call_soon(hook, tree)
    await asyncio.sleep(60)


def test_a_cleanup_nobody_awaits_is_finished_by_the_loops_shutdown(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A program's shutdown hook starts the cleanup (aclose(), dropped) and stops the loop;
    # nothing awaits the cleanup. Red before: asyncio.run's shutdown cancelled the cleanup's
    # task before its first step, and the task started in its place came after the
    # shutdown took its list of tasks to wait for: abandoned when the loop closed, it left
    # the tree running ("Task was destroyed but it is pending"), outcome None.
    trees: list[ProcessTree] = []

    def shut_down(tree: ProcessTree) -> None:  # as a SIGTERM handler of the program's might
        tree.aclose().close()  # the cleanup starts at the call
        asyncio.get_running_loop().stop()

    with pytest.raises(RuntimeError, match="Event loop stopped before Future completed"):
        asyncio.run(held_until_a_hook(shut_down, trees, grace=0.2, contained=contained))
    outcome = trees[0].outcome
    assert outcome is not None
    assert outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
    assert procs.reaped(trees[0].pid)
    assert tracked.survivors() == []


def test_the_cleanups_task_shows_where_it_is(tracked: Tracked, contained: dict[str, Any]) -> None:
    # Its coroutine is wrapped (so that it begins even if cancelled first): the task must
    # still show the cleanup's own code and stack, as asyncio's debugging aids read them.
    async def main() -> None:
        _, tree = await started_tree(tracked, contained, grace=0.3)
        closing = tree.aclose()
        [task] = [t for t in asyncio.all_tasks() if "TreeCore.cleanup" in repr(t)]
        await asyncio.sleep(0.05)  # into its grace
        assert "_core.py:" in repr(task)  # where it waits
        stack = task.get_stack()
        assert stack
        assert stack[0].f_code.co_name == "cleanup"
        await closing

    asyncio.run(main())
    assert tracked.survivors() == []


def test_task_group_aborting_right_after_scheduling_the_close(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A sibling's failure cancels the close task just after its cleanup began: the
    # cleanup runs to its end on its own, while the block is still open (red with the
    # close task running the cleanup itself: cut short, it left a closed pidfd behind).
    # (The sibling cannot fail before the close task's first step: the task group aborts
    # from a callback that runs after that step. The other test above covers that case.)
    if sys.version_info < (3, 11):
        pytest.skip("TaskGroup is Python 3.11+")

    async def fail() -> None:
        raise KeyError("sibling")

    async def main() -> None:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            with pytest.raises(ExceptionGroup) as raised:
                async with asyncio.TaskGroup() as group:
                    group.create_task(tree.aclose())
                    group.create_task(fail())
            assert raised.group_contains(KeyError, match="sibling")
            # Watch, without starting anything: the cleanup runs while the loop does.
            for _ in range(500):
                if tree.outcome is not None:
                    break
                await asyncio.sleep(0.01)
            assert tree.outcome is not None
            assert procs.reaped(tree.pid)  # reaped

    asyncio.run(main())
    assert tracked.survivors() == []


def test_callers_timeout_does_not_cut_the_cleanup_short(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.3)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tree.aclose(), 0.05)
        # It returned only once the tree was gone: after the whole grace, not 0.05 s. (Less
        # a hundredth: uvloop's clock counts whole milliseconds, and 0.36 - 0.06 < 0.3 in
        # floating point; seen once in CI.)
        assert loop.time() - began >= 0.29
        assert tracked.survivors() == []
        assert tree.outcome is not None
        assert tree.outcome.grace_expired
        await scope.__aexit__(None, None, None)

    run(main)


def run_script(
    code: str, containment: str, tracked: Tracked, *args: str, before: Sequence[str] = ()
) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` (given ``containment`` and ``args`` as its arguments) in a Python like
    this one, behind the command ``before`` if any, once that containment is known to be
    available here; what it did, exit status and output."""
    if containment != "group":
        available(containment)
    return subprocess.run(
        [*before, *procs.python(), "-c", code, containment, *args],
        capture_output=True,
        env=tracked.env,
        timeout=30,
        check=False,
    )


EXIT_NET = textwrap.dedent(
    """
    import atexit, os, sys, time

    def state(pid):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            return None
        return data[data.rindex(b")") + 2:].split()[0].decode()

    def report():
        # Registered before trio_proctree is imported, so it runs after its exit hook.
        deadline = time.monotonic() + 1
        while state(member) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.01)
        print(f"{leader} {member} leader={state(leader)} member={state(member)}", flush=True)

    atexit.register(report)

    import asyncio, subprocess
    from trio_proctree.asyncio import open_process_tree

    async def hold(started):
        # The member says its pid once it runs. Behind a prefix (as another user, say),
        # the leader exits once it has started it, which is then ours (as a subreaper's).
        prefix = (sys.argv[2:] or [""])[0]
        member = prefix + "sh -c 'echo $$; exec sleep 60 2>/dev/null'"
        async with open_process_tree(
            ["sh", "-c", member + (" &" if prefix else " & wait")], stdout=subprocess.PIPE,
            containment=sys.argv[1],
        ) as tree:
            pids = (tree.pid, int(await tree.stdout.readline()))
            if prefix:
                await tree.wait()
            started.set_result(pids)
            await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    started = loop.create_future()
    loop.create_task(hold(started))
    leader, member = loop.run_until_complete(started)
    # The interpreter now exits with the tree open: no cleanup ever ran.
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_trees_open_at_interpreter_exit_are_killed_and_reaped(
    tracked: Tracked, containment: str
) -> None:
    # Mutant: dropping the atexit hook (then only the watchdog kills, unreaped, later).
    result = run_script(EXIT_NET, containment, tracked)
    assert b"leader=None member=" in result.stdout, result
    member_state = result.stdout.split(b"member=")[1].strip()
    assert member_state in (b"None", b"Z"), result
    assert tracked.survivors() == []


EVERY_TREE_KILLED_BEFORE_ANY_WAIT = textwrap.dedent(
    """
    import asyncio, os, signal, subprocess, sys
    from trio_proctree import _leader
    from trio_proctree._procfs import read_stat
    from trio_proctree.asyncio import open_process_tree

    def killed(pid):
        # Dead, dying, or with a SIGKILL it has yet to take.
        stat = read_stat(pid)
        if stat is None or not stat.main_thread_alive or stat.exiting:
            return True
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status)
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
        return bool(pending & 1 << (signal.SIGKILL - 1))

    leaders = []
    reap_within = _leader.Leader.reap_within

    def spied(self, timeout):
        # At the exit net's first wait, which of the trees have had their SIGKILL?
        if not hasattr(spied, "seen"):
            spied.seen = [killed(pid) for pid in leaders]
            print(*spied.seen, flush=True)
        return reap_within(self, timeout)

    _leader.Leader.reap_within = spied

    async def hold(started):
        async with open_process_tree(["sleep", "60"], containment=sys.argv[1]) as tree:
            leaders.append(tree.pid)
            started.set_result(None)
            await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    tasks = []  # (held: a task the program drops is collected, and its tree stopped)
    for _ in range(3):
        started = loop.create_future()
        tasks.append(loop.create_task(hold(started)))
        loop.run_until_complete(started)
    # The interpreter now exits with three trees open: no cleanup ever ran.
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_every_tree_open_at_interpreter_exit_is_killed_before_any_is_waited_for(
    tracked: Tracked, containment: str
) -> None:
    # The net kills them all, then reaps: N leaders slow to die (in D state, say) cost
    # one kill_wait at exit, not N. Red before: kill one, wait for it, then the next.
    result = run_script(EVERY_TREE_KILLED_BEFORE_ANY_WAIT, containment, tracked)
    assert result.returncode == 0, result
    assert result.stdout.split() == [b"True"] * 3, result
    assert tracked.survivors() == []


CUT_OFF_BY_THE_LOOPS_CLOSE = textwrap.dedent(
    """
    import asyncio, subprocess, sys
    from trio_proctree.asyncio import open_process_tree

    async def hold(ready):
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"], grace=5.0,
            stdout=subprocess.PIPE, containment=sys.argv[1],
        ) as tree:
            await tree.stdout.readline()
            ready.set_result(tree.pid)
            await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    ready = loop.create_future()
    task = loop.create_task(hold(ready))
    print(loop.run_until_complete(ready), flush=True)
    task.cancel()  # the block's exit: its cleanup waits out the grace
    loop.run_until_complete(asyncio.sleep(0.1))
    # As asyncio.run's shutdown does when a second Ctrl-C cuts it short: the loop closes
    # with the cleanup pending. The interpreter then exits: the net at exit kills and
    # reaps the tree, and the cleanup's coroutine is finalised after it, with no loop.
    loop.close()
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_a_cleanup_cut_off_by_its_loops_close_ends_quietly(
    tracked: Tracked, containment: str
) -> None:
    # Red before: the finalised cleanup's last steps asked for the running loop, and
    # Python printed "Exception ignored in ... RuntimeError: no running event loop".
    result = run_script(CUT_OFF_BY_THE_LOOPS_CLOSE, containment, tracked)
    leader = int(result.stdout)
    assert result.returncode == 0, result
    assert b"Task was destroyed but it is pending" in result.stderr  # (asyncio's own word)
    assert b"Exception ignored" not in result.stderr, result.stderr.decode()
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    assert procs.state(leader) is None  # reaped
    assert tracked.survivors() == []


@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
def test_a_tree_open_at_interpreter_exit_with_a_member_it_may_not_signal_is_still_reaped(
    tracked: Tracked, containment: str
) -> None:
    # Run by a Python without CAP_KILL, the tree's member is nobody's (a setuid program,
    # say), and, its leader exited, ours: the hard stop at exit is refused for it (a
    # cgroup's kills it all the same). The leader must still be reaped, not left a zombie
    # for init (red before: the refusal skipped the reap).
    if not shutil.which("setpriv"):  # pragma: no cover
        pytest.skip("needs setpriv, to give up CAP_KILL and to become nobody")
    as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    result = run_script(EXIT_NET, containment, tracked, as_nobody, before=procs.WITHOUT_CAP_KILL)
    member = int(result.stdout.split()[1])  # (the leader's pid comes first)
    try:
        assert b"leader=None member=" in result.stdout, result
        member_state = result.stdout.split(b"member=")[1].strip()
        if containment == "cgroup":
            assert member_state in (b"None", b"Z"), result
        else:  # nothing could stop it: nobody's, and no cgroup
            assert member_state == b"S", result
    finally:
        procs.kill_ours(member, tracked.token)  # started by this test; we may (CAP_KILL)
    procs.wait_exited(member, within=1.0)
    assert tracked.survivors() == []


def test_close_stdin_step_says_stdin_stayed_open_where_the_program_holds_it(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As under trio (red before, helper-55: the outcome said stdin was closed).
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=0.3)

    async def main() -> None:
        async with open_process_tree(
            ["cat"], escalation=policy, stdin=subprocess.PIPE, **contained
        ) as tree:
            kept, tree.stdin = tree.stdin, None
        assert kept is not None
        try:
            outcome = tree.outcome
            assert outcome is not None
            assert not outcome.stdin_closed
            assert outcome.signals == (signal.SIGTERM, signal.SIGCONT)
        finally:
            kept.close()

    async def bounded() -> None:
        await asyncio.wait_for(main(), 10)

    run(bounded)
    assert tracked.survivors() == []


def test_close_stdin_step_waits_for_a_task_of_the_program_feeding_the_stdin(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As under trio (red when the step was skipped for a stdin held open: helper-57).
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=5.0)

    async def feed(stdin: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.3)  # (the block has ended by now: cleanup's step waits)
        stdin.write(b"the rest\n")
        await stdin.drain()
        stdin.close()

    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "cat >/dev/null; exit 0"],
            escalation=policy,
            stdin=subprocess.PIPE,
            **contained,
        ) as tree:
            stdin, tree.stdin = tree.stdin, None
            assert stdin is not None
            feeder = asyncio.get_running_loop().create_task(feed(stdin))
        await feeder
        outcome = tree.outcome
        assert outcome is not None
        assert outcome.signals == ()
        assert outcome.stdin_closed
        assert outcome.returncode == 0

    async def bounded() -> None:
        await asyncio.wait_for(main(), 10)

    run(bounded)
    assert tracked.survivors() == []


def test_close_stdin_step_waits_when_the_program_closed_the_stdin_it_took(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=5.0)

    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "cat >/dev/null; exec sleep 0.5"],  # (ends 0.5 s after its EOF)
            escalation=policy,
            stdin=subprocess.PIPE,
            **contained,
        ) as tree:
            kept, tree.stdin = tree.stdin, None
            assert kept is not None
            kept.close()
        outcome = tree.outcome
        assert outcome is not None
        assert outcome.stdin_closed
        assert outcome.signals == ()
        assert outcome.returncode == 0

    async def bounded() -> None:
        await asyncio.wait_for(main(), 10)

    run(bounded)
    assert tracked.survivors() == []


def test_unread_stdin_does_not_hold_up_the_cleanup(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The tree never reads its stdin; a megabyte waits in our buffer. Closing stdin (a
    # step of the policy here) must not wait for that buffer to drain.
    policy = Escalation(steps=[(signal.SIGTERM, 0.2)], close_stdin=0.2)

    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "echo ready; exec sleep 60"],
            escalation=policy,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdin is not None and tree.stdout is not None
            await tree.stdout.readline()
            tree.stdin.write(b"x" * 1_000_000)  # no drain: it stays buffered
        assert tree.outcome is not None
        assert tree.outcome.stdin_closed

    async def bounded() -> None:
        await asyncio.wait_for(main(), 10)

    run(bounded)
    assert tracked.survivors() == []


def test_a_writer_draining_as_cleanup_drops_its_input_is_told_it_was_not_sent(
    run: Callable[..., Any], tracked: Tracked
) -> None:
    # A writer waiting in drain() while cleanup drops what is still buffered for the
    # tree's stdin (the tree gone). Red before (helper-95: 8 runs in 60 where the loop did
    # not see the broken pipe first): the transport's abort ended the connection with no
    # error, and drain() returned as if the input had been sent; under uvloop, whose
    # transport is no asyncio.WriteTransport, nothing was dropped at all.
    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "echo ready; exec cat"],
            grace=0.2,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
        ) as tree:
            assert tree.stdin is not None and tree.stdout is not None
            assert await tree.stdout.readline() == b"ready\n"
            # The pipe's read end, held here too: no broken pipe when the tree ends, so
            # that what drain() says comes from the drop alone, every run.
            held = os.open(f"/proc/{tree.pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
            try:
                tree.send_signal(signal.SIGSTOP)
                tree.stdin.write(b"y" * 300_000)  # more than the pipe takes: buffered
                draining = asyncio.ensure_future(tree.stdin.drain())
                await asyncio.sleep(0.01)  # (it waits: the pipe is full)
                assert not draining.done()
                await tree.aclose()
                # (Bounded: under uvloop the drop never came, and drain() waited for good.)
                with pytest.raises(BrokenPipeError, match="never sent"):
                    await asyncio.wait_for(draining, 5)
            finally:
                os.close(held)

    run(main)
    assert tracked.survivors() == []


#: A leader that exits at SIGUSR1, and waits for it with nothing holding its stdin.
EXITS_ON_USR1 = "trap 'exit 0' USR1; "
WAITS_FOR_USR1 = "while :; do sleep 5 </dev/null & wait $!; done"


def test_a_writer_draining_as_the_tree_stops_reading_is_told_what_happened(
    run: Callable[..., Any], tracked: Tracked
) -> None:
    # A writer waiting in drain() when the tree closes its stdin's reading end (here: the
    # leader, its only reader, exits). Red before: under asyncio's own loop, whose pipe
    # transport raises BrokenPipeError() with no arguments, the writer got an error that
    # said nothing at all (str() empty, no errno). uvloop says "[Errno 32] Broken pipe".
    # The leader exits on our cue, once drain() waits: exiting on its own after "read", it
    # could beat drain()'s first step, which then met a connection already lost, and
    # asyncio's ConnectionResetError (seen once under uvloop, six workers).
    async def main() -> BrokenPipeError:
        async with open_process_tree(
            ["sh", "-c", EXITS_ON_USR1 + "read line; echo read; " + WAITS_FOR_USR1],
            grace=0.2,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
        ) as tree:
            assert tree.stdin is not None and tree.stdout is not None
            tree.stdin.write(b"first\n" + b"y" * 300_000)  # more than the pipe takes
            draining = asyncio.ensure_future(tree.stdin.drain())
            assert await tree.stdout.readline() == b"read\n"
            assert not draining.done()  # (waiting: the pipe is full, and still read from)
            tree.send_signal(signal.SIGUSR1)  # (the leader, its only reader, exits)
            with pytest.raises(BrokenPipeError) as raised:
                await asyncio.wait_for(draining, 5)
            return raised.value

    error = run(main)
    assert error.errno == errno.EPIPE
    assert "stdin" in str(error) or str(error) == "[Errno 32] Broken pipe"  # (the latter: uvloop)
    assert tracked.survivors() == []


def test_a_writer_the_program_put_in_place_of_stdin_keeps_what_it_holds(
    run: Callable[..., Any], tracked: Tracked
) -> None:
    # The program's own writer, in place of the tree's stdin, feeding a pipe of its own:
    # cleanup closes it, and it still writes all it holds as its reader reads. Red before
    # (helper-98): cleanup dropped its buffer as if it were the tree's own (under uvloop
    # since c4f3a4a, under asyncio's loop before it too): 65,536 bytes of 300,000 came.
    data = b"q" * 300_000
    received = bytearray()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        into, out = os.pipe()
        pipe = open(out, "wb")  # noqa: SIM115 - the transport owns it
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), pipe
        )
        mine = asyncio.StreamWriter(transport, protocol, None, loop)
        try:
            async with open_process_tree(
                ["sleep", "60"], grace=0.2, stdin=subprocess.PIPE, env=tracked.env
            ) as tree:
                assert tree.stdin is not None
                tree.stdin.close()
                tree.stdin = mine
                mine.write(data)  # (more than the pipe takes: buffered)
            reading = asyncio.ensure_future(asyncio.to_thread(read_to_the_end, into))
            await asyncio.wait_for(mine.drain(), 5)
            mine.close()
            received.extend(await asyncio.wait_for(reading, 5))
        finally:
            os.close(into)

    run(main)
    assert len(received) == len(data)
    assert tracked.survivors() == []


def read_to_the_end(fd: int) -> bytes:
    """What the pipe's read end ``fd`` gives until its end (blocking)."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_cleanup_error_goes_before_an_anyio_scope_cancellation_that_comes_again(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (helper-100): carried on the scope's cancellation, the error was
    # swallowed with it by the move_on_after (said only in the log), where the same code
    # on anyio's trio backend raises it. anyio delivers its scope's cancellation again at
    # the next wait, as trio does: the error goes first, the cancellation after it.
    anyio = pytest.importorskip("anyio")
    seen: list[object] = []

    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.2)
        injected = fail_first_stop_signal(tree)
        with anyio.move_on_after(0.05) as cancel_scope:
            try:
                await tree.aclose()  # fails, while the scope's cancellation is pending
            except PermissionError as exc:
                seen.append(exc is injected)
            await anyio.sleep(10)  # where the scope's cancellation comes again
            seen.append("not cancelled")
        seen.append(cancel_scope.cancelled_caught)
        await scope.__aexit__(None, None, None)

    anyio.run(main, backend="asyncio")
    assert seen == [True, True]
    assert tracked.survivors() == []


def test_a_plain_cancellation_still_wins_over_a_cleanup_error_in_an_anyio_scope(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A plain asyncio cancellation (a task group's, a Ctrl-C's) comes once: taken with the
    # scope's during the cleanup, it must not give way to the cleanup error.
    anyio = pytest.importorskip("anyio")

    async def main() -> None:
        scope, tree = await started_tree(tracked, contained, grace=0.3)
        injected = fail_first_stop_signal(tree)
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.1, task.cancel)  # (after the scope's)
        with pytest.raises(asyncio.CancelledError) as caught, anyio.move_on_after(0.05):
            await tree.aclose()  # fails, while both cancellations are pending
        assert caught.value.__cause__ is injected
        await scope.__aexit__(None, None, None)

    anyio.run(main, backend="asyncio")
    assert tracked.survivors() == []


def test_an_aclose_never_awaited_still_cleans_up_and_is_a_true_coroutine(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The docstring allows dropping it: the cleanup starts when aclose() is called. And
    # what it returns is a coroutine by inspect's test, which anyio 4.0-4.13's start_soon
    # applies (a Coroutine look-alike that spared the "never awaited" warning failed it).
    async def main() -> ProcessTree:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            dropped = tree.aclose()
            assert inspect.iscoroutine(dropped)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "coroutine .* was never awaited")
                del dropped  # dropped at once, unawaited
                gc.collect()
            for _ in range(500):  # watch, without awaiting anything of the cleanup's
                if tree.outcome is not None:
                    break
                await asyncio.sleep(0.01)
            assert tree.outcome is not None
        return tree

    tree = asyncio.run(main())
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tracked.survivors() == []


def test_a_tree_whose_task_the_program_dropped_is_stopped_when_the_task_is_collected(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncio keeps only weak references to tasks: one the program does not hold is
    # collected while it waits, its coroutine closed (GeneratorExit). The tree is stopped
    # all the same, gracefully, in a task of its own. (Python reports "coroutine ignored
    # GeneratorExit" for the block's exit, which awaited that cleanup: see
    # _TreeScope._closed_from_outside; kept out of pytest's report here.)
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    async def hold(started: asyncio.Future[ProcessTree]) -> None:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            started.set_result(tree)
            await asyncio.Event().wait()  # (nothing else holds this task)

    async def main() -> ProcessTree:
        started: asyncio.Future[ProcessTree] = asyncio.get_running_loop().create_future()
        task = weakref.ref(asyncio.get_running_loop().create_task(hold(started)))  # dropped
        tree = await started
        del started
        gc.collect()
        assert task() is None  # collected (asyncio said "Task was destroyed but it is pending")
        assert tree.outcome is None  # its cleanup began, in a task of its own...
        await tree.aclose()  # ...and is waited for here
        return tree

    tree = asyncio.run(main())
    assert unraisable, "Python said nothing of the block's exit"
    # The block's exit, suspended for good once Python gave up on it, is finalised by a
    # later collection, with no loop (and said so): here, not in another test. What was
    # said holds what it was said of: let go first.
    for _ in range(5):
        unraisable.clear()
        gc.collect()
        if not unraisable:
            break
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tracked.survivors() == []


def test_a_tree_in_an_async_generator_is_stopped_before_its_aclose_returns(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # An async generator left early gets GeneratorExit from aclose(), which may await: the
    # cleanup is awaited there, as at any block's exit (not left to a task of its own, as
    # for a destroyed task's coroutine, which can await nothing).
    async def lines() -> AsyncGenerator[ProcessTree]:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            yield tree

    async def main() -> ProcessTree:
        generator = lines()
        tree = await generator.__anext__()
        await generator.aclose()
        assert tree.outcome is not None  # done, not under way
        return tree

    tree = asyncio.run(main())
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tracked.survivors() == []


class _Delegating:
    """A program's own wrapper around the block (its ``__aexit__`` a coroutine that awaits
    the block's), as a library's resource class may be."""

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    async def __aenter__(self) -> ProcessTree:
        tree: ProcessTree = await self._scope.__aenter__()
        return tree

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._scope.__aexit__(*exc_info)


#: A leader alone, that takes 0.2 s to stop once it has SIGTERM, and says when it may get it.
SLOW_TO_STOP = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(0)))\n"
    "print('ready', flush=True)\n" + procs.WAIT_FOR_SIGNALS
)


@pytest.mark.parametrize("closed_by", ["aclose", "asyncio.run"])
def test_a_wrapped_block_in_an_async_generator_is_stopped_before_its_close_returns(
    tracked: Tracked, contained: dict[str, Any], closed_by: str
) -> None:
    # Closed by aclose() in the task that iterated it, or, left open, by asyncio.run's
    # shutdown (in a task of its own, the one that iterated it finished). Red before
    # (helper-53): a coroutine between the generator and the block (a wrapper's own
    # __aexit__) was taken for a destroyed task's, and the cleanup was left to a task of
    # its own: aclose() returned at once, and asyncio.run's end cut that task off (the
    # tree SIGKILLed only at interpreter exit).
    # (It takes 0.2 s to stop: a cleanup left to its own task is cut off by the loop's end.)
    slow = [*procs.python(), "-c", SLOW_TO_STOP]
    scope = open_process_tree(slow, grace=2.0, stdout=subprocess.PIPE, **contained)

    async def lines() -> AsyncGenerator[ProcessTree]:
        async with _Delegating(scope) as tree:
            assert tree.stdout is not None
            assert await tree.stdout.readline() == b"ready\n"
            yield tree

    trees: list[ProcessTree] = []
    generators: list[AsyncGenerator[ProcessTree]] = []  # (held: asyncio.run closes it)

    async def main() -> None:
        generator = lines()
        trees.append(await generator.__anext__())
        if closed_by == "aclose":
            await generator.aclose()
            assert trees[0].outcome is not None  # done, not under way
        else:
            generators.append(generator)

    asyncio.run(main())
    [tree] = trees
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tree.outcome.returncode == 0
    assert tracked.survivors() == []


# A program driving its loop with run_until_complete: the block's task, dropped, is
# collected between two runs, after a timed-out wait() left the loop watching the
# leader's pidfd. The next tree, its pidfd maybe the same number, is waited for.
COLLECTED_BETWEEN_RUNS = textwrap.dedent(
    """
    import asyncio, gc, sys
    from trio_proctree.asyncio import open_process_tree

    async def hold(started):
        async with open_process_tree(["sleep", "60"], containment=sys.argv[1]) as tree:
            started.set_result(tree)
            await asyncio.Event().wait()

    async def peek(tree):
        try:
            await asyncio.wait_for(tree.wait(), 0.05)  # (the loop watches its pidfd)
        except asyncio.TimeoutError:
            pass

    async def next_tree():
        async with open_process_tree(["true"], containment=sys.argv[1]) as tree:
            return await asyncio.wait_for(tree.wait(), 10)

    loop = asyncio.new_event_loop()
    started = loop.create_future()
    task = loop.create_task(hold(started))
    tree = loop.run_until_complete(started)
    loop.run_until_complete(peek(tree))
    del task, started
    gc.collect()  # no loop running: the tree is killed here
    print(tree.returncode, loop.run_until_complete(next_tree()), flush=True)
    loop.close()
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_a_tree_killed_between_runs_of_its_loop_leaves_the_loop_able_to_wait_again(
    tracked: Tracked, containment: str
) -> None:
    # Red before (helper-54): the kill closed the pidfd the stopped loop still watched; the
    # next tree's pidfd took its number, and the loop, registered for it already, never
    # woke for it: the next wait() hung.
    result = run_script(COLLECTED_BETWEEN_RUNS, containment, tracked)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"-9 0\n", result
    assert tracked.survivors() == []


# The same, with the tree's cleanup under way (its grace running) when the loop stopped:
# it finishes when the loop runs again, and the tree is let go once.
CLEANUP_UNDER_WAY_BETWEEN_RUNS = textwrap.dedent(
    """
    import asyncio, gc, sys
    from trio_proctree.asyncio import open_process_tree

    released = []

    def spy_on(containment):  # (its own class's release, which calls its bases')
        release = type(containment).release
        def spy(self, *args, **kwargs):
            released.append(self)
            return release(self, *args, **kwargs)
        type(containment).release = spy

    async def hold(started):
        command = ["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"]
        async with open_process_tree(
            command, grace=0.3, containment=sys.argv[1], stdout=-1
        ) as tree:
            spy_on(tree._core.containment)
            await tree.stdout.readline()
            started.set_result(tree)
            await asyncio.Event().wait()

    async def begin(tree):
        tree.aclose().close()  # (the cleanup starts in a task of its own)
        await asyncio.sleep(0.05)

    loop = asyncio.new_event_loop()
    started = loop.create_future()
    task = loop.create_task(hold(started))
    tree = loop.run_until_complete(started)
    loop.run_until_complete(begin(tree))
    del task, started
    gc.collect()  # no loop running, the cleanup under way
    loop.run_until_complete(asyncio.sleep(1))
    print(tree.outcome.signals, tree.outcome.returncode, len(released), flush=True)
    loop.close()
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_a_cleanup_under_way_when_its_loop_stopped_finishes_there_and_lets_go_once(
    tracked: Tracked, containment: str
) -> None:
    # Red before (helper-54): the collection killed the tree and let its containment go;
    # the cleanup then ran on against it once the loop ran again, and let it go again (a
    # cgroup left for the sweep was handed back for reuse).
    result = run_script(CLEANUP_UNDER_WAY_BETWEEN_RUNS, containment, tracked)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.split()[-2:] == [b"-9", b"1"], result
    assert b"SIGTERM" in result.stdout, result  # (its own escalation, not the kill)
    assert b"killed without grace" not in result.stderr, result.stderr.decode()
    assert tracked.survivors() == []


def test_a_tree_whose_task_is_collected_in_another_thread_is_stopped_in_its_loop(
    tracked: Tracked, contained: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The collector runs in whatever thread allocates: here another one than the thread
    # running the tree's loop. The cleanup goes to that loop, graceful. Red before
    # (helper-53): "no event loop to clean up in; killed without grace" (SIGKILL).
    caplog.set_level(logging.WARNING, logger="trio_proctree")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    gc.disable()  # (collected in this thread, where the test collects, nowhere else)
    try:

        async def hold(started: asyncio.Future[ProcessTree]) -> None:
            async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
                started.set_result(tree)
                await asyncio.Event().wait()  # (nothing else holds this task)

        async def start() -> ProcessTree:
            started: asyncio.Future[ProcessTree] = loop.create_future()
            dropped.append(weakref.ref(loop.create_task(hold(started))))
            return await started

        dropped: list[weakref.ref[asyncio.Task[None]]] = []
        tree = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
        gc.collect()  # (in this thread)
        assert dropped[0]() is None
        asyncio.run_coroutine_threadsafe(tree.aclose(), loop).result(timeout=30)
    finally:
        gc.enable()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert [r.getMessage() for r in caplog.records if r.name == "trio_proctree"] == []
    assert tracked.survivors() == []


DESTROYED_WITH_NO_LOOP = textwrap.dedent(
    """
    import asyncio, gc, os, sys
    from trio_proctree._procfs import read_stat
    from trio_proctree.asyncio import open_process_tree

    def zombies():
        # Our children that died and that nothing reaped.
        found = 0
        for name in os.listdir("/proc"):
            stat = read_stat(int(name)) if name.isdigit() else None
            found += stat is not None and stat.ppid == os.getpid() and stat.state == "Z"
        return found

    async def hold(started):
        command = ["sh", "-c", "sleep 60 & exec sleep 61"]  # (a member: for a subreaper, ours)
        async with open_process_tree(command, containment=sys.argv[1]) as tree:
            started.set_result(tree.pid)
            await asyncio.Event().wait()

    async def once():  # (the watchdog started, and its socket open, for what follows)
        async with open_process_tree(["true"], containment=sys.argv[1]) as tree:
            await tree.wait()

    asyncio.run(once())
    fds = len(os.listdir("/proc/self/fd"))
    loop = asyncio.new_event_loop()
    started = loop.create_future()
    task = loop.create_task(hold(started))
    leader = loop.run_until_complete(started)
    loop.close()  # with the task pending: its tree's cleanup never began
    del task, started
    gc.collect()  # the task's coroutine is closed, with no loop to run anything in
    stat = read_stat(leader)
    print(None if stat is None else stat.state, len(os.listdir("/proc/self/fd")) - fds, zombies())
    """
)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
def test_a_tree_whose_task_is_destroyed_with_no_loop_running_is_killed_at_once(
    tracked: Tracked, containment: str
) -> None:
    # No loop can run a cleanup: the tree is killed and its leader reaped there and then,
    # as the net at interpreter exit would (the program may run on for long). Red before:
    # "Exception ignored ... RuntimeError: no running event loop", the tree left running.
    result = run_script(DESTROYED_WITH_NO_LOOP, containment, tracked)
    assert result.returncode == 0, result
    # Reaped before the program went on; and nothing of it kept: no descriptor (a pidfd, a
    # cgroup's events), no zombie of ours (a subreaper's member). Red before (helper-53):
    # the leader alone was reaped, the containment never let go.
    assert result.stdout == b"None 0 0\n", result
    assert b"Exception ignored" not in result.stderr, result.stderr.decode()
    assert tracked.survivors() == []


DESTROYED_IN_THE_SETUP = textwrap.dedent(
    """
    import asyncio, concurrent.futures, gc, os, subprocess, sys, threading, time
    from trio_proctree._procfs import read_stat
    from trio_proctree.asyncio import open_process_tree, run_process_tree

    stage = sys.argv[2]
    marks = (f"1{os.getpid()}", f"2{os.getpid()}")  # (sleep's seconds: ours alone)
    command = ["sh", "-c", f"sleep {marks[0]} & exec sleep {marks[1]}"]

    def running():  # this script's tree, alive (a zombie is not), from its first exec
        found = 0
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    line = f.read()
            except OSError:
                continue
            stat = read_stat(int(name)) if name.isdigit() else None
            alive = stat is not None and stat.state != "Z"
            found += alive and any(mark.encode() in line for mark in marks)
        return found

    forking, forked = threading.Event(), threading.Event()

    class Watched(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            def told():
                forking.set()
                try:
                    return fn(*args, **kwargs)
                finally:
                    forked.set()
            return super().submit(told)

    # (Held in its fork for 0.3 s: Popen waits for its child's exec.)
    in_its_fork = stage in ("forking", "closed_while_forking")
    held = {"preexec_fn": lambda: time.sleep(0.3)} if in_its_fork else {}

    async def enter():
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}  # (never connected)
        async with open_process_tree(command, containment=sys.argv[1], **pipes, **held):
            raise AssertionError("the block is never reached")

    async def feed():
        await run_process_tree(command, stdin=b"fed", containment=sys.argv[1])

    connecting = threading.Event()

    def never_connected(loop):  # its pipes' transports made, never said connected
        make = loop._make_read_pipe_transport

        def made(pipe, protocol, waiter=None, extra=None):
            connecting.set()
            return make(pipe, protocol, loop.create_future(), extra)

        loop._make_read_pipe_transport = made

    def close_the_connect_first(loop):  # (holding no task: the collector must meet them)
        [starting] = [t for t in asyncio.all_tasks(loop) if t.get_coro().__name__ == "_start"]
        starting.get_coro().cr_await.close()

    async def once():  # (the watchdog started, and its socket open, for what follows)
        async with open_process_tree(["true"], containment=sys.argv[1]) as tree:
            await tree.wait()

    asyncio.run(once())
    fds = len(os.listdir("/proc/self/fd"))
    executor = Watched(max_workers=1)
    gate = threading.Event()
    queued = stage in ("queued", "closed_while_queued")
    if queued:
        executor.submit(gate.wait)  # (the only worker busy: the spawn waits in the queue)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(executor)
    task = loop.create_task(feed() if stage == "run_process_tree" else enter())
    connecting_stage = stage in ("connecting", "connect_closed_first")
    if connecting_stage:
        never_connected(loop)
    if queued:
        loop.run_until_complete(asyncio.sleep(0.05))
    elif connecting_stage:
        while not connecting.is_set():
            loop.run_until_complete(asyncio.sleep(0.01))
    elif stage != "run_process_tree":
        loop.run_until_complete(asyncio.sleep(0))  # (the spawn handed to the worker)
        (forking if in_its_fork else forked).wait()  # (the loop not run since)
    else:
        while running() < 2:
            loop.run_until_complete(asyncio.sleep(0.01))
    if stage == "closed_while_queued":
        task.get_coro().close()  # (its loop open but not running, as a framework may)
        gate.set()
        executor.shutdown(wait=True)  # (the worker took the spawn up, its loop still open)
    loop.close()  # with the task pending, in the setup (or in run_process_tree's wait)
    if stage == "connect_closed_first":
        # The collector finalises a cycle's coroutines in no set order: the pipes' connect
        # closed before the spawn's task that awaits it (seen in a full run, stop 45).
        close_the_connect_first(loop)
    if stage == "forking":
        task.get_coro().close()  # (as a framework may: the worker still in its fork)
    gate.set()
    # The executor's work item holds the task (through the spawn) until its worker lets
    # it go: a spawn still queued starts now, in a loop closed.
    executor.shutdown(wait=True)
    before = running()  # (a spawn its worker took up as the loop had closed: none)
    del task

    async def collect():
        gc.collect()

    if stage == "collected_in_the_next_loop":
        asyncio.run(collect())  # (another loop runs here: still, nothing of the first)
    else:
        gc.collect()  # the task's coroutine closed (if it was not), with no loop running
    print(before, running(), len(os.listdir("/proc/self/fd")) - fds)  # (no pipe end kept)
    """
)


STAGES = [
    "queued",
    "closed_while_queued",
    "forking",
    "closed_while_forking",
    "forked",
    "collected_in_the_next_loop",
    "connecting",
    "connect_closed_first",
    "run_process_tree",
]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("containment", ["cgroup", "group"])
def test_a_task_destroyed_in_the_setup_with_no_loop_running_leaves_no_tree(
    tracked: Tracked, containment: str, stage: str
) -> None:
    # As for a task destroyed in its block (above), but before it: with its spawn queued
    # as the loop closed (the worker drops it: the task, held by the spawn, would be
    # collected only later, the tree running till then) or its coroutine closed while
    # the loop was open (dropped: no fork), closed while the worker forks
    # (its coroutine closed, or only its loop: the worker kills the tree as the fork
    # returns), or once forked, collected where no loop runs or in the next loop, or in
    # run_process_tree's wait with input fed. Red before: "no running event loop" raised
    # in the setup's handler ("Exception ignored"; in the next loop, "coroutine ignored
    # GeneratorExit"), and the tree ran on until interpreter exit. Closed while its pipes
    # connect, asyncio's own cleanup raises "Event loop is closed" in place of the
    # close's GeneratorExit (red until stop 43: "Exception ignored", seen once in CI).
    result = run_script(DESTROYED_IN_THE_SETUP, containment, tracked, stage)
    said = result.stderr.decode()
    assert result.returncode == 0, said
    before, after, fds = result.stdout.split()
    if stage in ("queued", "closed_while_queued", "forking", "closed_while_forking"):
        assert before == b"0", said
    assert (after, fds) == (b"0", b"0"), said
    assert "Exception ignored" not in said, said
    if stage not in ("queued", "closed_while_queued"):
        assert "killed without grace" in said, said
    else:  # never started: not forked and then killed (nothing to kill, nothing said)
        assert "killed without grace" not in said, said
    assert tracked.survivors() == []


def test_the_trees_streams_stay_on_it_while_cleanup_runs(
    tracked: Tracked, contained: dict[str, Any], run: Callable[..., Any]
) -> None:
    # As under trio (red before, helper-85: ``tree.stdin`` was None during the close-stdin
    # wait, an AttributeError for a task of the program's that wrote to it).
    async def main() -> tuple[bool, bool, Any]:
        async with open_process_tree(
            ["sh", "-c", SAYS_EOF_AND_RUNS_ON],
            escalation=Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=30.0),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            given = (tree.stdin, tree.stdout)
            assert tree.stdout is not None
            pid = int(await tree.stdout.readline())
            closing = asyncio.create_task(tree.aclose())  # (the tree says "eof")
            assert await tree.stdout.readline() == b"eof\n"  # (looked up each time)
            during = (tree.stdin, tree.stdout)
            os.kill(pid, signal.SIGTERM)  # (ours, by pid: the wait ends)
            await closing
        return during == given, (tree.stdin, tree.stdout) == given, tree.outcome

    during, after, outcome = run(main)
    assert during
    assert after  # (closed: as the trio driver's stay)
    assert outcome is not None and outcome.stdin_closed and outcome.signals == ()
    assert tracked.survivors() == []


def test_aclose_is_recognised_as_async_by_those_who_inspect_it(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (helper-38): a plain method (the cleanup starts at the call), aclose was
    # taken for a sync function by frameworks that choose between awaiting and calling by
    # inspecting it (Starlette's BackgroundTask): run in a worker thread, it raised "no
    # running event loop", and the tree was stopped only at the block's end.
    async def main() -> tuple[bool, bool]:
        async with open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree:
            by_inspect = inspect.iscoroutinefunction(tree.aclose)
            if sys.version_info < (3, 12):  # (inspect honours no mark before 3.12)
                by_inspect = True
            with warnings.catch_warnings():  # (deprecated in 3.14, in favour of inspect's)
                warnings.simplefilter("ignore", DeprecationWarning)
                by_asyncio = asyncio.iscoroutinefunction(tree.aclose)
            return by_inspect, by_asyncio

    assert asyncio.run(main()) == (True, True)
    assert tracked.survivors() == []


def test_a_tree_outliving_its_event_loop_is_waited_for_in_the_next(
    tracked: Tracked,
    contained: dict[str, Any],
    run: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    # A tree entered under one asyncio.run and used under the next (a fixture of a wider
    # scope than the test's loop, say). Red before (helper-24): the first loop's future
    # for the leader's exit was reused, never to be set, and wait() hung.
    # Its pipes too (red before, helper-28: their transports, the first loop's, could not
    # close: "Event loop is closed"). And under uvloop (red before, helper-56: its closed
    # loop had closed our pipe ends, its transports still open, and the cleanup's last read
    # of them raised "I/O operation on a closed pipe end").
    with warnings.catch_warnings():
        if request.node.callspec.params["run"] == "uvloop.run":
            # uvloop's loop warns, as it closes, that the tree's transports are still
            # open (they are, for the next loop; it closes our pipe ends), and they stay
            # open to asyncio's StreamWriter, which says so once collected: uvloop's own
            # transports cannot close once their loop has. Not errors of this test's.
            warnings.simplefilter("ignore", ResourceWarning)
        assert entered_in_one_loop_and_ended_in_the_next(contained, run) == (0, 0)
        # Its transports collected now, not in a later test: none says it was left open.
        gc.collect()
    assert tracked.survivors() == []


def test_a_tree_ended_in_the_next_loop_with_its_reader_paused_is_still_stopped(
    tracked: Tracked,
    contained: dict[str, Any],
    run: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    # Its stdout reader paused in the first loop (it holds more than twice its limit), the
    # tree ignoring SIGTERM, ended in the next loop: cleanup reads the output of a tree
    # that still runs 10 ms after its stop signal, but not through a transport of a loop
    # that has closed. Red before (helper-67): resuming it raised "Event loop is closed"
    # (under uvloop, "the handler is closed"), which ended the cleanup there: no SIGKILL,
    # and the tree ran on.
    script = "head -c 200000 /dev/zero; trap '' TERM; echo ready >&2; while :; do sleep 0.05; done"
    scope = open_process_tree(
        ["sh", "-c", script],
        grace=0.2,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **contained,
    )

    async def first() -> ProcessTree:
        tree = await scope.__aenter__()
        assert tree.stderr is not None
        assert await tree.stderr.readline() == b"ready\n"  # (all 200000 bytes written)
        return tree

    async def second() -> None:
        await scope.__aexit__(None, None, None)

    with warnings.catch_warnings():
        if request.node.callspec.params["run"] == "uvloop.run":
            warnings.simplefilter("ignore", ResourceWarning)  # (as in the test above)
        tree = run(first)
        run(second)
        gc.collect()
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tree.outcome.returncode == -signal.SIGKILL
    assert tracked.survivors() == []


def entered_in_one_loop_and_ended_in_the_next(
    contained: dict[str, Any], run: Callable[..., Any]
) -> tuple[int, Any]:
    """A tree with pipes, entered in one ``run`` and waited for and ended in the next: what
    wait() said, and its outcome's return code."""
    scope = open_process_tree(
        ["sh", "-c", "echo ready; sleep 0.2"],
        grace=0.5,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **contained,
    )

    async def first() -> ProcessTree:
        tree = await scope.__aenter__()
        assert tree.stdout is not None
        assert await tree.stdout.readline() == b"ready\n"
        with pytest.raises(asyncio.TimeoutError):  # (not the builtin before 3.11)
            await asyncio.wait_for(tree.wait(), 0.01)  # watched from this loop
        return tree

    tree = run(first)

    async def second() -> int:
        try:
            return await asyncio.wait_for(tree.wait(), 10)
        finally:
            await scope.__aexit__(None, None, None)

    said = run(second)
    assert tree.outcome is not None
    return said, tree.outcome.returncode


@pytest.mark.parametrize("watched_first", [False, True], ids=["fresh", "watched"])
@pytest.mark.parametrize("call", ["wait", "aclose"])
def test_a_tree_is_refused_in_another_loop_while_its_own_is_open(
    tracked: Tracked, contained: dict[str, Any], call: str, watched_first: bool
) -> None:
    # Red before (helper-43), for a tree never waited on in its own loop: wait() and
    # aclose() ran in the other loop, whose waits on the first loop's streams and futures
    # could never end; the refusal came only once wait() had been used in the first.
    own = asyncio.new_event_loop()
    scope = open_process_tree(["sleep", "60"], grace=0.5, **contained)
    tree = own.run_until_complete(scope.__aenter__())
    try:
        if watched_first:
            watching = own.create_task(tree.wait())
            own.run_until_complete(asyncio.wait({watching}, timeout=0.01))
            watching.cancel()

        async def in_another_loop() -> None:
            await getattr(tree, call)()

        with pytest.raises(RuntimeError, match="in use in another event loop, still open"):
            asyncio.run(in_another_loop())
        assert tree.outcome is None  # nothing of the cleanup ran there
    finally:
        own.run_until_complete(scope.__aexit__(None, None, None))
        own.close()
    assert tree.outcome is not None
    assert tracked.survivors() == []


@pytest.mark.parametrize("caller", ["sync code", "another thread", "another threads loop"])
def test_aclose_called_outside_the_trees_loop_cleans_up_where_it_is_run(
    tracked: Tracked, contained: dict[str, Any], caller: str
) -> None:
    # Red before (helper-46): called with no loop running (loop.run_until_complete(
    # tree.aclose()), run_coroutine_threadsafe from a plain thread), aclose() raised "no
    # running event loop" and the tree ran on; called in another thread's loop for
    # run_coroutine_threadsafe (a Jupyter kernel, a GUI loop), it started the cleanup in
    # that loop, and the wait from the tree's own never woke.
    own = asyncio.new_event_loop()
    runner = threading.Thread(target=own.run_forever)
    scope = open_process_tree(["sleep", "60"], grace=0.5, **contained)
    try:
        if caller == "sync code":
            tree = own.run_until_complete(scope.__aenter__())
            own.run_until_complete(tree.aclose())
        else:
            runner.start()
            tree = asyncio.run_coroutine_threadsafe(scope.__aenter__(), own).result(10)
            if caller == "another thread":
                asyncio.run_coroutine_threadsafe(tree.aclose(), own).result(10)
            else:

                async def in_its_own_loop() -> None:
                    closing = asyncio.run_coroutine_threadsafe(tree.aclose(), own)
                    await asyncio.wait_for(asyncio.wrap_future(closing), 10)

                asyncio.run(in_its_own_loop())
        assert tree.outcome is not None
        assert tree.outcome.signals[0] == signal.SIGTERM
    finally:
        if runner.is_alive():
            exiting = scope.__aexit__(None, None, None)
            asyncio.run_coroutine_threadsafe(exiting, own).result(10)
            own.call_soon_threadsafe(own.stop)
            runner.join(10)
        else:
            own.run_until_complete(scope.__aexit__(None, None, None))
        own.close()
    assert tracked.survivors() == []


def test_a_cleanup_cut_off_by_its_loops_close_is_refused_in_another_loop_at_once(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Its task can never run again. Red before (helper-24): aclose() in the next loop
    # waited for it through every cancellation, for ever. The net at interpreter exit
    # stops the tree (in a child process: this one's exit is the test's).
    report = procs.run_python(
        CLEANUP_CUT_OFF_BY_ITS_LOOP, contained["containment"], env=tracked.env
    )
    assert report.splitlines() == ["RuntimeError: began in an event loop that has closed since"]
    assert tracked.survivors() == []  # stopped at that process's exit


CLEANUP_CUT_OFF_BY_ITS_LOOP = textwrap.dedent(
    """
    import asyncio, sys
    from trio_proctree.asyncio import open_process_tree

    loop = asyncio.new_event_loop()

    async def begin():
        command = ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]
        scope = open_process_tree(command, grace=5, stdout=-1, containment=sys.argv[1])
        tree = await scope.__aenter__()
        await tree.stdout.readline()
        tree.aclose().close()  # the cleanup begins, in a task of this loop
        await asyncio.sleep(0.05)
        return tree

    tree = loop.run_until_complete(begin())
    loop.close()  # its tasks left pending

    async def later():
        await asyncio.wait_for(tree.aclose(), 10)

    try:
        asyncio.run(later())
    except RuntimeError as exc:
        said = "began in an event loop that has closed since"
        print("RuntimeError:", said if said in str(exc) else exc)
    """
)
