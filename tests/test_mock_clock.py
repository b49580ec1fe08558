"""Under a mock clock (pytest-trio's ``autojump_clock``), cleanup's bounds are real seconds.

trio's timeouts follow the run's clock, and ``trio.testing.MockClock`` with autojump moves
it on whenever every task waits. The processes of a tree run in real time: a grace, a
``kill_wait`` or the output drain measured on that clock ran out at once (helper-40).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import trio
import trio.testing

from trio_proctree import open_process_tree, run_process_tree

from . import procs
from .conftest import Tracked, slow_to_die

#: Stops on SIGTERM, 50 ms of real time later.
STOPS_IN_50_MS = [
    *procs.python(),
    "-c",
    textwrap.dedent(
        """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.05), sys.exit(0)))
        print("ready", flush=True)
        time.sleep(60)
        """
    ),
]


async def test_a_grace_is_real_seconds_under_an_autojump_clock(
    tracked: Tracked, contained: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    # Red before: the grace ran out the moment cleanup waited, and the tree was SIGKILLed
    # 0.7 ms after its SIGTERM, its 50 ms of work cut short.
    async with open_process_tree(
        STOPS_IN_50_MS, grace=5.0, stdout=subprocess.PIPE, **contained
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
    # jumps to any deadline whenever every task waits, the spawn's thread included.)
    with trio.CancelScope() as scope:
        async with open_process_tree(
            STOPS_IN_50_MS, grace=5.0, stdout=subprocess.PIPE, **contained
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
