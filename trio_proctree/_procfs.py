"""Reading processes from /proc: one process's state, and shared snapshots of them all."""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import attrs

#: States of a process that has exited: a zombie still has a /proc entry (and still
#: answers ``kill(pid, 0)``) but runs nothing, so it is not "alive"...
_DEAD_STATES = frozenset("ZXx")
_DEAD_BYTES = frozenset(state.encode() for state in _DEAD_STATES)
#: ...unless only its main thread has exited: /proc shows the process as a zombie while
#: its other threads still run (its thread count says so, and its pidfd is not readable).
_THREADS = 17  # num_threads, as an index into the fields after comm
_FLAGS = 6  # the main thread's task flags, as an index into the fields after comm
#: The task flag of a thread in its exit (Linux's PF_EXITING): it never runs its program
#: again, though /proc shows it running until it is a zombie (tens of ms, for a process
#: freeing a gigabyte).
_PF_EXITING = 0x4


@attrs.frozen
class ProcStat:
    """The fields of ``/proc/PID/stat`` that containment needs."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    #: Clock ticks after boot; with ``pid`` it names one process, never a recycled pid.
    starttime: int
    threads: int
    flags: int

    @property
    def alive(self) -> bool:
        return self.main_thread_alive or self.threads > 1

    @property
    def exiting(self) -> bool:
        """Whether its main thread is in its exit (killed, say): the process is dying, unless
        that thread alone exits and others run on."""
        return bool(self.flags & _PF_EXITING)

    @property
    def main_thread_alive(self) -> bool:
        """Whether its main thread runs (the process may live on in others when not)."""
        return self.state not in _DEAD_STATES


def parse_stat(pid: int, data: bytes) -> ProcStat:
    # The command name sits in parentheses and may itself contain spaces and ')':
    # the fields start after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        starttime=int(fields[19]),
        threads=int(fields[_THREADS]),
        flags=int(fields[_FLAGS]),
    )


def read_file(path: str, *, dir_fd: int | None = None, made_whole: bool = False) -> bytes:
    """A small kernel file (procfs, cgroupfs) in one go: os.read, no buffered-IO layers.

    ``made_whole``: the kernel makes the file's whole text at once (``/proc/PID/stat``:
    under a page), so a read that returns less than asked returns it all, and the read
    that would say "end of file" is not needed (one syscall of four, in every stat read).

    Raises FileNotFoundError, or ProcessLookupError for a process that is gone.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks: list[bytes] = []
        if made_whole:
            chunks.append(first := os.read(fd, _WHOLE_READ))
            if len(first) < _WHOLE_READ:
                return first
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


#: Larger than any /proc/PID/stat (52 numbers and a 16-byte name: ~1.1 kB at the most).
_WHOLE_READ = 4096


def read_environ(pid: int) -> bytes:
    """The process's environment block; empty when it shows none. Raises as `read_file`.

    A process whose main thread has exited while its other threads run on shows none at
    /proc/PID/environ (it reads as gone); the task entry of a live thread shows it.
    """
    try:
        environment = read_file(f"/proc/{pid}/environ")
    except ProcessLookupError:
        if (other := _environ_of_other_threads(pid)) is None:
            raise  # gone altogether
        return other
    return environment or _environ_of_other_threads(pid) or environment


def _environ_of_other_threads(pid: int) -> bytes | None:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return None
    for tid in threads:
        if tid != str(pid):
            try:
                return read_file(f"/proc/{pid}/task/{tid}/environ")
            except (FileNotFoundError, ProcessLookupError):
                continue  # that thread has exited too
    return None


#: Whether this process has found /proc its pid namespace's. Forgotten in a forked child,
#: which may be the first process of a new namespace under a /proc mounted outside it (and
#: may even have its parent's pid: the parent was pid 1 of a namespace too, say).
_proc_is_ours = False


