"""Where this process's tree cgroups live: its home cgroup, made on first use, the tree
cgroups handed out and taken back in it, and the sweep of homes whose owners died.

Each process that uses trio_proctree gets one directory inside its own cgroup,
``trio_proctree-<pid namespace>-<pid>-<starttime>-<image>``, and each tree a
``tree-<n>`` cgroup inside that. ``<image>`` is new each time the process starts or
execs itself: the watchdog of a former image, still killing and removing that image's
trees (members can take a while to die) and then its home, never meets the new one's.
The watchdog removes the home should the process die without removing it; the homes of
owners that died anyway are swept.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Generator, Iterator

import attrs

from . import _cgroupfs as cgroupfs
from . import _spawn_into_cgroup as direct_spawn
from . import _watchdog as watchdog
from ._after_fork import renewed_in_forked_child
from ._procfs import ProcStat, boottime_offset, proc_hides_processes, read_file, read_stat

logger = logging.getLogger("trio_proctree")


_HOME_PREFIX = "trio_proctree-"


@attrs.define
class CgroupHome:
    """This process's directory of tree cgroups.

    Emptied tree cgroups are kept for the next tree: an empty cgroup whose settings a
    member did not change is as good as a new one for a leader that joins it, and reusing
    it takes the rmdir off the path that ends a tree (``aclose()`` measurably faster) and
    the mkdir off its start. Checking the settings costs about as much CPU as the two
    (~36-45 us against ~25 us alone on Linux 6.18; more with 100 spawns at once), in the
    spawn's worker thread, with no difference in wall time (2026-12-06). Where leaders start
    directly in their cgroup, one that ``cgroup.kill`` was written to is not reused (see
    `give_back`): it is removed when the next tree starts, in the spawn's worker thread,
    not on the path that ends a tree.

    Each of its tree cgroups is registered with the watchdog (`backstop_entry`) from when
    it is made until it leaves the home, kept ones too: a tree that reuses one writes
    nothing to the watchdog. (A write a tree woke the watchdog, a Python process: ~45 us
    of CPU a tree in all, with 100 trees at once. Should we die, an empty cgroup killed is
    one removed; the home goes after them.)
    """

    path: str
    #: The path as /proc/PID/cgroup shows it, for telling members from strangers.
    relative: str
    _free: list[str] = attrs.field(factory=list[str])
    #: Cgroups to remove at the next tree start, each with its watchdog entry to drop
    #: once it is gone (a tree that outlived its cleanup: `retire_outlived`; else none).
    _retired: dict[str, list[str]] = attrs.field(factory=dict[str, list[str]])
    _counter: Iterator[int] = attrs.field(factory=itertools.count)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    #: How many emptied tree cgroups are kept for reuse: enough for a program that runs
    #: a hundred trees at a time and starts them again (an empty cgroup costs the kernel a
    #: few kB; each one beyond this costs an rmdir on the path that ends its tree and a
    #: mkdir when the next starts, ~55 us each measured with 100 trees).
    KEEP = 128

    def take_tree(self) -> tuple[str, bool]:
        """An empty tree cgroup: (its path, whether it served a tree before)."""
        # Retired cgroups go whenever a tree starts, not only when none is kept: else one
        # a member froze stayed, unused, for as long as spares were left.
        self._remove_retired()
        while True:
            with self._lock:
                if not self._free:
                    break
                kept = self._free.pop()
            # Someone may have put a process in it since (root, or a member of another
            # tree moving itself): no tree's, it would be the next tree's member, and
            # stopped. Or changed its settings: frozen, it would freeze the next leader
            # for good; with a depth or descendant limit, refuse the next program's own
            # cgroups. Then it serves no more (a new one is made instead).
            try:
                inside, populated, as_new = cgroupfs.look_at_kept(kept)
            except FileNotFoundError as exc:  # (removed by someone else)
                logger.warning("cgroup %s cannot be read (%s); leaving it", kept, exc)
                self.forget(kept)
                continue
            except OSError:
                # Out of file descriptors, say: unseen, it is as good as it was. Dropped,
                # it would stay empty until we exit, and one more would be made for each
                # spawn that ran out. It stays kept; this spawn fails, as it would anyway.
                with self._lock:
                    self._free.append(kept)
                raise
            # A member of its last tree may have made cgroups inside it: they go before it
            # serves again (they are empty, as that tree was).
            if inside and not cgroupfs.remove_inner(kept):
                logger.warning("cgroup %s still has cgroups inside; leaving it", kept)
                self.forget(kept)
                continue
            if populated:
                logger.warning("cgroup %s has a process in it no tree started; leaving it", kept)
                self.forget(kept)  # (not ours to kill should we die)
                with self._lock:
                    self._retired[kept] = []  # (removed once that process has gone)
                continue
            if as_new:
                return kept, True
            self.forget(kept)
            try:
                os.rmdir(kept)
            except OSError as exc:  # (joined meanwhile, say: left, as one with cgroups inside)
                logger.warning("cgroup %s could not be removed (%s); leaving it", kept, exc)
        while True:
            with self._lock:
                path = os.path.join(self.path, f"tree-{next(self._counter)}")
            try:
                os.mkdir(path)
            except FileExistsError:  # pragma: no cover - a name made by someone else
                continue
            except OSError as exc:
                raise CgroupUnavailable(_why_no_cgroup("a tree cgroup", self.path, exc)) from exc
            # Before its leader starts: should we die between the fork and the leader's
            # attach, the watchdog must already know its cgroup.
            watchdog.register(backstop_entry(path))
            return path, False

    def _remove_retired(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, {}
        still_in_use: list[str] = []
        for tree, backstop in retired.items():
            if backstop:
                # A tree that outlived its cleanup: what it could not stop (its hard stop
                # not written, out of file descriptors) is stopped now, as the watchdog
                # would stop it had we died; else it ran on until interpreter exit
                # (helper-77). What is still dying is waited for by the next start.
                with contextlib.suppress(OSError):
                    cgroupfs.kill(tree)
                    cgroupfs.kill_main_thread_gone(tree)
            cgroupfs.remove_inner(tree)
            try:
                os.rmdir(tree)
            except FileNotFoundError:
                pass  # (removed by someone else)
            except OSError:
                # A process is still in it (or a cgroup inside it that would not go): tried
                # again at the next start. Forgotten, it stayed until interpreter exit, one
                # more for each such event in a program that runs for long (helper-59).
                still_in_use.append(tree)
                continue
            if backstop:  # (empty, and gone: nothing is left for the watchdog to kill)
                watchdog.unregister(*backstop)
        if still_in_use:
            with self._lock:
                kept = max(0, self.KEEP - len(self._retired))
                # (Those beyond are forgotten; their watchdog entries stay, harmless.)
                self._retired.update((tree, retired[tree]) for tree in still_in_use[:kept])

    def retire_outlived(self, tree: str, backstop: list[str]) -> None:
        """A tree cgroup whose processes outlived the tree's cleanup (in uninterruptible
        sleep past ``kill_wait``, on a hung NFS or FUSE mount, say, or not killed at all,
        the cleanup out of file descriptors): killed again at each tree start (up to
        `KEEP` such cgroups at a time), removed at the first after they have gone, and its
        watchdog entry, ``backstop``, dropped then
        (it stays until then: a parent killed meanwhile takes them along). Kept for good,
        it stayed until interpreter exit, one more for each such failure, each counted
        against any ``cgroup.max.descendants`` above (helper-63)."""
        with self._lock:
            if len(self._retired) < self.KEEP:
                self._retired[tree] = backstop

    def give_back(self, tree: str, *, killed: bool) -> None:
        """Keep an empty tree cgroup for reuse (or remove it, when enough are kept).

        ``killed``: ``cgroup.kill`` was written to it (or may have been: a leader started
        in it directly was killed at birth). Linux kills a child created directly in such
        a cgroup (see `_spawn_into_cgroup._prove`), so where leaders start that way it is
        not reused. (A member may write ``cgroup.kill`` too, unknown to us: a leader that
        dies of it at birth is caught, and started through /bin/sh, which can still join.)
        """
        reusable = not (killed and direct_spawn.available())
        with self._lock:
            if reusable and len(self._free) < self.KEEP:
                self._free.append(tree)
                return  # (still registered: it serves again)
            retired = not reusable and len(self._retired) < self.KEEP
            if retired:
                self._retired[tree] = []
        self.forget(tree)  # (empty, serving no more: nothing in it for the watchdog to kill)
        if retired:
            return
        if not cgroupfs.remove_inner(tree):
            logger.warning("cgroup %s still has cgroups inside; leaving it", tree)
            return
        os.rmdir(tree)

    def remove(self) -> None:
        """Remove the kept cgroups and the home itself (at interpreter exit)."""
        with self._lock:
            kept, self._free = self._free, []
            free, self._retired = [*kept, *self._retired], {}
        for tree in free:
            cgroupfs.remove_inner(tree)
            with contextlib.suppress(OSError):
                os.rmdir(tree)
        for tree in kept:
            self.forget(tree)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)  # fails, rightly, while some tree is still open

    def forget(self, tree: str) -> None:
        """Unregister ``tree`` from the watchdog: it leaves the home (or has left it)."""
        watchdog.unregister(backstop_entry(tree))


def backstop_entry(cgroup: str) -> str:
    """The watchdog's entry for a tree cgroup: killed, and removed, should we die."""
    return f"cgroup {cgroup}"


