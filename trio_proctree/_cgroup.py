"""cgroup v2 containment: every tree in a cgroup of its own, which no descendant can leave.

A process group misses descendants that call ``setsid()``; a cgroup keeps them all. Each
tree gets a cgroup in its process's home (`._cgroup_home`).

The leader is placed in its cgroup before the user's program runs, without Python code
between fork and exec where it can be (with a ``preexec_fn``, Popen forks where it would
vfork and runs every library's fork handlers in the child, which may wait on a lock held
by another thread at the fork: trio spawns from worker threads): with glibc 2.41 or
newer it is created there (`._spawn_into_cgroup`); elsewhere the joiner starts in its
place (`._joiner`), a program of a few hundred bytes that writes itself into the cgroup
and then ``exec``\\ s the command. Where the joiner cannot run, the command is started
through ``/bin/sh``, which does the same, or, for a command that ``executable=`` names
apart from its file (which sh's exec cannot do), joins in a ``preexec_fn`` of one
``write``. A process moved into a cgroup after it forked would leave its existing
children outside.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import time
from collections.abc import Sequence
from typing import Any

import attrs

from . import _cgroupfs as cgroupfs
from . import _joiner as joiner
from . import _spawn_into_cgroup as direct_spawn
from ._cgroup_home import CgroupHome, backstop_entry
from ._containment import NEED_SCAN, RETRY_LATER, RETRY_PAUSE, Pending, signal_leader_alone
from ._exec_check import exec_path
from ._leader import Leader
from ._member_tracking import MemberTracking
from ._pidfd import open_pidfd
from ._procfs import ProcStat
from ._spawn import Resolved, SpawnPlan, nothing_came_before, resolve_executable
from ._spawn_into_cgroup import IntoCgroup
from ._through_sh import wrapped

logger = logging.getLogger("trio_proctree")


class CgroupContainment(MemberTracking):
    """The tree is its cgroup, which also holds every descendant that left the group.

    The stop signal goes to the group with ``killpg`` first (one call, atomic against
    forks in the group). Cleanup then waits for the leader; once it has exited (or
    `SURVEY_DELAY` after the signal, if it has not), one read of ``cgroup.events`` says
    whether anything else is left, and only then is the cgroup listed: the escapees get
    the escalation so far through pidfds, and every member is pinned by pidfd to wait on.
    A user's `signal` lists at once.

    Why not wait on ``cgroup.events`` itself: the kernel sends at most one change
    notification per cgroup every 10 ms, so a tree that emptied soon after it started (or
    after its cgroup was last used) would be seen empty up to 10 ms late (measured: 9.2 ms).
    A pidfd turns readable the moment its process exits.
    """

    name = "cgroup"
    #: The leader is waited on by itself, not tracked with the members.
    watches_leader = False
    #: cgroup.kill reaches every member, in the group or not, and the watchdog removes the
    #: cgroup after it, so that a leader still on its way in (through the joiner or
    #: /bin/sh) cannot get in.
    backstop_needs_group = False

    #: Listings per signal: after the escapees a listing found are signalled, the cgroup is
    #: listed again for what they forked meanwhile, until a listing finds none new.
    SURVEY_ROUNDS = 8
    #: Seconds the first stop signal's listing waits for the leader to exit (see `signal`).
    SURVEY_DELAY = 0.005
    #: Seconds it then waits for the group's members to finish exiting (`_watch_emptying`).
    EMPTYING_WAIT = 0.001

    def __init__(self, home: CgroupHome) -> None:
        super().__init__()
        self._home = home
        self.path, self._reused = home.take_tree()
        self._relative = f"{home.relative}/{os.path.basename(self.path)}"
        self._events = os.path.join(self.path, "cgroup.events")
        #: cgroup.events, held open (opened here, in the spawn's worker thread): the check
        #: that ends most teardowns is then one pread, where opening the file costs ~0.1 ms
        #: on a VM right after the tree's exit, and needs no new file descriptor then.
        #: (-1: not held; read by path.)
        self._events_fd = cgroupfs.open_if_plentiful(self._events)
        #: Whether cgroup.kill was written (by us), or a direct start in it was refused.
        self._killed = False
        self._direct = False
        #: The cgroup was removed under us (by someone else: only an empty cgroup can go).
        self._removed = False
        #: The escalation's listing is still to come (`signal`); the driver has been told
        #: to come back for it once `ask_again_within` is set.
        self._survey_due = False
        #: When that listing is due at the latest (time.monotonic()).
        self._survey_by = 0.0
        #: Watches cgroup.events for a change, to wait on (see `_watch_emptying`).
        self._emptying: select.epoll | None = None
        #: That watch could not be made (out of file descriptors).
        self._no_watch = False
        #: The escalation has thawed the cgroup (`_thaw_once`).
        self._thawed = False
        #: When the leader was taken in charge: it has joined its cgroup by then, or (through
        #: the joiner or /bin/sh) is about to, so the join's change notice is about this old.
        self._attached_at = 0.0

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        options = dict(plan.options)
        shell = options.pop("shell", False)
        executable = options.pop("executable", None)
        if shell:
            argv: list[Any] = [executable or "/bin/sh", "-c", plan.command]
        else:
            assert isinstance(plan.command, list)
            argv = list(plan.command)
        leader_argv = list(argv)
        # A command that executable= names apart from the file it runs (Popen(["-sh"],
        # executable="/bin/sh"): busybox's applets, a login shell, Python finding its
        # prefix): sh's exec cannot set argv[0] apart, so it joins in a preexec_fn.
        named_apart = not shell and executable is not None and argv[0] != executable
        if executable is not None:
            argv[0] = executable
        starts_directly = direct_spawn.can_start(options)
        preexec = options.get("preexec_fn") is not None
        # (Not where the leader starts in its cgroup: the joiner is not proven there, and
        # a start that cannot be made so goes through /bin/sh.)
        program = None if preexec or starts_directly else joiner.path()
        found, path, settled = plan.resolved, None, None
        # Where Popen's search settles: for a direct start and for /bin/sh, not for the
        # joiner alone, which searches as Popen's child does (looking costs a stat for
        # each PATH entry before it, ~0.1 ms a spawn on a busy machine).
        looks = starts_directly or program is None
        if (
            looks
            and found is not None
            and found.path is not None
            and os.sep not in os.fsdecode(argv[0])
        ):
            if found.remembered and not nothing_came_before(found):
                # Something appeared on PATH before it since the last search, and sh
                # searches on its own: looked for afresh, as Popen's exec would.
                found = resolve_executable(
                    plan.program, env=options.get("env"), cwd=options.get("cwd"), remembered=False
                )
            if found.path is not None:
                path = os.path.abspath(found.path)  # (sh runs in the tree's cwd)
                # A direct start execs it without searching again only where every place
                # before it is empty now (an answer remembered has just been seen so):
                # one there, even one judged not to run, is the exec's own to judge.
                if found.remembered or nothing_came_before(found):
                    settled = _on_path(found, plan.program, options.get("env"))
        # Where the C library can, the leader starts in the cgroup itself, with no wrapper;
        # the command through a wrapper stays as the way there if it cannot after all.
        direct = None
        if starts_directly:
            direct = IntoCgroup(
                self.path, plan.program, leader_argv, reused=self._reused, settled=settled
            )
            self._direct = True
        procs = os.path.join(self.path, "cgroup.procs")
        # With a preexec_fn, Popen itself starts the program, as the caller asked, with one
        # write of ours in its child before the exec (`_spawn.joining_first`) and before
        # the preexec_fn, whose code must run in the cgroup (what it forked would stay
        # outside a cgroup joined after it): Popen forks for a preexec_fn anyway, where it
        # would vfork. So too a command named apart, where there is no joiner (sh's exec
        # cannot name it apart): that costs the fork.
        if preexec or (named_apart and program is None):
            return attrs.evolve(super().prepare(plan), into_cgroup=direct, joins=procs)
        wrapper_env = None
        if program is not None:
            # The joiner starts in its place, which joins the cgroup and then execs the
            # command (`._joiner`): the command named apart too, as it asked.
            command: list[Any] = joiner.command(
                procs, plan.program, leader_argv, env=options.get("env"), settled=settled
            )
            if direct is None and direct_spawn.can_start_joiner(options):
                direct = IntoCgroup(self.path, plan.program, command, joiner=program)
            options["executable"] = program
        else:
            command, wrapper_env = wrapped(
                procs,
                argv,
                env=options.get("env"),
                found=path,
                passed_over=found is not None and found.passed_over,
                cwd=options.get("cwd"),
            )
        return attrs.evolve(
            super().prepare(plan),
            command=command,
            options=options,
            into_cgroup=direct,
            through_wrapper=True,
            joiner=program,
            command_env=wrapper_env,
        )

    @property
    def backstop(self) -> list[str]:
        return [backstop_entry(self.path)]

    def _arm_backstop(self) -> None:
        pass  # (registered by the home since it made the cgroup: `CgroupHome.take_tree`)

    def _disarm_backstop(self) -> None:
        pass  # (by the home, once the cgroup leaves it: `CgroupHome.give_back`)

    def attach(self, leader: Leader) -> None:
        super().attach(leader)
        self._attached_at = time.monotonic()
        if self._direct and leader.popen is not None:
            # Asked to start directly, started by Popen: perhaps because a member
            # of the cgroup's last tree wrote cgroup.kill (the direct start died at birth).
            self._killed = True

    def _thaw_once(self) -> None:
        """Thaw the cgroup, if a member froze it (cgroup.freeze): frozen, no member can act
        on the escalation's signal, as none stopped can before its SIGCONT, and the grace
        ran out (helper-70). One write, a no-op if not frozen, made by the escalation's
        first listing (`_survey`), with those of the cgroups members made inside it and
        froze (`_thaw_inside`): a frozen leader does not exit, so that listing comes
        SURVEY_DELAY after the step at the latest; a tree that empties at its stop signal,
        as most do, has nothing frozen, and is spared the write (~10 us of the event
        loop's time, with 100 trees torn down at once). A step for the leader alone, which
        lists nothing, thaws at once."""
        if self._thawed:
            return
        self._thawed = True
        with contextlib.suppress(OSError):  # (gone, or out of descriptors: the hard stop
            cgroupfs.thaw(self.path)  # reaches frozen members all the same)

    def _thaw_inside(self) -> None:
        """Thaw the cgroups members made inside the tree's and froze: their members could
        not act on the escalation's signals, and sat out the grace (red before stop 41).
        Called by the escalation's listings, not at its first step: a tree whose leader
        exits at its stop signal, its cgroup left empty, is never looked into (a stat of
        the cgroup's directory, where nothing was made inside)."""
        cgroupfs.thaw_inside(self.path)

    def _list_members(self) -> list[int]:
        return cgroupfs.processes_in(self.path)

    def _confirm_escapee(self, pid: int, stat: ProcStat) -> bool:
        return cgroupfs.in_cgroup(pid, self._relative)

    def _ours(self, stat: ProcStat) -> bool:
        # A zombie still names the cgroup it died in.
        return super()._ours(stat) or cgroupfs.in_cgroup(stat.pid, self._relative)

    def _hard_kill(self) -> None:
        # cgroup.kill reaches every member, escapees included, and no fork can race it...
        self._killed = True
        self._survey_due, self.ask_again_within = False, None  # (no listing needed for it)
        try:
            cgroupfs.kill(self.path)
        except FileNotFoundError:
            if os.path.isdir(self.path):
                raise
            self._removed = True  # (what left it is tracked, and killed as such)
        # ...but a process whose main thread has exited while others run on: Linux sends
        # cgroup.kill's SIGKILL to that exited thread alone, where nothing takes it, and
        # the tree would outlive its hard stop. A signal to the process reaches it: each
        # such member gets one through its pidfd. (Best effort: out of file descriptors,
        # say, the wait for the tree to empty tells.)
        try:
            for pid in cgroupfs.main_thread_gone(self.path):
                fd = self._members.get(pid)
                if fd is None and (fd := self._open_member(pid)) is not None:
                    self._members[pid] = fd
                if fd is not None:
                    self._signal_member(fd, signal.SIGKILL)
        except OSError as exc:
            logger.debug("%s: not looked at after cgroup.kill: %s", self.path, exc)

    def _survey(self, *, track: bool, pins: bool, give: Sequence[int]) -> list[int]:
        """List the members, and return the escapees not known before (pinned by pidfd).
        With ``track`` (an escalation's listing), every member listed is tracked by a
        pidfd, to be waited on, and the tree's cgroup and those members froze inside it are
        thawed first (`_thaw_once`, `_thaw_inside`).
        ``pins``: whether the unreaped leader pins the group id (the caller has just asked).
        ``give``: the signals the caller gives new escapees; should the listing fail part
        way (out of file descriptors, say), those it found have them before the error is
        raised, as no later listing returns them again (they are known by then).

        A member of the group is told by ``getpgid`` alone: ``killpg`` reaches it, and a
        listed pid recycled by the time ``getpgid`` asks is in our pinned group only if it
        is a member anyway. (Its pidfd, opened first, only serves to wait: should it name
        a process that exited, it reads as exited, and the next listing finds the new
        one.) Anything else is confirmed by `_open_member` through a pidfd of its own.
        """
        new: list[int] = []
        if track:
            self._thaw_once()
            self._thaw_inside()
        listed = self._list_members()
        try:
            if not pins:
                # The leader reaped elsewhere: a process with its group's id is a member
                # while that group has one, which one question answers for every stat read
                # before it. The stats are read first, each process pinned.
                self._pin_listed(listed)
            self._lives_for_listed = None
            self._survey_listed(listed, new, track=track, pins=pins)
        except OSError:
            self._signal_escapees(new, give)
            raise
        finally:
            self._unpin()
        return new

    def _survey_listed(self, listed: list[int], new: list[int], *, track: bool, pins: bool) -> None:
        leader = self.leader
        for pid in listed:
            if pid in self._members or (pid == leader.pid and not leader.lost):
                continue
            if pins:
                waited = open_pidfd(pid) if track else None
                if track and waited is None:
                    continue  # exited since the listing
                try:
                    in_group = os.getpgid(pid) == leader.pid
                except ProcessLookupError:
                    in_group = False
                if in_group:
                    if waited is not None:
                        self._members[pid] = waited
                    continue
                if waited is not None:
                    os.close(waited)
            fd = self._open_member(pid)
            if fd is None:
                continue
            self._members[pid] = fd
            if pid in self._escapees:
                new.append(pid)

    def kill(self) -> None:
        if self._survey_due or not self._surveyed:
            # The graceful wait ended before the deferred listing (no grace, or Ctrl-C cut it
            # short), or no step listed at all (steps for the leader alone list nothing):
            # take it now, so that the escapees are counted and the lingering known
            # before the hard stop, which itself needs no listing (cgroup.kill). (Not as
            # `_try_survey_now`: a listing held as failed is raised all the same, below.)
            try:
                self._survey_now()
            except OSError as exc:  # out of file descriptors, say: the hard stop goes out
                logger.debug("%s: not listed before the hard stop: %s", self.path, exc)
        super().kill()

    def signal(self, sig: int, *, escalation: bool = False, leader_only: bool = False) -> bool:
        if leader_only and signal_leader_alone(self.leader, sig):
            # No listing: what the leader does not stop is listed at its exit (or before
            # the hard stop: `kill`).
            self._wake_all()
            self._thaw_once()
            return True
        pins = self.leader.pins_group  # (asks the kernel; `exited` reads the answer)
        new: list[int] = []  # escapees this signal's listings find
        listing_failed: OSError | None = None
        # What escapees found now get before this signal (a listing that fails part way
        # gives them these, and this signal goes to every escapee known, below).
        earlier = list(self._sent)
        listed = False  # every member tracked by a listing of this call's
        if escalation and self.leader.exited:
            # A step after the leader exited: what still runs outlived it, and lingers.
            # Counted before the signal, which some of it may die of at once. (Only here
            # is the listing taken first: while the leader runs, nothing lingers yet.)
            try:
                new = self._survey(track=True, pins=pins, give=earlier)
                listed = True
            except OSError as exc:
                # Out of file descriptors, say: the group still gets its signal below (a
                # killpg needs none); the error is raised after it.
                listing_failed = exc
            self._mark_lingering()
            pins = self.leader.pins_group  # asked again: a listing takes a while
        # The group first, in one call, before anything else is worked out: its members act
        # on the signal at once, and what is done below is done while they exit. (The
        # leader reaped elsewhere, its group id may be anyone's: the group is reached
        # through the leader's pidfd, or, where the kernel cannot, the cgroup alone says
        # who is a member, and each is signalled through a pidfd, counted as an escapee.)
        self._signal_group(sig, pins=pins, wake=escalation)  # (a step: SIGCONT follows)
        step = [sig, signal.SIGCONT] if escalation else [sig]
        # The members already seen are surveyed once per escalation (a later step needs
        # no new listing), on every signal a user sends.
        survey = not (escalation and self._surveyed)
        self._surveyed |= escalation
        if survey and escalation and not self.leader.exited:
            # The escalation's listing waits for the leader's exit, SURVEY_DELAY at most
            # (`pending`): on a machine with few cores, listing while the group exits holds
            # a core its members need, and a cgroup found empty needs no listing at all.
            # Escapees (the only members the group's signal misses) get the stop signal
            # that much later; a grace is seconds.
            survey, self._survey_due = False, True
            self._survey_by = time.monotonic() + self.SURVEY_DELAY
        # Replayed to escapees found later: the escalation's signals, and the program's
        # SIGKILL (a member found after this call's listings belongs to a tree that is to
        # die, and must not sit out cleanup's wait for it until the hard stop).
        replayed = escalation or sig == signal.SIGKILL
        if replayed:
            self._sent.extend(step)
        # Escapees found now get the escalation so far, and then this signal: a program's
        # signal during cleanup may be the first to find an escapee (while the escalation's
        # listing waits, say), and the escapees it finds are known from then on, so no
        # later listing of the escalation's would give them its signals.
        catch_up = self._sent if replayed else [*self._sent, sig]
        # Then the escapees, one pidfd each. An escalation also pins the members to wait on.
        if listing_failed is None and survey:
            try:
                new += self._survey(track=escalation, pins=pins, give=earlier)
                listed |= escalation
            except OSError as exc:
                listing_failed = exc
        if listing_failed is None:
            self._signal_escapees([pid for pid in self._escapees if pid not in new], step)
            try:
                self._catch_up(new, catch_up, pins=pins, chase=replayed)
            except OSError as exc:
                listing_failed = exc
        else:
            self._signal_escapees(self._escapees, step)  # those already known
        if listing_failed is not None and not escalation:
            self._raise_denied(listing_failed)  # a program's own signal: said at once
        if listing_failed is not None:
            # A step's: held, and tried again, as the deferred listing (`pending`).
            self._hold(listing_failed)
        elif listed and self._unlisted is not None:
            # What a failed listing left out has the escalation so far now.
            self._unlisted, self._survey_due, self.ask_again_within = None, False, None
        self._raise_denied()
        return False

    def _catch_up(
        self, new: list[int], signals: list[int], *, pins: bool, chase: bool = True
    ) -> None:
        """Give escapees just found ``signals``; as one may have forked before its signal
        came, list again (and give those) until a listing finds none new. (With no
        signals to give, nothing has been told to stop: there is no fork race to chase.)

        Not to ``chase`` a program's own signal: it reaches the escapees one listing
        finds (as under the subreaper). Listed again, what an escapee started on it got
        it too (a server's new workers, killed by the SIGHUP that had them started:
        helper-92); what an escapee forks as the call runs may miss it instead, and
        cleanup stops that all the same."""
        self._signal_escapees(new, signals)
        for _ in range(self.SURVEY_ROUNDS - 1 if new and signals and chase else 0):
            new = self._survey(track=False, pins=pins, give=signals)
            if not new:
                break
            self._signal_escapees(new, signals)

    def pending(self) -> Pending:
        self.leader.poll()  # (asks the kernel; `exited` reads the answer)
        if not self.leader.exited:
            if self._survey_due:
                # Due once the leader has outlived SURVEY_DELAY, or a failed listing's pause
                # is over: by the clock, as the driver asks again for other reasons too (to
                # read the output pipes 10 ms into a step). Taken for the delay's end, that
                # wake listed the cgroup while a loaded machine kept `sh` from its exit.
                due = self._retry_at if self._unlisted is not None else self._survey_by
                if (remaining := due - time.monotonic()) <= 0:
                    self._try_survey_now()
                    self._raise_denied()
                else:
                    self.ask_again_within = remaining
            return [self.leader.pidfd]
        if self._members:
            self._members.forget_exited()
        # With nothing tracked, one read says whether anything is left (a process leaves
        # the count before its pidfd turns readable). Most teardowns end here, at the
        # first wake-up after the leader's exit, without listing the cgroup at all.
        if not self._members and not self._populated():
            if self._unlisted is not None:
                # Every member exited, escapees included, if any: the failed listing missed
                # nothing (a leader slow to act on its stop signal on a loaded machine
                # made it fail, where the tree then ended cleanly, without it).
                logger.debug("%s: emptied, though not listed: %s", self.path, self._unlisted)
                self._unlisted = None
            return self._now_empty()
        # The escalation's listing, deferred until the leader exited; or, something outlived
        # the leader: track it by pidfd (and give escapees found only now the escalation).
        list_now = self._survey_due or not self._members
        if self._survey_due:
            if (emptying := self._watch_emptying()) is not None:
                return [emptying]
            if self._no_watch and (remaining := self._survey_by - time.monotonic()) > 0:
                # Out of file descriptors for the watch, the listing (which needs more)
                # would fail: the held cgroup.events is read again in a moment instead,
                # until the listing is due.
                list_now, self.ask_again_within = False, remaining
        if list_now and not self._try_survey_now():
            self._raise_denied()
            # Tried again within ask_again_within; meanwhile an exit of a member tracked
            # may end the tree sooner.
            return list(self._members.values()) if self._members else RETRY_LATER
        self._raise_denied()  # (the members are tracked: the next call waits on them)
        if not self._members:
            # Populated, yet nobody listed: the last members are finishing their exit
            # (a process leaves the listing first). Ask again after the driver yields.
            return NEED_SCAN
        return list(self._members.values())

    #: Seconds after the leader joined its cgroup from which the kernel tells of the cgroup's
    #: emptying at once: it tells of one change per cgroup per 10 ms, and the join was one
    #: (as was the last tree's end, for a reused cgroup: up to 10 ms before the join).
    NOTIFIES_AT_ONCE_AFTER = 0.02

    def _watch_emptying(self) -> int | None:
        """A file descriptor that turns readable when cgroup.events changes, to wait on
        until the listing is due: the members left after the leader's exit are most often
        finishing their own (they had the same signal), and listing them meanwhile holds a
        core they need (on 2 cores, a fifth of teardowns waited ~0.4 ms more for it). None
        where that would not pay: the listing is due, the kernel would tell late, or there
        is no cgroup.events held open."""
        now = time.monotonic()
        remaining = self._survey_by - now
        young = now - self._attached_at < self.NOTIFIES_AT_ONCE_AFTER
        # With members tracked (an escapee a program's signal found, say), cgroup.events
        # was not just read, and a change it has not been read since keeps the watch
        # ready: the listing, as before, instead of a wait that would spin.
        if remaining <= 0 or young or self._events_fd < 0 or self._members:
            return None
        if self._emptying is None:
            try:
                self._emptying = select.epoll()
                # A change, not the data: kernfs files always read as readable.
                self._emptying.register(self._events_fd, select.EPOLLPRI)
            except OSError:  # out of file descriptors, say: looked at again (`pending`)
                self._no_watch = True
                return None
            # The group's members had the signal with the leader, and finish their exit
            # within a few hundred us of its own: a cgroup still populated past that holds
            # escapees the group's signal missed, which die only once the listing signals
            # them (waiting all of SURVEY_DELAY for it added ~5 ms to every teardown of a
            # tree with a daemon).
            self._survey_by = min(self._survey_by, now + self.EMPTYING_WAIT)
            remaining = self._survey_by - now
        self.ask_again_within = remaining
        return self._emptying.fileno()

    def _try_survey_now(self) -> bool:
        """`_survey_now`, and whether it succeeded; if it failed, why is held (`_hold`)."""
        try:
            self._survey_now()
        except OSError as exc:
            self._hold(exc)
            return False
        self._unlisted, self._retry_pause = None, RETRY_PAUSE  # (they had their signals)
        return True

    @property
    def _where(self) -> str:
        return self.path

    def _hold(self, failed: OSError) -> None:
        # The deferred listing, tried again (`pending`).
        super()._hold(failed)
        self._survey_due = True

    def _survey_now(self) -> None:
        """The escalation's deferred listing: every member pinned by pidfd, and the escapees
        among them given the escalation so far; listed again for what they forked before
        their signal came, until a listing finds none new."""
        self._survey_due, self.ask_again_within = False, None
        pins = self.leader.pins_group
        new = self._survey(track=True, pins=pins, give=self._sent)
        self._catch_up(new, self._sent, pins=pins)

    def _populated(self) -> bool:
        try:
            if self._events_fd < 0:
                return cgroupfs.populated(self._events)
            # (kernfs writes the file anew for every read from its start.)
            return os.pread(self._events_fd, 64, 0).startswith(b"populated 1")
        except OSError as exc:
            # Removed by someone else (ENODEV through the file held open, ENOENT by its
            # path): only an empty cgroup can be removed, and none can join it now. Taken
            # for an error, it kept cleanup asking until the grace and kill_wait ran out,
            # then raised CleanupError for a tree that had ended (helper-26).
            if exc.errno not in (errno.ENODEV, errno.ENOENT) or os.path.isdir(self.path):
                raise
            self._removed = True
            return False

    def _now_empty(self) -> list[int]:
        self._emptied = True
        return []

    def release(self, *, emptied: bool = True) -> None:
        # A listing that failed after the hard stop: the likeliest reason the tree outlived
        # it, to show as the cause of the error that says so (a tree that ended lost
        # nothing to it).
        unlisted, self._unlisted = self._unlisted, None
        if emptied and self._emptied:
            unlisted = None
        try:
            self._release(emptied=emptied)
        except BaseException:
            if unlisted is not None:  # (the held error; the one in flight goes on)
                message = "%s: not listed after the hard stop"
                logger.error(message, self.path, exc_info=unlisted)  # noqa: TRY400
            raise
        if unlisted is not None:
            raise unlisted

    def _release(self, *, emptied: bool) -> None:
        if self._emptying is not None:
            self._emptying.close()
            self._emptying = None
        if self._events_fd >= 0:
            os.close(self._events_fd)
            self._events_fd = -1
        super().release(emptied=emptied)
        if self._leader is None:
            # The spawn failed. Not kept for reuse: the failure may have been the cgroup's
            # own (removed under us, say). If its leader ran (not ``emptied``), the
            # watchdog kills what it started, and removes the cgroup.
            with contextlib.suppress(OSError):  # (else left for the sweep, or the watchdog)
                os.rmdir(self.path)
            return
        # Emptied is known from pending(); nothing re-enters an empty cgroup by itself. One
        # not known to be empty stays, for the watchdog.
        if self._removed:
            self._home.forget(self.path)
            return
        if not (emptied and self._emptied):
            logger.warning("cgroup %s may not be empty; it goes once it is", self.path)
            self._home.retire_outlived(self.path, self.backstop)
            return
        # Cgroups that members made inside ours are removed when it is next taken, in the
        # spawn's worker thread, not on the path that ends a tree (`CgroupHome.take_tree`).
        self._home.give_back(self.path, killed=self._killed)


def _on_path(found: Resolved, program: Any, env: Any) -> bytes | None:
    """Where Popen's search of PATH for ``program`` settles, as the child execs it: the
    PATH entry ``found`` was found in, joined to the name (relative to the child's cwd if
    the entry is). None if PATH is not the one searched (changed since, in ``env`` or
    `os.environ`): then the child searches it."""
    entries = exec_path(env)
    index = len(found.looked_before)
    if tuple(entries) != found.searched or index >= len(entries):
        return None
    return os.path.join(os.fsencode(entries[index]), os.fsencode(program))
