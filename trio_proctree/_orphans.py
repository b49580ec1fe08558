"""Processes that re-parent to us: being their child subreaper, finding and reaping them.

With ``PR_SET_CHILD_SUBREAPER`` set, a descendant whose parent dies becomes our child;
once it dies it stays a zombie until we reap it. Only the processes of our own trees are
ever reaped here: another part of the program may be waiting for its own children.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator

from ._after_fork import renewed_in_forked_child
from ._leader import is_unreaped_leader
from ._procfs import ProcStat, read_file, read_stat

logger = logging.getLogger("trio_proctree")

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_lock = threading.Lock()
renewed_in_forked_child(globals(), "_lock")
_subreaper_in: set[int] = set()  # the pid that set it: a forked child must set it again


class SubreaperUnavailable(Exception):
    """Why this process cannot become a child subreaper (the message says)."""


def become_subreaper() -> None:
    """Make this process the child subreaper of its descendants (once per process)."""
    with _lock:
        if os.getpid() in _subreaper_in:
            return
        try:
            result = libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError) as exc:
            raise SubreaperUnavailable(f"prctl is not available: {exc}") from exc
        if result != 0:
            error = ctypes.get_errno()
            raise SubreaperUnavailable(f"PR_SET_CHILD_SUBREAPER failed: {os.strerror(error)}")
        _subreaper_in.add(os.getpid())
        logger.debug("pid %d is now the child subreaper of its descendants", os.getpid())


def is_subreaper() -> bool:
    """Whether this process is a child subreaper: made so here, or by the image it exec'd
    from (the setting outlives execve, and orphans then re-parent to us all the same,
    to pile up as zombies if taken for none), or by other code. Asked of the kernel until
    it says yes (~0.5 us); a forked child is none until it sets it again."""
    pid = os.getpid()
    if pid in _subreaper_in:
        return True
    flag = ctypes.c_int()
    try:
        asked = libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no prctl: no subreaper either
        return False
    if asked == 0 and flag.value:
        with _lock:
            _subreaper_in.add(pid)
        return True
    return False


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def check_subreaper_available() -> None:
    """Raise SubreaperUnavailable if this process could not become a child subreaper.

    Asks without changing anything (PR_GET_CHILD_SUBREAPER): the setting is process-wide,
    so it is made only when a tree that needs it is started.
    """
    try:
        flag = ctypes.c_int()
        result = libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError) as exc:
        raise SubreaperUnavailable(f"prctl is not available: {exc}") from exc
    if result != 0:
        error = ctypes.get_errno()
        raise SubreaperUnavailable(f"PR_GET_CHILD_SUBREAPER failed: {os.strerror(error)}")


def children(pid: int) -> list[int]:
    """The children of ``pid``, of all its threads (each thread's children are its own)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return found
    for tid in threads:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found.extend(_thread_children(pid, tid))
    return found


def _thread_children(pid: int, tid: int | str) -> list[int]:
    """The children of one thread of ``pid``; raises as `read_file` once it is gone."""
    return [int(child) for child in read_file(f"/proc/{pid}/task/{tid}/children").split()]


def adopted_children(also: Iterable[int] = ()) -> list[int]:
    """Our children that a tree's members may be among, read from where the kernel puts
    them: those of the main thread and of the threads named in ``also``.

    An orphan re-parented to a subreaper goes to the subreaper's first live thread (the
    kernel's ``find_new_reaper``: ``find_alive_thread`` takes the first in the thread
    list not exiting), and a thread that exits hands its children on the same way: while
    the main thread lives, every orphan is its child. A leader's ``CLONE_PARENT`` children
    are its own parent's, the thread that forked it (``also``; once that thread has
    exited, they too are the main thread's). So two files, not one per thread (~10 us
    each: with trio's idle worker threads, 30 in each listing, three listings a teardown).
    The leaders, children of the threads that started them, are known to their trees.
    """
    pid = os.getpid()
    if threading.get_native_id() != pid:  # (else we run in the main thread: it lives)
        main = read_stat(pid)
        if main is None or not main.main_thread_alive:
            return children(pid)  # the main thread has exited: some other one adopts
    found: list[int] = []
    for tid in dict.fromkeys([pid, *(tid for tid in also if tid)]):
        try:
            found.extend(_thread_children(pid, tid))
        except (FileNotFoundError, ProcessLookupError):
            if tid == pid:
                return children(pid)
            # That thread has exited: its children are the main thread's, read above or
            # (moved since) in the next listing.
    return found


def exited_child(pid: int) -> bool:
    """Whether ``pid``, listed as a child of ours, has exited (a zombie, or reaped already).

    One ``waitid`` (``WNOWAIT``: nothing is reaped), instead of a /proc read: zombies that
    other code leaves unreaped pile up under a subreaper, and each listing meets them all.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped since the listing: no child of ours any more


def descendants(roots: Iterable[int]) -> Iterator[ProcStat]:
    """The stat of each of ``roots`` and of every process below them (gone ones skipped)."""
    pending = list(roots)
    while pending:
        pid = pending.pop()
        stat = read_stat(pid)
        if stat is not None:
            yield stat
            pending.extend(children_of(stat))


def children_of(stat: ProcStat) -> list[int]:
    """`children`, one file read fewer for a process of one thread (most are): its
    thread's children file, without listing its threads first. (A child of a thread
    started since the stat was read is missed by this listing only: members are listed
    again until none new shows up, and the group's signals reach it meanwhile.)"""
    if stat.threads != 1 or not stat.main_thread_alive:
        return children(stat.pid)
    try:
        return _thread_children(stat.pid, stat.pid)
    except (FileNotFoundError, ProcessLookupError):
        return []


def reap_orphans(
    leader_pid: int, ours: Callable[[ProcStat], bool], *, parent_thread: int = 0
) -> None:
    """Reap the dead processes of one tree that re-parented to us (we are a subreaper),
    or that its leader started with ``CLONE_PARENT`` (the children of ``parent_thread``).

    Without the subreaper setting, orphans go to init and there is nothing to do. The
    leader is left alone: its driver reaps it, after the last signal to its group.
    """
    if not is_subreaper():
        return
    listed = adopted_children(also=[parent_thread])
    for child in listed:
        # Leaders (this tree's, and the other trees' zombies) are reaped by their drivers.
        if child == leader_pid or is_unreaped_leader(child) or not exited_child(child):
            continue
        stat = _zombie_stat(child)  # (None once reaped since the listing)
        if stat is not None and ours(stat):
            # Read again before the reap: a kept stat must never have us reap another's.
            _zombies.pop(child, None)
            stat = read_stat(child)
            if stat is None or stat.alive or not ours(stat):
                continue
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass  # reaped meanwhile
    for gone in _zombies.keys() - set(listed):  # reaped since, by their own code
        _zombies.pop(gone, None)


#: The stat of each zombie child of ours last read, by pid, with the inode number of its
#: /proc directory: zombies of other code's orphans pile up under a subreaper, each
#: teardown meets them all, and a zombie's stat never changes (read each time, ~50 us a
#: zombie a teardown; a stat of the directory is ~5). A pid reused by a new process has
#: a /proc directory of a new inode; an entry is also dropped once its pid no longer lists.
_zombies: dict[int, tuple[int, ProcStat]] = {}


def _zombie_stat(pid: int) -> ProcStat | None:
    """The stat of zombie child ``pid``, read once; None if it is not a zombie after all
    (its main thread exited while others run, say) or is gone."""
    try:
        inode = os.stat(f"/proc/{pid}").st_ino
    except OSError:
        return None
    if (known := _zombies.get(pid)) is not None and known[0] == inode:
        return known[1]
    stat = read_stat(pid)
    if stat is None or stat.alive:
        return None
    _zombies[pid] = (inode, stat)
    return stat


def _forget_the_parents_zombies() -> None:
    # A forked child has children of its own: none of these.
    _zombies.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
    os.register_at_fork(after_in_child=_forget_the_parents_zombies)