class CgroupUnavailable(Exception):
    """Why cgroup containment cannot be used here (the message says)."""


def _why_no_cgroup(what: str, parent: str, error: OSError) -> str:
    """What stopped ``what`` (a tree's cgroup, our home) from being made in ``parent``,
    for the user."""
    why = f"cannot create {what} in {parent}: {error.strerror}"
    if error.errno == errno.EAGAIN:
        # Linux says EAGAIN for a cgroup one level too deep, or one too many.
        why += (
            " (the cgroup.max.depth or cgroup.max.descendants of that cgroup or of one "
            "above it is reached)"
        )
    return why


_home_lock = threading.Lock()
renewed_in_forked_child(globals(), "_home_lock")


def cgroup_home() -> CgroupHome:
    """This process's home for tree cgroups, created on first use.

    Raises:
        CgroupUnavailable: no writable cgroup v2 hierarchy is delegated to us.
    """
    with _home_lock:
        pid = os.getpid()  # a forked child gets a home of its own
        if pid not in _homes:
            _homes[pid] = _make_home(pid)
        return _homes[pid]


_homes: dict[int, CgroupHome] = {}


def remove_home() -> None:
    """Remove this process's home, if it made one and no tree is left in it (at exit)."""
    with _home_lock:
        home = _homes.pop(os.getpid(), None)
    if home is not None:
        home.remove()


