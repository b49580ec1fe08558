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
from collections.abc import Callable
from typing import Protocol

from ._leader import Leader
from ._procfs import process_table, read_stat
from ._spawn import SpawnPlan

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

    #: ``"cgroup"``, ``"subreaper"`` or ``"group"``.
    name: str

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        """The spawn request adjusted so the leader starts inside the containment."""
        ...

    def attach(self, leader: Leader) -> None:
        """Take charge of the tree whose leader has just started."""
        ...

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process in the tree."""
        ...

    def kill(self) -> None:
        """Hard-stop every process in the tree."""
        ...

    def pending(self) -> Pending:
        """Pidfds to wait on (any turning readable: ask again); [] once the tree is empty."""
        ...

    @property
    def lingering(self) -> int:
        """How many processes other than the leader were still running after it exited."""
        ...

    @property
    def escapees(self) -> int:
        """How many members outside the tree's process group cleanup found (and stopped)."""
        ...

    def release(self) -> None:
        """Free what the containment holds. Called once, at the end of cleanup."""
        ...


def exited(pidfd: int) -> bool:
    """Whether the pidfd's process has exited (its pidfd is readable)."""
    poller = select.poll()  # not select(): pidfds of many trees go past fd 1024
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def forget_exited(watched: dict[int, int], also: Callable[[int], bool]) -> None:
    """Drop (and close) the pidfds in ``watched`` whose process exited, or that ``also`` names."""
    poller = select.poll()
    for fd in watched.values():
        poller.register(fd, select.POLLIN)
    gone = {fd for fd, _ in poller.poll(0)}
    for pid, fd in list(watched.items()):
        if fd in gone or also(pid):
            del watched[pid]
            os.close(fd)


def close_all(watched: dict[int, int]) -> None:
    for fd in watched.values():
        os.close(fd)
    watched.clear()


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
    if now is None or not now.alive or now.pgid != pgid or exited(fd):
        os.close(fd)
        return None
    return fd


class ProcessGroupContainment:
    """The tree is the leader's process group (pgid == leader pid).

    Misses descendants that leave the group (``setsid()``, ``setpgid()``): daemons and
    ``setsid -f`` escape it. Signals go to the group with ``killpg`` while the leader's
    unreaped zombie pins the pgid; members are found by scanning /proc once the leader
    has exited.
    """

    name = "group"

    def __init__(self) -> None:
        self._watched: dict[int, int] = {}  # pid -> pidfd of members believed alive
        self._started = False
        self._scan_after: int | None = None
        self._lingering: set[int] = set()

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        return plan  # plan_spawn already gives the leader a group of its own

    def attach(self, leader: Leader) -> None:
        self._leader = leader
        self._pgid = leader.pid

    @property
    def lingering(self) -> int:
        return len(self._lingering)

    @property
    def escapees(self) -> int:
        return 0  # a process group cannot see them

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

    def watch_leader(self, watched: dict[int, int]) -> None:
        """Start watching the leader (unless it was reaped elsewhere: its pid may be reused)."""
        if self._leader.pins_group:
            watched[self._leader.pid] = os.pidfd_open(self._leader.pid)

    def pending(self) -> Pending:
        if not self._started:
            self._started = True
            self.watch_leader(self._watched)
        forget_exited(self._watched, also=self._left_group)
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
                self._watched[pid] = fd
        return list(self._watched.values())

    def _left_group(self, pid: int) -> bool:
        """Whether member ``pid`` has left the group (so it escapes the tree)."""
        if pid == self._leader.pid:
            return False
        stat = read_stat(pid)
        if stat is not None and stat.pgid != self._pgid:
            logger.debug("pid %d left process group %d; it escapes the tree", pid, self._pgid)
            return True
        return False

    def release(self) -> None:
        close_all(self._watched)
