"""Child-subreaper containment, for where no cgroup is delegated to us.

With ``PR_SET_CHILD_SUBREAPER`` set, a descendant whose parent dies re-parents to this
process instead of to init, so every process a tree ever starts stays below us, and the
tree is "the leader's descendants, and those re-parented to us from the tree".

The setting is process-wide: orphans of *every* child of this process re-parent to it,
those of trees trio_proctree does not own included. trio_proctree reaps only the
processes that came from its own trees; it never waits for any other.

A re-parented process is known to come from a tree by its process group, or, if it left
the group, by a marker in its environment (``TRIO_PROCTREE_TREE_<id>``), inherited from
the leader. An escapee that both leaves the group and clears its environment is missed. A
process that shows no environment at all may be in the middle of ``execve``: cleanup
looks again for a while (`SubreaperContainment.UNDECIDED_LISTINGS`) before it decides.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs

from ._after_fork import renewed_in_forked_child
from ._leader import is_unreaped_leader
from ._member_tracking import MemberTracking
from ._orphans import adopted_children, become_subreaper, children_of, exited_child
from ._pidfd import exited, open_pidfd
from ._procfs import ProcStat, read_environ, read_stat
from ._spawn import MARKER_PREFIX, SpawnPlan, inherited_environment
from ._watchdog import is_watchdog

logger = logging.getLogger("trio_proctree")

#: Each tree's marker is a variable of its own, ``TRIO_PROCTREE_TREE_<id>=1``: a tree
#: started inside another tree's member adds its marker to the outer one's instead of
#: replacing it (and keeps the outer one in an ``env=`` of its own: `plan_spawn`), so the
#: outer tree (and its watchdog) still knows the inner tree's processes as its own.

_tree_numbers = itertools.count()


def _environment_has(pid: int, entry: bytes) -> bool | Literal["exiting"] | None:
    """Whether the process's environment holds ``entry``; None when it shows none at all;
    ``"exiting"`` when it is in its exit, its environment gone with its memory."""
    try:
        environment = read_environ(pid)
    except FileNotFoundError:
        return False  # gone: what it started was handed on to us, and is looked at itself
    except (ProcessLookupError, PermissionError):
        # A process in its exit has let go of its memory, environment and all, but not yet
        # of its children. Taken for a stranger, it was not walked, and a daemon it had
        # just forked went unseen: the tree was called empty while the daemon ran.
        stat = read_stat(pid)
        return "exiting" if stat is not None and stat.alive and stat.exiting else False
    return entry in environment.split(b"\0") if environment else None


#: How often each live process (pid, start time) re-parented to us has been seen with no
#: environment, over all trees: one started with an empty environment (a child of the
#: program's own, ``env={}``) shows none for good, and keeps a teardown looking again only
#: the first time, not in every teardown after.
_no_environment_seen: dict[tuple[int, int], int] = {}
_no_environment_lock = threading.Lock()
renewed_in_forked_child(globals(), "_no_environment_lock")


def _still_undecided(stat: ProcStat, listings: int) -> bool:
    """Count one more sighting of ``stat`` with no environment; whether to look again."""
    key = (stat.pid, stat.starttime)
    with _no_environment_lock:
        seen = _no_environment_seen.get(key, 0)
        if seen >= listings:
            return False
        if len(_no_environment_seen) >= 4096:  # keep it bounded: forget the gone
            for old in [k for k in _no_environment_seen if read_stat(k[0]) is None]:
                del _no_environment_seen[old]
        _no_environment_seen[key] = seen + 1
        return True


class SubreaperContainment(MemberTracking):
    """The tree is the leader's descendants plus what re-parented to us from the tree."""

    name = "subreaper"
    # Members are found by walking down from their parents: walk before the stop signal,
    # while the parents still live (an escapee whose parent dies re-parents to us, and
    # one that also cleared its environment could no longer be told apart).
    survey_first = True

    def __init__(self) -> None:
        super().__init__()
        #: Processes the listing under way met in their exit (`_environment_has`), to look
        #: below; and the pids of those the last listing looked below.
        self._in_their_exit: list[ProcStat] = []
        self._looked_below: set[int] = set()
        become_subreaper()
        self.marker = f"{MARKER_PREFIX}{os.getpid()}_{next(_tree_numbers)}_{uuid.uuid4().hex[:8]}"
        self._marker_entry = f"{self.marker}=1".encode()

    def prepare(self, plan: SpawnPlan) -> SpawnPlan:
        env: Mapping[Any, Any] | None = plan.options.get("env")
        if env is None:  # (not `or`: env={} is an empty environment, not ours)
            # What Popen would pass, as bytes: os.environ decodes every entry on the way
            # out, and Popen encodes each back (~0.2 ms a spawn, for this copy).
            env = inherited_environment()
        if any(isinstance(key, bytes) for key in env):
            marked = {**env, self.marker.encode(): b"1"}
        else:
            marked = {**env, self.marker: "1"}
        return attrs.evolve(super().prepare(plan), options={**plan.options, "env": marked})

    @property
    def backstop(self) -> list[str]:
        return [f"marker {self.marker}=1"]

    #: How many listings a live process that shows no environment stays undecided before
    #: it is taken for a stranger. A process in the middle of ``execve`` shows none for a
    #: moment (its new memory has no environment yet): taking it for a stranger then
    #: missed a member ~3% of the time, and the tree was called empty while it ran. A
    #: process started with an empty environment shows none for good.
    UNDECIDED_LISTINGS = 50

    def _from_this_tree(self, stat: ProcStat, *, listed: bool = False) -> bool:
        """Whether a process re-parented to us came from this tree: in its group (while
        the unreaped leader pins the group id, or the group it led, asked through its
        pidfd after this stat was read, has a member: ``listed``, see `_group_lives`), or
        carrying its marker. A live one whose environment cannot be read yet is noted as
        undecided (`_undecided`)."""
        if stat.pgid == self.leader.pid and (
            self.leader.pins_group or self._group_lives(listed=listed)
        ):
            return True
        verdict = _environment_has(stat.pid, self._marker_entry)
        if verdict == "exiting":
            self._in_their_exit.append(stat)  # (its children are looked at instead)
            return False
        if verdict is None and stat.alive and _still_undecided(stat, self.UNDECIDED_LISTINGS):
            self._undecided = True
        return bool(verdict)

    #: How many times one listing reads our children again for processes re-parented to us
    #: while it ran, before it leaves the rest to the next listing (`_undecided`).
    RELISTINGS = 20

    def _list_members(self) -> list[int]:
        # Every process of the tree is below us: the leader's subtree, and the subtrees of
        # what re-parented to us from the tree. (Once the leader is reaped, its pid may
        # belong to another child of ours: then only the marker says who is ours.)
        leader = self.leader.pid if self.leader.pins_group else None
        self._undecided = False
        self._looked_below = set()
        # A dead child has no subtree left (its children re-parented to us as it exited,
        # and are listed here themselves): it is not read at all.
        roots = [leader] if leader is not None and not exited_child(leader) else []
        members: list[int] = []
        known: set[int] = set()  # our children read so far
        walked: set[int] = set()
        for _ in range(self.RELISTINGS):
            read_before = len(known)
            roots += self._adopted_from_this_tree(known, leader)
            if not roots and len(known) == read_before:
                return members  # no child of ours came since the last read: all listed
            for stat in self._walk(roots, walked):
                if stat.alive:
                    members.append(stat.pid)
                    self._seen.add((stat.pid, stat.starttime))
            # A member that exited after our children were read handed its own to us, past
            # that read: they are read again, until no new child shows up. (Read once, a
            # daemon that double-forks again and again was missed, the tree taken for empty
            # while it ran: its new self became our child after the read, and the old one
            # had exited by the time it was looked at, among hundreds of zombies.)
            roots = []
        self._undecided = True  # (still new ones: the next listing goes on)
        return members

    def _adopted_from_this_tree(self, known: set[int], leader: int | None) -> list[int]:
        """Those of our children not in ``known`` (each added to it) that came from this
        tree, ``leader`` (the unreaped leader's pid, if any) aside."""
        adopted: list[ProcStat] = []
        for child in adopted_children(also=[self.leader.parent_thread]):
            if child in known:
                continue
            known.add(child)
            if child == leader or is_unreaped_leader(child) or is_watchdog(child):
                continue  # a leader (another tree's: started by us, from no tree), or ours
            if exited_child(child):
                continue
            if (stat := read_stat(child)) is not None:
                adopted.append(stat)
        # Every stat read before any is judged: one question about a reaped leader's group
        # serves them all (`_group_lives`).
        self._lives_for_listed = None
        self._in_their_exit = []
        roots = [stat.pid for stat in adopted if self._from_this_tree(stat, listed=True)]
        return roots + self._from_this_tree_below_their_exits()

    def _from_this_tree_below_their_exits(self) -> list[int]:
        """The children that came from this tree of the processes just judged that were in
        their exit (and of those of them in theirs), each judged as ours would be.

        Such a process has let go of its memory, environment and all, so it cannot be
        placed: taken for a stranger and not looked below, it hid the daemon a double
        fork had just made, still its child, and the tree was called empty while the
        daemon ran. Waiting for its exit to hand its children on to us let any stranger
        stuck in its exit hold every tree's cleanup to its bound. It is never counted
        nor signalled itself: its children say for themselves whose they are.
        """
        found: list[int] = []
        while self._in_their_exit:
            exiting = self._in_their_exit.pop()
            self._looked_below.add(exiting.pid)
            for child in children_of(exiting):
                stat = read_stat(child)
                if stat is not None and stat.alive and self._from_this_tree(stat):
                    found.append(child)
        return found

    def _walk(self, roots: list[int], walked: set[int]) -> Iterator[ProcStat]:
        """`descendants` of ``roots``, each process not tracked yet pinned on the way: its
        pidfd opened before its stat is read, so that the walk's stat is also the pin's
        proof (`pin_process`), and `_open_member` need not read it again (one /proc read
        fewer a new member, of three; 15-50 us each on a VM, before the stop signal).
        ``walked``: the pids walked already in this listing, skipped (a pid may be listed
        twice: children handed on meanwhile), and those walked here added."""
        pending = list(roots)
        while pending:
            if (pid := pending.pop()) in walked:
                continue
            walked.add(pid)
            fd: int | None = None
            if pid not in self._members and self._pin_in_listing:
                fd = open_pidfd(pid)
                if fd is None:
                    continue  # gone since it was listed: no subtree left either
            try:
                stat = read_stat(pid)
            except BaseException:
                if fd is not None:
                    os.close(fd)
                raise
            if fd is not None and (stat is None or exited(fd)):
                os.close(fd)
                continue  # it has exited: its children re-parented to us, listed as ours
            if stat is None:
                continue
            if fd is not None and stat.alive:
                self._pinned[pid] = (fd, stat)  # (listed, so `_open_member` takes it)
            elif fd is not None:
                os.close(fd)  # its exit is under way
            yield stat
            pending.extend(children_of(stat))

    def _confirm_escapee(self, pid: int, stat: ProcStat) -> bool:
        # Listed as a descendant; still one if its parent is us or a member we track, or
        # a process in its exit that the listing looked below (what it judged there).
        parent_is_leader = stat.ppid == self.leader.pid and self.leader.pins_group
        return (
            stat.ppid in self._members
            or parent_is_leader
            or (
                (stat.ppid == os.getpid() or stat.ppid in self._looked_below)
                and self._from_this_tree(stat)
            )
        )

    def _hard_kill(self) -> None:
        # No atomic kill here: SIGKILL every member, and list again until nobody new shows
        # up (a member may fork until its SIGKILL lands).
        killed: set[int] = set()
        while True:
            self._track_new_members(give=[signal.SIGKILL])
            self._members.forget_exited()
            targets = [pid for pid in self._members if pid not in killed]
            if not targets:
                return
            for pid in targets:
                killed.add(pid)
                self._signal_member(self._members[pid], signal.SIGKILL)
