"""run_process_tree: trio.run_process semantics, for the whole tree; and its pipes."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_proctree import ProcessTree, open_process_tree, run_process_tree

from . import procs
from .conftest import Tracked, read_pids, seq

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


async def test_returns_the_exit_status_and_captured_output(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    result = await run_process_tree(
        ["sh", "-c", "echo out; echo err >&2; exit 0"],
        capture_stdout=True,
        capture_stderr=True,
        **contained,
    )
    assert result.returncode == 0
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    assert result.args == ["sh", "-c", "echo out; echo err >&2; exit 0"]


@pytest.mark.parametrize(
    "command", [("sh", "-c", "exit 3"), Path("/bin/false")], ids=["tuple", "path"]
)
async def test_the_command_is_reported_as_given(
    tracked: Tracked, contained: dict[str, Any], command: Any
) -> None:
    # As subprocess.run does: args and CalledProcessError.cmd are the caller's own object
    # (red before: they came back as a list).
    with pytest.raises(subprocess.CalledProcessError) as caught:
        await run_process_tree(command, **contained)
    assert caught.value.cmd == command
    assert type(caught.value.cmd) is type(command)
    async with open_process_tree(command, **contained) as tree:
        assert tree.args == command
        assert type(tree.args) is type(command)


async def test_nonzero_exit_raises_called_process_error_when_checked(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    with pytest.raises(subprocess.CalledProcessError) as caught:
        await run_process_tree(
            ["sh", "-c", "echo partial; exit 7"], capture_stdout=True, **contained
        )
    assert caught.value.returncode == 7
    assert caught.value.output == b"partial\n"
    result = await run_process_tree(["sh", "-c", "exit 7"], check=False, **contained)
    assert result.returncode == 7


async def test_a_leader_killed_by_a_signal_raises_called_process_error_when_checked(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As subprocess.run: any status but 0 is a failure, a death by signal (an OOM kill, a
    # crash) included. (A mutant that took only positive statuses survived: helper-35.)
    with pytest.raises(subprocess.CalledProcessError) as caught:
        await run_process_tree(["sh", "-c", "kill -9 $$"], **contained)
    assert caught.value.returncode == -9
    assert tracked.survivors() == []


async def test_input_the_command_does_not_read_is_not_an_error(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # What the tree did not take is not ours to report: the call returns the command's
    # status. (A mutant that let the broken pipe through survived: helper-35.)
    result = await run_process_tree(
        ["sh", "-c", "exec 0<&-; sleep 0.2"], stdin=b"x" * (8 << 20), **contained
    )
    assert result.returncode == 0
    assert tracked.survivors() == []


async def test_stdin_bytes_are_fed_then_closed(tracked: Tracked, contained: dict[str, Any]) -> None:
    result = await run_process_tree(["cat"], stdin=b"hello tree", capture_stdout=True, **contained)
    assert result.stdout == b"hello tree"


async def test_twenty_megabytes_of_output_arrive_whole(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    size = 20_000_000
    result = await run_process_tree(
        ["head", "-c", str(size), "/dev/urandom"], capture_stdout=True, **contained
    )
    assert len(result.stdout) == size


async def test_grandchild_holding_the_pipe_does_not_hang_the_call(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The background sleep inherits stdout and would keep it open for a minute.
    with trio.fail_after(10):
        result = await run_process_tree(
            ["sh", "-c", "sleep 60 & echo $!; echo done"],
            capture_stdout=True,
            grace=0.5,
            **contained,
        )
    pid_line, done = result.stdout.splitlines()
    assert done == b"done"
    assert not procs.alive(int(pid_line))
    assert tracked.survivors() == []


def leaving_an_escapee_on_stdout(tmp_path: Path) -> list[str]:
    """A command whose ``setsid`` escapee says its pid and keeps stdout open after the
    leader exits. The leader waits (on a fifo) until the escapee has left the group and
    said its pid: a leader exiting first would have the group killed while the escapee is
    still in it."""
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    return ["sh", "-c", f"setsid -f sh -c 'echo $$; echo > {fifo}; exec sleep 60'; read x < {fifo}"]


async def _run_leaving_an_escapee_on_stdout(
    tracked: Tracked, tmp_path: Path, containment: str
) -> int:
    """Run `leaving_an_escapee_on_stdout` to its end; the escapee's pid."""
    with trio.fail_after(10):
        result = await run_process_tree(
            leaving_an_escapee_on_stdout(tmp_path),
            capture_stdout=True,
            grace=0.5,
            env=tracked.env,
            containment=containment,
        )
    return int(result.stdout)


