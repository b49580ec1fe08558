"""The asyncio driver keeps every core guarantee, with real processes: the same tree
shapes as the trio tests, under plain asyncio and under anyio on asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import gc
import logging
import os
import random
import re
import signal
import subprocess
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import trio_proctree.asyncio
from trio_proctree.asyncio import Escalation, open_process_tree, run_process_tree

from . import procs
from .conftest import Tracked, seq, slow_to_die
from .test_bad_input import BAD_REQUESTS
from .test_containment import LEADER_IGNORES_TERM_ESCAPEE_HANDLES_IT
from .test_escalation import (
    INPUT_CASES,
    LEAVES_A_FAST_READER_OF_ITS_INPUT,
    LEAVES_A_SLOW_READER_OF_ITS_INPUT,
    LETS_A_CLI_FINISH,
    LONG_INPUT,
    SHORT_CLOSE_STDIN,
    SLOW_COUNTER,
    WAITS_FOR_THE_COUNTER,
)
from .test_run_process_tree import leaving_an_escapee_on_stdout

TWO_SLEEPS = ["sh", "-c", "sleep 60 & echo $!; sleep 61 & echo $!; wait"]


async def read_pids(reader: asyncio.StreamReader | None, count: int) -> list[int]:
    assert reader is not None
    return [int(await reader.readline()) for _ in range(count)]


async def fds_once_settled(**options: Any) -> set[int]:
    """Our open file descriptors, once a first tree has opened what stays open for good
    (the watchdog's pipe; with a pipe, uvloop's /dev/null)."""
    async with open_process_tree(["true"], stdout=subprocess.PIPE, **options):
        pass
    return procs.open_fds()


def test_asyncio_end_of_block_stops_the_whole_tree(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(
            TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree:
            members = await read_pids(tree.stdout, 2)
            assert all(procs.alive(pid) for pid in [tree.pid, *members])
        assert not any(procs.alive(pid) for pid in [tree.pid, *members])
        assert tree.outcome is not None
        assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
        assert tree.outcome.containment == contained["containment"]

    run(main)
    assert tracked.survivors() == []


def test_exception_in_block_propagates_unchanged(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    error = ValueError("the user's own error")

    async def main() -> None:
        with pytest.raises(ValueError) as caught:
            async with open_process_tree(TWO_SLEEPS, grace=0.5, **contained):
                raise error
        assert caught.value is error
        assert caught.value.__cause__ is None

    run(main)
    assert tracked.survivors() == []


def test_asyncio_cancellation_stops_the_whole_tree(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        seen: list[int] = []

        async def hold() -> None:
            async with open_process_tree(
                TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
            ) as tree:
                procs.remember(tree.pid)
                seen.extend([tree.pid, *await read_pids(tree.stdout, 2)])
                await asyncio.Event().wait()

        task = asyncio.get_running_loop().create_task(hold())
        while len(seen) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not any(procs.alive(pid) for pid in seen)

    run(main)
    assert tracked.survivors() == []


def test_asyncio_lingering_descendants_are_stopped_after_the_leader_exited(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "sleep 60 & echo $!; exit 0"],
            grace=0.5,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            [orphan] = await read_pids(tree.stdout, 1)
            assert await tree.wait() == 0
            assert procs.state(tree.pid) == "Z"  # exited, not reaped: the pgid stays pinned
            assert procs.alive(orphan)
        assert not procs.alive(orphan)
        assert procs.reaped(tree.pid)
        assert tree.outcome is not None
        assert tree.outcome.lingering_killed == 1
        assert tree.outcome.returncode == 0

    run(main)
    assert tracked.survivors() == []


def test_tree_ignoring_sigterm_is_killed_after_the_grace_with_a_warning(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; echo ready; sleep 60"],
            grace=0.3,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            await tree.stdout.readline()
        assert tree.outcome is not None
        assert tree.outcome.grace_expired
        assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT, signal.SIGKILL)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert str(tree.pid) in warnings[0]

    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    run(main)
    assert tracked.survivors() == []


@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
def test_asyncio_an_escapee_gets_the_stop_signal_while_the_leader_ignores_it(
    run: Callable[..., Any], tracked: Tracked, containment: str
) -> None:
    # As in the trio test: the escapees' stop signal is not held back until the SIGKILL
    # at the grace's end by a leader that ignores it.
    grace = 1.0

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with open_process_tree(
            LEADER_IGNORES_TERM_ESCAPEE_HANDLES_IT,
            grace=grace,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
            containment=containment,
        ) as tree:
            assert tree.stdout is not None
            pids = await read_pids(tree.stdout, 2)  # the escapee's and the leader's
            assert tree.pid in pids and len(set(pids)) == 2
            for pid in pids:
                assert procs.wait_reading(pid)  # (the escapee's trap must not miss the signal)
            started = loop.time()
            closing = asyncio.ensure_future(tree.aclose())
            said = await tree.stdout.readline()  # b"" if cleanup closed it first
            handled_after = loop.time() - started
            await closing
        assert said == b"handled\n"
        assert handled_after < grace / 2
        assert tree.outcome is not None
        assert tree.outcome.grace_expired
        assert tree.outcome.escapees_killed >= 1

    run(main)
    assert tracked.survivors() == []


def test_asyncio_cancellation_while_spawning_still_stops_the_tree(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async def enter() -> None:
            async with open_process_tree(TWO_SLEEPS, grace=0.5, **contained):
                pytest.fail("the block must not run: the task was cancelled during the spawn")

        task = asyncio.get_running_loop().create_task(enter())
        await asyncio.sleep(0)  # the spawn is now under way in a worker thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    run(main)
    started = [int(m) for m in re.findall(r"pid (\d+) \(.*\) started", caplog.text)]
    assert len(started) == 1, "the spawn did happen: the cancel arrived while it ran"
    assert procs.reaped(started[0])  # reaped
    assert tracked.survivors() == []


def test_100_random_cancellation_instants_leave_no_survivors(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> int:
        rng = random.Random(20261129)
        inside = 0
        for _ in range(100):

            async def hold() -> None:
                nonlocal inside
                async with open_process_tree(
                    ["sh", "-c", "sleep 60 & sleep 61 & wait"], grace=0.5, **contained
                ):
                    inside += 1
                    await asyncio.Event().wait()

            task = asyncio.get_running_loop().create_task(hold())
            await asyncio.sleep(rng.uniform(0, 0.030))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert tracked.survivors() == []
        return inside

    inside = run(main)
    assert 0 < inside < 100  # both sides of the spawn were hit


def test_reading_returncode_never_reaps_and_send_signal_reaches_all(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(
            TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree:
            members = await read_pids(tree.stdout, 2)
            assert tree.returncode is None
            tree.send_signal(signal.SIGUSR1)
            assert await tree.wait() == -signal.SIGUSR1
            assert tree.returncode == -signal.SIGUSR1
            assert procs.state(tree.pid) == "Z"
            for _ in range(500):
                if not any(procs.alive(pid) for pid in members):
                    break
                await asyncio.sleep(0.01)
            assert not any(procs.alive(pid) for pid in members)
        assert procs.reaped(tree.pid)

    run(main)
    assert tracked.survivors() == []


def test_run_process_tree_returns_output_and_raises_on_a_failed_exit(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        result = await run_process_tree(
            ["sh", "-c", "cat; echo err >&2"],
            stdin=b"fed",
            capture_stdout=True,
            capture_stderr=True,
            **contained,
        )
        assert (result.returncode, result.stdout, result.stderr) == (0, b"fed", b"err\n")
        with pytest.raises(subprocess.CalledProcessError) as caught:
            await run_process_tree(["sh", "-c", "echo x; exit 3"], capture_stdout=True, **contained)
        assert (caught.value.returncode, caught.value.output) == (3, b"x\n")
        unchecked = await run_process_tree(["sh", "-c", "exit 3"], check=False, **contained)
        assert unchecked.returncode == 3
        with pytest.raises(subprocess.CalledProcessError) as killed:
            await run_process_tree(["sh", "-c", "kill -9 $$"], **contained)
        assert killed.value.returncode == -9  # (a death by signal is a failure too)

    run(main)
    assert tracked.survivors() == []


def test_run_process_tree_raises_an_error_that_ended_its_reading(
    run: Callable[..., Any],
    tracked: Tracked,
    contained: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reader that fails (an error reading its pipe) is not lost, and the tree it read
    # is not left blocked writing a pipe nobody reads: the pipe closes, and the error is
    # raised once the tree is gone, as the trio driver's nursery raises it. Red before:
    # `yes` blocked on the full pipe until the test's timeout, and the error was never
    # retrieved.
    failure = OSError(errno.EIO, "injected")

    async def fails_after_one_chunk(reader: asyncio.StreamReader, chunks: list[bytes]) -> None:
        chunks.append(await reader.read(65536))
        raise failure

    monkeypatch.setattr(trio_proctree.asyncio, "_read_all", fails_after_one_chunk)

    async def main() -> None:
        with pytest.raises(OSError) as caught:
            await asyncio.wait_for(
                run_process_tree(["yes"], capture_stdout=True, grace=0.2, **contained), 5
            )
        assert caught.value is failure

    run(main)
    assert tracked.survivors() == []


def test_run_process_tree_returns_twenty_megabytes_whole(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        result = await run_process_tree(
            ["head", "-c", "20000000", "/dev/urandom"], capture_stdout=True, **contained
        )
        assert len(result.stdout) == 20_000_000

    run(main)


class _HandsBack:
    """A ``task_status`` of plain asyncio: what ``started()`` is given, as a future."""

    def __init__(self) -> None:
        self.tree: asyncio.Future[trio_proctree.asyncio.ProcessTree] = (
            asyncio.get_running_loop().create_future()
        )

    def started(self, tree: trio_proctree.asyncio.ProcessTree) -> None:
        self.tree.set_result(tree)


def test_run_process_tree_hands_back_the_tree_and_cancel_tears_it_down(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As trio's nursery.start() does, for any task_status with a started() (anyio's, or a
    # program's own). Red before: task_status was passed on as an option of the spawn.
    async def main() -> None:
        status = _HandsBack()
        task = asyncio.ensure_future(
            run_process_tree(TWO_SLEEPS, grace=0.5, task_status=status, **contained)
        )
        either: set[asyncio.Future[Any]] = {status.tree, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()  # (ended before it handed the tree back)
        tree = status.tree.result()
        assert procs.alive(tree.pid)
        assert tree.returncode is None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not procs.alive(tree.pid)
        assert tree.outcome is not None

    run(main)
    assert tracked.survivors() == []


def test_anyio_task_group_start_hands_back_the_tree_and_cancel_tears_it_down(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    anyio = pytest.importorskip("anyio")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tree = await tg.start(
                functools.partial(run_process_tree, TWO_SLEEPS, grace=0.5, **contained)
            )
            assert isinstance(tree, trio_proctree.asyncio.ProcessTree)
            assert procs.alive(tree.pid)
            tg.cancel_scope.cancel()
        assert not procs.alive(tree.pid)
        assert tree.outcome is not None
        assert tree.outcome.signals[0] == signal.SIGTERM

    anyio.run(main, backend="asyncio")
    assert tracked.survivors() == []


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_pipe_handed_back_by_anyio_start_is_left_to_be_read_to_its_end(
    tracked: Tracked, contained: dict[str, Any], stream: str
) -> None:
    # As trio's test of the same name: the caller reads what the tree wrote, all of it,
    # after the run ended.
    anyio = pytest.importorskip("anyio")
    pipe: dict[str, Any] = {stream: subprocess.PIPE}
    redirect = ">&2" if stream == "stderr" else ""

    async def main() -> bytes:
        async with anyio.create_task_group() as tg:
            tree = await tg.start(
                functools.partial(
                    run_process_tree,
                    ["sh", "-c", f"echo first; echo last {redirect}"],
                    **pipe,
                    **contained,
                )
            )
            assert await tree.wait() == 0
            await tree.aclose()  # the run's own cleanup (whichever starts it)
            handed: asyncio.StreamReader | None = getattr(tree, stream)
            assert handed is not None
            said = await handed.read()
        assert tree.outcome is not None
        return bytes(said)

    said = anyio.run(main, backend="asyncio")
    assert said == (b"first\nlast\n" if stream == "stdout" else b"last\n")
    assert tracked.survivors() == []


def test_grandchild_holding_the_pipe_does_not_hang_run_process_tree(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        result = await asyncio.wait_for(
            run_process_tree(
                ["sh", "-c", "sleep 60 & echo $!; echo done"],
                capture_stdout=True,
                grace=0.5,
                **contained,
            ),
            10,
        )
        pid_line, done = result.stdout.splitlines()
        assert done == b"done"
        assert not procs.alive(int(pid_line))

    run(main)
    assert tracked.survivors() == []


def test_stdin_a_process_outside_the_tree_holds_does_not_hang_run_process_tree(
    run: Callable[..., Any], tracked: Tracked, tmp_path: Path
) -> None:
    # A setsid escapee, which a process group misses, keeps the tree's stdin and never
    # reads it; the leader exits with a megabyte still to feed. run_process_tree returns
    # as the trio driver does, the rest of the input dropped (red before: it waited, the
    # feeder closing its pipe, until the escapee exited: 30 s here).
    # The escapee says its pid through a FIFO once in its own session; it gets stdin
    # through fd 3, as a shell gives a background job /dev/null before its redirections.
    escapee = 'setsid sh -c \'echo $$ > "$0"; exec sleep 30\' "$0" <&3 3<&- >/dev/null &'
    script = f'exec 3<&0; mkfifo "$0"; {escapee} read pid < "$0"; echo $pid; read x; exit 0'
    fifo = str(tmp_path / "escapee")

    async def main() -> float:
        started = time.monotonic()
        result = await run_process_tree(
            ["sh", "-c", script, fifo], stdin=b"go\n" + b"x" * 1_000_000,
            capture_stdout=True, grace=0.2, env=tracked.env, containment="group",
        )  # fmt: skip
        [pid] = [int(line) for line in result.stdout.splitlines()]
        assert procs.alive(pid)  # (the group missed it, as documented)
        return time.monotonic() - started

    try:
        assert run(main) < 10
    finally:
        procs.kill_survivors(tracked.token)  # the escapee: ours, found by the test's token
    assert tracked.survivors() == []


def test_output_held_open_outside_the_group_is_read_for_a_bounded_time_with_a_warning(
    run: Callable[..., Any],
    tracked: Tracked,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A setsid escapee, which a process group misses, holds stdout: the drain bound lets
    # the call return, and a warning names the tree (helper-35: a mutant at DEBUG lived).
    caplog.set_level(logging.WARNING, logger="trio_proctree")
    command = leaving_an_escapee_on_stdout(tmp_path)

    async def main() -> bytes:
        result = await asyncio.wait_for(
            run_process_tree(
                command, capture_stdout=True, grace=0.5, env=tracked.env, containment="group"
            ),
            10,
        )
        return result.stdout

    try:
        escapee = int(run(main))
        assert procs.alive(escapee)  # (the group missed it, as documented)
    finally:
        procs.kill_survivors(tracked.token)  # the escapee: ours, found by the test's token
    [warned] = [r.getMessage() for r in caplog.records if "pipe still open" in r.getMessage()]
    assert warned.startswith("pid ")  # (the tree's label: its pid and command)
    assert tracked.survivors() == []


async def cancelled_once_it_says(
    cue: bytes, command: list[str], feed: bytes, contained: dict[str, Any]
) -> None:
    """run_process_tree of ``command``, fed ``feed``, its stderr read until it has said
    ``cue``; then cancelled, and the cancellation seen raised once its cleanup is done."""
    cue_read, cue_write = os.pipe()
    try:
        running = asyncio.get_running_loop().create_task(
            run_process_tree(
                command, stdin=feed, stderr=cue_write, escalation=LETS_A_CLI_FINISH, **contained
            )
        )
        said = b""
        while cue not in said:
            chunk = await asyncio.get_running_loop().run_in_executor(None, os.read, cue_read, 4096)
            assert chunk, said
            said += chunk
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    finally:
        os.close(cue_read)
        os.close(cue_write)


@pytest.mark.parametrize("cancelled", list(INPUT_CASES))
def test_asyncio_close_stdin_step_runs_for_the_input_run_process_tree_fed(
    run: Callable[..., Any],
    tracked: Tracked,
    tmp_path: Path,
    contained: dict[str, Any],
    cancelled: str,
) -> None:
    # As with trio (red before: SIGTERM cut the CLI short; mid-input, the feeder went on
    # writing through the cleanup's wait, so the input never ended).
    script, feed, cue = INPUT_CASES[cancelled]
    out = tmp_path / "flushed"
    # (Once it says so, the CLI is under way: its stdin is being fed.)
    run(cancelled_once_it_says, cue, ["sh", "-c", script, str(out)], feed, contained)
    assert out.read_text() == "flushed\n"
    assert tracked.survivors() == []


@pytest.mark.parametrize("size", [65_537, 100_000, 131_072])
def test_asyncio_input_reaches_the_command_in_full_whatever_its_size(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], size: int
) -> None:
    # Red before (helper-86): from 64 KiB + 1 to 128 KiB of input, the command got the
    # first 64 KiB, then EOF, and the run said nothing: drain() returned with the rest
    # still buffered (under the transport's high-water mark), and the feeder's end took
    # it for a cancelled feed's leftover, and dropped it.
    data = b"".join(b"%d\n" % n for n in range(size))[:size]

    async def main() -> bytes:
        result = await run_process_tree(["wc", "-c"], stdin=data, capture_stdout=True, **contained)
        return result.stdout

    assert run(main) == b"%d\n" % size
    assert tracked.survivors() == []


def test_asyncio_input_still_fed_once_the_leader_exited_reaches_what_it_left_in_full(
    run: Callable[..., Any], tracked: Tracked, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # As with trio (red with the input cut as the leader exited: helper-62).
    out = tmp_path / "taken"

    async def main() -> int:
        result = await run_process_tree(
            ["sh", "-c", LEAVES_A_FAST_READER_OF_ITS_INPUT, str(out)],
            stdin=LONG_INPUT, escalation=LETS_A_CLI_FINISH, **contained,
        )  # fmt: skip
        return result.returncode

    assert run(main) == 0
    assert out.read_bytes() == LONG_INPUT
    assert tracked.survivors() == []


def test_asyncio_close_stdin_step_sends_what_write_took_before_the_input_ends(
    run: Callable[..., Any], tracked: Tracked, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # What write() took and the pipe has not yet goes to the tree first, as it reads it,
    # then the end of its input, within the close-stdin step's wait (trio's twin has no
    # such buffer: its input ends at once). The README says which.
    out = tmp_path / "taken"
    data = b"x" * (2 << 20)

    async def main() -> Any:
        async with open_process_tree(
            [*SLOW_COUNTER, str(out)],
            escalation=WAITS_FOR_THE_COUNTER,
            stdin=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdin is not None
            tree.stdin.write(data)  # (not drained: the block ends with it buffered)
        assert tree.stdin is not None and tree.stdin.is_closing()  # the tree's, closed
        return tree.outcome

    outcome = run(main)
    assert outcome.stdin_closed
    assert outcome.signals == ()  # it ended at its input's end, in the step's wait
    assert int(out.read_text()) == len(data)
    assert tracked.survivors() == []


def test_asyncio_input_still_fed_as_the_close_stdin_wait_ends_is_not_said_closed(
    run: Callable[..., Any],
    tracked: Tracked,
    tmp_path: Path,
    contained: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As with trio (red before, helper-60: said closed). The asyncio run_process_tree hands
    # no tree back: its cleanup's log says it.
    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    out = tmp_path / "flushed"

    async def main() -> None:
        await run_process_tree(
            ["sh", "-c", LEAVES_A_SLOW_READER_OF_ITS_INPUT, str(out)],
            stdin=LONG_INPUT, escalation=SHORT_CLOSE_STDIN, **contained,
        )  # fmt: skip

    run(main)
    said = [record.getMessage() for record in caplog.records]
    assert any("the close-stdin step could not close it" in line for line in said), said
    assert not out.exists()
    assert tracked.survivors() == []


#: Under this task factory a new task running trio_proctree's feeder of input waits 10 s
#: before it starts it: one cancelled meanwhile never runs a line of the feeder.
def _feeders_start_late(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
    if getattr(coro, "__qualname__", "") == "_feed":

        async def late(coro: Any = coro) -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                coro.close()
                raise
            await coro

        coro = late()
    return asyncio.Task(coro, loop=loop, **kwargs)


def test_asyncio_input_whose_feeder_never_began_still_ends_for_the_cli(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # Red before: cancelled before its first step, the feeder never ran to close the pipe,
    # and the CLI waited for the input's end through the close-stdin step's wait, then
    # was SIGTERMed before it could flush.
    out = tmp_path / "flushed"
    script = 'echo started >&2; cat >/dev/null; echo flushed > "$0"'

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(_feeders_start_late)
        await cancelled_once_it_says(
            b"started\n", ["sh", "-c", script, str(out)], b"work\n", contained
        )

    asyncio.run(main())
    assert out.read_text() == "flushed\n"
    assert tracked.survivors() == []


def test_asyncio_readers_take_a_limit_as_create_subprocess_exec_does(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (helper-64): "unknown option(s) for a process tree: limit", and a line
    # over 64 KiB could not be read with readline() (line-delimited JSON, logs).
    line = b"x" * 200_000 + b"\n"

    async def main() -> tuple[bytes, bytes]:
        async with open_process_tree(
            ["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x; echo; echo y >&2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, limit=2**20, **contained,
        ) as tree:  # fmt: skip
            assert tree.stdout is not None and tree.stderr is not None
            return await tree.stdout.readline(), await tree.stderr.readline()

    assert run(main) == (line, b"y\n")
    assert tracked.survivors() == []


@pytest.mark.parametrize(
    ("limit", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_asyncio_a_bad_limit_is_refused_by_the_call(limit: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        open_process_tree(["true"], stdout=subprocess.PIPE, limit=limit)


@pytest.mark.parametrize("taken", [True, False], ids=["taken-off", "kept"])
def test_a_reader_holds_all_the_tree_said_as_it_stopped_after_cleanup(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], taken: bool
) -> None:
    # The program keeps the reader (taking it off the tree, or not) and reads it after
    # the block: all that the tree said as it stopped is there. Here it says more
    # (~162 KiB) than the reader takes in unread (128 KiB, then the transport pauses), and
    # less than that and a full pipe, so the tree ends with the rest in the pipe. (Red
    # before: cleanup closed the pipe, and that rest was lost.) Nothing stays open.
    last = 29500
    stopping = f"trap 'seq 1 {last}; exit 0' TERM; echo ready; while :; do sleep 0.05; done"

    async def main() -> None:
        before = await fds_once_settled(**contained)
        async with open_process_tree(
            ["sh", "-c", stopping], stdout=subprocess.PIPE, **contained
        ) as tree:
            reader = tree.stdout
            assert reader is not None
            if taken:
                tree.stdout = None
            assert await reader.readline() == b"ready\n"
        assert procs.open_fds() == before
        # Still the tree's unless taken off it (red before: None after the block).
        assert tree.stdout is (None if taken else reader)
        said = await reader.read()
        assert said == seq(last)
        assert tree.outcome is not None
        assert not tree.outcome.grace_expired

    run(main)
    assert tracked.survivors() == []


def test_a_tree_writing_more_than_its_reader_takes_in_as_it_stops_stops_gracefully(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Read for its first line only, then kept: on SIGTERM the tree says ~469 KB, more
    # than the reader takes in unread (twice its limit) and a pipe hold. While the tree
    # stops, the reader takes in up to 1 MiB, so the tree exits as it asks, and the reader
    # gives it all after the block. Red before: blocked on the full pipe, the tree was
    # SIGKILLed at the grace's end. The limit is the reader's own again after it.
    last = 80000
    stopping = f"trap 'seq 1 {last}; exit 0' TERM; echo ready; while :; do sleep 0.05; done"

    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", stopping], grace=0.5, stdout=subprocess.PIPE, limit=1000, **contained
        ) as tree:
            reader = tree.stdout
            assert reader is not None
            assert await reader.readline() == b"ready\n"
        assert tree.outcome is not None
        assert not tree.outcome.grace_expired
        assert tree.outcome.returncode == 0
        with pytest.raises(asyncio.LimitOverrunError):  # (nothing taken: over 1000 bytes)
            await reader.readuntil(b"80000\n")
        said = await reader.read()
        assert said == seq(last)

    run(main)
    assert tracked.survivors() == []


def test_a_cli_writing_more_than_its_reader_takes_in_on_eof_finishes_in_the_close_stdin_wait(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The trio driver's twin: a CLI that writes its result (~469 KB) once its input ends.
    # The reader takes it in during the close-stdin step's wait, so no signal is needed.
    last = 80000
    cli = f"echo ready; cat >/dev/null; seq 1 {last}"

    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", cli],
            escalation=Escalation(steps=[(signal.SIGTERM, 0.5)], close_stdin=0.5),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            reader = tree.stdout
            assert reader is not None
            assert await reader.readline() == b"ready\n"
        assert tree.outcome is not None
        assert (tree.outcome.stdin_closed, tree.outcome.signals) == (True, ())
        assert tree.outcome.returncode == 0
        assert await reader.read() == seq(last)

    run(main)
    assert tracked.survivors() == []


def reading(transport: Any) -> bool:
    """Whether a read transport reads (is not paused)."""
    try:
        return bool(transport.is_reading())
    except NotImplementedError:  # (Python 3.10's pipe transports do not say)
        return not transport._paused


def test_a_reader_the_program_ended_itself_is_left_alone_and_cleanup_completes(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The program ends the reader itself (feed_eof, to stop a read loop of its own) while
    # the tree still has output in the pipe: that reader wants no more, and cleanup must
    # not trip over it (red before, helper-8: asyncio's "feed_data after feed_eof" escaped
    # cleanup, and the tree was neither released nor reaped). The reader's transport is
    # paused first (128 KiB unread), so that the last words stay in the pipe.
    trap = "trap 'head -c 20000 /dev/zero; exit 0' TERM; "
    stopping = trap + "head -c 150000 /dev/zero; echo ready >&2; while :; do sleep 0.05; done"

    async def main() -> None:
        before = await fds_once_settled(**contained)
        async with open_process_tree(
            ["sh", "-c", stopping], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None and tree.stderr is not None
            assert await tree.stderr.readline() == b"ready\n"
            transport = tree.stdout._transport  # type: ignore[attr-defined]
            deadline = time.monotonic() + 5
            while reading(transport):  # (no event says it paused)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            tree.stdout.feed_eof()
        assert procs.open_fds() == before
        assert tree.outcome is not None
        assert tree.outcome.returncode == 0

    run(main)
    assert tracked.survivors() == []


def test_a_reader_the_program_ended_is_not_read_into_while_the_tree_stops(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As above, the program ends its paused reader itself (feed_eof); the tree then
    # writes as it stops, and runs on past the 10 ms after which cleanup reads output.
    # That reader wants no more, and is left paused. Red before (helper-67): it was
    # resumed, and each chunk read into it reported "feed_data after feed_eof" to the
    # loop as an error.
    trap = "trap 'head -c 20000 /dev/zero; sleep 0.1; exit 0' TERM; "
    stopping = trap + "head -c 150000 /dev/zero; echo ready >&2; while :; do sleep 0.05; done"
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        async with open_process_tree(
            ["sh", "-c", stopping], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None and tree.stderr is not None
            assert await tree.stderr.readline() == b"ready\n"
            transport = tree.stdout._transport  # type: ignore[attr-defined]
            deadline = time.monotonic() + 5
            while reading(transport):  # (no event says it paused)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            tree.stdout.feed_eof()
        assert tree.outcome is not None
        assert (tree.outcome.returncode, tree.outcome.grace_expired) == (0, False)

    run(main)
    assert reported == []
    assert tracked.survivors() == []


@pytest.mark.parametrize("taken", [True, False], ids=["taken-off", "kept"])
def test_a_readers_pipe_an_escapee_holds_is_closed_with_its_tree(
    run: Callable[..., Any], tracked: Tracked, taken: bool
) -> None:
    # A bare process group misses a setsid escapee, which holds the tree's stdout on: the
    # pipe closes with the tree all the same (a reader has no close of its own). Red with
    # the reader taken off the tree left open (helper-5: its fd leaked, and uvloop's loop
    # blocked at its close until the escapee exited).
    escapee: list[int] = []

    async def main() -> None:
        before = await fds_once_settled(env=tracked.env, containment="group")
        async with open_process_tree(
            ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 60' & wait"],
            stdout=subprocess.PIPE,
            env=tracked.env,
            containment="group",
        ) as tree:
            reader = tree.stdout
            assert reader is not None
            if taken:
                tree.stdout = None
            escapee.append(int(await reader.readline()))
        assert procs.open_fds() == before
        assert procs.alive(escapee[0])  # (as a group leaves it: test_containment.py)
        assert await reader.read() == b""

    try:
        run(main)
    finally:
        for pid in escapee:  # (started by this test: its pid read from the tree)
            assert procs.wait_exited(pid, kill=True)
    assert tracked.survivors() == []


def test_asyncio_full_pipe_nobody_reads_does_not_deadlock_cleanup(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; echo go; head -c 1000000 /dev/zero; sleep 60"],
            grace=0.3,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            await tree.stdout.readline()
        assert tree.outcome is not None
        assert tree.outcome.grace_expired

    run(main)
    assert tracked.survivors() == []


#: A CLI that, once its input ends, says so in a file: a cleanup that stops it with a
#: signal before its stdin ends leaves no file.
SAYS_EOF = ["sh", "-c", 'cat >/dev/null; echo eof > "$0"']


def says_eof_with_every_pipe(said: Path, contained: dict[str, Any]) -> Any:
    """A `SAYS_EOF` tree writing to ``said``, its stdin, stdout and stderr pipes, with
    time to say it."""
    return open_process_tree(
        [*SAYS_EOF, str(said)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        escalation=LETS_A_CLI_FINISH,  # (time to say it before SIGTERM)
        **contained,
    )


def test_every_task_cancelled_as_the_tree_forks_leaves_no_pipe_end_open(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A blanket "cancel every task" (as asyncio.run's shutdown does) reaches the spawn's
    # own task while the worker thread forks: the tree is stopped, and our ends of its
    # pipes, never wrapped in streams, must be closed too (red before: three leaked);
    # stdin first, so that the close-stdin step gives the tree its EOF (red before: held
    # until after cleanup, SIGTERM ended the CLI still reading).
    forked, cancelled = threading.Event(), threading.Event()
    real_start_tree = trio_proctree.asyncio.start_tree  # type: ignore[attr-defined]
    said = tmp_path / "said"

    def start_tree_until_cancelled(*args: Any) -> Any:
        started = real_start_tree(*args)
        forked.set()
        cancelled.wait(10)  # the worker "still forking" as every task is cancelled
        return started

    async def enter() -> None:
        async with says_eof_with_every_pipe(said, contained):
            pytest.fail("the block must not run: its task was cancelled during the spawn")

    async def main() -> None:
        fds = await fds_once_settled(**contained)
        monkeypatch.setattr(trio_proctree.asyncio, "start_tree", start_tree_until_cancelled)
        user = asyncio.get_running_loop().create_task(enter())
        assert await asyncio.get_running_loop().run_in_executor(None, forked.wait, 10)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        cancelled.set()
        with pytest.raises(asyncio.CancelledError):
            await user
        assert procs.open_fds() == fds

    asyncio.run(main())
    assert said.read_text() == "eof\n"
    assert tracked.survivors() == []


@pytest.mark.parametrize("failing", ["connect_read_pipe", "connect_write_pipe"])
def test_a_tree_whose_streams_fail_to_connect_leaves_no_pipe_end_open(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path, failing: str
) -> None:
    # The event loop refuses a pipe (out of descriptors for its selector, say): the error
    # propagates, the tree is stopped, and the pipe ends no stream was made of are closed
    # (red before: left open); stdin first, as above.
    said = tmp_path / "said"

    async def main() -> None:
        fds = await fds_once_settled(**contained)
        loop = asyncio.get_running_loop()

        async def refuse(*args: Any) -> Any:
            raise OSError(errno.EMFILE, "Too many open files (injected)")

        real = getattr(loop, failing)
        setattr(loop, failing, refuse)
        try:
            with pytest.raises(OSError, match="injected"):
                async with says_eof_with_every_pipe(said, contained):
                    pytest.fail("the block must not run: the streams failed to connect")
        finally:
            setattr(loop, failing, real)
        assert procs.open_fds() == fds

    asyncio.run(main())
    assert said.read_text() == "eof\n"
    assert tracked.survivors() == []


@pytest.mark.parametrize(("command", "kwargs", "error", "message"), BAD_REQUESTS)
def test_asyncio_bad_request_fails_early_and_leaks_nothing(
    command: Any, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    children, fds = procs.children_of_self(), procs.open_fds()
    with pytest.raises(error, match=message):
        open_process_tree(command, **kwargs)

    async def run_it() -> None:
        await run_process_tree(command, **kwargs)

    with pytest.raises(error, match=message):
        asyncio.run(run_it())
    assert procs.children_of_self() == children
    assert procs.open_fds() == fds


@pytest.mark.parametrize("task_status", ["not given", "anyio", "trio"])
@pytest.mark.parametrize("stream", ["stdin", "stdout", "stderr"])
def test_run_process_tree_refuses_a_pipe_it_cannot_hand_back(stream: str, task_status: str) -> None:
    # asyncio has no nursery.start(): the error must not send the caller looking for one
    # (red before: it did, in trio's words), but to the task_status that hands the tree
    # back (anyio's start(); red before: none was taken). anyio's or trio's
    # TASK_STATUS_IGNORED, passed on by a function of the program's own started with
    # start_soon(), hands the tree back to no one either.
    extra: dict[str, Any] = {}
    if task_status != "not given":
        extra["task_status"] = pytest.importorskip(task_status).TASK_STATUS_IGNORED

    async def run_it() -> None:
        pipe: dict[str, Any] = {stream: subprocess.PIPE}
        await run_process_tree(["true"], **pipe, **extra)

    children = procs.children_of_self()
    with pytest.raises(ValueError, match="open_process_tree") as caught:
        asyncio.run(run_it())
    assert "nursery" not in str(caught.value)
    assert "task_status" in str(caught.value)
    assert procs.children_of_self() == children


def test_a_task_status_without_started_is_refused_before_anything_runs() -> None:
    # As under trio (red before, helper-103: the tree started, and the AttributeError came
    # once it ran).
    async def run_it() -> None:
        await run_process_tree(["true"], task_status=None)  # type: ignore[arg-type]

    children = procs.children_of_self()
    with pytest.raises(TypeError, match=r"task_status must have a started\(\) method"):
        asyncio.run(run_it())
    assert procs.children_of_self() == children


def test_a_closed_asyncio_tree_is_freed_without_the_cycle_collector(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # With what its readers took in. Red before (helper-104): its cleanup's task held it
    # in a cycle (through the wrapper's cancellation callback), freed only by gc.
    async def main() -> weakref.ref[trio_proctree.asyncio.ProcessTree]:
        async with open_process_tree(
            ["head", "-c", "100000", "/dev/zero"], stdout=subprocess.PIPE, **contained
        ) as tree:
            await tree.wait()
        assert tree.outcome is not None
        return weakref.ref(tree)

    gc.disable()
    try:
        freed = run(main)
        assert freed() is None
    finally:
        gc.enable()
    assert tracked.survivors() == []


def test_an_asyncio_tree_says_what_it_is_and_how_it_stands(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(["sh", "-c", "exit 3"], **contained) as tree:
            name = f"<trio_proctree.asyncio.ProcessTree pid {tree.pid} (sh -c 'exit 3')"
            assert repr(tree) in (
                f"{name}: running>",
                f"{name}: exited with status 3>",
            )
            assert await tree.wait() == 3
            assert repr(tree) == f"{name}: exited with status 3>"

    asyncio.run(main())
    assert tracked.survivors() == []


def test_an_asyncio_tree_can_be_killed_whole_before_its_block_ends(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> None:
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; sleep 60 & wait"], grace=5, **contained
        ) as tree:
            tree.kill()
            assert await tree.wait() == -signal.SIGKILL
        assert tree.outcome is not None
        assert not tree.outcome.grace_expired  # nothing was left to sit out the grace

    asyncio.run(main())
    assert tracked.survivors() == []


def test_an_asyncio_tree_the_program_killed_is_waited_for_not_signalled_again(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The block ends while the tree is still dying of kill(), which does not wait (this
    # member takes ms to die): cleanup waits for it, and sends nothing more (red before:
    # SIGTERM and SIGCONT went out).
    async def main() -> tuple[Any, int, int]:
        async with open_process_tree(
            slow_to_die(), grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree:
            [member] = await read_pids(tree.stdout, 1)
            procs.remember(tree.pid)
            procs.remember(member)
            tree.kill()
        return tree.outcome, tree.pid, member

    outcome, pid, member = asyncio.run(main())
    assert outcome is not None
    assert outcome.signals == ()
    assert outcome.lingering_killed == 0
    assert outcome.returncode == -signal.SIGKILL
    assert not any(procs.alive(pid) for pid in [pid, member])
    assert tracked.survivors() == []


def test_an_asyncio_tree_gets_a_step_for_its_leader_alone(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # The escalation is written once, for both drivers: a leader-only step here too.
    from .test_escalation import LEADER_ONLY, coordinator  # noqa: PLC0415 - the trio test's

    said = tmp_path / "said"

    async def main() -> Any:
        # Into a file, read once the tree is gone: cleanup closes the pipes it made,
        # and what was still in one would be lost (seen in CI: 1 run in 6).
        with said.open("wb") as out:
            async with open_process_tree(
                coordinator(tmp_path), escalation=LEADER_ONLY, stdout=out, **contained
            ) as tree:
                deadline = time.monotonic() + 5
                while said.read_bytes().count(b"ready") < 2:
                    assert time.monotonic() < deadline, said.read_bytes()
                    await asyncio.sleep(0.005)  # (a file's growth: no event to wait on)
        return tree.outcome

    outcome = asyncio.run(main())
    text = said.read_bytes()
    assert b"member stopped by the leader" in text
    assert b"leader done" in text
    assert b"member got TERM" not in text
    assert outcome is not None
    assert outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert not outcome.grace_expired
    assert tracked.survivors() == []


def test_an_asyncio_trees_leader_that_exits_during_its_step_hands_it_on(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # As for trio (test_escalation.py): the leader dies of the step meant for it to pass
    # on, and the member it left gets the step from cleanup, not SIGKILL 5 s later.
    from .test_escalation import _MEMBER, LEADER_ONLY  # noqa: PLC0415 - the trio test's

    member, said = tmp_path / "member", tmp_path / "said"
    member.write_text(_MEMBER)

    async def main() -> Any:
        with said.open("wb") as out:
            async with open_process_tree(
                ["sh", "-c", f"sh {member} & wait"],
                escalation=LEADER_ONLY,
                stdout=out,
                **contained,
            ) as tree:
                deadline = time.monotonic() + 5
                while b"ready" not in said.read_bytes():
                    assert time.monotonic() < deadline, said.read_bytes()
                    await asyncio.sleep(0.005)  # (a file's growth: no event to wait on)
        return tree.outcome

    outcome = run(main)
    assert b"member got TERM" in said.read_bytes()
    assert outcome is not None
    assert outcome.signals == (signal.SIGTERM, signal.SIGCONT) * 2
    assert not outcome.grace_expired
    assert tracked.survivors() == []


@pytest.mark.parametrize("canceller", ["asyncio.wait_for", "anyio.move_on_after"])
def test_a_spawn_still_queued_for_a_worker_thread_is_dropped_when_cancelled(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path, canceller: str
) -> None:
    # Red before: a timeout that fired while the spawn still waited for a worker thread of
    # the (shared, small) default executor waited for whatever work held that thread, here
    # 2 s of it. Nothing has forked while the spawn is queued: nothing to wait for.
    async def enter() -> None:
        ran = tmp_path / "ran"
        async with open_process_tree(["sh", "-c", f"touch {ran}; sleep 60"], **contained):
            pytest.fail("a cancelled spawn must not enter its block")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        release = threading.Event()
        busy = loop.run_in_executor(None, release.wait)  # the one worker: held elsewhere
        releaser = threading.Timer(2.0, release.set)
        releaser.start()
        try:
            if canceller == "asyncio.wait_for":
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(enter(), 0.1)
            else:  # (anyio's scope, whose cancellation the waits shield themselves from)
                with anyio.move_on_after(0.1) as scope:
                    await enter()
                assert scope.cancelled_caught
            assert not busy.done()  # it left while the worker was still held
        finally:
            release.set()
            releaser.cancel()
        await busy
        await loop.run_in_executor(None, lambda: None)  # the dropped spawn had its turn

    anyio = pytest.importorskip("anyio")
    anyio.run(main, backend="asyncio")
    assert not (tmp_path / "ran").exists()  # it never started
    assert tracked.survivors() == []


def test_anyio_merely_imported_costs_the_first_tree_no_backend_import(
    tracked: Tracked,
) -> None:
    # Red before: with anyio imported (httpx does it) but never run on this loop, the
    # first tree imported anyio's asyncio backend to shield from scopes that cannot exist
    # yet: ~120 ms with the event loop blocked, enough for a 0.1 s timeout to expire.
    pytest.importorskip("anyio")
    code = textwrap.dedent(
        """
        import asyncio, sys
        import anyio
        from trio_proctree.asyncio import run_process_tree

        asyncio.run(run_process_tree(["true"]))
        print("anyio._backends._asyncio" in sys.modules)
        """
    )
    assert procs.run_python(code, env=tracked.env) == "False\n"


def test_asyncio_a_scope_entered_twice_at_once_starts_one_tree(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before: both entries passed the check before either spawn was done, each
    # started a tree, and the first one, its record overwritten, ran on after both blocks.
    async def main() -> None:
        scope = open_process_tree(["sleep", "60"], grace=0.2, **contained)
        entered: list[int] = []
        refused: list[RuntimeError] = []

        async def enter() -> None:
            try:
                async with scope as tree:
                    entered.append(tree.pid)
                    await asyncio.sleep(0.05)
            except RuntimeError as exc:
                refused.append(exc)

        await asyncio.gather(enter(), enter())
        assert len(entered) == 1
        message = "this open_process_tree() scope was already entered"
        assert [str(exc) for exc in refused] == [message]
        with pytest.raises(RuntimeError, match="already entered"):  # and after it ended
            await scope.__aenter__()

    run(main)
    assert tracked.survivors() == []


def test_asyncio_a_scope_never_entered_refuses_to_be_left(
    run: Callable[..., Any], tracked: Tracked
) -> None:
    async def main() -> None:
        scope = open_process_tree(["true"], env=tracked.env)
        message = r"^this open_process_tree\(\) scope was never entered$"
        with pytest.raises(RuntimeError, match=message):
            await scope.__aexit__(None, None, None)

    run(main)


def test_asyncio_a_scope_whose_spawn_failed_can_be_entered_again(
    run: Callable[..., Any], tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # Nothing of the failed entry runs, so nothing stands in the way of another (red
    # while the scope was marked entered for good before its spawn).
    async def main() -> None:
        workdir = tmp_path / "work"
        workdir.mkdir()
        scope = open_process_tree(["true"], cwd=workdir, **contained)
        workdir.rmdir()  # gone by the time the scope is entered
        with pytest.raises(FileNotFoundError):
            async with scope:
                pytest.fail("entered with no working directory")  # pragma: no cover
        workdir.mkdir()
        async with scope as tree:
            assert await tree.wait() == 0

    run(main)
    assert tracked.survivors() == []


def _connecting_a_pipe(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` waits, somewhere down its awaits, in a pipe's connect."""
    awaited: Any = task.get_coro()
    while awaited is not None:
        if getattr(getattr(awaited, "cr_code", None), "co_name", "") == "_closing_on_error":
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