def _make_home(pid: int) -> CgroupHome:
    mount = cgroupfs.find_cgroup2_mount(_read_own("mountinfo"))
    if mount is None:
        raise CgroupUnavailable("no cgroup v2 hierarchy is mounted")
    own = cgroupfs.own_cgroup(_read_own("cgroup"))
    if own is None:
        raise CgroupUnavailable("this process is in no cgroup v2 cgroup")
    parent = os.path.normpath(os.path.join(mount, own.lstrip("/")))
    # Making a cgroup needs the directory; moving a process into it needs the common
    # ancestor's cgroup.procs (ours) writable too.
    for needed in (parent, os.path.join(parent, "cgroup.procs")):
        if not os.access(needed, os.W_OK):
            raise CgroupUnavailable(f"{needed} is not writable (not delegated to us)")
    stat = read_stat(pid)
    assert stat is not None
    _sweep_stale_homes(parent)
    while True:
        image = os.urandom(4).hex()
        name = f"{_HOME_PREFIX}{_pid_namespace()}-{pid}-{_started(stat)}-{image}"
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except FileExistsError:  # pragma: no cover - a token drawn twice
            continue
        except OSError as exc:
            # (No room for it under a limit, say: EAGAIN, named as such.)
            raise CgroupUnavailable(_why_no_cgroup("a cgroup", parent, exc)) from exc
        break
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        os.rmdir(path)
        raise CgroupUnavailable("cgroup.kill is missing (needs Linux 5.14 or newer)")
    # Should this process die without removing it (SIGKILL), the watchdog removes it after
    # the trees it kills; registered once, before any tree of it starts.
    watchdog.register(f"home {path}")
    relative = "/" + os.path.join(own.strip("/"), name)
    return CgroupHome(path, relative.replace("//", "/"))


