"""The containment interface: how the drivers hold a tree together and stop it.

A containment knows who belongs to the tree. It signals them all, and tells the driver
which file descriptors to wait on until the tree is empty. It does no waiting itself, so
the trio and asyncio drivers share it. There are three: the process group
(`._group`), and, tracking the members that leave it (`._member_tracking`), the cgroup
(`._cgroup`) and the child subreaper (`._subreaper`).
"""

from __future__ import annotations

import enum
from typing import Final, Protocol

from ._leader import Leader
from ._pidfd import signal_pidfd
from ._spawn import Spawned, SpawnPlan


class NeedScan(enum.Enum):
    """Returned by `Containment.pending` when it cannot name pidfds to wait on yet."""

    #: The next answer needs a /proc scan: the driver yields to its event loop once and
    #: asks again, so that all the teardowns that reach this point together share one scan.
    NEED_SCAN = enum.auto()
    #: A look at the tree failed (out of file descriptors, say) and is to be taken again:
    #: the driver pauses first, `ask_again_within` (else `RETRY_PAUSE`).
    RETRY_LATER = enum.auto()
    #: As `RETRY_LATER`, where the failed look was the only way to tell whether anything
    #: is left: a wait that runs out meanwhile ran out with the tree unseen, not running.
    UNSEEN = enum.auto()


NEED_SCAN: Final = NeedScan.NEED_SCAN
RETRY_LATER: Final = NeedScan.RETRY_LATER
UNSEEN: Final = NeedScan.UNSEEN
#: Seconds before a look at the tree that failed is taken again (the first time).
RETRY_PAUSE = 0.05
#: Seconds, at least, of an `ask_again_within` that is due now (0 would read as "none").
RETRY_SOON = 0.001
Pending = list[int] | NeedScan


class ContainmentLost(OSError):
    """The tree can no longer be signalled without risking processes outside it.

    Raised by cleanup (chained onto an exception already in flight, as any cleanup
    error) when other code in the program reaped the tree's leader and nothing is left
    that names its process group: on kernels before Linux 6.9 under group containment,
    or when the leader was reaped before its pidfd could even be opened. What may be
    the tree's is then left alone, and this says so.
    """


class Containment(Protocol):
    """What the drivers need from a containment strategy."""

    #: ``"cgroup"``, ``"subreaper"`` or ``"group"``.
    name: str

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        """The spawn request adjusted so the leader starts inside the containment."""
        ...

    def started(self, spawned: Spawned) -> None:
        """The leader has just been started: register what the parent-death backstop
        needs (called at once, in the spawn's thread, before `attach`)."""
        ...

    def attach(self, leader: Leader) -> None:
        """Take charge of the tree whose leader has just started."""
        ...

    def signal(self, sig: int, *, escalation: bool = False, leader_only: bool = False) -> bool:
        """Send ``sig`` to every process in the tree.

        ``escalation``: as a graceful step of cleanup, so followed by SIGCONT, which wakes
        stopped members to act on ``sig``. A step may reach some members only in a later
        `pending` (a cgroup lists its escapees once the leader has exited, within
        `ask_again_within`); a member first found by a later signal gets the escalation's
        signals before it. ``leader_only``: a step for the leader alone, while it runs
        (`signal_leader_alone`); members found later do not get it.

        Returns whether the signal went to the leader alone (for the leader to pass on).
        """
        ...

    def kill(self) -> None:
        """Hard-stop every process in the tree."""
        ...

    def pending(self) -> Pending:
        """Pidfds to wait on (any turning readable: ask again); [] once the tree is empty;
        `NEED_SCAN` to be asked again after the driver has yielded once, `RETRY_LATER`
        (or `UNSEEN`) after a pause."""
        ...

    #: If not None, the driver asks `pending` again after at most this many seconds, even
    #: if no pidfd turned readable (the containment has a look to take by then).
    ask_again_within: float | None

    @property
    def lingering(self) -> int:
        """How many processes other than the leader were still running after it exited."""
        ...

    @property
    def escapees(self) -> int:
        """How many members outside the tree's process group cleanup found (and stopped)."""
        ...

    def release(self, *, emptied: bool = True) -> None:
        """Free what the containment holds. Called once, at the end of cleanup (or after a
        failed spawn); a tree not known to be ``emptied`` keeps its watchdog backstop."""
        ...


def signal_leader_alone(leader: Leader, sig: int) -> bool:
    """A step for the leader alone: ``sig`` through its pidfd (never another process that
    took its pid). Whether the leader ran to take it: once it has exited, nobody is left
    to pass the step on, and the caller gives it to every process. (The caller then wakes
    every process with SIGCONT: the members the leader is to stop may have been stopped
    with it, by job control, and could not act on its signal.)

    A leader that fails the step during its wait (see `Step`), leaving members running,
    hands it on: cleanup then gives it to every process (`TreeCore._failed`).
    """
    if leader.poll() is not None or leader.reaped or leader.lost:
        return False
    signal_pidfd(leader.pidfd, sig)
    return True
