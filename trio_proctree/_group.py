"""Process-group containment: the tree is the leader's group, reached with ``killpg``
while the leader's zombie pins the group's id (and through its pidfd after that)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

from . import _watchdog as watchdog
from ._containment import NEED_SCAN, ContainmentLost, Pending, signal_leader_alone
from ._leader import Leader
from ._orphans import reap_orphans
from ._pidfd import Pidfds, pin_process, signal_group_of, signal_pidfd
from ._procfs import ProcStat, Snapshot, process_table, read_stat
from ._spawn import Spawned, SpawnPlan

logger = logging.getLogger("trio_proctree")


class ProcessGroupContainment:
    """The tree is the leader's process group (pgid == leader pid).

    Misses descendants that leave the group (``setsid()``, ``setpgid()``): daemons and
    ``setsid -f`` escape it. Signals go to the group with ``killpg`` while the leader's
    unreaped zombie pins the pgid; members are found by scanning /proc once the leader
    has exited.
    """

    name = "group"
    ask_again_within: float | None = None

    def __init__(self) -> None:
        self._leader: Leader | None = None
        self._watched = Pidfds()
        self._started = False
        self._scan_after: int | None = None
        self._lingering: set[int] = set()
        #: Members found after the leader exited: they linger if still running at
        #: cleanup's next step (else they were dying of the last, or ended on their own).
        self._outliving: set[int] = set()
        #: Whether the group was scanned for them since the leader exited.
        self._scanned_after_exit = False
        #: Members seen to leave the group (`_left_group`): they escape the tree, and
        #: were not stopped by cleanup, though they may have lingered at a step.
        self._left: set[int] = set()
        #: Processes found in a group with the tree's id that could be no one's but could
        #: not be told to be the tree's (`Leader.never_watched`): `release` reports them.
        self._left_alone = 0
        #: What the parent-death watchdog kills, should we die before cleanup.
        self.backstop: list[str] = []

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        return plan  # plan_spawn already gives the leader a group of its own

    def started(self, spawned: Spawned) -> None:
        # Registered here, in the spawn's thread the moment the fork returns, not in
        # `attach` once the driver has the result: a parent SIGKILLed in between (a
        # return from a worker thread, ~0.2 ms as a rule and ms on a busy machine) left
        # the tree with no backstop (helper-21: 2 random SIGKILLs in 15, under load).
        self._register(spawned.pid, spawned.started_within, lost=spawned.lost)

    def _register(self, pid: int, started_within: tuple[int, int], *, lost: bool) -> None:
        # A leader reaped before its pidfd opened left its pid to whoever took it next, in
        # the clock tick of its start as often as not: the watchdog would take that one
        # for the leader, and kill its group with us. Such a group is never registered.
        if lost or self.backstop:
            return
        # Named with the leader's start time, that the watchdog must not kill a later
        # group that got the same id: as the clock told it around the fork, not as /proc
        # does (a read of the leader's stat while it starts cost 0.1-0.3 ms). A later
        # group's leader can only start once ours is reaped, after the fork: in the
        # window's last tick at the earliest, as good as an exact start time.
        earliest, latest = started_within
        self.backstop = [f"group {pid} {earliest} {latest}"]
        watchdog.register(*self.backstop)

    def attach(self, leader: Leader, *, register: bool = True) -> None:
        """Take charge of the tree; ``register``: have the watchdog kill the group should
        we die first (not where the containment's own backstop does: a cgroup's is
        registered before the fork, and reaches even a leader still on its way in)."""
        self._leader = leader
        self._pgid = leader.pid
        if register:  # (once: as it started, as a rule)
            self._register(leader.pid, leader.started_within, lost=leader.lost)

    @property
    def lingering(self) -> int:
        return len(self._lingering - self._left)

    @property
    def escapees(self) -> int:
        return 0  # a process group cannot see them

    def signal(self, sig: int, *, escalation: bool = False, leader_only: bool = False) -> bool:
        assert self._leader is not None
        if escalation:
            self._step_taken()
        if leader_only and signal_leader_alone(self._leader, sig):
            with contextlib.suppress(ContainmentLost):  # (as for any signal to the group)
                self._signal(signal.SIGCONT)  # (see signal_leader_alone)
            return True
        # (After the program's kill(), what cleanup finds running was dying of it: like any
        # member found after the leader's exit, it lingers only if still running at
        # cleanup's next step, here its hard stop.)
        self._signal(sig, wake=escalation)
        return False

    def _step_taken(self) -> None:
        """A step of cleanup: who it finds still running, found after the leader exited
        past the step before, lingers (see `_outliving`)."""
        self._watched.forget_exited()
        assert self._leader is not None
        if self._leader.exited and not self._scanned_after_exit:
            # The step that hands the leader's step on to what it left comes as its exit
            # is seen, and the scan that finds what outlived it a yield later (`pending`):
            # scanned now, else what this step stops was never counted as lingering
            # (about one run in thirty, on two cores). Out of file descriptors, say, it is
            # left to `pending`, which says why: the step's signal needs none.
            with contextlib.suppress(OSError):
                self._find_outliving(process_table.snapshot(not_before=time.monotonic_ns()))
        self._lingering.update(pid for pid in self._outliving if pid in self._watched)

    def _signal(self, sig: int, *, wake: bool = False) -> None:
        """The group's signal: by its id while the unreaped leader pins it; else through
        the leader's pidfd, which still names the group once someone else has reaped the
        leader, and never a later group that took its id (Linux 6.9+)."""
        assert self._leader is not None
        if self._leader.pins_group:
            self.signal_pinned(sig, wake=wake)
        else:
            self.signal_through_leader(sig, wake=wake)

    def signal_through_leader(self, sig: int, *, wake: bool = False) -> None:
        """The group's signal through the leader's pidfd, the caller having just seen the
        leader reaped elsewhere. Raises `ContainmentLost` where the kernel cannot."""
        assert self._leader is not None
        try:
            signal_group_of(self._leader.pidfd, sig)
            if wake:
                signal_group_of(self._leader.pidfd, signal.SIGCONT)
        except PermissionError:
            raise  # members we may not signal (one runs as another user): said as it is
        except OSError as exc:
            # By its id, the group may be a new, unrelated one by now: signalling it could
            # hit processes outside the tree.
            raise ContainmentLost(
                f"cannot signal process group {self._pgid} safely: its leader has been "
                f"reaped, and this kernel cannot reach the group through its pidfd ({exc})"
            ) from None

    def group_lives(self) -> bool:
        """Whether the group that the reaped leader led still has a member (False where
        the kernel cannot say: then nobody found by its id is taken for a member)."""
        assert self._leader is not None
        try:
            return signal_group_of(self._leader.pidfd, 0)
        except PermissionError:
            return True  # it has members, if none that we may signal (another user's)
        except OSError:
            return False

    def signal_pinned(self, sig: int, *, wake: bool = False) -> None:
        """``killpg``, the caller having just seen the unreaped leader pin the group id
        (`Leader.pins_group`): asking the kernel again would only delay the signal.
        ``wake``: then SIGCONT, so that stopped members act on ``sig``."""
        assert self._leader is not None
        # A leader kept in the caller's session may have moved to another group of it
        # (setpgid): the group's signal missed it, and it sat out the grace for SIGKILL, or
        # ran on past cleanup under this containment. It is signalled through its pidfd,
        # looked at before the group's signal (after it, one that moved in between would
        # take the signal twice, and a handler would run twice). The look and the signal
        # are two steps, and one that moves in between is missed by both: SIGKILL, which
        # harms nothing twice, goes to it whatever the look says (helper-62).
        leader_moved = not self._leader.heads_session and (
            sig == signal.SIGKILL or self._leader_moved()
        )
        try:
            os.killpg(self._pgid, sig)
            if wake:
                os.killpg(self._pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # nothing left in the group, not even the leader's zombie
        if leader_moved:
            try:
                signal_pidfd(self._leader.pidfd, sig)
                if wake:
                    signal_pidfd(self._leader.pidfd, signal.SIGCONT)
            except PermissionError:
                # A leader we may not signal (it runs a set-user-ID program): SIGKILL went
                # to it unlooked-at, and the group's reached it unless it moved (one that
                # did, and outlives it, is said as such at the end of cleanup). Raised, it
                # turned a refusal the group's signal passes over into a cleanup error.
                if sig != signal.SIGKILL:
                    raise

    def _leader_moved(self) -> bool:
        """Whether the unreaped leader (its pid is still its own) is in another group."""
        assert self._leader is not None
        stat = read_stat(self._leader.pid)
        if stat is None or stat.pgid == self._pgid:
            return False
        logger.debug("leader %d left its process group for %d", self._leader.pid, stat.pgid)
        return True

    def kill(self) -> None:
        self._step_taken()
        self._signal(signal.SIGKILL)  # (a stopped process dies of it: no SIGCONT)

    def watch_leader(self, watched: Pidfds) -> None:
        """Start watching the leader (unless it has been reaped: its pid may be reused)."""
        assert self._leader is not None
        if self._leader.pins_group:
            watched.borrow(self._leader.pid, self._leader.pidfd)

    def pending(self) -> Pending:
        assert self._leader is not None
        if not self._started:
            self._started = True
            self.watch_leader(self._watched)
        self._watched.forget_exited(also=self._left_group)
        if self._watched:
            return list(self._watched.values())
        # Every member we knew of has exited. Any other one must show up in a scan taken
        # after that moment; ask the driver to yield first so concurrent teardowns share it.
        if self._scan_after is None:
            self._scan_after = time.monotonic_ns()
            return NEED_SCAN
        snapshot = process_table.snapshot(not_before=self._scan_after)
        self._scan_after = None
        self._find_outliving(snapshot)
        return list(self._watched.values())

    def _find_outliving(self, snapshot: Snapshot) -> None:
        """Watch the members ``snapshot`` finds in the group, the leader having exited."""
        assert self._leader is not None
        found: dict[int, int] = {}
        try:
            for pid in snapshot.in_group(self._pgid):
                if pid in self._watched:
                    continue  # (found by an earlier scan)
                if (pinned := pin_process(pid, self._in_group)) is not None:
                    found[pid] = pinned[0]
        except OSError:  # out of file descriptors, say: none of them is kept
            for fd in found.values():
                os.close(fd)
            raise
        self._scanned_after_exit = True
        # Asked after the pgids were read: the id was ours all along if the leader still
        # pins it, or if the group it led still has a member (while it has one, its id can
        # be no other group's). Else the leader was reaped elsewhere and the group may have
        # emptied: the id may be another group's by now, and those found strangers.
        if found and not self._leader.pins_group and not self.group_lives():
            for fd in found.values():
                os.close(fd)
            if self._leader.never_watched:
                # Reaped before its pidfd opened, the leader left nothing that names its
                # group: these may be the tree's or another program's. Left alone, and said.
                self._left_alone = max(self._left_alone, len(found))
            return
        for pid, fd in found.items():
            # Outliving the leader: it lingers if still running at cleanup's next step
            # (after one, it may be dying of it; before the first, it may end on its own
            # in the close-stdin step's wait, and then no signal was needed: counted at
            # once, it was, as no other containment counts it).
            self._outliving.add(pid)
            self._watched[pid] = fd

    def _in_group(self, stat: ProcStat) -> bool:
        return stat.pgid == self._pgid

    def _left_group(self, pid: int) -> bool:
        """Whether member ``pid`` has left the group (so it escapes the tree)."""
        if pid == self._pgid:
            return False
        stat = read_stat(pid)
        if stat is not None and stat.pgid != self._pgid:
            logger.debug("pid %d left process group %d; it escapes the tree", pid, self._pgid)
            self._left.add(pid)
            return True
        return False

    def release(self, *, emptied: bool = True, reap: bool = True) -> None:
        """``reap``: reap the group's dead orphans (not when the caller reaps a wider set:
        each reaping reads every child of this process)."""
        self._watched.close_all()
        if self._leader is None:
            return  # the spawn failed: nothing was started, nothing is registered
        if reap and self._leader.pins_group:
            reap_orphans(
                self._pgid,
                lambda stat: stat.pgid == self._pgid,
                parent_thread=self._leader.parent_thread,
            )
        if emptied and self.backstop:  # (none where the containment's own covers the tree)
            watchdog.unregister(*self.backstop)
        if self._left_alone:
            raise ContainmentLost(
                f"process group {self._pgid}: its leader was reaped by other code before "
                f"it could be watched, and {self._left_alone} process(es) in a group with "
                "its id were left alone: they may be the tree's, or another program's"
            )