def _read_own(name: str) -> str:
    """``/proc/self/<name>``. Where it cannot be read for what this process is (EINVAL or
    ENOENT: its main thread has exited, in an embedding host that ended it with
    ``pthread_exit``, and the files that go by its namespaces went with it), cgroup
    containment cannot be had: raised as such, ``"auto"`` takes the subreaper. It raised
    the OSError, and no tree of any containment could start (helper-68)."""
    path = f"/proc/self/{name}"
    try:
        return cgroupfs.read_text(path)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOENT):
            raise  # (out of file descriptors, say: this spawn fails, the next may not)
        raise CgroupUnavailable(
            f"cannot read {path}: {exc.strerror} (has the main thread exited?)"
        ) from exc


#: The initial pid namespace's inode (``PROC_PID_INIT_INO``): the same on every boot.
INITIAL_PID_NAMESPACE = 0xEFFFFFFC


def _pid_namespace() -> int:
    """Our pid namespace, by inode: a home's pid means something only inside it."""
    return os.stat("/proc/self/ns/pid").st_ino


def _started(stat: ProcStat) -> int:
    """A process's start time as a process outside any time namespace sees it: the one
    that names a home. /proc shows each reader boot time moved by its own namespace's
    offset; an owner and a sweeper in different ones would else never agree, and the
    sweep would take a live owner's home for a dead one's and kill its trees."""
    return stat.starttime - (boottime_offset() or 0)


def _may_be_owner(stat: ProcStat, named: int) -> bool:
    """Whether the live process ``stat`` may be the owner whose start time names a home:
    within a tick (an offset that is no whole number of ticks rounds the two views
    apart), or at all, where our own offset cannot be told. (A dead owner's pid taken by
    another process within a tick of its start leaves a stale home unswept: never the
    other way round.)"""
    offset = boottime_offset()
    return offset is None or abs(stat.starttime - offset - named) <= 1


#: Seconds a sweep waits for a stale tree it killed to empty (~1.5 ms, measured).
STALE_KILL_WAIT = 0.5


