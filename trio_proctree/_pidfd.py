"""Processes named by pidfd: opened, pinned, signalled, looked at, never another
process that took the same pid."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
from collections.abc import Callable

from ._orphans import is_subreaper
from ._procfs import ProcStat, read_stat


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; None if no process has that pid (any more). Raises OSError
    for anything else (out of file descriptors, say).

    A pid whose process is gone while the number lives on as a process group's id (a
    reaped group leader with members), or has been taken as a thread's id, is EINVAL to
    kernels before 6.15; since, ESRCH and ENOENT (no process, a thread's id).
    """
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, FileNotFoundError):
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def exited(pidfd: int) -> bool:
    """Whether the pidfd's process has exited (its pidfd is readable)."""
    poller = select.poll()  # not select(): pidfds of many trees go past fd 1024
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def signal_pidfd(pidfd: int, sig: int) -> None:
    """Send ``sig`` through a pidfd; a process that has exited meanwhile is not an error.

    (Its pidfd still names it, so no other process can receive the signal.)
    """
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


class Pidfds(dict[int, int]):
    """pid -> pidfd, for members believed alive. Closes the pidfds it opened; the leader's,
    borrowed from the tree (one pidfd per tree, not two: file descriptors run out first
    when hundreds of trees are torn down at once), it leaves open."""

    def __init__(self) -> None:
        super().__init__()
        self._borrowed: set[int] = set()

    def borrow(self, pid: int, fd: int) -> None:
        self[pid] = fd
        self._borrowed.add(fd)

    def forget_exited(self, also: Callable[[int], bool] = lambda pid: False) -> None:
        """Drop the pidfds whose process exited, or that ``also`` names.

        A member that exited as our child (it re-parented to us, a subreaper) is reaped
        through its pidfd, which names that very process: zombies do not pile up.
        """
        poller = select.poll()
        for fd in self.values():
            poller.register(fd, select.POLLIN)
        gone = {fd for fd, _ in poller.poll(0)}
        reaping = is_subreaper()  # else no member other than the leader is our child
        for pid, fd in list(self.items()):
            if reaping and fd in gone and fd not in self._borrowed:
                with contextlib.suppress(ChildProcessError):  # not our child: not ours to reap
                    os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
            if fd in gone or also(pid):
                self._drop(pid)

    def close_all(self) -> None:
        for pid in list(self):
            self._drop(pid)

    def _drop(self, pid: int) -> None:
        # (Dropped once, whoever asks twice: the net at interpreter exit and a daemon
        # thread's loop both pruned this table, helper-94; they now take turns, under
        # the tree's lock.)
        fd = self.pop(pid, None)
        if fd is not None and fd not in self._borrowed:
            os.close(fd)


#: ``pidfd_send_signal``'s flag for the process group led by the pidfd's process (Linux
#: 6.9+): the kernel finds the group by the object behind its id, not by the number, so a
#: signal sent so reaches the group's members even once the leader has been reaped, and
#: never a later group that took the same id. Older kernels refuse it (EINVAL).
PIDFD_SIGNAL_PROCESS_GROUP = 4


def signal_group_of(pidfd: int, sig: int) -> bool:
    """``sig`` (0: none, only a look) to the process group that the pidfd's process led:
    whether the group still had a member. Raises OSError where the kernel cannot do it
    (EINVAL before Linux 6.9; EBADF for a closed pidfd)."""
    try:
        signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except ProcessLookupError:
        return False
    return True


def pin_process(pid: int, still_ours: Callable[[ProcStat], bool]) -> tuple[int, ProcStat] | None:
    """A pidfd for ``pid``, and its stat, if it is a live process ``still_ours`` accepts.

    The pid may have been recycled since a listing saw it. The stat read after the pidfd
    is open, with the pidfd still unreadable (its process not exited) after that read,
    proves the stat and the pidfd describe the same live process. Alive is what the pidfd
    says: /proc shows a process whose main thread exited as a zombie while its other
    threads run on.
    """
    if (fd := open_pidfd(pid)) is None:
        return None
    try:
        stat = read_stat(pid)
        if stat is None or not still_ours(stat) or exited(fd):
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return fd, stat
