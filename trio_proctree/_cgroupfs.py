"""The cgroup v2 files: where the hierarchy is mounted, who is in a cgroup, and how a
cgroup is killed, looked at and emptied of what members made inside it."""

from __future__ import annotations

import contextlib
import os
import signal

from ._procfs import read_file


def _unescape_mount_path(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape")


def find_cgroup2_mount(mountinfo: str) -> str | None:
    """Where the cgroup v2 hierarchy is mounted: ``/sys/fs/cgroup`` on pure v2 hosts,
    ``/sys/fs/cgroup/unified`` on hybrid ones. None if it is not mounted where our own
    cgroup path (as /proc/self/cgroup gives it) can be found under it.

    That takes a mount of the hierarchy's root as our cgroup namespace sees it (mountinfo
    root ``/``). In a cgroup namespace whose mount was made outside it (``unshare
    --cgroup``, say), the root shows as ``/..``: the mount holds cgroups above our
    namespace's root, whose names we cannot know, so our own cannot be found in it.
    """
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields = before.split(" ")
        if after.split(" ", 1)[0] == "cgroup2" and fields[3] == "/":
            return _unescape_mount_path(fields[4])
    return None


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """Our cgroup v2 path (``/user.slice/...``), from the ``0::`` line of /proc/self/cgroup."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def read_text(path: str) -> str:
    return read_file(path).decode()


def populated(events: str, *, dir_fd: int | None = None) -> bool:
    """Whether a cgroup holds a live process, from its ``cgroup.events`` file (the path,
    relative to ``dir_fd`` if given)."""
    # One short read: the file is two short lines, ``populated`` the first (read_file's
    # loop and its 64 KiB buffer cost more than the answer, on the path that ends a tree).
    fd = os.open(events, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 64).startswith(b"populated 1")
    finally:
        os.close(fd)


def open_if_plentiful(path: str) -> int:
    """``path`` opened for reading, while file descriptors are plentiful; else -1.

    Plentiful: the lowest free descriptor, which the kernel hands out, is below half the
    soft limit. Past that, a descriptor held per tree would be one the program may need:
    500 trees must run under the common soft limit of 1024, each holding its leader's
    pidfd (and its pipes, if any).
    """
    import resource  # noqa: PLC0415 - Unix only: importing the package must work on Windows

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # out of file descriptors, say
        return -1
    if fd < resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2:
        return fd
    os.close(fd)
    return -1


def remove_inner(cgroup: str) -> bool:
    """Remove the cgroups members made inside ``cgroup``, deepest first: True if none is
    left (one a member still runs in stays)."""
    inner = all_dirs(cgroup)[1:]
    for folder in sorted(inner, key=len, reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return not (inner and subdirs(cgroup))


#: The settings a member may change in its own cgroup, as a new cgroup has them: a tree
#: cgroup has only the core files (its home enables no controllers). ``cgroup.type``
#: cannot change while the cgroup has processes; ``cgroup.pressure`` is absent where
#: pressure accounting is off. ``cgroup.freeze`` is not among them: an empty cgroup is
#: frozen the moment it is told to freeze, and ``cgroup.events``, read anyway, says so.
NEW_CGROUP_SETTINGS = {
    "cgroup.max.depth": b"max",
    "cgroup.max.descendants": b"max",
    "cgroup.pressure": b"1",
}


def as_new(folder: int) -> bool:
    """Whether an emptied cgroup's settings are still those of a new one (``folder``: its
    directory, open), but for freezing (`look_at_kept`)."""
    for name, new in NEW_CGROUP_SETTINGS.items():
        try:
            if read_file(name, dir_fd=folder, made_whole=True).strip() != new:
                return False
        except FileNotFoundError:
            if name != "cgroup.pressure":
                return False
    return True


def look_at_kept(cgroup: str) -> tuple[bool, bool, bool]:
    """Whether an emptied cgroup has cgroups inside, whether it holds a live process, and
    whether its settings are those of a new one (not frozen among them): read through one
    descriptor of its directory, its files found without walking the path for each (~25 us
    less a tree, with 100 trees starting at once)."""
    folder = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        inside = os.fstat(folder).st_nlink > 2  # (2 + its subdirectories)
        fd = os.open("cgroup.events", os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
        try:
            events = os.read(fd, 64)
        finally:
            os.close(fd)
        # (Linux before 5.2 has no freezer, and no "frozen" line.)
        frozen = b"\nfrozen 1" in events
        return inside, events.startswith(b"populated 1"), not frozen and as_new(folder)
    finally:
        os.close(folder)


def processes_in(cgroup: str) -> list[int]:
    """Every process in the cgroup and in the cgroups a member may have made inside it."""
    try:
        pids = [int(pid) for pid in read_file(os.path.join(cgroup, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []  # removed meanwhile
    for inner in subdirs(cgroup):
        pids.extend(processes_in(inner))
    return pids


def main_thread_gone(cgroup: str) -> list[int]:
    """Processes in the cgroup (or in those inside it) whose main thread has exited while
    their other threads run on: ``cgroup.procs`` lists them, ``cgroup.threads`` does not
    list that thread (nor any exited one)."""
    try:
        processes = read_file(os.path.join(cgroup, "cgroup.procs")).split()
        threads = set(read_file(os.path.join(cgroup, "cgroup.threads")).split())
    except FileNotFoundError:
        return []  # removed meanwhile
    found = [int(pid) for pid in processes if pid not in threads]
    for inner in subdirs(cgroup):
        found.extend(main_thread_gone(inner))
    return found


def kill(cgroup: str) -> None:
    _write_control(cgroup, "cgroup.kill", b"1")


def thaw(cgroup: str) -> None:
    """Thaw ``cgroup`` if it is frozen (``cgroup.freeze``; nothing happens if not)."""
    _write_control(cgroup, "cgroup.freeze", b"0")


def thaw_inside(cgroup: str) -> None:
    """Thaw every cgroup a member made inside ``cgroup`` and froze: thawing ``cgroup``
    leaves them frozen (each keeps its own ``cgroup.freeze``). One that cannot be thawed
    (removed meanwhile) is passed over."""
    for inner in all_dirs(cgroup)[1:]:
        with contextlib.suppress(OSError):
            thaw(inner)


def _write_control(cgroup: str, name: str, value: bytes) -> None:
    fd = os.open(os.path.join(cgroup, name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def kill_main_thread_gone(cgroup: str) -> None:
    """SIGKILL, through pidfds, each process in ``cgroup`` whose main thread has exited
    while others run on: ``cgroup.kill`` sends its SIGKILL to that exited thread alone,
    where nothing takes it. (Each pidfd is opened first, then the process proven to be
    in the cgroup, so that a pid recycled meanwhile is never hit.)"""
    mount = find_cgroup2_mount(read_text("/proc/self/mountinfo"))
    if mount is None:
        return
    relative = "/" + os.path.relpath(cgroup, mount)
    for pid in main_thread_gone(cgroup):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone meanwhile (or out of file descriptors: the wait tells)
        try:
            if in_cgroup(pid, relative):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # exited meanwhile
        finally:
            os.close(fd)


def subdirs(path: str) -> list[str]:
    """The cgroups directly inside ``path`` (members may make some)."""
    try:
        if os.stat(path).st_nlink <= 2:  # a directory's link count is 2 + its subdirectories
            return []
        return [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def in_cgroup(pid: int, relative: str) -> bool:
    """Whether ``pid`` is in the cgroup with this /proc/PID/cgroup path, or below it."""
    try:
        path = own_cgroup(read_text(f"/proc/{pid}/cgroup"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return path is not None and (path == relative or path.startswith(relative + "/"))


def all_dirs(path: str) -> list[str]:
    found = [path]
    for inner in subdirs(path):
        found.extend(all_dirs(inner))
    return found
