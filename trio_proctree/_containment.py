"""How a tree is held together and stopped: the containment interface and the process-group one.

A containment knows who belongs to the tree. It signals them all, and tells the driver
which file descriptors to wait on until the tree is empty. It does no waiting itself, so
the trio and asyncio drivers share it.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from . import _watchdog as watchdog
from ._leader import Leader
from ._orphans import is_subreaper, reap_orphans
from ._pidfd import open_pidfd
from ._procfs import ProcStat, process_table, read_stat
from ._spawn import Spawned, SpawnPlan

logger = logging.getLogger("trio_proctree")


class NeedScan(enum.Enum):
    """Returned by `Containment.pending` when it cannot name pidfds to wait on yet."""

    #: The next answer needs a /proc scan: the driver yields to its event loop once and
    #: asks again, so that all the teardowns that reach this point together share one scan.
    NEED_SCAN = enum.auto()
    #: A look at the tree failed (out of file descriptors, say) and is to be taken again:
    #: the driver pauses first, `ask_again_within` (else `RETRY_PAUSE`).
    RETRY_LATER = enum.auto()


NEED_SCAN: Final = NeedScan.NEED_SCAN
RETRY_LATER: Final = NeedScan.RETRY_LATER
#: Seconds before a look at the tree that failed is taken again (the first time).
RETRY_PAUSE = 0.05
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
        after a pause."""
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
        fd = self.pop(pid)
        if fd not in self._borrowed:
            os.close(fd)


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
        #: Members found after the leader exited, once cleanup had begun its steps: they
        #: linger if still running at the next step (else they were dying of the last).
        self._outliving: set[int] = set()
        self._stepped = False
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
        return len(self._lingering)

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
        self._signal(sig, wake=escalation)
        if sig == signal.SIGKILL:
            # The program's kill() is a step too: what cleanup then finds running was
            # dying of it, and lingers only if still running at cleanup's hard stop.
            self._stepped = True
        return False

    def _step_taken(self) -> None:
        """A step of cleanup: who it finds still running, found after the leader exited
        past the step before, lingers (see `_outliving`)."""
        self._stepped = True
        self._watched.forget_exited()
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
        try:
            os.killpg(self._pgid, sig)
            if wake:
                os.killpg(self._pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # nothing left in the group, not even the leader's zombie

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
        found: dict[int, int] = {}
        try:
            for pid in snapshot.in_group(self._pgid):
                if (pinned := pin_process(pid, self._in_group)) is not None:
                    found[pid] = pinned[0]
        except OSError:  # out of file descriptors, say: none of them is kept
            for fd in found.values():
                os.close(fd)
            raise
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
            return []
        for pid, fd in found.items():
            # Outliving the leader: on its own before cleanup's first step; after one,
            # only if still running at the next (it may be dying of this one).
            (self._outliving if self._stepped else self._lingering).add(pid)
            self._watched[pid] = fd
        return list(self._watched.values())

    def _in_group(self, stat: ProcStat) -> bool:
        return stat.pgid == self._pgid

    def _left_group(self, pid: int) -> bool:
        """Whether member ``pid`` has left the group (so it escapes the tree)."""
        if pid == self._pgid:
            return False
        stat = read_stat(pid)
        if stat is not None and stat.pgid != self._pgid:
            logger.debug("pid %d left process group %d; it escapes the tree", pid, self._pgid)
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


class MemberTracking:
    """What the cgroup and subreaper containments share: the tree's group, plus members
    found by listing and tracked by pidfd from the first time cleanup sees them.

    One pass over the members serves the stop signal, SIGCONT and the wait. Members in
    the group get ``killpg``; escapees (members outside the group) get each signal
    through their pidfds, so a recycled pid is never hit.

    Subclasses say how members are listed (`_list_members`), how one found outside the
    group is confirmed as a member (`_confirm_escapee`) and how all are hard-stopped.
    """

    name: str
    ask_again_within: float | None = None

    def __init__(self) -> None:
        # The group covers the leader even before the members can be listed.
        self._group = ProcessGroupContainment()
        self._leader: Leader | None = None
        self._members = Pidfds()
        self._escapees: set[int] = set()
        self._lingering: set[int] = set()
        self._surveyed = False
        self._emptied = False
        self._sent: list[int] = []  # signals sent so far, replayed to members found later
        #: Whether the last listing met a process it could not place yet (ask again soon).
        self._undecided = False
        #: (pid, starttime) of every member seen, to recognise their zombies later.
        self._seen: set[tuple[int, int]] = set()
        #: Processes the listing under way pinned as it read them: pidfd, and the stat
        #: read after it opened (taken by `_open_member`; the rest closed after the listing).
        self._pinned: dict[int, tuple[int, ProcStat]] = {}
        #: What `group_lives` last said within the `_track` under way, if asked: it holds
        #: for every stat the listing read, all read before it was asked (`_group_lives`).
        self._lives_for_listed: bool | None = None
        #: The first refusal to signal (EPERM: a member runs as another user) met by the
        #: call under way, raised once it has done the rest (`_raise_denied`).
        self._denied: PermissionError | None = None

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        # Registered before the leader starts: if this process is SIGKILLed between the
        # fork and attach(), the watchdog must already know the tree (a process group is
        # only known once its leader runs; that window is the group containment's).
        watchdog.register(*self.backstop)
        return plan

    #: Whether the leader is tracked (and waited on) with the members.
    watches_leader = True
    #: Whether the watchdog also needs the process group (not where the backstop alone
    #: reaches every member).
    backstop_needs_group = True

    def started(self, spawned: Spawned) -> None:
        if self.backstop_needs_group:
            self._group.started(spawned)

    def attach(self, leader: Leader) -> None:
        self._leader = leader
        self._group.attach(leader, register=self.backstop_needs_group)
        if self.watches_leader:
            self._group.watch_leader(self._members)

    @property
    def backstop(self) -> list[str]:
        """What the parent-death watchdog kills, should we die before cleanup."""
        return []

    @property
    def leader(self) -> Leader:
        assert self._leader is not None, "attach() comes first"
        return self._leader

    @property
    def lingering(self) -> int:
        return len(self._lingering)

    @property
    def escapees(self) -> int:
        return len(self._escapees)

    def _list_members(self) -> list[int]:
        """Pids of the tree's live processes (a listing: some may be gone already)."""
        raise NotImplementedError

    def _confirm_escapee(self, pid: int, stat: ProcStat) -> bool:
        """Whether ``pid``, outside the group, is a member (read after its pidfd opened)."""
        raise NotImplementedError

    def _hard_kill(self) -> None:
        raise NotImplementedError

    def _track_new_members(self, give: Sequence[int]) -> tuple[int, list[int]]:
        """Track listed members not tracked yet: (how many were listed, new escapees).
        ``give``: the signals the caller gives new escapees; should the listing fail part
        way (out of file descriptors, say), those it found have them before the error is
        raised, as no later listing returns them again (they are tracked by then)."""
        new_escapees: list[int] = []
        try:
            try:
                listed = self._list_members()
            except OSError:
                if not self._pinned:
                    raise
                # Out of file descriptors, say, with the listing's pins holding some: list
                # again without pinning on the way, so that the members are then pinned one
                # at a time, each with the descriptors it needs for its checks, as many as
                # there is room for (and they get the tree's signals).
                self._unpin()
                self._pin_in_listing = False
                try:
                    listed = self._list_members()
                finally:
                    self._pin_in_listing = True
            self._track(listed, new_escapees)
        except OSError:
            self._signal_escapees(new_escapees, give)
            raise
        finally:
            self._unpin()
        return len(listed), new_escapees

    #: Whether a listing pins the processes it finds as it reads them (`_pinned`).
    _pin_in_listing = True

    def _unpin(self) -> None:
        for fd, _ in self._pinned.values():
            os.close(fd)
        self._pinned.clear()
        self._lives_for_listed = None  # (the next listing reads its stats anew)

    def _pin_listed(self, pids: Iterable[int]) -> None:
        """Pin the listed processes not tracked yet, reading each one's stat (`_pinned`),
        before any is looked at: then one question about the reaped leader's group serves
        them all (`_group_lives`). Out of file descriptors, none is: each is then pinned
        as it is looked at."""
        try:
            for pid in pids:
                if pid in self._members or pid in self._pinned:
                    continue
                if (pinned := pin_process(pid, lambda stat: True)) is not None:
                    self._pinned[pid] = pinned
        except OSError:
            self._unpin()

    def _track(self, pids: Iterable[int], new_escapees: list[int]) -> None:
        """Track those of ``pids`` that are members and not tracked yet."""
        self._lives_for_listed = None  # (asked after every stat the listing read)
        for pid in pids:
            if pid not in self._members:
                fd = self._open_member(pid)
                if fd is not None:
                    self._members[pid] = fd
                    if pid in self._escapees:
                        new_escapees.append(pid)

    def _group_lives(self, *, listed: bool) -> bool:
        """Whether the reaped leader's group has a member, asked after a stat was read:
        one just read, or, ``listed``, one the listing under way read before `_track`
        began. Each question has the kernel go through the whole group: asked for each
        of 2,000 members of a lost leader's group, a teardown took 2.5-4 times as long.
        Any answer given since the listing holds for all the stats it read."""
        if not listed or self._lives_for_listed is None:
            self._lives_for_listed = self._group.group_lives()
        return self._lives_for_listed

    def _open_member(self, pid: int) -> int | None:
        """A pidfd for ``pid`` if it is a live member, noting whether it is an escapee.

        In the tree's process group it is a member while the unreaped leader pins the
        group's id, or, the leader reaped elsewhere, while the group it led has a member;
        otherwise the containment has to confirm it.
        """
        leader = self.leader

        def is_member(stat: ProcStat, *, listed: bool = False) -> bool:
            # A process in the group is a member while the unreaped leader pins the pgid,
            # or, the leader reaped elsewhere, while the group it led (asked through its
            # pidfd, after this stat was read) has a member: an emptied group never gets
            # one again, so its id was ours all along. (Where the kernel cannot say, the
            # containment confirms each member, as an escapee.)
            if stat.pgid == leader.pid and (leader.pins_group or self._group_lives(listed=listed)):
                return True
            if self._confirm_escapee(pid, stat):
                self._escapees.add(pid)
                return True
            return False

        if (pinned := self._pinned.pop(pid, None)) is not None:
            try:
                accepted = is_member(pinned[1], listed=True)
            except BaseException:
                os.close(pinned[0])
                raise
            if not accepted:
                os.close(pinned[0])
                return None
        elif (pinned := pin_process(pid, is_member)) is None:
            return None
        fd, stat = pinned
        self._seen.add((pid, stat.starttime))
        return fd

    def _ours(self, stat: ProcStat) -> bool:
        """Whether a dead process re-parented to us was a member (to reap it).

        One in the group is, while the unreaped leader pins its id, or, the leader reaped
        elsewhere, while the group it led (asked after this stat was read) has a member:
        a zombie is one until it is reaped. (Asked only for one never seen alive: few.)
        """
        assert self._leader is not None
        if (stat.pid, stat.starttime) in self._seen:
            return True
        return stat.pgid == self._leader.pid and (
            self._leader.pins_group or self._group.group_lives()
        )

    def _signal_escapees(self, pids: Iterable[int], signals: Iterable[int]) -> None:
        for pid in pids:
            fd = self._members.get(pid)
            if fd is not None:
                self._signal_member(fd, *signals)

    def _signal_member(self, fd: int, *signals: int) -> None:
        """``signals`` through a member's pidfd; a refusal is kept (`_deny`), and the
        others still get theirs."""
        try:
            for sig in signals:
                signal_pidfd(fd, sig)
        except PermissionError as exc:
            self._deny(exc)

    def _deny(self, refusal: PermissionError) -> None:
        """Keep a refusal to signal, to raise once the call has done the rest: one member
        we may not signal (another user's: a setuid program, sudo) must not keep the others
        from their signal, nor the tree from its hard stop (cgroup.kill needs no right to
        signal anyone)."""
        if self._denied is None:
            self._denied = refusal

    def _raise_denied(self, failed: OSError | None = None) -> None:
        """Raise ``failed``, else the refusal kept (`_deny`), if any."""
        denied, self._denied = self._denied, None
        if failed is not None:
            if denied is not None and failed.__context__ is None:
                failed.__context__ = denied  # (shown with it, not lost)
            elif denied is not None:
                logger.error("a signal was refused during cleanup", exc_info=denied)
            raise failed
        if denied is not None:
            raise denied

    #: Learn the members before the group's signal (else after it, overlapping their exit).
    survey_first = False

    def signal(self, sig: int, *, escalation: bool = False, leader_only: bool = False) -> bool:
        if leader_only and signal_leader_alone(self.leader, sig):
            # No listing: what the leader does not stop is listed at its exit.
            self._wake_all()
            return True
        survey = not (escalation and self._surveyed)  # for an escalation, once
        self._surveyed |= escalation
        listing_failed = None
        found: list[int] = []  # escapees this signal's listing finds
        # What escapees found now get before this signal (a listing that fails part way
        # gives them these, and this signal goes to every escapee known, below).
        earlier = list(self._sent)
        if survey and self.survey_first:
            try:
                _, found = self._track_new_members(give=earlier)
            except OSError as exc:
                # Out of file descriptors, say: the group still gets its signal below (a
                # killpg needs none); the error is raised after it.
                listing_failed = exc
        pins = self.leader.pins_group  # (asks the kernel; `exited` below reads the answer)
        if escalation and self.leader.exited:
            # A step of cleanup taken after the leader exited: what still runs outlived it,
            # and lingers. Counted before the signal, which some of it may die of at once.
            self._mark_lingering()
        step = [sig, signal.SIGCONT] if escalation else [sig]
        # The group in one call; its members start acting on the signal at once... (The
        # leader reaped elsewhere, its group id may be anyone's by now: the group is reached
        # through the leader's pidfd, or, on kernels that cannot, every member the listing
        # confirms is signalled through its own pidfd, as an escapee.)
        self._signal_group(sig, pins=pins, wake=escalation)
        if escalation or sig == signal.SIGKILL:
            # Replayed to escapees found later (pending() looks for more once every tracked
            # member has exited); kept as soon as the group has it, so that a listing that
            # fails below cannot lose it. The program's SIGKILL too: a member found later
            # (forked by an escapee after the listing below, say) belongs to a tree that
            # is to die, and must not sit out cleanup's wait for it until the hard stop.
            self._sent.extend(step)
        # ...while we learn who else is in the tree: that work overlaps the members' exit,
        # which the caller would be waiting for anyway. Then the escapees, one by one.
        if listing_failed is None and survey and not self.survey_first:
            try:
                _, found = self._track_new_members(give=earlier)
            except OSError as exc:  # out of file descriptors, say: raised below
                listing_failed = exc
        if listing_failed is not None:
            self._signal_escapees(self._escapees, step)  # those already known
            self._raise_denied(listing_failed)
        if not escalation:
            # A program's signal during cleanup may be the first to find an escapee: it
            # gets the escalation so far first.
            self._signal_escapees(found, earlier)
        self._signal_escapees(self._escapees, step)
        self._raise_denied()
        return False

    def _note_members_that_left(self) -> None:
        """Count as escapees the tracked members that have left the tree's group since
        they were tracked (a daemon's setsid): the group's signal misses them, and they
        sat out the grace for the hard stop. Asked just before that signal: one that
        leaves after it has had it (and must not get it twice: a handler would run twice).
        """
        leader = self.leader.pid  # (a group leader cannot leave its group)
        for pid, fd in list(self._members.items()):
            if pid == leader or pid in self._escapees:
                continue
            stat = read_stat(pid)
            # Still alive after the read (its pidfd unreadable): the stat was its, not a
            # recycled pid's.
            if stat is not None and stat.pgid != leader and not exited(fd):
                self._escapees.add(pid)

    def _wake_all(self) -> None:
        """SIGCONT to the group and to the escapees known, after a step for the leader
        alone (see `signal_leader_alone`)."""
        self._signal_group(signal.SIGCONT, pins=self.leader.pins_group)
        self._signal_escapees(self._escapees, [signal.SIGCONT])
        self._raise_denied()

    def _signal_group(self, sig: int, *, pins: bool, wake: bool = False) -> None:
        """``sig`` to the tree's group: by its id while the leader pins it; else through
        the leader's pidfd (Linux 6.9+; on older kernels the listing confirms each member
        and signals it through a pidfd of its own). Members that have left the group are
        counted as escapees first, for the caller to signal one by one."""
        self._note_members_that_left()
        try:
            if pins:
                self._group.signal_pinned(sig, wake=wake)
            else:
                self._group.signal_through_leader(sig, wake=wake)
        except ContainmentLost:
            pass
        except PermissionError as exc:
            self._deny(exc)  # nothing in the group we may signal: the rest still goes

    def _mark_lingering(self) -> None:
        """Members other than the leader still running at a step after the leader exited."""
        self._members.forget_exited()
        self._lingering.update(pid for pid in self._members if pid != self.leader.pid)

    def kill(self) -> None:
        pins = self.leader.pins_group
        if self.leader.exited:
            self._mark_lingering()
        # The group first: a killpg needs no file descriptor, so it works even when this
        # process has run out of them, which the hard stop below may not (it opens files).
        # It also reaches a leader that has not joined its cgroup yet.
        self._signal_group(signal.SIGKILL, pins=pins)
        self._sent.append(signal.SIGKILL)
        try:
            self._hard_kill()
        except OSError as exc:
            self._signal_escapees(self._escapees, [signal.SIGKILL])  # those already known
            self._raise_denied(exc)
        self._raise_denied()

    def pending(self) -> Pending:
        self._members.forget_exited()
        # Every tracked member has exited: a new listing says whether others remain (forked
        # while we signalled, say); they get the escalation's signals so far.
        if not self._members:
            listed, new_escapees = self._track_new_members(give=self._sent)
            self._signal_escapees(new_escapees, self._sent)
            self._raise_denied()  # (the members are tracked: the next call waits on them)
            if not self._members and (listed or self._undecided):
                # Listed, but gone before its pidfd opened: still finishing its exit. Or
                # a process the listing could not place yet. Ask again after the driver
                # yields, rather than spin here.
                return NEED_SCAN
        self._emptied = not self._members
        return list(self._members.values())

    def release(self, *, emptied: bool = True) -> None:
        self._members.close_all()
        if self.backstop_needs_group:
            # (Else the group registered nothing, and watches nothing: its members are ours.)
            # The group's orphans are among those reaped below (`_ours`).
            self._group.release(emptied=emptied, reap=False)
        if self._leader is None:
            # The spawn failed. Only the backstop was registered: not needed unless the
            # leader had run (not ``emptied``). Then what it started is killed now, by the
            # watchdog: the failure is most often running out of file descriptors, which
            # finding the tree's processes takes, and the watchdog has its own.
            if emptied:
                watchdog.unregister(*self.backstop)
            elif not watchdog.kill_now(*self.backstop):
                logger.warning("no watchdog to stop what a failed spawn started: %s", self.backstop)
            return
        reap_orphans(self._leader.pid, self._ours, parent_thread=self._leader.parent_thread)
        if emptied:
            watchdog.unregister(*self.backstop)
