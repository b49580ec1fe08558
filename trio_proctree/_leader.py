"""The tree's first process: its exit status read without reaping it, and the final reap.

The leader's zombie is what keeps its process group id reserved: while it is unreaped, no
new process can get that pid, so no new group can get that pgid, and ``killpg`` on it can
only reach our tree. So nothing here reaps until the drivers say the last group signal
has been sent.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess

logger = logging.getLogger("trio_proctree")

# What Popen is told when the leader was reaped by someone else (never reported to users).
LOST = -255

#: Every leader of this process not yet reaped, by pid: a listing of our children (the
#: subreaper's, to find a tree's re-parented members) passes over the other trees'
#: leaders without reading them. Reading each child's /proc files made every teardown
#: cost as much as the number of trees open beside it: 100 trees took 0.8 s, not 0.05.
_unreaped: dict[int, Leader] = {}


def is_unreaped_leader(pid: int) -> bool:
    """Whether ``pid`` is, right now, the leader of one of our trees, not yet reaped.

    Asked of the kernel through the leader's pidfd: a leader that someone else reaped
    (its pid free for a new process, perhaps one of a tree's) is not taken for one.
    """
    leader = _unreaped.get(pid)
    try:
        return leader is not None and leader.pins_group
    except OSError:  # (its tree, in another thread, closed the pidfd just now)
        return False


def _decode(info: os.waitid_result) -> int:
    """The exit status as `subprocess` reports it: the code, or minus the killing signal."""
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class Leader:
    def __init__(
        self,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
        pidfd: int,
        started_within: tuple[int, int] = (0, 0),
        parent_thread: int = 0,
        *,
        lost: bool = False,
        heads_session: bool = False,
    ) -> None:
        #: The Popen that started the leader, if one did: told the exit status when it is
        #: settled, so that it never waits for (or reaps) this pid itself.
        self.popen = popen
        self.pid = pid
        #: Its start time (clock ticks after boot, as /proc gives it) is within these two.
        self.started_within = started_within
        #: The thread of ours that forked it: the parent of what it starts with
        #: ``CLONE_PARENT``, while that thread lives (then the main thread's).
        self.parent_thread = parent_thread
        #: Readable once the leader has exited; owned by the tree, closed after the reap.
        self.pidfd = pidfd
        #: Whether it leads a session of its own, and so can never leave its process group
        #: (one kept in the caller's session can move to another group of it: setpgid).
        self.heads_session = heads_session
        self._returncode: int | None = None
        self.reaped = False
        #: A reap of ours has called ``waitid``: a later "no such child" may be that reap's
        #: own doing, cut short after the call by an exception (a Ctrl-C) before it could
        #: note it, not someone else's.
        self._reap_began = False
        #: Someone else (an ``os.wait()`` elsewhere in the program) reaped the leader: its
        #: process group id is no longer pinned and must not be signalled by its number.
        self.lost = False
        #: Reaped elsewhere before its pidfd opened: its pid, and so its group id, may be
        #: anyone's, and nothing names its group (``pidfd`` is a stand-in).
        self.never_watched = lost
        if lost:
            self._lose(before_its_pidfd=True)
        else:
            _unreaped[pid] = self

    def _unlist(self) -> None:
        # (Only this leader: a new one of ours may have its pid, if someone else reaped it.)
        if _unreaped.get(self.pid) is self:
            _unreaped.pop(self.pid, None)  # (another thread may have just done so)

    def poll(self) -> int | None:
        """The leader's exit status, or None while it runs. Never reaps."""
        if self._returncode is None:
            self._peek()
        return self._returncode

    def _peek(self) -> None:
        """Look at the leader without reaping it: note its exit status, or that it is gone."""
        if self.reaped or self.lost:
            return
        try:
            # By pidfd, not pid: if someone else reaped the leader and its pid went to
            # another child of ours, waitid(P_PID) would report on that one instead.
            # WNOWAIT: the exit is reported, not consumed (the zombie stays).
            info = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            self._gone()
            return
        if info is not None and self._returncode is None:
            self._returncode = _decode(info)

    def _gone(self) -> None:
        """The kernel has no such child: reaped by a reap of ours cut short (its status
        was seen first: `reap` reaps only what `poll` saw exit), else by someone else."""
        if self._reap_began and self._returncode is not None:
            self._reaped()
        else:
            self._lose()

    def _lose(self, *, before_its_pidfd: bool = False) -> None:
        """Note that someone else reaped the leader."""
        self.lost = True
        self._unlist()
        # Popen must never look at this pid again: it may be another child of ours by
        # now, and Popen.poll() would reap that one. Marking Popen settled also keeps
        # it from warning when freed; the value is never shown (ours stays None, or
        # the status seen before the loss).
        if self.popen is not None:
            self.popen.returncode = LOST
        if before_its_pidfd:
            logger.warning(
                "pid %d was reaped by someone else before its pidfd could be opened: its "
                "exit status is lost, and its process group cannot be reached safely",
                self.pid,
            )
        elif self._returncode is not None:
            logger.warning(
                "pid %d was reaped by someone else (its exit status, %d, was seen first): "
                "its process group is reached only through its pidfd from now on (Linux "
                "6.9+)",
                self.pid,
                self._returncode,
            )
        else:
            logger.warning(
                "pid %d was reaped by someone else: its exit status is lost, and its "
                "process group is reached only through its pidfd from now on (Linux 6.9+)",
                self.pid,
            )

    @property
    def exited(self) -> bool:
        """Whether the leader was seen to exit (or to be reaped, by us or someone else) the
        last time the kernel was asked (`poll`, `pins_group`): no syscall of its own."""
        return self.reaped or self.lost or self._returncode is not None

    @property
    def pins_group(self) -> bool:
        """True while the unreaped leader keeps its pgid from being recycled.

        Asked of the kernel every time: an exit status seen earlier says nothing about
        whether someone has reaped the zombie since.
        """
        self._peek()
        return not (self.reaped or self.lost)

    def reap_within(self, timeout: float) -> int | None:
        """Block up to `timeout` seconds for the leader to exit, then reap it (at exit only)."""
        if not (self.reaped or self.lost):
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            poller.poll(timeout * 1000)
        return self.reap()

    def reap(self) -> int | None:
        """Reap the leader if it has exited; its exit status, or None if it still runs."""
        if self.reaped or self.lost or self.poll() is None:
            # (Lost: reaped by other code, after its status was seen, maybe; asked again,
            # the kernel said so twice, helper-100.)
            return self._returncode
        self._unlist()  # before the reap frees the pid: then it may be a new process's
        began_before, self._reap_began = self._reap_began, True
        try:
            # Through the pidfd: the very process, even if someone else reaped it and its
            # pid now belongs to another child of ours (then: ECHILD, nothing to reap).
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            # Someone else's reap, unless one of ours was cut short after its waitid
            # (helper-73: a Ctrl-C there, and the leader was said reaped by someone else,
            # its status lost, and cleanup's outcome with it).
            if began_before:
                self._reaped()
            else:
                self._lose()
            return self._returncode
        self._reaped()
        return self._returncode

    def _reaped(self) -> None:
        # Popen must not wait for it again (nor warn that it still runs).
        if self.popen is not None:
            self.popen.returncode = self._returncode
        self.reaped = True
        logger.debug("pid %d reaped, exit status %s", self.pid, self._returncode)


def _forget_the_parents_leaders() -> None:
    # A forked child inherits the table, not the children: they are its parent's.
    _unreaped.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
    os.register_at_fork(after_in_child=_forget_the_parents_leaders)
