"""Under a mock clock (pytest-trio's ``autojump_clock``), cleanup's bounds are real seconds.

trio's timeouts follow the run's clock, and ``trio.testing.MockClock`` with autojump moves
it on whenever every task waits. The processes of a tree run in real time: a grace, a
``kill_wait`` or the output drain measured on that clock ran out at once (helper-40).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trio_proctree import ProcessTree, _real_time, open_process_tree, run_process_tree
from trio_proctree._real_time import clock_is_virtual

from . import procs
from .conftest import Tracked, slow_to_die

#: Stops on SIGTERM, 50 ms of real time later.
STOPS_IN_50_MS = [
    *procs.python(),
    "-c",
    textwrap.dedent(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.05), sys.exit(0)))
        os.write(1, b"ready\\n")  # (one write: print() may make two, read apart)
        """
    )
    + procs.WAIT_FOR_SIGNALS,
]


async def test_a_grace_is_real_seconds_under_an_autojump_clock(
    tracked: Tracked, contained: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    # Red before: the grace ran out the moment cleanup waited, and the tree was SIGKILLed
    # 0.7 ms after its SIGTERM, its 50 ms of work cut short. (A grace of 30 s: one of 5 s
    # ran out once in CI, its tree starved under load, or a bound fired early: not shown.)
    async with open_process_tree(
        STOPS_IN_50_MS, grace=30.0, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        assert await tree.stdout.receive_some() == b"ready\n"
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert not tree.outcome.grace_expired
    assert tree.outcome.returncode == 0
    assert tracked.survivors() == []


async def test_a_tree_still_dying_of_sigkill_is_waited_for_under_an_autojump_clock(
    tracked: Tracked, contained: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    # Red before: kill_wait ran out at once, while the member was still freeing its
    # memory (a few ms), and cleanup raised "processes outlived SIGKILL".
    async with open_process_tree(
        slow_to_die(), stop_signal=signal.SIGKILL, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        assert (await tree.stdout.receive_some()).strip().isdigit()
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGKILL,)
    assert tracked.survivors() == []


async def test_run_process_tree_returns_its_output_under_an_autojump_clock(
    tracked: Tracked, contained: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    # The README's example, which raised CleanupError now and then (helper-40).
    for _ in range(5):
        result = await run_process_tree(
            ["sh", "-c", "sleep 60 & echo hi"], capture_stdout=True, **contained
        )
        assert result.stdout == b"hi\n"
    assert tracked.survivors() == []


@pytest.mark.timeout(30)  # (red, it hung)
async def test_a_tree_that_ignores_its_stop_signal_is_killed_under_a_still_clock(
    tracked: Tracked, contained: dict[str, Any], mock_clock: trio.testing.MockClock
) -> None:
    # Red before: under a mock clock that nobody moves on, the grace never ran out, and
    # cleanup waited for ever for a tree that ignores SIGTERM.
    async with open_process_tree(
        ["sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait"],
        grace=0.2,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stdout is not None
        assert await tree.stdout.receive_some() == b"ready\n"
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
    assert tracked.survivors() == []


async def test_output_held_outside_the_tree_is_read_for_real_seconds_under_an_autojump_clock(
    tracked: Tracked, autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # Red before: the drain's bound (PIPE_DRAIN_TIMEOUT) ran out at once, and the output
    # that a process outside the tree wrote 0.1 s later was lost. (A process group's
    # escapee: the one containment that leaves one running to hold the pipe. The leader
    # ends once it has left the group, told through a FIFO.)
    left = tmp_path / "left"
    os.mkfifo(left)
    escapee = 'echo > "$0"; sleep 0.1; echo late'
    result = await run_process_tree(
        ["sh", "-c", f'setsid sh -c \'{escapee}\' "$0" & read _ < "$0"; echo early', left],
        capture_stdout=True,
        containment="group",
        env=tracked.env,
    )
    assert result.stdout == b"early\nlate\n"
    assert tracked.survivors() == []


async def test_a_cancellation_does_not_cut_cleanup_short_under_an_autojump_clock(
    tracked: Tracked, contained: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    # The caller's deadline is the mock clock's, and passes at once; cleanup's waits, in
    # real seconds there, are still shielded from it. (Set once the tree runs: the clock
    # jumps to any deadline whenever every task waits, the spawn's thread included.) The
    # grace, cut short, would end at once: a long one costs nothing, and a loaded CI
    # machine once took 5 s to let the tree's 50 ms run.
    with trio.CancelScope() as scope:
        async with open_process_tree(
            STOPS_IN_50_MS, grace=30.0, stdout=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None
            assert await tree.stdout.receive_some() == b"ready\n"
            scope.deadline = trio.current_time() + 0.01
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tree.outcome.returncode == 0  # its 50 ms of work done
    assert tracked.survivors() == []


IGNORES_TERM = ["sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait"]


@contextlib.asynccontextmanager
async def running(
    command: list[str], grace: float, trees: list[ProcessTree], tracked: Tracked
) -> AsyncIterator[None]:
    """A tree of ``command`` for a block, from its "ready" on; kept in ``trees``."""
    async with open_process_tree(
        command, grace=grace, stdout=subprocess.PIPE, env=tracked.env
    ) as tree:
        trees.append(tree)
        assert tree.stdout is not None
        assert await tree.stdout.receive_some() == b"ready\n"
        yield


async def test_real_time_bounds_take_one_thread_however_many_trees_end(
    tracked: Tracked, autojump_clock: trio.testing.MockClock
) -> None:
    # Red before (helper-41): a worker thread per bound, each sleeping its whole bound
    # (the grace, the drain) however soon its wait ended: 122 threads after 100 trees,
    # and a run that could start no more broke down.
    before = threading.active_count()
    for _ in range(30):  # (each waits: its member outlives the leader)
        result = await run_process_tree(
            ["sh", "-c", "sleep 60 & echo hi"], capture_stdout=True, env=tracked.env
        )
        assert result.stdout == b"hi\n"
    assert threading.active_count() - before <= 3  # (the timer thread, trio's spawn thread)
    assert tracked.survivors() == []


def test_a_tree_in_a_generator_closed_at_the_runs_end_is_still_bounded_on_a_mock_clock(
    tracked: Tracked,
) -> None:
    # Red before (helper-41): trio closes an unfinished async generator after its system
    # nursery, where the first version's timer task could not start: the tree that
    # ignores SIGTERM was never SIGKILLed nor reaped, and ran on after trio.run returned.
    trees: list[ProcessTree] = []
    generators: list[AsyncIterator[None]] = []

    async def holding_a_tree() -> AsyncIterator[None]:
        async with running(IGNORES_TERM, 0.2, trees, tracked):
            yield

    async def main() -> None:
        generator = holding_a_tree()
        generators.append(generator)  # (kept: closed by trio as the run ends)
        await generator.__anext__()

    trio.run(main, clock=trio.testing.MockClock())
    [tree] = trees
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
    assert tree.outcome.returncode == -signal.SIGKILL
    assert tracked.survivors() == []


@pytest.mark.timeout(30)
def test_a_tree_in_a_system_task_cancelled_as_the_run_ends_is_bounded_on_a_mock_clock(
    tracked: Tracked,
) -> None:
    # Red before (helper-41): the first version's timer task, spawned into the system
    # nursery that trio had cancelled as the main task returned, never ran: the grace of
    # a tree that ignores SIGTERM never ended, and trio.run hung.
    trees: list[ProcessTree] = []

    async def worker(started: trio.Event) -> None:
        async with running(IGNORES_TERM, 0.2, trees, tracked):
            started.set()
            await trio.sleep_forever()

    async def main() -> None:
        started = trio.Event()
        trio.lowlevel.spawn_system_task(worker, started)
        await started.wait()

    trio.run(main, clock=trio.testing.MockClock())
    [tree] = trees
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tracked.survivors() == []


class HundredfoldClock(trio.abc.Clock):
    """A clock of the program's own that runs a hundred times as fast as real time."""

    def start_clock(self) -> None:
        self._started = time.monotonic()

    def current_time(self) -> float:
        return (time.monotonic() - self._started) * 100

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(deadline - self.current_time(), 0.0) / 100


def test_a_grace_is_real_seconds_under_any_clock_but_trios_own(tracked: Tracked) -> None:
    # Red before (helper-41): only trio.testing.MockClock was told from trio's own, and a
    # 2 s grace on this clock was 20 ms, the tree's 50 ms of work cut short by SIGKILL.
    trees: list[ProcessTree] = []

    async def main() -> None:
        async with running(STOPS_IN_50_MS, 2.0, trees, tracked):
            pass

    trio.run(main, clock=HundredfoldClock())
    [tree] = trees
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tree.outcome.returncode == 0
    assert tracked.survivors() == []


async def test_trios_own_clock_is_not_taken_for_a_mock_one() -> None:
    # Where it were, every cleanup would take the timer thread's way, and pay for it.
    assert not clock_is_virtual()


BOUNDED_IN_A_FORKED_CHILD = textwrap.dedent(
    """
    import os, signal, sys, trio, trio.testing
    from trio_proctree import open_process_tree

    async def a_tree():
        command = ["sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait"]
        async with open_process_tree(command, grace=0.2, stdout=-1) as tree:
            await tree.stdout.receive_some()
        return tree.outcome.signals[-1] == signal.SIGKILL

    assert trio.run(a_tree, clock=trio.testing.MockClock())  # (the timer thread starts)
    child = os.fork()
    if child == 0:  # (only the forking thread goes on here: no timer thread)
        signal.alarm(20)  # (red, it hung)
        os._exit(0 if trio.run(a_tree, clock=trio.testing.MockClock()) else 1)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_gets_its_own_timer_thread(tracked: Tracked) -> None:
    # A forked child has no timer thread, only the record of its parent's: its bounds
    # would never end, and a grace under a still mock clock would run for ever.
    assert procs.run_python(BOUNDED_IN_A_FORKED_CHILD, env=tracked.env) == "0\n"
    assert tracked.survivors() == []


@pytest.mark.timeout(30)  # (red, it hung)
async def test_a_bound_of_centuries_leaves_the_timer_thread_at_work(
    tracked: Tracked, autojump_clock: trio.testing.MockClock
) -> None:
    # Red before (helper-42): a grace of 1e10 s (accepted: only inf is refused) made the
    # timer thread's wait overflow, and the thread died, leaving every later bound unended:
    # the next tree's grace never ran out.
    trees: list[ProcessTree] = []
    async with running(STOPS_IN_50_MS, 1e10, trees, tracked):
        pass  # (its 50 ms to stop: the long bound waits at the head meanwhile)
    async with running(IGNORES_TERM, 0.2, trees, tracked):
        pass
    assert [tree.outcome.returncode for tree in trees if tree.outcome] == [0, -signal.SIGKILL]
    assert tracked.survivors() == []


def test_the_timer_thread_ends_with_no_bound_left_and_starts_again(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread left for good makes every later os.fork() warn on Python 3.12+ (helper-42):
    # it ends after a while with no bound, as trio's own worker threads do.
    monkeypatch.setattr(_real_time._Timers, "IDLE", 0.1)
    trees: list[ProcessTree] = []

    async def a_tree() -> None:
        async with running(IGNORES_TERM, 0.2, trees, tracked):
            pass

    for _ in range(2):  # (the second starts it again)
        trio.run(a_tree, clock=trio.testing.MockClock())
        [timer] = [t for t in threading.enumerate() if t.name == "trio_proctree real-time bounds"]
        timer.join(15)  # (one waiting from before the patch waits its 10 s out)
        assert not timer.is_alive()
    assert [tree.outcome.returncode for tree in trees if tree.outcome] == [-signal.SIGKILL] * 2
    assert tracked.survivors() == []
