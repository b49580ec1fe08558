"""Member tracking, which the cgroup and subreaper containments add to the process group:
members found by listing, tracked by pidfd, and those outside the group signalled one by
one."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence

from . import _watchdog as watchdog
from ._containment import (
    NEED_SCAN,
    RETRY_PAUSE,
    RETRY_SOON,
    UNSEEN,
    ContainmentLost,
    Pending,
    signal_leader_alone,
)
from ._group import ProcessGroupContainment
from ._leader import Leader
from ._orphans import reap_orphans
from ._pidfd import Pidfds, exited, pin_process, signal_pidfd
from ._procfs import ProcStat, read_stat
from ._spawn import Spawned, SpawnPlan

logger = logging.getLogger("trio_proctree")


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
        #: Why the escalation's listing failed (out of file descriptors, say), held rather
        #: than raised: it is tried again (`pending`), and a tree then seen empty had no
        #: escapee left to miss its stop signal. Raised by the hard stop (`kill`).
        self._unlisted: OSError | None = None
        #: Seconds until that listing is tried again: RETRY_PAUSE, doubled at each failure
        #: up to MAX_RETRY_PAUSE (a 5 s grace out of descriptors takes ~15 tries, not 100).
        self._retry_pause = RETRY_PAUSE
        #: When that listing is next tried (time.monotonic()), at the latest.
        self._retry_at = 0.0
        #: The held error the last hard stop raised (`kill`): the net at interpreter exit,
        #: with nobody to tell, does not take it for a hard stop that failed.
        self.raised_held: OSError | None = None

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        # Registered before the leader starts: if this process is SIGKILLed between the
        # fork and attach(), the watchdog must already know the tree (a process group is
        # only known once its leader runs; that window is the group containment's).
        self._arm_backstop()
        return plan

    def _arm_backstop(self) -> None:
        """Register `backstop` with the watchdog, before the leader starts."""
        watchdog.register(*self.backstop)

    def _disarm_backstop(self) -> None:
        """Unregister `backstop`: the tree is known to be empty."""
        watchdog.unregister(*self.backstop)

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
    def _where(self) -> str:
        """The tree, as the log names it."""
        return f"pid {self.leader.pid}"

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
            if not escalation:
                self._raise_denied(listing_failed)  # a program's own signal: said at once
            # A step's: held, and the listing tried again (`pending`), its escapees then
            # given the escalation so far. Raised at once, it ended in an error a teardown
            # that stopped cleanly in a millisecond, once descriptors were back (helper-77).
            self._hold(listing_failed)
            self._raise_denied()
            return False
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

    #: Seconds between tries of a failed listing, at most (see `_retry_pause`).
    MAX_RETRY_PAUSE = 0.4

    def _hold(self, failed: OSError) -> None:
        """Keep why the escalation's listing failed, and have it tried again later (the
        escapees it finds then get the escalation so far).

        Not raised at once: the members are often exiting by then, and a tree seen empty
        before its hard stop lost nothing to the failure. (Raised, it ended every teardown
        in an error, however clean.) One held still at the hard stop is raised by `kill`.
        """
        now = time.monotonic()
        if self._unlisted is None or now >= self._retry_at:
            # The first failure, or a try at its time: the next waits twice as long. (Tries
            # between, at a member's exit, leave the pause as it is: counted, they took it
            # to its longest within 10 ms, and escapees were found ~0.3 s late: helper-81.)
            self._retry_at = now + self._retry_pause
            self._retry_pause = min(self._retry_pause * 2, self.MAX_RETRY_PAUSE)
        self._unlisted = failed
        self.ask_again_within = max(self._retry_at - now, RETRY_SOON)

    def _listed_again(self) -> bool:
        """The held listing, tried again at its time, or once nothing tracked is left to
        wait on: whether it worked (its escapees then have the escalation so far), or,
        failing, is held once more (`_hold`). (Tried at every member's exit, it took a
        listing each: 250 exits, 250 listings.)"""
        now = time.monotonic()
        if self._members and now < self._retry_at:
            self.ask_again_within = max(self._retry_at - now, RETRY_SOON)
            return False
        try:
            _, new_escapees = self._track_new_members(give=self._sent)
        except OSError as exc:
            self._hold(exc)
            return False
        self._signal_escapees(new_escapees, self._sent)
        logger.debug("%s: listed at last, after: %s", self._where, self._unlisted)
        self._unlisted, self.ask_again_within, self._retry_pause = None, None, RETRY_PAUSE
        return True

    def kill(self) -> None:
        # A listing that failed all through the grace left any escapee without its stop
        # signal: said once the hard stop (which reaches them) has gone out.
        unlisted, self._unlisted = self._unlisted, None
        self.ask_again_within = None
        failed: Exception | None = None
        try:
            self._kill()
        except Exception as exc:  # noqa: BLE001 - raised below, after the held error
            failed = exc
        except BaseException:
            # A Ctrl-C goes on as it is, unreplaced, and the held error stays held: the
            # hard stop, taken again after it, says it (dropped, a bare KeyboardInterrupt
            # came out of a cleanup whose escapees never had their stop signal: helper-81).
            self._unlisted = unlisted
            raise
        if unlisted is not None and failed is None:
            # The hard stop went out: the net at exit says so, not that it could not kill.
            self.raised_held = unlisted
            raise unlisted
        if failed is not None and unlisted is not None:
            # The hard stop's own failure is the one raised: it is what may have left the
            # tree running. The held one came first and is shown as such (raised the other
            # way round, the traceback said the listing failed while the hard stop's
            # failure was handled, and the net at exit named the listing's errno).
            if failed.__context__ is None:
                failed.__context__ = unlisted
            else:  # (its own chain says something else: not lost, logged)
                logger.error(
                    "%s: the stop signal's listing had failed", self._where, exc_info=unlisted
                )
        if failed is not None:
            raise failed

    def _kill(self) -> None:
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
        if self._unlisted is not None and not self._listed_again():
            # The step's listing failed, and again now (or it is not time yet): asked again
            # within ask_again_within. With nothing tracked, whether anything is left is
            # unknown.
            return list(self._members.values()) if self._members else UNSEEN
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
            self._disarm_backstop()
