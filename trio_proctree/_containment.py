"""How a tree is held together and stopped: the containment interface and the process-group one.

A containment knows who belongs to the tree. It signals them all, and tells the driver
which file descriptors to wait on until the tree is empty. It does no waiting itself, so
the trio and asyncio drivers share it.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import signal
import time
from typing import Protocol

from ._leader import Leader
from ._procfs import process_table, read_stat

logger = logging.getLogger("trio_proctree")


class NeedScan(enum.Enum):
    """Returned by `Containment.pending` when the next answer needs a /proc scan.

    The driver yields to its event loop once and asks again, so that all the teardowns
    that reach this point together share one scan.
    """

    NEED_SCAN = enum.auto()


NEED_SCAN = NeedScan.NEED_SCAN
Pending = list[int] | NeedScan


class ContainmentLost(OSError):
    """The tree can no longer be signalled without risking processes outside it."""


class Containment(Protocol):
    """What the drivers need from a containment strategy."""

    #: ``"group"`` (and later ``"cgroup"``, ``"subreaper"``).
    name: str

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process in the tree."""
        ...

    def kill(self) -> None:
        """Hard-stop every process in the tree."""
        ...

    def pending(self) -> Pending:
        """File descriptors to wait on (any turning readable: ask again); [] once empty."""
        ...

    @property
    def lingering(self) -> int:
        """How many processes other than the leader were still running after it exited."""
        ...

    def release(self) -> None:
        """Free what the containment holds. Called once, after the leader is reaped."""
        ...


def open_member_pidfd(pid: int, pgid: int) -> int | None:
    """A pidfd for ``pid`` if it is a live process in group ``pgid``, else None.

    The pid may have been recycled since a scan saw it. The stat read after the pidfd is
    open, with the pidfd still unreadable (its process not exited) after that read, proves
    the stat and the pidfd describe the same live process.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    now = read_stat(pid)
    if now is None or not now.alive or now.pgid != pgid or _exited(fd):
        os.close(fd)
        return None
    return fd


def _exited(pidfd: int) -> bool:
    poller = select.poll()  # not select(): pidfds of many trees go past fd 1024
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class ProcessGroupContainment:
    """The tree is the leader's process group (pgid == leader pid).

    Misses descendants that leave the group (``setsid()``, ``setpgid()``): daemons and
    ``setsid -f`` escape it. Signals go to the group with ``killpg`` while the leader's
    unreaped zombie pins the pgid; members are found by scanning /proc once the leader
    has exited.
    """

    name = "group"

    def __init__(self, leader: Leader) -> None:
        self._leader = leader
        self._pgid = leader.pid
        self._watched: dict[int, int] = {}  # pid -> pidfd of members believed alive
        self._started = False
        self._scan_after: int | None = None
        self._lingering: set[int] = set()

    @property
    def lingering(self) -> int:
        return len(self._lingering)

    def signal(self, sig: int) -> None:
        if not self._leader.pins_group:
            # The pgid may belong to a new, unrelated group by now: signalling it could hit
            # processes outside the tree.
            raise ContainmentLost(
                f"cannot signal process group {self._pgid}: its leader was reaped elsewhere"
            )
        try:
            os.killpg(self._pgid, sig)
        except ProcessLookupError:
            pass  # nothing left in the group, not even the leader's zombie

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def pending(self) -> Pending:
        if not self._started:
            self._started = True
            if self._leader.pins_group:  # else its pid may be someone else's by now
                self._watch(self._leader.pid, os.pidfd_open(self._leader.pid))
        self._forget_gone()
        if self._watched:
            return list(self._watched.values())
        # Every member we knew of has exited. Any other one must show up in a scan taken
        # after that moment; ask the driver to yield first so concurrent teardowns share it.
        if self._scan_after is None:
            self._scan_after = time.monotonic_ns()
            return NEED_SCAN
        snapshot = process_table.snapshot(not_before=self._scan_after)
        self._scan_after = None
        if not self._leader.pins_group:
            # Without the pin a process in this pgid may be a stranger: watch nobody new.
            return []
        for pid in snapshot.in_group(self._pgid):
            fd = open_member_pidfd(pid, self._pgid)
            if fd is not None:
                self._lingering.add(pid)
                self._watch(pid, fd)
        return list(self._watched.values())

    def _watch(self, pid: int, fd: int) -> None:
        self._watched[pid] = fd

    def _forget_gone(self) -> None:
        """Drop members that exited, and members that left the group (escaped it)."""
        poller = select.poll()
        for fd in self._watched.values():
            poller.register(fd, select.POLLIN)
        exited = {fd for fd, _ in poller.poll(0)}
        for pid, fd in list(self._watched.items()):
            if fd not in exited and pid != self._leader.pid:
                stat = read_stat(pid)
                if stat is not None and stat.pgid != self._pgid:
                    logger.debug(
                        "pid %d left process group %d; it escapes the tree", pid, self._pgid
                    )
                    exited.add(fd)
            if fd in exited:
                del self._watched[pid]
                os.close(fd)

    def release(self) -> None:
        for fd in self._watched.values():
            os.close(fd)
        self._watched.clear()
