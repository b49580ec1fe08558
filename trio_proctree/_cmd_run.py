"""``trio-proctree run``: a tree-aware ``timeout(1)``.

coreutils ``timeout`` signals its own process group, which misses every descendant that
leaves it; this runs the command as a contained tree, so a time limit, or a signal to
this command, stops all of it: gracefully first, certainly second.

Exit status, as ``timeout`` has it: the command's own; 124 when ``--timeout`` expired; 125
when this tool failed (or could not make sure the tree is gone); 126 when the command is
not executable; 127 when it is not found.
A command that a signal N ended ends this tool by N too (a shell shows 128+N), as
``timeout`` and ``sudo`` do; and after a stop request (SIGTERM, SIGINT, SIGHUP), which
stops the tree (at once, during a stop already under way), it ends by that signal, so
that a script running it in a loop stops on Ctrl-C (bash stops a script only for a child
that died of SIGINT).
An interactive command keeps the terminal, in a group of its own; under job control this
tool stops when its command stops, as ``sudo`` does (`_follow_a_stop`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import math
import os
import resource
import signal
import stat
import sys
from collections.abc import AsyncIterator, Generator, Sequence

import attrs
import trio

from ._choose import ContainmentUnavailable
from ._outcome import CleanupError
from ._procfs import read_stat, scan
from ._trio import ProcessTree, open_process_tree, unwrapped

TIMED_OUT = 124
TOOL_FAILED = 125
NOT_EXECUTABLE = 126
NOT_FOUND = 127

#: Signals that ask this tool to stop the tree and exit.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@attrs.frozen
class RunOptions:
    command: Sequence[str]
    grace: float
    stop_signal: int
    timeout: float | None
    containment: str


def run(options: RunOptions) -> int:
    """Run the command; its exit status (see the module's docstring). Ends this process
    by a signal where the command ended by one, or a stop request came."""
    try:
        returncode = trio.run(_run, options)
    except (OSError, ContainmentUnavailable, NotImplementedError, CleanupError) as exc:
        return _failed(options.command[0], exc)
    return _end_by(-returncode) if returncode < 0 else returncode


def _failed(name: str, exc: Exception) -> int:
    """Say why the command could not run, and the exit status that says so."""
    if isinstance(exc, FileNotFoundError):
        _complain(f"{name}: command not found ({exc.strerror})")
        return NOT_FOUND
    # Not executable, or found but no program the kernel runs.
    if isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and exc.errno == errno.ENOEXEC
    ):
        _complain(f"{name}: {exc.strerror}")
        return NOT_EXECUTABLE
    _complain(str(exc))
    return TOOL_FAILED


def _complain(message: str) -> None:
    sys.stderr.write(f"trio-proctree: {message}\n")


def _end_by(sig: int) -> int:
    """End this process by signal ``sig`` (the tree is gone by now); 128+N if it lives on
    (a signal whose default action is not to end a process)."""
    # What a normal exit does first: the watchdog told we are done and waited for, the
    # output flushed. (A signal's end runs no atexit hook.)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, ValueError):
        # A command's SIGSEGV or SIGABRT is not this tool's to dump core for.
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):  # (SIGKILL has no handler to reset)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), sig)
    return 128 + sig


async def _run(options: RunOptions) -> int:
    """The exit status for a shell, or minus the signal this process is to end by."""
    with _owned_terminal() as terminal:
        return await _run_with(options, terminal)


async def _run_with(options: RunOptions, terminal: int | None) -> int:
    """`_run`, given our controlling terminal open (`_owned_terminal`), or None."""
    interactive = terminal is not None
    timed_out = False
    requested: list[int] = []  # the stop requests received, in order
    # Signals are received from here on, so none can end us before the tree is stopped;
    # and until the end, so none is redelivered as we leave (trio's receiver does that to
    # signals left pending: a traceback, or death by it, and the command's status lost).
    # An interactive command's stops are followed (`_follow_a_stop`): told by SIGCHLD.
    received = (*STOP_REQUESTS, signal.SIGCHLD) if interactive else STOP_REQUESTS
    with trio.open_signal_receiver(*received) as requests, unwrapped():
        stopping = trio.Event()  # set once the tree is being stopped, whatever stops it
        async with trio.open_nursery() as answering:
            async with open_process_tree(
                options.command,
                grace=options.grace,
                stop_signal=options.stop_signal,
                containment=options.containment,
                # A session of its own detaches the command from the terminal: interactive
                # commands keep ours, in a group of their own that gets the terminal.
                start_new_session=not interactive,
            ) as tree:
                with (
                    _terminal_handed_to(terminal, tree),
                    trio.CancelScope() as waiting,
                ):
                    answer = functools.partial(_answer, terminal=terminal)
                    answering.start_soon(answer, requests, requested, waiting, stopping, tree)
                    timeout = math.inf if options.timeout is None else options.timeout
                    with trio.move_on_after(timeout) as deadline:
                        await tree.wait()
                    timed_out = deadline.cancelled_caught
                stopping.set()
                # Leaving the block stops whatever is still running: the whole escalation
                # (cut short by a second stop request: `_answer`).
            answering.cancel_scope.cancel()
    assert tree.outcome is not None and tree.outcome.returncode is not None
    if requested:
        return -requested[0]
    if timed_out:
        return TIMED_OUT
    return tree.outcome.returncode


async def _answer(
    requests: AsyncIterator[int],
    requested: list[int],
    waiting: trio.CancelScope,
    stopping: trio.Event,
    tree: ProcessTree,
    *,
    terminal: int | None,
) -> None:
    """A stop request ends the wait for the command: the tree is stopped as the escalation
    says, gracefully first. One that comes during a stop already under way (a second one,
    or one after the timeout, or after the command's end with members left) kills the tree
    now: Ctrl-C pressed at a slow stop, as the library takes a second Ctrl-C."""
    async for sig in requests:
        if sig == signal.SIGCHLD:
            # Not once a stop was asked for: the tree's members are then the escalation's
            # to continue, and this tool, stopped along with them, would wait for ever
            # (`kill %1` continues a stopped job, then the command reads in the background).
            if terminal is not None and not (requested or stopping.is_set()):
                _follow_a_stop(tree, terminal)
            continue
        requested.append(sig)
        if stopping.is_set() or len(requested) > 1:
            tree.kill()
        else:
            waiting.cancel()


def _follow_a_stop(tree: ProcessTree, terminal: int) -> None:
    """If the command stopped (Ctrl-Z; a read of the terminal in the background), stop
    this tool by the same signal, as ``sudo`` does, and once continued (``fg``, ``bg``)
    continue the command.

    The command's group has the terminal, and the shell does not know of it: Ctrl-Z
    stops the command alone, and the shell, waiting for this tool, would wait for ever.
    Stopped, this tool is a stopped job to the shell, which takes the terminal back.
    """
    try:
        # Its stop only, never its exit (WEXITED not asked): the leader is reaped by the
        # cleanup, after the last signal to its group.
        stopped = os.waitid(os.P_PID, tree.pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return
    if stopped is None or stopped.si_code != os.CLD_STOPPED:
        return  # (another child's SIGCHLD, or the stop was continued meanwhile)
    sig = stopped.si_status
    with contextlib.suppress(OSError):
        if os.tcgetpgrp(terminal) == tree.pid:
            os.tcsetpgrp(terminal, os.getpgrp())  # the terminal back to the shell's job: this tool
    # (SIGTTOU is ignored while the terminal is the tree's: a stop by it must stop us too.)
    previous = signal.signal(sig, signal.SIG_DFL) if sig != signal.SIGSTOP else None
    try:
        os.kill(os.getpid(), sig)  # returns once continued (an orphaned group: at once)
    finally:
        if previous is not None:
            signal.signal(sig, previous)
    with contextlib.suppress(OSError):
        if os.tcgetpgrp(terminal) == os.getpgrp():  # continued in the foreground: fg, not bg
            os.tcsetpgrp(terminal, tree.pid)
    tree.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def _owned_terminal() -> Generator[int | None]:
    """Our controlling terminal, open, if its foreground process group is ours, and ours
    alone; None else (no terminal: cron, CI, a service; or run in the background).

    The controlling terminal, not stdin: ``run -- sudo make < input`` prompts on it.
    The commands of a pipeline share a process group (``trio-proctree run -- git log |
    less``): the terminal is then theirs too, and handed to the tree it would be taken
    from them (the reader's read of it fails, or stops it). The tree then runs in the
    background of the terminal, as under ``timeout``.
    """
    try:
        # (O_NONBLOCK: the open of a serial line may wait for its carrier, else.)
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None  # no controlling terminal
        return
    try:
        try:
            owned = os.tcgetpgrp(fd) == os.getpgrp() and not _group_shared()
        except OSError:
            owned = False
        yield fd if owned else None
    finally:
        os.close(fd)


def _group_shared() -> bool:
    """Whether other commands of a pipeline are in our process group: processes there (not
    us, nor our ancestors) that hold a pipe of our stdin, stdout or stderr. (A shell
    running a script without job control is in its commands' group, and waits; so is a
    job it left in the background: neither shares the terminal with us. A shell puts each
    command of a pipeline in its group before it runs it: by now they all are.)"""
    pipes: set[tuple[int, int]] = set()
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO((st := os.fstat(fd)).st_mode):
                pipes.add((st.st_dev, st.st_ino))
    if not pipes:
        return False
    ours = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in ours and (parent := read_stat(pid)) is not None:
        ours.add(pid)
        pid = parent.ppid
    return any(
        _holds(member, pipes) for member in scan().in_group(os.getpgrp()) if member not in ours
    )


def _holds(pid: int, pipes: set[tuple[int, int]]) -> bool:
    """Whether process ``pid`` has one of ``pipes`` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if (st.st_dev, st.st_ino) in pipes:
                return True
    return False


@contextlib.contextmanager
def _terminal_handed_to(terminal: int | None, tree: ProcessTree) -> Generator[None]:
    """Make the tree's group the terminal's foreground group (so the command can read from
    it and gets Ctrl-C), and take the terminal back afterwards. (None: no terminal.)"""
    if terminal is None:
        yield
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background tcsetpgrp stops us
    try:
        os.tcsetpgrp(terminal, tree.pid)
        # The command runs from its spawn on, before this: one that read the terminal
        # meanwhile got SIGTTIN, as a background reader, and stopped. It may read now.
        tree.send_signal(signal.SIGCONT)
        yield
    finally:
        with contextlib.suppress(OSError):
            # Only from the tree: a tree in the background (``bg``) left the terminal to
            # the shell, and taken from it the shell would be left without it.
            if os.tcgetpgrp(terminal) == tree.pid:
                os.tcsetpgrp(terminal, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
