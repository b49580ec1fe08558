"""The terminal under ``trio-proctree run``: the tree runs in this tool's session, in a
process group of its own, gets the terminal when it is to have it, and its stops make
this tool's job a stopped job to the shell.

The shell knows this tool's process group (its job), not the tree's. Ctrl-Z stops the
group that has the terminal, the tree's: left at that, the shell would wait for this tool
for ever. So this tool stops its own group the same way when the tree stops, as ``sudo``
does, and when the shell continues it (``fg``, ``bg``) it continues the tree's group,
handing it the terminal again only in the foreground.

The tree gets the terminal at once only when this tool leads a job of its own in the
foreground (typed at a shell): a caller that shares this tool's group (a script, xargs,
make, a Python program) would lose Ctrl-C to the tree. There, and in the background, the
tree gets it when it stops for it (a read: SIGTTIN), as a job's reader would; and a
Ctrl-C that ended the tree while it had the terminal goes on to that caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

from ._procfs import read_stat, scan


class Terminal:
    """Our controlling terminal, open (`owned_terminal`). ``leads``: this tool is a job of
    its own in the foreground, and the tree gets the terminal at once."""

    def __init__(self, fd: int, *, leads: bool) -> None:
        self.fd = fd
        #: The tree's process group, once it runs (`hand_to`).
        self.group: int | None = None
        #: Whether the terminal is the tree's in the foreground: from the start when this
        #: tool leads its job, else from the tree's first stop for it.
        self.given = leads
        self._ttou: Callable[[int, FrameType | None], Any] | int | None = None

    def hand_to(self, group: int) -> None:
        """The tree's group runs: give it the terminal if it is to have it now (so that it
        can read it and gets Ctrl-C), and continue it: started before this, it may have
        read the terminal as a background reader and stopped (SIGTTIN)."""
        # Ignored from here on, not before the spawn (the tree would inherit it): this
        # tool's tcsetpgrp from the background would stop it.
        self._ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        self.group = group
        self.resume()

    def held_by_the_tree(self) -> bool:
        """Whether the tree's group is the terminal's foreground group now."""
        try:
            return self.group is not None and os.tcgetpgrp(self.fd) == self.group
        except OSError:
            return False

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
            if self.given and os.tcgetpgrp(self.fd) == os.getpgrp():
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
                # in the foreground (fg) before it stopped for it, or a reader that this
                # tool's caller shares the terminal with: from now on it is the tree's.
                self.given = True
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

    def pass_on(self, sig: int) -> bool:
        """The tree's leader ended by ``sig`` (Ctrl-C, Ctrl-\\): if the tree had the
        terminal, the rest of this tool's group would have got ``sig`` too, had the tree
        been in it. Send it to them (a script running this tool in a loop stops on Ctrl-C
        only if it got SIGINT itself); not to this tool, whose end tells of it. Whether the
        tree had the terminal (and so the key was pressed for it)."""
        if not self.held_by_the_tree():  # (its zombie leader, unreaped, pins the group)
            return False
        for pid in scan().in_group(os.getpgrp()):
            if pid == os.getpid():
                continue
            try:
                pidfd = os.pidfd_open(pid)  # (a pid recycled since the scan is not signalled)
            except OSError:
                continue
            try:
                with contextlib.suppress(ProcessLookupError):
                    stat_ = read_stat(pid)
                    if stat_ is not None and stat_.pgid == os.getpgrp():
                        signal.pidfd_send_signal(pidfd, sig)
            finally:
                os.close(pidfd)
        return True

    def close(self) -> None:
        """Take the terminal back from the tree's group, if it has it, or from a group
        gone (a job of a shell in the tree, left the terminal and killed with it); not
        from the shell: a tree continued in the background left it the terminal. Then
        close it."""
        try:
            if self.group is not None:
                with contextlib.suppress(OSError):
                    foreground = os.tcgetpgrp(self.fd)
                    if foreground != os.getpgrp() and (
                        foreground == self.group or not _has_live_members(foreground)
                    ):
                        os.tcsetpgrp(self.fd, os.getpgrp())
            if self._ttou is not None:
                signal.signal(signal.SIGTTOU, self._ttou)
        finally:
            os.close(self.fd)


@contextlib.contextmanager
def owned_terminal() -> Generator[Terminal | None]:
    """Our controlling terminal; None where there is none (cron, CI, a service), and the
    tree then gets a session of its own.

    The controlling terminal, not stdin: ``run -- sudo make < input`` prompts on it. The
    tree gets it at once only when this tool is a job of its own in the foreground: it
    leads its process group, alone. The commands of a pipeline share a group (``run --
    git log | less``, led by the first): handed to the tree, the terminal would be taken
    from the others (a reader's read of it would stop it).
    """
    try:
        # (O_NONBLOCK: the open of a serial line may wait for its carrier, else.)
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None  # no controlling terminal
        return
    ours = os.getpid()
    try:
        leads = os.tcgetpgrp(fd) == os.getpgrp() == ours and _alone_in_group(ours)
    except OSError:
        leads = False
    terminal = Terminal(fd, leads=leads)
    try:
        yield terminal
    finally:
        terminal.close()


def _alone_in_group(group: int) -> bool:
    """Whether no other process of process group ``group`` runs. (A shell puts each
    command of a pipeline in its group before it runs it: by now they all are.)"""
    return not any(
        pid != os.getpid() and (stat_ := read_stat(pid)) is not None and stat_.alive
        for pid in scan().in_group(group)
    )


def _has_live_members(group: int) -> bool:
    """Whether a process of process group ``group`` still runs."""
    return any(
        (stat_ := read_stat(pid)) is not None and stat_.alive for pid in scan().in_group(group)
    )


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
