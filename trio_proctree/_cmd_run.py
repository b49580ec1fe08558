"""``trio-proctree run``: a tree-aware ``timeout(1)``.

coreutils ``timeout`` signals its own process group, which misses every descendant that
leaves it; this runs the command as a contained tree, so a time limit, or a signal to
this command, stops all of it: gracefully first, certainly second.

Exit status, as ``timeout`` has it: the command's own; 124 when ``--timeout`` expired; 125
when this tool failed (or could not make sure the tree is gone); 126 when the command is
not executable; 127 when it is not found; 128+N when a signal N ended the command, the
status a shell shows for it, which a program running this tool sees too (``timeout`` and
``sudo`` end by the signal instead: such a program sees minus N). After a stop request
(SIGTERM, SIGINT, SIGHUP), which stops the tree (at once, during a stop already under
way), this tool ends by that signal, so that a script running it in a loop stops on
Ctrl-C (bash stops a script only for a child that died of SIGINT); so it does when the
command, holding the terminal, died of the Ctrl-C (or Ctrl-\\) that only it got.
An interactive command keeps the terminal, in a group of its own; under job control this
tool stops when its command stops, as ``sudo`` does (`_job_control`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import logging
import math
import os
import resource
import signal
from collections.abc import AsyncIterator, Generator, Sequence

import attrs
import trio

from ._choose import ContainmentUnavailable
from ._job_control import Terminal, owned_terminal
from ._outcome import CleanupError
from ._said import complain, flush_said
from ._trio import ProcessTree, main_thread_only, open_process_tree, unwrapped

TIMED_OUT = 124
TOOL_FAILED = 125
NOT_EXECUTABLE = 126
NOT_FOUND = 127

#: Signals that ask this tool to stop the tree and exit.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Signals passed on to the command's process group, as timeout(1) passes on SIGQUIT: each
#: ends a process that has no handler for it, and is the command's to act on (Ctrl-\\ or
#: `kill -QUIT` for a JVM's thread dump; `kill -USR1` for a server to reopen its logs).
#: Left to their default action, this tool died of them, and its watchdog SIGKILLed the
#: tree. (Faults, SIGSEGV and the like, are this process's own: not passed on.)
PASSED_ON = tuple(
    getattr(signal, name)
    for name in ("SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGPWR")
    if hasattr(signal, name)
)


@attrs.frozen
class RunOptions:
    command: Sequence[str]
    grace: float
    stop_signal: int
    timeout: float | None
    containment: str
    #: The descriptors above 2 passed on to the command (`inherited_descriptors`).
    pass_fds: tuple[int, ...] = ()


def run(options: RunOptions) -> int:
    """Run the command; its exit status (see the module's docstring). Ends this process
    by a signal where a stop request came, or a Ctrl-C that only the command got."""
    if not options.command[0]:
        # As timeout(1) says it: an empty variable (`run -- "$CMD"`) is no program. Raised
        # by the library as a ValueError, it came out as a traceback with status 1, the
        # status of a command that failed (helper-61).
        complain("'': command not found (an empty program name)")
        return NOT_FOUND
    options = attrs.evolve(options, pass_fds=inherited_descriptors())
    children_reaped_by_us()
    with _warnings_named_as_the_tool():
        try:
            returncode = trio.run(_run, options)
        except (OSError, ContainmentUnavailable, NotImplementedError, CleanupError) as exc:
            return _failed(options.command[0], exc)
    return end_by(-returncode) if returncode < 0 else returncode


def children_reaped_by_us() -> None:
    """SIGCHLD back to its default, where this tool inherited it ignored from whatever
    started it: Linux would then reap its children as they end, their exit statuses
    with them (the library refuses to start a tree so). Ours to set, as timeout(1) sets
    it; the command then gets the default, as there (helper-70)."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def inherited_descriptors() -> tuple[int, ...]:
    """The descriptors above 2 this process was started with, to pass on to the command as
    timeout(1) does: a process substitution's ``/dev/fd/63``, make's jobserver, a lock
    held for the command. Closed, as Popen closes what it is not told to pass, they were
    lost to it (helper-61). Those marked close-on-exec were not meant for a child, and
    none of this process's own is passed: Python opens them so (PEP 446)."""
    passed: list[int] = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                passed.append(fd)
        except OSError:
            continue  # (the listing's own, closed by now)
    return tuple(sorted(passed))


@contextlib.contextmanager
def _warnings_named_as_the_tool() -> Generator[None]:
    """The library's warnings (a grace that ran out, say) on stderr as the tool's own
    messages are, after its name: left to Python's last-resort handler, they came with
    no name, and a CI log did not say which tool wrote them."""
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("trio-proctree: %(message)s"))
    logger = logging.getLogger("trio_proctree")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _failed(name: str, exc: Exception) -> int:
    """Say why the command could not run, and the exit status that says so."""
    if isinstance(exc, FileNotFoundError):
        complain(f"{name}: command not found ({exc.strerror})")
        return NOT_FOUND
    # Not executable, found but no program the kernel runs, or a path through a file.
    if isinstance(exc, (PermissionError, NotADirectoryError)) or (
        isinstance(exc, OSError) and exc.errno == errno.ENOEXEC
    ):
        complain(f"{name}: {exc.strerror}")
        return NOT_EXECUTABLE
    complain(str(exc))
    return TOOL_FAILED


