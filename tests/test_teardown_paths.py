"""Every way a tree's scope can end stops the whole tree, and nothing of it survives."""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import shlex
import signal
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_proctree._trio
from trio_proctree import Escalation, open_process_tree

from . import procs
from .conftest import Tracked, read_pids, seq, slow_to_die

# A leader that starts two members and says their pids.
TWO_SLEEPS = ["sh", "-c", "sleep 60 & echo $!; sleep 61 & echo $!; wait"]
#: Ignores SIGTERM, as its child does: the grace runs out, and SIGKILL ends it.
IGNORES_TERM_WITH_A_CHILD = ["sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait"]


async def test_end_of_block_stops_the_whole_tree(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async with open_process_tree(
        TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        members = await read_pids(tree.stdout, 2)
        procs.remember(tree.pid)
        assert all(procs.alive(pid) for pid in [tree.pid, *members])
    assert not any(procs.alive(pid) for pid in [tree.pid, *members])
    assert tracked.survivors() == []
    assert tree.outcome is not None
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tree.outcome.returncode == -signal.SIGTERM


async def test_exception_in_block_stops_the_tree_and_propagates_unchanged(
    tracked: Tracked,
    contained: dict[str, Any],
) -> None:
    error = ValueError("the user's own error")
    with pytest.raises(ValueError) as caught:
        async with open_process_tree(
            TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None
            members = await read_pids(tree.stdout, 2)
            procs.remember(tree.pid)
            raise error
    # The very object, not an ExceptionGroup around it nor a cleanup error instead of it.
    assert caught.value is error
    assert caught.value.__cause__ is None
    assert not any(procs.alive(pid) for pid in [tree.pid, *members])
    assert tracked.survivors() == []


async def test_a_cancelled_scope_never_replaces_the_blocks_exception_after_aclose(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The cleanup already ran (aclose() in the block), so the scope's end only waits for
    # it: that wait must not turn the cancellation into a Cancelled that replaces the
    # block's own exception.
    error = ValueError("the user's own error")
    escaped: list[BaseException] = []
    with trio.CancelScope() as scope:
        try:
            async with open_process_tree(
                TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
            ) as tree:
                assert tree.stdout is not None
                await read_pids(tree.stdout, 2)
                await tree.aclose()
                scope.cancel()
                raise error  # noqa: TRY301 - the block's own exception is the subject
        except BaseException as exc:
            escaped.append(exc)
    assert escaped == [error]
    assert tree.outcome is not None
    assert tracked.survivors() == []


async def test_cancellation_stops_the_whole_tree(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    with trio.CancelScope() as scope:
        async with open_process_tree(
            TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree:
            assert tree.stdout is not None
            members = await read_pids(tree.stdout, 2)
            procs.remember(tree.pid)
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert not any(procs.alive(pid) for pid in [tree.pid, *members])
    assert tracked.survivors() == []


async def test_cleanup_takes_turns_with_a_task_waiting_for_the_leader(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A common shape: one task awaits tree.wait() while the block ends. trio lets one
    # task at a time wait on a file descriptor; cleanup must wait its turn, not fail. The
    # leader outlives the stop signal by 0.1 s, so cleanup does wait on it (a leader that
    # died of the signal at once would not be waited on at all). Its trap is set before
    # it says the pids, so the signal cannot come first.
    leader = (
        'sleep 60 & a=$!; sleep 61 & b=$!; trap "sleep 0.1; exit 7" TERM; echo $a; echo $b; wait'
    )
    statuses: list[int] = []
    async with (
        trio.open_nursery() as nursery,
        open_process_tree(
            ["sh", "-c", leader], grace=0.5, stdout=subprocess.PIPE, **contained
        ) as tree,
    ):
        assert tree.stdout is not None
        members = await read_pids(tree.stdout, 2)
        procs.remember(tree.pid)

        async def waiter() -> None:
            statuses.append(await tree.wait())

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
    assert statuses == [7]
    assert not any(procs.alive(pid) for pid in [tree.pid, *members])
    assert tracked.survivors() == []
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired


async def test_a_task_waiting_for_the_leader_gets_its_status_when_cleanup_reaps_it(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The leader dies while a task waits in tree.wait(), and cleanup runs before that
    # task is woken: it reaps the leader and closes its pidfd under the waiting task.
    # That task must get the status (a mutant that let trio's ClosedResourceError out,
    # and one that did not tell trio the pidfd closes, which hung it, lived: helper-35).
    statuses: list[int] = []
    async with (
        trio.open_nursery() as nursery,
        open_process_tree(["sleep", "60"], grace=0.5, **contained) as tree,
    ):

        async def waiter() -> None:
            statuses.append(await tree.wait())

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        procs.remember(tree.pid)
        tree.kill()
        assert procs.wait_unreaped(tree.pid, within=5)  # dead, before any checkpoint
        await tree.aclose()
        with trio.fail_after(2):
            await trio.testing.wait_all_tasks_blocked()
            while not statuses:
                await trio.sleep(0.01)
    assert statuses == [-signal.SIGKILL]
    assert tracked.survivors() == []


async def test_lingering_descendants_are_stopped_after_the_leader_exited(
    tracked: Tracked,
    contained: dict[str, Any],
) -> None:
    async with open_process_tree(
        ["sh", "-c", "sleep 60 & echo $!; exit 0"],
        grace=0.5,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stdout is not None
        [orphan] = await read_pids(tree.stdout, 1)
        assert await tree.wait() == 0
        assert procs.alive(orphan)
    assert not procs.alive(orphan)
    assert tracked.survivors() == []
    assert tree.outcome is not None
    assert tree.outcome.lingering_killed == 1
    assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tree.outcome.returncode == 0


async def test_a_member_that_outlives_the_stopped_leader_counts_as_lingering(
    tracked: Tracked,
    contained: dict[str, Any],
) -> None:
    # The leader takes 0.1 s to stop after SIGTERM; its child ignores SIGTERM (inherited
    # across exec) and is still running after the leader exited, until SIGKILL.
    ignores_term = "trap '' TERM; echo $$; exec sleep 60"
    async with open_process_tree(
        ["sh", "-c", f"trap 'sleep 0.1; exit 0' TERM; sh -c {shlex.quote(ignores_term)} & wait"],
        grace=0.5,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stdout is not None
        [child] = await read_pids(tree.stdout, 1)
    assert not procs.alive(child)
    assert tracked.survivors() == []
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    assert tree.outcome.lingering_killed == 1
    assert tree.outcome.returncode == 0


async def test_members_stopped_with_the_leader_are_not_counted_as_lingering(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before: members still dying of the same SIGTERM when the leader's exit was seen
    # counted, in 2 teardowns of 5 (cgroup). Lingering means outliving the leader into a
    # later step (or into cleanup itself), not dying a moment after it.
    for _ in range(15):
        async with open_process_tree(
            ["sh", "-c", "sleep 60 & sleep 61 & wait"], **contained
        ) as tree:
            await trio.sleep(0.02)  # the shell has started both
        assert tree.outcome is not None
        assert tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
        assert tree.outcome.lingering_killed == 0
    assert tracked.survivors() == []


async def test_a_member_that_ends_on_its_own_in_the_close_stdin_wait_is_not_lingering(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (group containment only): a member still running as cleanup began, after
    # the leader's exit, counted as lingering at once, though it ended on its own within
    # the close-stdin step's wait and no signal was sent; the other containments count one
    # only if it is still running at a signal step.
    async with open_process_tree(
        ["sh", "-c", "sleep 1 & echo $!; exit 0"],
        escalation=Escalation(steps=[(signal.SIGTERM, 0.5)], close_stdin=3.0),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stdout is not None
        [member] = await read_pids(tree.stdout, 1)
        assert await tree.wait() == 0
        assert procs.alive(member)  # (a second to go: cleanup begins while it runs)
    assert tree.outcome is not None
    assert (tree.outcome.signals, tree.outcome.lingering_killed) == ((), 0)
    assert tracked.survivors() == []


async def test_a_task_reading_stdout_as_the_block_ends_gets_all_the_tree_said_then_eof(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A reader task outside the block (a log reader, say), slow with each chunk: the tree
    # says its last words as it stops, and cleanup closes the pipe once the tree is gone.
    # Red before (helper-64): the reader's next read raised ClosedResourceError, and the
    # last words were lost (the asyncio driver's reader had them all).
    said: list[bytes] = []
    stopping = (
        "trap 'echo draining; echo drained; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    )

    async def read_slowly(stream: trio.abc.ReceiveStream, first: trio.Event) -> None:
        async for chunk in stream:
            said.append(bytes(chunk))
            first.set()
            await trio.sleep(0.3)  # (the tree stops, and cleanup ends, meanwhile)

    first = trio.Event()
    async with (
        trio.open_nursery() as nursery,
        open_process_tree(
            ["sh", "-c", stopping], stdout=subprocess.PIPE, grace=2.0, **contained
        ) as tree,
    ):
        # (The block ends before the nursery: the reader, outside it, reads on.)
        assert tree.stdout is not None
        nursery.start_soon(read_slowly, tree.stdout, first)
        await first.wait()
    assert b"".join(said) == b"ready\ndraining\ndrained\n"
    assert tree.outcome is not None and tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert tracked.survivors() == []


async def test_a_stream_kept_by_the_program_holds_what_the_tree_said_as_it_stopped(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Kept, not read until the block is over: what the tree said as it stopped is read from
    # the pipe as cleanup closes it, and given, then the end; no descriptor stays open.
    # (Red before: it raised ClosedResourceError, its last words lost.) Closed by the
    # program, it raises as any closed trio stream does.
    stopping = "trap 'seq 1 2000; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    async with open_process_tree(["true"], stdout=subprocess.PIPE, **contained):
        pass  # (what stays open for good: the watchdog's socket)
    before = procs.open_fds()
    async with open_process_tree(
        ["sh", "-c", stopping], stdout=subprocess.PIPE, **contained
    ) as tree:
        kept = tree.stdout
        assert kept is not None
        assert await kept.receive_some() == b"ready\n"
    assert procs.open_fds() == before
    # Still the tree's, as a trio.Process keeps its own (red before: None after the block,
    # an AttributeError for `tree.stdout.receive_some()` where the rest was waiting).
    assert tree.stdout is kept
    with pytest.raises(ValueError, match="max_bytes"):
        await kept.receive_some(0)
    busy: list[BaseException] = []

    async def receive_too() -> None:
        try:
            await kept.receive_some(1)
        except trio.BusyResourceError as exc:
            busy.append(exc)

    async with trio.open_nursery() as nursery:  # two receivers at once: as trio's streams,
        nursery.start_soon(receive_too)  # the second is refused
        nursery.start_soon(receive_too)
    assert len(busy) == 1
    said = b"1"  # (the byte the other receiver took)
    while chunk := await kept.receive_some(1000):
        assert len(chunk) <= 1000
        said += chunk
    assert said == seq(2000)
    assert await kept.receive_some() == b""  # (the end, again)
    await kept.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await kept.receive_some()
    assert tracked.survivors() == []


#: Says its pid, reads its stdin to the end, says "eof", and runs on regardless.
SAYS_EOF_AND_RUNS_ON = "echo $$; cat > /dev/null; echo eof; exec sleep 60"


async def test_the_trees_streams_stay_on_it_while_cleanup_runs(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (helper-85): cleanup set each stream to None while it closed it, and put
    # it back at its end, so a task of the program's that looked ``tree.stdin`` up during
    # the close-stdin wait met an AttributeError where trio's closed-stream error was due
    # (and ``tree.stdout``, while cleanup drained it, now and then).
    async with open_process_tree(
        ["sh", "-c", SAYS_EOF_AND_RUNS_ON],
        escalation=Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=30.0),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        given = (tree.stdin, tree.stdout)
        assert tree.stdout is not None
        [pid] = await read_pids(tree.stdout, 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tree.aclose)  # (its close-stdin step: the tree says "eof")
            said = b""
            while not said.endswith(b"eof\n"):
                said += await tree.stdout.receive_some()  # (looked up each time)
            during = (tree.stdin, tree.stdout)
            os.kill(pid, signal.SIGTERM)  # (ours, by pid: the wait ends)
            while await tree.stdout.receive_some():  # to its end, as cleanup ends
                pass
    assert during == given
    assert (tree.stdin, tree.stdout) == given  # (closed: as a trio.Process keeps its own)
    assert tree.outcome is not None and tree.outcome.stdin_closed
    assert tree.outcome.signals == ()  # (the tree ended within the close-stdin wait)
    assert tracked.survivors() == []


#: On SIGTERM, more (~289 KB) than a pipe holds, then a graceful exit.
SAYS_MUCH_AS_IT_STOPS = "trap 'seq 1 50000; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
SAID_AS_IT_STOPPED = seq(50000)


async def test_a_tree_writing_more_than_a_pipe_holds_as_it_stops_stops_gracefully(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Read for its first line only, then kept: the tree's last words fill the pipe, and it
    # could not exit until someone read them. Cleanup reads them as the tree stops, and
    # the stream gives them after the block. Red before: blocked on the full pipe, the
    # tree was SIGKILLed at the grace's end (and the stream held what one pipe holds).
    async with open_process_tree(
        ["sh", "-c", SAYS_MUCH_AS_IT_STOPS], grace=0.5, stdout=subprocess.PIPE, **contained
    ) as tree:
        kept = tree.stdout
        assert kept is not None
        assert await kept.receive_some() == b"ready\n"
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tree.outcome.returncode == 0
    assert b"".join([chunk async for chunk in kept]) == SAID_AS_IT_STOPPED
    assert tracked.survivors() == []


async def test_a_tree_writing_a_little_more_than_cleanup_reads_as_it_stops_loses_nothing(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # ~1.1 MB as it stops: cleanup's reader takes 1 MiB and stops there, the rest fits
    # in the pipe, and the tree exits as it asks. Red before (helper-69): cleanup's last
    # read of the pipe, as it closed it, shared the reader's budget, took nothing, and
    # the stream ended 51,424 bytes short, with nothing said.
    stopping = SAYS_MUCH_AS_IT_STOPS.replace("seq 1 50000", "head -c 1100000 /dev/zero")
    async with open_process_tree(
        ["sh", "-c", stopping], grace=0.5, stdout=subprocess.PIPE, **contained
    ) as tree:
        kept = tree.stdout
        assert kept is not None
        assert await kept.receive_some() == b"ready\n"
    assert tree.outcome is not None
    assert (tree.outcome.grace_expired, tree.outcome.returncode) == (False, 0)
    assert len(b"".join([chunk async for chunk in kept])) == 1100000
    assert tracked.survivors() == []


async def test_a_tree_writing_as_it_stops_to_a_pipe_never_read_stops_gracefully(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # stdout is never read: what the tree writes there as it stops is read, and dropped,
    # as cleanup would drop it when it closes the pipe. Red before: SIGKILL at the grace's
    # end. (The trap is known to be set by a line on stderr.)
    stopping = SAYS_MUCH_AS_IT_STOPS.replace("echo ready", "echo ready >&2")
    async with open_process_tree(
        ["sh", "-c", stopping],
        grace=0.5,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stderr is not None
        assert await tree.stderr.receive_some() == b"ready\n"
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tree.outcome.returncode == 0
    assert tracked.survivors() == []


@pytest.mark.parametrize("read_in_the_block", [True, False])
async def test_a_cli_writing_its_result_on_eof_into_a_full_pipe_finishes_in_the_close_stdin_wait(
    tracked: Tracked, contained: dict[str, Any], read_in_the_block: bool
) -> None:
    # A CLI that writes its result (~289 KB, more than a pipe holds) once its input ends:
    # cleanup reads it during the close-stdin step's wait, so no signal is needed. Red
    # before: blocked on the full pipe, it got SIGTERM once the wait ran out. The stream
    # gives it after the block, also kept unread until then (the README's CLI, as the
    # asyncio driver gives it; red before, helper-70: a stream never read from in the
    # block kept nothing, and its first read raised ClosedResourceError).
    cli = "echo ready; cat >/dev/null; seq 1 50000"
    async with open_process_tree(
        ["sh", "-c", cli],
        escalation=Escalation(steps=[(signal.SIGTERM, 0.5)], close_stdin=0.5),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        kept = tree.stdout
        assert kept is not None
        said = b"ready\n"
        if read_in_the_block:
            assert await kept.receive_some() == said
            said = b""
    assert tree.outcome is not None
    assert (tree.outcome.stdin_closed, tree.outcome.signals) == (True, ())
    assert tree.outcome.returncode == 0
    assert b"".join([chunk async for chunk in kept]) == said + SAID_AS_IT_STOPPED
    assert tracked.survivors() == []


async def test_output_flows_while_a_stream_put_in_place_of_stdin_flushes_as_it_closes(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The program put a buffering stream in place of stdin, whose close flushes ~289 KB to
    # the tree, which writes it all out: the close-stdin step's close must not wait on a
    # full output pipe. Red before (helper-67): it did, for the step's whole wait, and the
    # tree got SIGTERM.
    class Buffered(trio.abc.SendStream):
        def __init__(self, inner: trio.abc.SendStream) -> None:
            self.inner, self.held = inner, bytearray()

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            self.held += data
            await trio.lowlevel.checkpoint()

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def aclose(self) -> None:
            async with self.inner:
                await self.inner.send_all(self.held)

    async with open_process_tree(
        ["sh", "-c", "echo ready; exec cat"],
        escalation=Escalation(steps=[(signal.SIGTERM, 0.5)], close_stdin=0.5),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        kept = tree.stdout
        assert kept is not None and tree.stdin is not None
        assert await kept.receive_some() == b"ready\n"
        tree.stdin = Buffered(tree.stdin)
        await tree.stdin.send_all(SAID_AS_IT_STOPPED)
    assert tree.outcome is not None
    assert (tree.outcome.stdin_closed, tree.outcome.signals) == (True, ())
    assert tree.outcome.returncode == 0
    assert b"".join([chunk async for chunk in kept]) == SAID_AS_IT_STOPPED
    assert tracked.survivors() == []


async def test_a_reader_and_cleanup_taking_turns_on_a_pipe_keep_its_order(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A task outside the block reads in small chunks, yielding between them, while
    # cleanup reads the same pipe for the stopping tree whenever that task is not in a
    # read: every byte comes once, in order, then the end.
    said: list[bytes] = []

    async def read_in_small_chunks(stream: trio.abc.ReceiveStream, first: trio.Event) -> None:
        while chunk := await stream.receive_some(1000):
            said.append(bytes(chunk))
            first.set()
            await trio.lowlevel.checkpoint()

    first = trio.Event()
    async with (
        trio.open_nursery() as nursery,
        open_process_tree(
            ["sh", "-c", SAYS_MUCH_AS_IT_STOPS], grace=2.0, stdout=subprocess.PIPE, **contained
        ) as tree,
    ):
        assert tree.stdout is not None
        nursery.start_soon(read_in_small_chunks, tree.stdout, first)
        await first.wait()
    assert b"".join(said) == b"ready\n" + SAID_AS_IT_STOPPED
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tracked.survivors() == []


async def test_a_read_after_cleanup_read_for_it_gives_that_first(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # Steered, where the test above leaves the turns to chance: as it stops, the tree says
    # its last words and closes its stdout, then waits at a FIFO. Cleanup's reader reads
    # them to the pipe's end and stops; the pipe is not closed yet (the tree runs). A read
    # then gives what cleanup read, not the pipe's end: a mutant that read the pipe first
    # (its end, all the rest lost) lived a run in two of the test above.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    held = os.open(gate, os.O_RDWR)  # (so that neither the tree's open nor our write waits)
    stops = (
        f"trap 'seq 1 6000; exec >&-; read x < {shlex.quote(str(gate))}; exit 0' TERM; "
        "echo ready; while :; do sleep 0.05; done"
    )
    said: list[bytes] = []

    async def read_once_cleanup_has_read_it_all(stream: Any) -> None:
        try:
            with trio.fail_after(10):
                while stream._flowing is not None or not stream._rest:  # (nothing tells)
                    await trio.sleep(0.005)
            while chunk := await stream.receive_some(1000):
                said.append(bytes(chunk))
        finally:
            os.write(held, b"go\n")  # (the tree may end)

    try:
        async with (
            trio.open_nursery() as nursery,
            open_process_tree(
                ["sh", "-c", stops], grace=5.0, stdout=subprocess.PIPE, **contained
            ) as tree,
        ):
            assert tree.stdout is not None
            assert await tree.stdout.receive_some() == b"ready\n"
            nursery.start_soon(read_once_cleanup_has_read_it_all, tree.stdout)
    finally:
        os.close(held)
    assert b"".join(said) == seq(6000)
    assert tree.outcome is not None
    assert not tree.outcome.grace_expired
    assert tracked.survivors() == []


async def test_a_tree_output_handed_to_another_tree_reaches_it_in_blocking_mode(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A pipeline: the producer's stdout, a trio stream (its pipe in non-blocking mode, as
    # trio needs), is the consumer's stdin, which must wait for the producer as a shell's
    # pipeline does. Red before: the consumer got the pipe in non-blocking mode, as trio's
    # own processes do (trio issue #1707), and its read of the pipe while the producer
    # paused failed: "Resource temporarily unavailable", exit status 1.
    producer = ["sh", "-c", "seq 1 1000; sleep 0.2; seq 1001 2000"]
    async with (
        open_process_tree(producer, stdout=subprocess.PIPE, **contained) as tree,
        open_process_tree(
            ["wc", "-c"], stdin=tree.stdout, stdout=subprocess.PIPE, **contained
        ) as consumer,
    ):
        assert consumer.stdout is not None
        counted = b"".join([chunk async for chunk in consumer.stdout])
        assert await consumer.wait() == 0
    assert int(counted) == len(seq(2000))
    assert tracked.survivors() == []


async def test_a_tree_input_handed_to_another_tree_as_its_output_is_in_blocking_mode(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # The other way round: the consumer's stdin, a trio stream, is the producer's stdout,
    # and the producer writes more than the pipe holds while the consumer has yet to read.
    # Red before: its write to the full pipe failed with EAGAIN, and it exited 1.
    async with open_process_tree(
        ["sh", "-c", "sleep 0.2; wc -c"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **contained,
    ) as consumer:
        assert consumer.stdin is not None and consumer.stdout is not None
        async with open_process_tree(
            ["seq", "1", "50000"], stdout=consumer.stdin, **contained
        ) as producer:
            assert await producer.wait() == 0
        await consumer.stdin.aclose()
        counted = b"".join([chunk async for chunk in consumer.stdout])
    assert int(counted) == len(SAID_AS_IT_STOPPED)
    assert tracked.survivors() == []


#: Prints the O_NONBLOCK flag of the command's stdin, then copies stdin to stdout.
SAYS_IF_STDIN_BLOCKS = "grep ^flags /proc/$$/fdinfo/0 >&2; exec cat"


def non_blocking_flag(said: bytes | bytearray) -> bool:
    """Whether ``flags:`` (octal, from /proc/PID/fdinfo) had O_NONBLOCK set."""
    return bool(int(said.split()[1], 8) & os.O_NONBLOCK)


async def test_a_pipe_given_as_a_descriptor_reaches_the_command_as_given(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A descriptor (not a trio stream) in non-blocking mode: that mode is the program's
    # choice, and the command gets the pipe as Popen gives it (a command may poll a
    # non-blocking stdin on purpose). Red before (helper-68): it was made blocking, and
    # such a command waited in its read until cleanup stopped it.
    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    try:
        async with open_process_tree(
            ["sh", "-c", SAYS_IF_STDIN_BLOCKS],
            stdin=read_end,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            **contained,
        ) as tree:
            assert tree.stderr is not None
            said = await tree.stderr.receive_some()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert non_blocking_flag(said)
    assert tracked.survivors() == []


async def test_a_trio_stream_of_a_packet_pipe_keeps_its_packets_for_the_command(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A pipe of packets (O_DIRECT): each write is a packet of its own. Opened anew in
    # blocking mode for the command, it keeps that. Red before (helper-68): only the
    # access mode was kept, and the two writes came as one read, b"aaabbb"; then
    # (helper-69) open() refused O_DIRECT for a pipe, and the command got it as it was,
    # non-blocking.
    read_end, write_end = os.pipe2(os.O_DIRECT | os.O_NONBLOCK)
    # (Its flags as F_GETFL gives them: /proc's fdinfo of a command's stdout did not show
    # O_DIRECT, seen here, though its writes were packets.)
    says_its_flags = (
        "import fcntl, os, sys; print('flags:', oct(fcntl.fcntl(1, fcntl.F_GETFL))[2:],"
        " file=sys.stderr, flush=True); os.write(1, b'aaa'); os.write(1, b'bbb')"
    )
    try:
        async with open_process_tree(
            [*procs.python(), "-c", says_its_flags],
            stdout=trio.lowlevel.FdStream(write_end),
            stderr=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stderr is not None
            said = b"".join([chunk async for chunk in tree.stderr])
            assert await tree.wait() == 0, said
        assert os.read(read_end, 100) == b"aaa"
    finally:
        os.close(read_end)
    assert not non_blocking_flag(said)
    assert int(said.split()[1], 8) & os.O_DIRECT
    assert tracked.survivors() == []


#: For a Python child whose main thread ends with pthread_exit: ``main_thread_gone()``
#: waits until it has (its task shows as a zombie), for at most 5 s.
MAIN_THREAD_GONE = textwrap.dedent(
    """
    import os, time

    def main_thread_gone():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(f"/proc/{os.getpid()}/task/{os.getpid()}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
            time.sleep(0.001)
        raise AssertionError("the main thread did not exit")
    """
)


@pytest.mark.parametrize("containment", ["subreaper", "group"])
def test_a_trio_stream_is_made_blocking_for_the_command_after_the_main_thread_exited(
    tracked: Tracked, containment: str
) -> None:
    # An embedding host whose main thread has exited (pthread_exit), the program running
    # on in another thread: /proc/self/fd is gone for it. Red before (helper-68): the
    # pipe could not be opened anew, and the command got it non-blocking. (Not cgroup
    # containment, which cannot be had in such a process: see the README's limits.)
    code = textwrap.dedent(
        f"""
        import ctypes, os, subprocess, sys, threading, trio
        from trio_proctree import open_process_tree

        def worker():
            main_thread_gone()

            async def main():
                read_end, write_end = os.pipe()
                async with open_process_tree(
                    ["sh", "-c", {SAYS_IF_STDIN_BLOCKS!r}],
                    stdin=trio.lowlevel.FdStream(read_end),
                    stderr=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    containment={containment!r},
                    env={tracked.env!r},
                ) as tree:
                    said = await tree.stderr.receive_some()
                    os.close(write_end)
                sys.stdout.write(said.decode())
                sys.stdout.flush()

            trio.run(main)
            os._exit(0)

        threading.Thread(target=worker).start()
        ctypes.CDLL(None).pthread_exit(None)
        """
    )
    assert not non_blocking_flag(procs.run_python(MAIN_THREAD_GONE + code).encode())
    assert tracked.survivors() == []


def test_auto_gives_a_process_whose_main_thread_exited_a_containment_it_can_have() -> None:
    # An embedding host whose main thread has exited: /proc/self/mountinfo cannot be read
    # there (EINVAL), and no cgroup home can be found. Red before (helper-68): "auto"
    # raised that OSError, and no tree could start; now it takes the subreaper, and
    # "cgroup" says why it cannot be had.
    code = textwrap.dedent(
        """
        import ctypes, os, sys, threading, trio
        from trio_proctree import ContainmentUnavailable, open_process_tree

        def worker():
            main_thread_gone()

            async def main():
                async with open_process_tree(["true"]) as tree:
                    print(tree.containment, await tree.wait(), flush=True)
                try:
                    async with open_process_tree(["true"], containment="cgroup"):
                        pass
                except ContainmentUnavailable as exc:
                    print("cgroup:", exc, flush=True)

            trio.run(main)
            os._exit(0)

        threading.Thread(target=worker).start()
        ctypes.CDLL(None).pthread_exit(None)
        """
    )
    said = procs.run_python(MAIN_THREAD_GONE + code).splitlines()
    assert said[0] == "subreaper 0"
    assert said[1].startswith("cgroup: ") and "/proc/self/mountinfo" in said[1]


async def test_a_tree_output_handed_to_another_process_keeps_all_it_has_not_read(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A pipeline: the tree's stdout is the stdin of a slow consumer, which still has the
    # tree's output to read as the block ends. Red before (helper-66): cleanup read what
    # was left in the pipe, for a reader of the stream, and the consumer got 0 of 60000.
    counted: list[bytes] = []

    async def consume(stdin: Any, started: trio.Event) -> None:
        async with open_process_tree(
            ["sh", "-c", "sleep 0.3; wc -c"], stdin=stdin, stdout=subprocess.PIPE, **contained
        ) as consumer:
            started.set()  # (it holds the pipe's read end now)
            assert consumer.stdout is not None
            counted.append(b"".join([chunk async for chunk in consumer.stdout]))
            await consumer.wait()

    async with (
        trio.open_nursery() as nursery,
        open_process_tree(
            ["head", "-c", "60000", "/dev/zero"], stdout=subprocess.PIPE, **contained
        ) as tree,
    ):
        started = trio.Event()
        nursery.start_soon(consume, tree.stdout, started)
        await started.wait()
        assert await tree.wait() == 0
    assert [int(said) for said in counted] == [60000]
    assert tracked.survivors() == []


async def test_a_tree_that_already_ended_gets_no_signal(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async with open_process_tree(["true"], **contained) as tree:
        assert await tree.wait() == 0
    assert tree.outcome is not None
    assert tree.outcome.signals == ()
    assert tree.outcome.lingering_killed == 0
    assert tree.outcome.returncode == 0


async def test_a_tree_the_program_killed_is_waited_for_not_signalled_again(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before: the block ended while the tree was still dying of the program's SIGKILL
    # (kill() does not wait; this member takes ms to die), and cleanup took it for a
    # running tree: it sent SIGTERM and SIGCONT to processes already past acting on them,
    # and said so in the outcome; a process group counted the member as left behind.
    async with open_process_tree(
        slow_to_die(), grace=0.5, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        [member] = await read_pids(tree.stdout, 1)
        procs.remember(tree.pid)
        tree.kill()
    assert not any(procs.alive(pid) for pid in [tree.pid, member])
    assert tree.outcome is not None
    assert tree.outcome.signals == ()
    assert tree.outcome.grace_expired is False
    assert tree.outcome.lingering_killed == 0
    assert tree.outcome.returncode == -signal.SIGKILL
    assert tracked.survivors() == []


async def test_cancellation_while_spawning_still_stops_the_tree(
    tracked: Tracked,
    caplog: pytest.LogCaptureFixture,
    contained: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker thread spawns for real, then holds on until the cancel has been issued:
    # without that hold, a spawn finishing in the same scheduler batch as the cancel would
    # legitimately enter the block first (a cancel is seen at a checkpoint, not before).
    cancel_issued = threading.Event()
    real_start_tree = trio_proctree._trio.start_tree  # type: ignore[attr-defined]

    def start_tree_then_hold(*args: Any) -> Any:
        started = real_start_tree(*args)
        cancel_issued.wait(30)
        return started

    monkeypatch.setattr(trio_proctree._trio, "start_tree", start_tree_then_hold)
    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_the_spawn_is_under_way() -> None:
                # Every task blocked: the spawning task is waiting on its worker thread.
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
                cancel_issued.set()

            nursery.start_soon(cancel_once_the_spawn_is_under_way)
            async with open_process_tree(TWO_SLEEPS, grace=0.5, **contained):
                pytest.fail("the block must not run: the scope was cancelled during the spawn")
    assert scope.cancelled_caught
    started = [int(m) for m in re.findall(r"pid (\d+) \(.*\) started", caplog.text)]
    assert len(started) == 1, "the spawn did happen: the cancel arrived while it ran"
    assert procs.reaped(started[0]), "the leader was reaped"
    assert tracked.survivors() == []


async def test_cancellation_before_spawning_starts_nothing(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    before = procs.children_of_self()
    with trio.CancelScope() as scope:
        scope.cancel()
        async with open_process_tree(TWO_SLEEPS, **contained):
            pytest.fail("unreachable")
    assert scope.cancelled_caught
    assert procs.children_of_self() == before
    assert tracked.survivors() == []


async def test_200_random_cancellation_instants_leave_no_survivors(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    rng = random.Random(20261129)
    cancelled_inside = 0
    for _ in range(200):
        with trio.move_on_after(rng.uniform(0, 0.030)):
            async with open_process_tree(
                ["sh", "-c", "sleep 60 & sleep 61 & wait"], grace=0.5, **contained
            ):
                cancelled_inside += 1
                await trio.sleep_forever()
        assert tracked.survivors() == []
    # The instants covered both sides of the spawn, so both paths were exercised.
    assert 0 < cancelled_inside < 200


async def test_aclose_is_idempotent_and_safe_concurrently(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async with open_process_tree(
        TWO_SLEEPS, grace=0.5, stdout=subprocess.PIPE, **contained
    ) as tree:
        assert tree.stdout is not None
        members = await read_pids(tree.stdout, 2)
        procs.remember(tree.pid)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tree.aclose)
            nursery.start_soon(tree.aclose)
        first = tree.outcome
        await tree.aclose()
        assert tree.outcome is first
    assert first is not None
    # One escalation, not two: SIGTERM was sent once.
    assert first.signals == (signal.SIGTERM, signal.SIGCONT)
    assert first.emptied  # (seen empty; test_cleanup_errors has trees that are not)
    assert not any(procs.alive(pid) for pid in members)
    assert tracked.survivors() == []


def test_aclose_from_another_trio_run_waits_for_the_cleanup_under_way_there(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Nothing ties a tree to the trio run that opened it: another run (another thread)
    # may close it, and waits for the cleanup under way, as a second task would. Red
    # before (helper-94: 15 hangs in 15): that wait was on a trio.Event, set in the run
    # that cleaned up, which wakes no task of another run.
    cleaning: list[trio_proctree.ProcessTree] = []
    under_way = threading.Event()
    errors: list[BaseException] = []

    async def owner() -> None:
        async with open_process_tree(
            IGNORES_TERM_WITH_A_CHILD,
            grace=0.3,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            await tree.stdout.receive_some()
            cleaning.append(tree)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tree.aclose)
                while tree._cleanup_run is None:
                    await trio.lowlevel.checkpoint()
                under_way.set()  # (the cleanup now waits out the grace)

    def in_its_thread() -> None:
        try:
            trio.run(owner)
        except BaseException as exc:  # (said by the test below)
            errors.append(exc)
        finally:
            under_way.set()

    thread = threading.Thread(target=in_its_thread)
    thread.start()
    try:
        assert under_way.wait(10)
        [tree] = cleaning

        async def closer() -> None:
            with trio.fail_after(5):
                await tree.aclose()

        trio.run(closer)
        assert tree.outcome is not None  # it returned once the cleanup was done
        assert tree.outcome.grace_expired
    finally:
        thread.join(10)
    assert not thread.is_alive()
    assert errors == []
    assert tracked.survivors() == []


async def test_block_scope_cancel_does_not_cut_cleanup_short(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # A tree that ignores SIGTERM needs the whole grace and SIGKILL; the caller's
    # cancellation arrives during that wait and must not interrupt it.
    with trio.move_on_after(0.1) as scope:
        async with open_process_tree(
            IGNORES_TERM_WITH_A_CHILD,
            grace=0.3,
            stdout=subprocess.PIPE,
            **contained,
        ) as tree:
            assert tree.stdout is not None
            await tree.stdout.receive_some()
            await tree.aclose()
    assert scope.cancel_called  # the deadline passed during the cleanup...
    assert tree.outcome is not None
    assert tree.outcome.grace_expired  # ...which still ran its whole course
    assert tree.outcome.duration >= 0.3
    assert tracked.survivors() == []


@pytest.mark.parametrize("ends", ["block", "aclose", "run_process_tree"])
async def test_a_deadline_that_passes_during_cleanup_is_raised_once_it_is_done(
    tracked: Tracked, contained: dict[str, Any], ends: str
) -> None:
    # Red before: the shielded cleanup outlasted the deadline, and nothing checked for the
    # cancellation after it, so fail_after's scope ended as if in time: no TooSlowError,
    # the block or aclose() returned, run_process_tree returned (or raised the exit
    # status's CalledProcessError) past its deadline (helper-38; trio.run_process and
    # the asyncio driver raise the timeout).
    ignores_term = ["sh", "-c", "trap '' TERM; echo ready; sleep 60 & exit 3"]
    with pytest.raises(trio.TooSlowError), trio.fail_after(10) as scope:
        if ends == "run_process_tree":
            async with trio.open_nursery() as nursery:
                tree = await nursery.start(
                    functools.partial(
                        trio_proctree.run_process_tree, ignores_term, grace=0.3, **contained
                    )
                )
                scope.deadline = trio.current_time() + 0.1  # (the cleanup takes >= 0.3 s)
        else:
            async with open_process_tree(
                ignores_term, grace=0.3, stdout=subprocess.PIPE, **contained
            ) as tree:
                assert tree.stdout is not None
                await tree.stdout.receive_some()
                scope.deadline = trio.current_time() + 0.1
                if ends == "aclose":
                    await tree.aclose()
                    pytest.fail("aclose() returned past the deadline")
    assert tree.outcome is not None
    assert tree.outcome.grace_expired  # the cleanup still ran its whole course
    assert tracked.survivors() == []


async def test_aclose_and_the_blocks_end_are_checkpoints_for_a_tree_that_ended(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (helper-40): a tree found empty needs no wait, and neither aclose() nor
    # the block's end let another task run (cancel point, no schedule point), against
    # trio's rule that every async call is both; trio.Process.wait() is, even then.
    async with open_process_tree(["true"], **contained) as tree:
        await tree.wait()
        with trio.testing.assert_checkpoints():
            await tree.aclose()
    scope = open_process_tree(["true"], **contained)
    tree = await scope.__aenter__()
    await tree.wait()
    with trio.testing.assert_checkpoints():
        await scope.__aexit__(None, None, None)
    assert tracked.survivors() == []


async def test_a_scope_entered_twice_at_once_starts_one_tree(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before: both entries passed the check before either spawn was done, each
    # started a tree, and the first one, its record overwritten, ran on after both blocks.
    scope = open_process_tree(["sleep", "60"], grace=0.2, **contained)
    entered: list[int] = []
    refused: list[RuntimeError] = []

    async def enter() -> None:
        try:
            async with scope as tree:
                entered.append(tree.pid)
                await trio.sleep(0.05)
        except RuntimeError as exc:
            refused.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enter)
        nursery.start_soon(enter)
    assert len(entered) == 1
    assert [str(exc) for exc in refused] == ["this open_process_tree() scope was already entered"]
    with pytest.raises(RuntimeError, match="already entered"):  # and after it ended
        await scope.__aenter__()
    assert tracked.survivors() == []


async def test_a_scope_never_entered_refuses_to_be_left(tracked: Tracked) -> None:
    scope = open_process_tree(["true"], env=tracked.env)
    with pytest.raises(RuntimeError, match=r"^this open_process_tree\(\) scope was never entered$"):
        await scope.__aexit__(None, None, None)


async def test_a_scope_whose_spawn_failed_can_be_entered_again(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # Nothing of the failed entry runs, so nothing stands in the way of another (red
    # while the scope was marked entered for good before its spawn).
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
    assert tracked.survivors() == []