async def test_output_held_open_outside_the_group_is_read_for_a_bounded_time(
    tracked: Tracked, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # With only a group for containment, the escapee is out of reach and keeps stdout
    # open: the drain bound alone lets the call return, and a warning says so.
    caplog.set_level(logging.WARNING, logger="trio_proctree")
    escapee = await _run_leaving_an_escapee_on_stdout(tracked, tmp_path, "group")
    assert procs.alive(escapee)
    [warned] = [r.getMessage() for r in caplog.records if "pipe still open" in r.getMessage()]
    assert warned.startswith("pid ")  # (the tree's label: its pid and command)
    assert tracked.survivors() == [escapee]
    procs.kill_survivors(tracked.token)


async def test_escapee_holding_the_pipe_is_stopped_by_its_cgroup(
    tracked: Tracked, tmp_path: Path
) -> None:
    escapee = await _run_leaving_an_escapee_on_stdout(tracked, tmp_path, "cgroup")
    assert not procs.alive(escapee)
    assert tracked.survivors() == []


async def test_nursery_start_hands_back_the_tree_and_cancel_tears_it_down(
    tracked: Tracked,
    contained: dict[str, Any],
) -> None:
    async with trio.open_nursery() as nursery:
        tree = await nursery.start(
            lambda task_status: run_process_tree(
                ["sh", "-c", "sleep 60 & sleep 61 & wait"],
                grace=0.5,
                **contained,
                task_status=task_status,
            )
        )
        assert isinstance(tree, ProcessTree)
        assert procs.alive(tree.pid)
        assert tree.returncode is None
        nursery.cancel_scope.cancel()
    assert not procs.alive(tree.pid)
    assert tree.outcome is not None
    assert tracked.survivors() == []


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_a_pipe_handed_back_by_nursery_start_is_left_to_be_read_to_its_end(
    tracked: Tracked, contained: dict[str, Any], stream: str
) -> None:
    # As trio.run_process leaves it: the caller reads what the tree wrote, all of it,
    # after the run ended, as a client reads the last words of a language server on its
    # stdout. Red before: cleanup closed the stream and took it off the tree, so a read
    # after it had nothing to read, and one under way raised ClosedResourceError.
    pipe: dict[str, Any] = {stream: subprocess.PIPE}
    async with trio.open_nursery() as nursery:
        tree = await nursery.start(
            lambda task_status: run_process_tree(
                ["sh", "-c", f"echo first; echo last {'>&2' if stream == 'stderr' else ''}"],
                **pipe,
                **contained,
                task_status=task_status,
            )
        )
        assert await tree.wait() == 0
        await tree.aclose()  # the run's own cleanup (whichever starts it)
        handed: trio.abc.ReceiveStream | None = getattr(tree, stream)
        assert handed is not None
        said = b""
        async with handed:
            async for chunk in handed:
                said += chunk
    assert said == (b"first\nlast\n" if stream == "stdout" else b"last\n")
    assert tree.outcome is not None
    assert tracked.survivors() == []


async def test_cancellation_propagates_unwrapped(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    contexts: list[BaseException | None] = []
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await trio.sleep(0.05)
                scope.cancel()

            nursery.start_soon(cancel_soon)
            try:
                await run_process_tree(
                    ["sh", "-c", "sleep 60 & wait"],
                    capture_stdout=True,
                    stdin=b"x",
                    grace=0.5,
                    **contained,
                )
            except trio.Cancelled as exc:
                contexts.append(exc.__context__)
                raise
            except BaseException as exc:  # pragma: no cover - the failure this test pins
                pytest.fail(f"expected a bare Cancelled, got {exc!r}")
    assert scope.cancelled_caught
    # Nor does the group it came out of show in its traceback ("during handling of"):
    # a mutant that left it there lived (helper-35).
    assert len(contexts) == 1
    assert not isinstance(contexts[0], BaseExceptionGroup)
    assert tracked.survivors() == []


async def test_pipe_arguments_need_nursery_start() -> None:
    with pytest.raises(ValueError, match=r"nursery\.start"):
        await run_process_tree(["true"], stdout=subprocess.PIPE)
    with pytest.raises(ValueError, match="capture_stdout"):
        await run_process_tree(["true"], capture_stdout=True, stdout=subprocess.DEVNULL)
    with pytest.raises(TypeError, match="bytes"):
        await run_process_tree(["true"], stdin="text")  # type: ignore[arg-type]


@pytest.mark.parametrize("ignored", ["anyio", "trio_proctree.asyncio"])
async def test_pipe_arguments_need_nursery_start_whoever_made_the_ignored_status(
    ignored: str,
) -> None:
    # A function of the program's own, started with start_soon, passes on the
    # TASK_STATUS_IGNORED it was given, anyio's say: that hands the tree back to no one
    # either. Red before (helper-103): anyio's was taken for a hand-back, the pipe went to
    # no one, and the run hung on it.
    status = pytest.importorskip(ignored).TASK_STATUS_IGNORED
    children = procs.children_of_self()
    with pytest.raises(ValueError, match=r"nursery\.start"):
        await run_process_tree(["true"], stdout=subprocess.PIPE, task_status=status)
    assert procs.children_of_self() == children


async def test_a_task_status_without_started_is_refused_before_anything_runs() -> None:
    # Red before (helper-103): the tree started, and the AttributeError came once it ran.
    children = procs.children_of_self()
    with pytest.raises(TypeError, match=r"task_status must have a started\(\) method"):
        await run_process_tree(["true"], task_status=None)  # type: ignore[arg-type]
    assert procs.children_of_self() == children


async def test_full_pipe_nobody_reads_does_not_deadlock_cleanup(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The tree fills its stdout pipe, which nobody reads, and ignores SIGTERM.
    with trio.fail_after(10):
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; echo $$; head -c 1000000 /dev/zero; sleep 60"],
            grace=0.3,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            await read_pids(tree.stdout, 1)
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tracked.survivors() == []


async def test_tree_flushing_into_a_full_pipe_on_sigterm_is_still_stopped(
    tracked: Tracked,
    contained: dict[str, Any],
) -> None:
    # On SIGTERM it writes more than cleanup reads for it (1 MiB unread) and a pipe hold:
    # blocked for good.
    script = "trap 'head -c 3000000 /dev/zero; exit 0' TERM; echo ready; while :; do sleep 1; done"
    with trio.fail_after(10):
        async with open_process_tree(
            ["sh", "-c", script], grace=0.3, stdout=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None
            await tree.stdout.receive_some()
    assert tree.outcome is not None
    assert tree.outcome.signals[-1] == 9
    assert tracked.survivors() == []


async def test_a_cancelled_run_whose_tree_writes_as_it_stops_stops_gracefully(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Cancelled, the run stops reading the output it captures; on SIGTERM the tree writes
    # more (~289 KB) than a pipe holds. Cleanup reads it meanwhile (and drops it: the run
    # returns nothing), so the tree stops as it asks. Red before: blocked on the full
    # pipe, it was SIGKILLed once the grace ran out.
    stopping = "trap 'seq 1 50000; exit 0' TERM; echo ready >&2; while :; do sleep 0.05; done"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            tree = await nursery.start(
                functools.partial(
                    run_process_tree,
                    ["sh", "-c", stopping],
                    capture_stdout=True,
                    stderr=subprocess.PIPE,
                    grace=0.5,
                    **contained,
                )
            )
            assert tree.stderr is not None
            assert await tree.stderr.receive_some() == b"ready\n"  # (its trap is set)
            nursery.cancel_scope.cancel()
        await tree.stderr.aclose()
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tree.outcome.returncode == 0
    assert tracked.survivors() == []


async def test_a_stream_taken_off_the_tree_is_read_to_its_end_after_cleanup(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A stream the program takes off the tree is the program's: cleanup leaves it open, to
    # be read to its end, all that the tree said as it stopped (here within one pipe's
    # capacity: nobody reads while the block ends). The asyncio driver's twin was red.
    stopping = "trap 'seq 1 5000; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    async with open_process_tree(
        ["sh", "-c", stopping], stdout=subprocess.PIPE, **contained
    ) as tree:
        stdout, tree.stdout = tree.stdout, None
        assert stdout is not None
        assert await stdout.receive_some() == b"ready\n"
    said = b""
    async with stdout:
        while chunk := await stdout.receive_some():
            said += chunk
    assert said == seq(5000)
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tracked.survivors() == []


async def test_a_tree_says_what_it_is_and_how_it_stands(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # As trio.Process's repr does, under the public name (red before: the private
    # module's, and no state at all).
    async with open_process_tree(
        ["sh", "-c", "read x; exit 3"], stdin=subprocess.PIPE, **contained
    ) as tree:
        name = f"<trio_proctree.ProcessTree pid {tree.pid} (sh -c 'read x; exit 3')"
        assert repr(tree) == f"{name}: running>"
        assert tree.stdin is not None
        await tree.stdin.aclose()
        assert await tree.wait() == 3
        assert repr(tree) == f"{name}: exited with status 3>"
    assert procs.reaped(tree.pid)  # (read without reaping: cleanup reaped it)
    assert tracked.survivors() == []