def _until_emptied(cgroup: str, within: float) -> bool:
    """Block up to ``within`` seconds until ``cgroup`` holds no live process; whether it
    came to that. Woken by each change of its ``cgroup.events`` (no polling)."""
    fd = os.open(os.path.join(cgroup, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        changed = select.poll()
        changed.register(fd, select.POLLPRI)  # (kernfs: a change since the last read)
        deadline = time.monotonic() + within
        while os.pread(fd, 64, 0).startswith(b"populated 1"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            changed.poll(remaining * 1000)
        return True
    finally:
        os.close(fd)


def _sweep_stale_homes(parent: str) -> None:
    """Remove the homes of processes that died without cleaning up (crashed, SIGKILLed).

    What still runs in them outlived its owner: the parent-death backstop should have
    killed it, and this does, before removing the directories. A home of this very
    process but not its current one was made by an image it exec'd away from, and is
    stale too. A home made in another pid namespace is looked at only once that
    namespace has no process left (`_live_pid_namespaces`): until then its owner may
    well be alive, under a pid that means nothing (or someone else) here.
    """
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    namespace = _pid_namespace()
    live_namespaces: set[int] | None = None
    for name in entries:
        if not name.startswith(_HOME_PREFIX):
            continue
        fields = name[len(_HOME_PREFIX) :].split("-")
        if len(fields) not in (3, 4):  # (3: named before homes had an image token)
            continue
        try:
            ns_text, pid_text, start_text = fields[:3]
            home_namespace, owner, start = int(ns_text), int(pid_text), int(start_text)
        except ValueError:
            continue  # not a home of ours (nor of this version)
        home = os.path.join(parent, name)
        if home_namespace != namespace:
            if live_namespaces is None:
                live_namespaces = _live_pid_namespaces()
            if home_namespace in live_namespaces:
                continue  # (or it cannot be told: every namespace is then taken for live)
            # Every process of it has died, its owner with them: its trees died with them
            # (a namespace's processes die with its init), and what may have been put in
            # their cgroups since is not its.
        elif (stat := read_stat(owner)) is not None and _may_be_owner(stat, start):
            current = _homes.get(owner)
            if owner != os.getpid() or (current is not None and current.path == home):
                continue  # its owner still runs
            # This process made it before it exec'd itself: that image's trees died with
            # its watchdog, which removes the home too, unless it was stopped first.
        with _claimed(home) as claimed:
            if claimed:
                _sweep_home(home, foreign=home_namespace != namespace)


@contextlib.contextmanager
def _claimed(home: str) -> Generator[bool]:
    """Whether the stale ``home`` is this sweep's to clear (locked, ``flock``, for the
    block, where a lock can be had).

    Its owner's watchdog share-locks it from its registration until the watchdog exits
    (`_watchdog.claim_home`). Between its owner's death and the end of its kill (tens of
    ms on a loaded machine) the home is stale by every other sign: a sweep then killed
    the same trees itself, and warned of an owner's leftovers on its own stderr. So a
    home a watchdog holds is cleared only once that watchdog has exited (it has removed
    the home, as a rule), waited for up to `WATCHDOG_WAIT`; or at once where every
    holder is stopped (SIGSTOP: it kills nothing until continued); or after that wait
    all the same (a watchdog that never saw its owner's death, as when a child forked at
    C level holds the socket). A home another sweep holds (exclusively) is left to it.
    """
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False  # (gone meanwhile: removed by its watchdog or another sweep)
        return
    except OSError as exc:  # (out of file descriptors, say: swept as before homes had locks)
        logger.debug("cannot open stale cgroup home %s to lock it: %s", home, exc)
        yield True
        return
    import fcntl  # noqa: PLC0415 - POSIX only, and the package imports on Windows

    try:
        ours = _lock_after_its_watchdog(fd, home)
        # (Its watchdog removed it meanwhile, as a rule.)
        yield ours is not None and os.path.isdir(home)
    finally:
        # Unlocked before the close (a no-op where no lock was had): a child another
        # thread forked meanwhile holds the lock with its copy of the descriptor, for its
        # whole life.
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


#: Seconds a sweep waits, at most, for the watchdog of a dead owner to finish with its home.
WATCHDOG_WAIT = 0.5


def _lock_after_its_watchdog(fd: int, home: str) -> bool | None:
    """Lock ``home`` (open as ``fd``) for the sweep, after its watchdog if one holds it
    (see `_claimed`): whether it got the lock, or None if the home is not this sweep's
    (another sweep holds it)."""
    import fcntl  # noqa: PLC0415 - POSIX only, and the package imports on Windows

    deadline = time.monotonic() + WATCHDOG_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        except OSError as exc:
            logger.debug("cannot lock stale cgroup home %s: %s", home, exc)
            return False
        else:
            return True
        holders = _flock_holders(os.fstat(fd))
        if any(exclusive for _, exclusive in holders):
            return None  # another sweep's
        at_work: list[int] = []
        for pid, _ in holders:
            stat = read_stat(pid)
            if stat is not None and stat.main_thread_alive and stat.state not in "Tt":
                with contextlib.suppress(OSError):  # (gone meanwhile)
                    at_work.append(os.pidfd_open(pid))
        try:
            remaining = deadline - time.monotonic()
            if not at_work or remaining <= 0:
                logger.debug("cgroup home %s: its watchdog is not done with it", home)
                return False  # swept unlocked: its holders kill nothing now
            waiting = select.poll()
            for pidfd in at_work:
                waiting.register(pidfd, select.POLLIN)  # (readable once it has exited)
            waiting.poll(remaining * 1000)
        finally:
            for pidfd in at_work:
                os.close(pidfd)


def _flock_holders(of: os.stat_result) -> list[tuple[int, bool]]:
    """The processes that hold a ``flock`` on the file ``of`` stats, from ``/proc/locks``,
    each with whether its lock is exclusive; none if that cannot be read."""
    node = f"{os.major(of.st_dev):02x}:{os.minor(of.st_dev):02x}:{of.st_ino}"
    try:
        lines = read_file("/proc/locks").decode().splitlines()
    except OSError:
        return []
    holders: list[tuple[int, bool]] = []
    for line in lines:
        # "1: FLOCK  ADVISORY  READ 1234 00:1a:5678 0 EOF" (a waiter's: "1: -> FLOCK ...")
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == node:
            with contextlib.suppress(ValueError):
                holders.append((int(fields[4]), fields[3] == "WRITE"))
    return holders


def _sweep_home(home: str, *, foreign: bool) -> None:
    """Kill what runs in the trees of a stale ``home`` and remove them and it, as far as
    it goes; of a home made in another pid namespace (``foreign``), remove only the
    emptied trees (see `_sweep_stale_homes`)."""
    for tree in cgroupfs.subdirs(home):
        try:
            if cgroupfs.populated(os.path.join(tree, "cgroup.events")):
                if foreign:
                    continue  # (left, with the home: not its owner's)
                logger.warning("killing what outlived its owner in %s", tree)
                cgroupfs.kill(tree)
                cgroupfs.kill_main_thread_gone(tree)
                # A cgroup goes only once empty, and its members die in a moment: not
                # waited for, the home stayed until some later process swept again.
                _until_emptied(tree, within=STALE_KILL_WAIT)
            cgroupfs.remove_inner(tree)  # (kept cgroups keep what members made, until reused)
            os.rmdir(tree)
        except OSError as exc:
            logger.debug("cannot remove stale cgroup %s yet: %s", tree, exc)
    try:
        os.rmdir(home)
    except OSError:
        return
    logger.debug("removed stale cgroup home %s", home)


class _AllNamespaces(set[int]):
    """Stands for every pid namespace: none can be told ended."""

    def __contains__(self, namespace: object) -> bool:
        return True


def _live_pid_namespaces() -> set[int]:
    """The pid namespaces (by inode) with a process in them.

    Only the initial namespace sees every process (with /proc its own: checked before
    any tree starts), and only through a /proc that hides none (no ``hidepid``), to a
    reader that may look at every process's namespace (root); otherwise every namespace
    is taken for live. A namespace lives exactly while its init does, and its init is in
    it: a process of a namespace nested in it shows that one, but cannot outlive the
    init of ours.
    """
    if _pid_namespace() != INITIAL_PID_NAMESPACE or proc_hides_processes():
        return _AllNamespaces()
    found: set[int] = {INITIAL_PID_NAMESPACE}
    try:
        entries = os.listdir("/proc")
    except OSError:  # (out of file descriptors, say)
        return _AllNamespaces()
    for entry in entries:
        if not entry.isdigit() or entry == "1":  # (init is in ours: it may be unreadable)
            continue
        try:
            found.add(os.stat(f"/proc/{entry}/ns/pid").st_ino)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited and reaped
        except OSError:
            return _AllNamespaces()  # (not ours to look at)
    return found