def end_by(sig: int) -> int:
    """End this process by signal ``sig`` (the tree is gone by now); 128+N if it lives on
    (a signal whose default action is not to end a process)."""
    # What a normal exit does first: the watchdog told we are done and waited for, the
    # output flushed. (A signal's end runs no atexit hook.)
    atexit._run_exitfuncs()
    flush_said(ending_by_signal=True)
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
    # The terminal is taken back only once the tree is stopped: a program stopped at the
    # --timeout (an editor) restores the terminal's settings as it ends, which it can do
    # only in the foreground.
    with owned_terminal() as terminal:
        return await _run_with(options, terminal)


async def _run_with(options: RunOptions, terminal: Terminal | None) -> int:
    """`_run`, given our controlling terminal (`owned_terminal`), or None."""
    interactive = terminal is not None
    timed_out = False
    keys_pressed = False  # the command, holding the terminal, died of Ctrl-C or Ctrl-\\
    requested: list[int] = []  # the stop requests received, in order
    passed_on: set[int] = set()  # the signals this tool passed on to the command
    # Signals are received from here on, so none can end us before the tree is stopped;
    # and until the end, so none is redelivered as we leave (trio's receiver does that to
    # signals left pending: a traceback, or death by it, and the command's status lost).
    # An interactive command's stops are followed (SIGCHLD), and this tool's stops and
    # continues (SIGTSTP, SIGCONT) passed on to it: `_job_control`.
    job_control = (signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP)
    # SIGQUIT and the like are passed on to the command (`PASSED_ON`, `_answer`). A signal
    # this tool inherited ignored stays ignored: nohup's SIGHUP, and SIGINT and SIGQUIT for
    # a script's command in the background (a Ctrl-C for the foreground is not for it).
    received = (
        *(sig for sig in (*STOP_REQUESTS, *PASSED_ON) if signal.getsignal(sig) != signal.SIG_IGN),
        *(job_control if interactive else ()),
    )
    with trio.open_signal_receiver(*received) as requests, main_thread_only(received), unwrapped():
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
                pass_fds=options.pass_fds,
            ) as tree:
                if terminal is not None:
                    terminal.hand_to(tree.pid)  # (its group's id: a group of its own)
                with trio.CancelScope() as waiting:
                    answer = functools.partial(_answer, terminal=terminal, passed_on=passed_on)
                    answering.start_soon(answer, requests, requested, waiting, stopping, tree)
                    timeout = math.inf if options.timeout is None else options.timeout
                    with trio.move_on_after(timeout) as deadline:
                        returncode = await tree.wait()
                        keys = (signal.SIGINT, signal.SIGQUIT)
                        if -returncode in keys and -returncode not in passed_on and terminal:
                            # Its Ctrl-C, passed on to a caller where it had the terminal.
                            keys_pressed = terminal.pass_on(-returncode)
                    timed_out = deadline.cancelled_caught
                stopping.set()
                # Leaving the block stops whatever is still running: the whole escalation
                # (cut short by a second stop request: `_answer`).
            # The tree is gone: the task answering signals would wait for the next one
            # for ever, and the nursery with it.
            answering.cancel_scope.cancel()
    assert tree.outcome is not None and tree.outcome.returncode is not None
    if requested:
        return -requested[0]
    if timed_out:
        return TIMED_OUT
    returncode = tree.outcome.returncode
    if returncode < 0 and not keys_pressed:
        # 128+N, what a shell shows, for a program that runs this tool as for a shell. Not
        # for keys pressed at the terminal the command held: bash stops a script on
        # Ctrl-C only for a child that died of SIGINT, so this tool ends by it (`end_by`).
        return 128 - returncode
    return returncode


async def _answer(
    requests: AsyncIterator[int],
    requested: list[int],
    waiting: trio.CancelScope,
    stopping: trio.Event,
    tree: ProcessTree,
    *,
    terminal: Terminal | None,
    passed_on: set[int],
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
                terminal.follow_a_stop(tree.pid)
            continue
        if sig in PASSED_ON:
            # Ctrl-\\ where the tool's group has the terminal (run by a script), a kill
            # -QUIT or -USR1: the command's to act on (a JVM prints its threads and runs on,
            # a server reopens its logs), not this tool's death without its cleanup.
            # To the group, as a terminal sends them to its foreground job: a daemon or an
            # escapee that left it has left the job too.
            if tree.outcome is None:  # (not yet reaped: the leader pins the group id)
                # (Noted: should it end the command, that was no key pressed at the
                # terminal, for the caller to get too.)
                passed_on.add(sig)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(tree.pid, sig)
            continue
        if sig in (signal.SIGCONT, signal.SIGTSTP):
            if terminal is not None and tree.outcome is None:  # (not yet reaped)
                if sig == signal.SIGCONT:
                    terminal.resume()
                elif not (requested or stopping.is_set()):
                    terminal.stop_the_tree()
            continue
        requested.append(sig)
        if stopping.is_set() or len(requested) > 1:
            tree.kill()
        else:
            waiting.cancel()