def test_a_pipe_connect_cancelled_under_uvloop_is_not_closed_twice(
    tracked: Tracked, contained: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # uvloop closes the pipe's number itself when its connect is cancelled (a blanket
    # "cancel every task", as asyncio.run's shutdown does). Red before (helper-46, 200 runs
    # in 200): our file object closed that number again: EBADF, logged as a failed cleanup
    # and carried by the CancelledError (or, had another thread taken the number
    # meanwhile, that thread's file closed under it).
    uvloop = pytest.importorskip("uvloop")
    ended: list[BaseException] = []

    async def holder() -> None:
        async with open_process_tree(TWO_SLEEPS, stdout=subprocess.PIPE, **contained):
            await asyncio.sleep(60)

    async def main() -> None:
        held = asyncio.create_task(holder())
        for _ in range(100_000):
            await asyncio.sleep(0)
            if any(_connecting_a_pipe(task) for task in asyncio.all_tasks()):
                break
        else:
            pytest.fail("the pipe's connect was never seen")
        held.cancel()  # (the spawn's own task is cancelled with it, as at a shutdown)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        try:
            await held
        except BaseException as exc:  # (what ended it is the point)
            ended.append(exc)

    uvloop.run(main())
    [exc] = ended
    assert isinstance(exc, asyncio.CancelledError)
    assert exc.__cause__ is None  # no cleanup error rode along
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert tracked.survivors() == []


def test_a_tree_closed_under_uvloop_closes_each_pipe_number_once(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvloop's transport has libuv close the pipe's number, then calls the file object's
    # close(): ours closed the number again. Red before (helper-73): EBADF, which uvloop
    # passes over, or, where another thread had opened a file in between (the spawns'
    # and cgroup reads' worker threads do), that file closed under it: Popen's error pipe
    # read a cgroup.events, and a tree's cleanup failed with its processes running.
    uvloop = pytest.importorskip("uvloop")
    not_open: list[int] = []  # numbers closed while not open: each a second close
    real_close = os.close

    def close(fd: int) -> None:
        try:
            os.fstat(fd)
        except OSError:
            not_open.append(fd)
        real_close(fd)

    async def main() -> None:
        for _ in range(3):
            async with open_process_tree(
                TWO_SLEEPS,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                grace=0.2,
                **contained,
            ) as tree:
                assert tree.stdout is not None
                await asyncio.sleep(0)

    monkeypatch.setattr(os, "close", close)  # (watched, as the process closes them)
    uvloop.run(main())
    monkeypatch.undo()
    assert not_open == []
    assert tracked.survivors() == []


def test_a_tree_stream_given_to_another_tree_says_how_to_make_a_pipeline(
    tracked: Tracked, tmp_path: Path
) -> None:
    # As a trio pipeline is written (stdin=tree.stdout): refused before the second tree
    # starts, naming what it got and the way that works. Red before (helper-70): the
    # message named a private class, "not _TreeReader", and said nothing more.
    ran = tmp_path / "ran"

    async def main() -> None:
        async with open_process_tree(
            ["seq", "1", "5"], stdout=subprocess.PIPE, env=tracked.env
        ) as first:
            with pytest.raises(TypeError, match=r"not asyncio\.StreamReader .*os\.pipe\(\)"):
                await run_process_tree(
                    ["sh", "-c", f"wc -l; touch {ran}"],
                    stdin=first.stdout,  # type: ignore[arg-type]
                    env=tracked.env,
                )
        read, write = os.pipe()
        try:
            async with open_process_tree(["seq", "1", "5"], stdout=write, env=tracked.env):
                os.close(write)
                write = -1
                result = await run_process_tree(
                    ["wc", "-l"], stdin=read, capture_stdout=True, env=tracked.env
                )
        finally:
            os.close(read)
            if write != -1:
                os.close(write)
        assert result.stdout.strip() == b"5"  # the way the message gives

    asyncio.run(main())
    assert not ran.exists()
    assert tracked.survivors() == []
