"""The terminal under ``trio-proctree run``: an interactive command's tree gets it, in a
process group of its own, and the tree's stops make this tool a stopped job to the shell.

The shell knows this tool's process group (its job), not the tree's. Ctrl-Z stops the
group that has the terminal, the tree's: left at that, the shell would wait for this tool
for ever. So this tool stops its own group the same way when the tree stops, as ``sudo``
does, and when the shell continues it (``fg``, ``bg``) it continues the tree's group,
handing it the terminal again only in the foreground.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

from ._procfs import read_stat, scan


class Terminal:
    """Our controlling terminal, open, while this tool's group is its foreground group and
    ours alone (`owned_terminal`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: The tree's process group, once the terminal went to it (`hand_to`).
        self.group: int | None = None
        self._ttou: Callable[[int, FrameType | None], Any] | int | None = None

    def hand_to(self, group: int) -> None:
        """Give the tree's group the terminal (so that it can read it and gets Ctrl-C) and
        continue it: started before this, it may have read the terminal as a background
        reader and stopped (SIGTTIN)."""
        # Ignored from here on, not before the spawn (the tree would inherit it): this
        # tool's tcsetpgrp from the background would stop it.
        self._ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self.group = group
        self.resume()

    def resume(self) -> None:
        """After the hand-over, or once this tool is continued: in the foreground the tree's
        group gets the terminal; continued either way. (bash's ``fg`` of a job running in
        the background sends no SIGCONT: the tree then gets the terminal when it stops for
        it, `follow_a_stop`.)

        Only in the foreground: continued by ``bg`` (or stopped by a Ctrl-Z before the
        hand-over, then ``bg``) this tool must not take the terminal from the shell. (The
        foreground may change between the look and the tcsetpgrp: a window of two system
        calls.) Only the tree's group is continued, as a shell continues a job: members
        that stopped themselves elsewhere (a nested shell's jobs) stay stopped.
        """
        if self.group is None:
            return
        with contextlib.suppress(OSError):
            if os.tcgetpgrp(self.fd) == os.getpgrp():
                os.tcsetpgrp(self.fd, self.group)
        with contextlib.suppress(ProcessLookupError):
            # (The leader, unreaped until cleanup's end, pins the group id.)
            os.killpg(self.group, signal.SIGCONT)

    def stop_the_tree(self) -> None:
        """Ctrl-Z that reached this tool, not the tree: the terminal was not the tree's (it
        came before the hand-over, or ``fg`` brought back a job that ran in the background,
        which bash does without a SIGCONT). The job is the tree too: its stop is followed
        as any (`follow_a_stop`)."""
        if self.group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group, signal.SIGTSTP)

    def follow_a_stop(self, leader: int) -> None:
        """If the tree's leader stopped, stop this tool's job by the same signal; `resume`
        continues it once the shell continues this tool (SIGCONT)."""
        try:
            # Its stop only, never its exit (WEXITED not asked): the leader is reaped by the
            # cleanup, after the last signal to its group.
            stopped = os.waitid(os.P_PID, leader, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:
            return
        if stopped is None or stopped.si_code != os.CLD_STOPPED:
            return  # (another child's SIGCHLD, or the stop was continued meanwhile)
        sig = stopped.si_status
        ours = os.getpgrp()
        with contextlib.suppress(OSError):
            if sig in (signal.SIGTTIN, signal.SIGTTOU) and os.tcgetpgrp(self.fd) == ours:
                # It stopped for the terminal, and the terminal is ours to give: continued
                # in the foreground (fg) before it stopped for it.
                self.resume()
                return
        if _orphaned(ours):
            # No shell would continue this tool: stopped, it would never end, nor would its
            # --timeout. The kernel passes over the terminal's stops for such a job: so
            # does this, for a Ctrl-Z; a SIGSTOP someone sent is theirs to end.
            if sig == signal.SIGTSTP:
                self.resume()
            return
        # (SIGTTOU is ignored while the terminal may be the tree's: its stop must stop us.)
        previous = signal.signal(sig, signal.SIG_DFL) if sig != signal.SIGSTOP else None
        try:
            # The whole job, as sudo does: a script that runs this tool waits for it, and
            # the shell takes a job for stopped once all of it is.
            os.killpg(ours, sig)
        finally:
            if previous is not None:
                signal.signal(sig, previous)

    def close(self) -> None:
        """Take the terminal back from the tree's group, if it has it (not from the shell:
        a tree continued in the background left it the terminal), and close it."""
        try:
            if self.group is not None:
                with contextlib.suppress(OSError):
                    if os.tcgetpgrp(self.fd) == self.group:
                        os.tcsetpgrp(self.fd, os.getpgrp())
            if self._ttou is not None:
                signal.signal(signal.SIGTTOU, self._ttou)
        finally:
            os.close(self.fd)


@contextlib.contextmanager
def owned_terminal() -> Generator[Terminal | None]:
    """Our controlling terminal, if its foreground process group is ours, and ours alone;
    None else (no terminal: cron, CI, a service; or run in the background).

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
        owned = os.tcgetpgrp(fd) == os.getpgrp() and not _group_shared()
    except OSError:
        owned = False
    if not owned:
        os.close(fd)
        yield None
        return
    terminal = Terminal(fd)
    try:
        yield terminal
    finally:
        terminal.close()


def _orphaned(group: int) -> bool:
    """Whether process group ``group`` is orphaned: no member has a parent in another
    group of its session, so no shell can continue it (POSIX's definition)."""
    session = os.getsid(0)
    for member in scan().in_group(group):
        stat_ = read_stat(member)
        parent = None if stat_ is None else read_stat(stat_.ppid)
        if parent is not None and parent.pgid != group and parent.sid == session:
            return False
    return True


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