def foreign_proc() -> str | None:
    """Why /proc cannot be trusted to name this process's processes, or None if it can.

    A /proc mounted for another pid namespace (``unshare --pid --fork`` without
    ``--mount-proc``) lists pids of that namespace: /proc/N is not our process N, so a
    start-time proof, a subreaper's children, a group's scan would all read strangers,
    and a pidfd opened for a pid read there would name the wrong process.
    Once /proc is found ours, that is kept for the process (a /proc remounted under a
    running program is not seen); a refusal is asked again each time.

    Raises OSError for a /proc that cannot be read for another reason (out of file
    descriptors, say).
    """
    global _proc_is_ours  # noqa: PLW0603 - one answer per process
    if _proc_is_ours:
        return None
    try:
        # NStgid lists our pid in each pid namespace from /proc's down to ours: just
        # getpid() when they are the same.
        status = read_file("/proc/self/status")
    except (FileNotFoundError, ProcessLookupError):
        # /proc does not show this process at all: it is a namespace's below ours, or
        # beside it.
        return (
            "/proc does not show this process: it is mounted for another pid namespace "
            "(a child namespace's, or an unrelated one); mount a /proc for this one"
        )
    ids = next(
        (line.split()[1:] for line in status.splitlines() if line.startswith(b"NStgid:")), None
    )
    if ids != [str(os.getpid()).encode()]:
        return (
            "/proc shows another pid namespace than this process's (started with "
            "`unshare --pid` without `--mount-proc`?): the pids it lists are other "
            "processes' here; mount a /proc for this namespace"
        )
    _proc_is_ours = True
    return None


def proc_hides_processes() -> bool:
    """Whether /proc is mounted to hide processes its reader may not trace (``hidepid``):
    then a pid missing from it may be a live process's."""
    try:
        mounts = read_file("/proc/self/mountinfo")
    except OSError:
        return True  # (cannot tell)
    hides = True  # (no /proc mount found: cannot tell)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[4] != b"/proc" or b"-" not in fields:
            continue
        after = fields[fields.index(b"-") + 1 :]
        if len(after) < 3 or after[0] != b"proc":
            continue
        # The last one mounted there is the one seen. hidepid: 0/off shows every process.
        hides = any(
            option.startswith(b"hidepid=") and option not in (b"hidepid=0", b"hidepid=off")
            for option in after[2].split(b",")
        )
    return hides


#: The initial time namespace's inode (``PROC_TIME_INIT_INO``): the same on every boot.
INITIAL_TIME_NAMESPACE = 0xEFFFFFFA


def boottime_offset() -> int | None:
    """Clock ticks that our time namespace adds to boot time, which /proc adds to every
    start time it shows us (0 outside time namespaces); None where that cannot be told.

    Start times seen by processes in different time namespaces are compared by taking
    this off each (the sweep of stale cgroup homes names their owners so), within a tick:
    an offset that is no whole number of ticks rounds the views apart. The offsets file
    tells of the namespace our *children* get, which is ours unless we unshared a new one
    and stay outside it: then only the initial namespace's offset (none) is known.
    """
    try:
        own = os.stat("/proc/self/ns/time").st_ino
        childrens = os.stat("/proc/self/ns/time_for_children").st_ino
    except OSError:
        return 0  # a kernel without time namespaces: no offset
    if own == INITIAL_TIME_NAMESPACE:
        return 0
    if own != childrens:
        return None
    nanoseconds = 0
    try:
        with open("/proc/self/timens_offsets") as offsets:
            for line in offsets:
                clock, seconds, nanos = line.split()
                if clock in ("boottime", "7"):  # (CLOCK_BOOTTIME by name, or number)
                    nanoseconds = int(seconds) * 1_000_000_000 + int(nanos)
    except (OSError, ValueError):
        return None
    return nanoseconds // (1_000_000_000 // os.sysconf("SC_CLK_TCK"))


