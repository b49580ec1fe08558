"""``trio-proctree run``: a tree-aware ``timeout(1)``.

coreutils ``timeout`` signals its own process group, which misses every descendant that
leaves it; this runs the command as a contained tree, so a time limit, or a signal to
this command, stops all of it: gracefully first, certainly second.

Exit status, as ``timeout`` has it: the command's own; 128+N if a signal N ended it; 124
when ``--timeout`` expired; 125 when this tool failed; 126 when the command is not
executable; 127 when it is not found.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import sys
from collections.abc import Generator, Sequence

import attrs
import trio

from ._choose import ContainmentUnavailable
from ._trio import ProcessTree, open_process_tree

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


def exit_status(returncode: int) -> int:
    """A shell's view of a return code: minus N (killed by signal N) becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def run(options: RunOptions) -> int:
    try:
        return trio.run(_run, options)
    except FileNotFoundError as exc:
        _complain(f"{options.command[0]}: command not found ({exc.strerror})")
        return NOT_FOUND
    except PermissionError as exc:
        _complain(f"{options.command[0]}: {exc.strerror}")
        return NOT_EXECUTABLE
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:  # found, but no program the kernel runs
            _complain(f"{options.command[0]}: {exc.strerror}")
            return NOT_EXECUTABLE
        _complain(str(exc))
        return TOOL_FAILED
    except (ContainmentUnavailable, NotImplementedError) as exc:
        _complain(str(exc))
        return TOOL_FAILED


def _complain(message: str) -> None:
    sys.stderr.write(f"trio-proctree: {message}\n")


async def _run(options: RunOptions) -> int:
    interactive = _owns_terminal()
    timed_out = False
    # Signals are received from here on, so none can end us before the tree is stopped.
    with trio.open_signal_receiver(*STOP_REQUESTS) as requests:
        async with open_process_tree(
            options.command,
            grace=options.grace,
            stop_signal=options.stop_signal,
            containment=options.containment,
            # A session of its own detaches the command from the terminal: interactive
            # commands keep ours, in a group of their own that gets the terminal.
            start_new_session=not interactive,
        ) as tree:
            with _terminal_handed_to(tree if interactive else None):
                async with trio.open_nursery() as nursery:

                    async def stop_on_request() -> None:
                        async for _ in requests:
                            nursery.cancel_scope.cancel()

                    nursery.start_soon(stop_on_request)
                    timeout = math.inf if options.timeout is None else options.timeout
                    with trio.move_on_after(timeout) as deadline:
                        await tree.wait()
                    timed_out = deadline.cancelled_caught
                    nursery.cancel_scope.cancel()
            # Leaving the block stops whatever is still running: the whole escalation.
    assert tree.outcome is not None and tree.outcome.returncode is not None
    if timed_out:
        return TIMED_OUT
    return exit_status(tree.outcome.returncode)


def _owns_terminal() -> bool:
    """Whether stdin is a terminal whose foreground process group is ours."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


@contextlib.contextmanager
def _terminal_handed_to(tree: ProcessTree | None) -> Generator[None]:
    """Make the tree's group the terminal's foreground group (so the command can read from
    it and gets Ctrl-C), and take the terminal back afterwards."""
    if tree is None:
        yield
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background tcsetpgrp stops us
    try:
        os.tcsetpgrp(0, tree.pid)
        # The command runs from its spawn on, before this: one that read the terminal
        # meanwhile got SIGTTIN, as a background reader, and stopped. It may read now.
        tree.send_signal(signal.SIGCONT)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(0, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