def _forget_whose_proc() -> None:
    global _proc_is_ours  # noqa: PLW0603 - one answer per process
    _proc_is_ours = False
    process_table.forget()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
    os.register_at_fork(after_in_child=_forget_whose_proc)


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None once it has been reaped (or never existed)."""
    try:
        data = read_file(f"/proc/{pid}/stat", made_whole=True)
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_stat(pid, data) if data else None


#: How long a live process that shows no arguments is given to show them: one caught
#: inside exec (its new image's arguments not yet in place; subprocess.Popen returns
#: that early) shows them within microseconds.
_ARGUMENTS_WITHIN = 0.01


def on_one_line(text: str) -> str:
    """``text`` with each character that is not printable (a newline, an escape) written as
    its Python escape: a command line shown in a table or a list, one per line, cannot
    then forge a line of its own or move the terminal's cursor."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def command_line(pid: int) -> str:
    """The process's arguments joined by spaces, for people to read.

    When there are none to read (a zombie, a kernel thread, a process still without them
    after `_ARGUMENTS_WITHIN`), its command name in brackets, as ps shows it; "?" once it
    is gone.
    """
    try:
        deadline = None
        while True:
            raw = read_file(f"/proc/{pid}/cmdline")
            if arguments := [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]:
                return " ".join(arguments)
            stat = read_stat(pid)
            now = time.monotonic()
            deadline = now + _ARGUMENTS_WITHIN if deadline is None else deadline
            if stat is None or not stat.main_thread_alive or now >= deadline:
                break
            time.sleep(0.0005)  # (for people to read; no event says an exec is done)
        return f"[{read_file(f'/proc/{pid}/comm').decode(errors='replace').strip()}]"
    except OSError:
        return "?"


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler of its own for ``sig`` now (``SigCgt`` in
    /proc/PID/status: one mask for all its threads). False when that cannot be told: it
    is gone, /proc hides it (``hidepid``), or no file descriptor is left to look."""
    try:
        status = read_file(f"/proc/{pid}/status")
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith(b"SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False  # pragma: no cover - every Linux since 2.6 shows it


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; False for a zombie or a reaped process."""
    stat = read_stat(pid)
    return stat is not None and stat.alive


@attrs.frozen
class Snapshot:
    """Which live processes were in which process group at one moment.

    ``taken_at`` (`time.monotonic_ns`) is read before the scan starts, so every process
    that existed then is in it, unless it exited during the scan.
    """

    taken_at: int
    groups: dict[int, list[int]]

    def in_group(self, pgid: int) -> list[int]:
        return self.groups.get(pgid, [])


def scan() -> Snapshot:
    """Map every live process to its process group.

    The kernel formats each /proc/PID/stat (~10 µs a process), so this stays lean: one
    directory fd, one read per process, and only the fields up to the pgid parsed.
    """
    taken_at = time.monotonic_ns()
    groups: dict[int, list[int]] = defaultdict(list)
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for entry in os.listdir(proc):
            if not entry.isdigit():
                continue
            try:
                data = read_file(entry + "/stat", dir_fd=proc, made_whole=True)
            except OSError:
                continue  # exited since the listing
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
            fields = data[data.rfind(b")") + 2 :].split(b" ", _THREADS + 1)
            if fields[0] not in _DEAD_BYTES or int(fields[_THREADS]) > 1:
                groups[int(fields[2])].append(int(entry))
    finally:
        os.close(proc)
    return Snapshot(taken_at, dict(groups))


class ProcessTable:
    """Hands out snapshots of /proc, sharing one scan among every caller it can serve.

    A scan costs ~10 µs per process on the machine. When many trees are torn down at
    once, each asks for "a snapshot taken after time T" (T: when it saw its last known
    member die); one scan taken after all of their T's serves them all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None

    def forget(self) -> None:
        """In a forked child: the parent's scan is not the child's, and its lock may have
        been held, by another thread, as the parent forked."""
        self._lock = threading.Lock()
        self._latest = None

    def snapshot(self, not_before: int) -> Snapshot:
        with self._lock:
            if self._latest is None or self._latest.taken_at < not_before:
                self._latest = scan()
            return self._latest


process_table = ProcessTable()
