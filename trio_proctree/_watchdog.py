"""The parent-death backstop: one small process that kills our trees if we die first.

atexit hooks do not run when a process is SIGKILLed, and ``PR_SET_PDEATHSIG`` covers only
the direct child (and, set from trio's worker threads, fires when that thread retires,
killing a healthy child). So each process that starts trees also starts, on first use,
one watchdog (not one per tree): a ``python -I -S`` running `_WATCHDOG` (sent down its
stdin first: its command line stays short, `command`), in a session of
its own so terminal signals do not reach it, reading our registrations from a socket. When
that socket reaches EOF — we exited, however — it SIGKILLs what is still registered:

- ``cgroup PATH``: the whole cgroup, through ``cgroup.kill``, which it then removes (a
  leader still on its way in through ``/bin/sh`` then cannot join, and runs nothing);
- ``group PGID EARLIEST LATEST``: the process group of the leader that has that pid and
  started within those clock ticks after boot. On Linux 6.9+ the watchdog opens a pidfd
  of that leader as the registration arrives, and kills the group through it
  (``PIDFD_SIGNAL_PROCESS_GROUP``): its members die even if init reaped the leader first,
  and a later group with the same id is never hit. Elsewhere, ``killpg`` only while that
  leader (alive or a zombie) still pins the group id;
- ``marker VAR=VALUE``: every process whose environment carries the marker, through
  pidfds (the subreaper containment's escapees). A process caught in the middle of
  ``execve`` shows no environment for a moment: such processes are looked at again,
  for up to 0.5 s in all, until they show one;
- ``home PATH``: our directory of tree cgroups, removed last, with the emptied cgroups
  kept in it for reuse (a home with a tree still running in it stays, for the sweep).
  Held open and share-locked (``flock``) from its registration until the watchdog
  exits: a sweep in another process that finds it so held waits for the watchdog to
  exit first (0.5 s at most; not for one that is stopped) (`claim_home`).

An entry can also be killed at once (`kill_now`), and forgotten: a tree whose spawn failed
after its leader ran, when this process may be out of the file descriptors it takes.

Trees are registered when they start, in one write. Unregistrations are kept back and
go with the next registration (or at exit): a write wakes the watchdog, which costs tens
of microseconds on the path that ends a tree, and an entry left registered a little longer
is harmless (a group is checked against its leader's start time; a cgroup that has been
emptied or reused is killed only if the parent dies, when its new tree must die too).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable

from ._after_fork import renewed_in_forked_child

logger = logging.getLogger("trio_proctree")

_WATCHDOG = r"""
import errno, fcntl, os, queue, resource, select, signal, sys, threading, time

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()

def kill_cgroup(path):
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        pass
    # cgroup.kill misses a process whose main thread has exited while others run on
    # (Linux sends that SIGKILL to the exited thread alone): each such member gets one
    # through a pidfd, opened before a second look confirms that its pid is still such a
    # member's (a pid recycled in between names a process in the cgroup, or a dead one).
    pidfds = {}
    for pid in main_thread_gone(path):
        try:
            pidfds[pid] = os.pidfd_open(pid)
        except OSError:
            pass
    still = set(main_thread_gone(path))
    for pid, fd in pidfds.items():
        try:
            if pid in still:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        os.close(fd)

def main_thread_gone(path):
    # Listed in cgroup.procs, with no thread of that id in cgroup.threads.
    found = []
    for inner, _, _ in os.walk(path):
        try:
            with open(os.path.join(inner, "cgroup.procs"), "rb") as f:
                processes = f.read().split()
            with open(os.path.join(inner, "cgroup.threads"), "rb") as f:
                threads = set(f.read().split())
        except OSError:
            continue
        found.extend(int(pid) for pid in processes if pid not in threads)
    return found

def remove_cgroups(paths):
    # A leader that joins through the joiner or /bin/sh may still be on its way in (it writes
    # cgroup.procs after its exec, a write that can wait tens of ms), and the cgroup.kill
    # above missed it. So each cgroup goes: a removed cgroup cannot be joined, and the
    # wrapper exits without running the command. Until then, whoever made it in is killed
    # again, every 5 ms at the least. Woken sooner by a cgroup's cgroup.events, which the
    # kernel flags when it empties (its members most often die within 2 ms of their
    # cgroup.kill): the next try then comes at once. Not woken by that alone: the kernel
    # flags no join into a populated cgroup, and drops a notice it held back (one per 10
    # ms) if the cgroup is removed meanwhile (by its own process, say, while the watchdog
    # waits: it was seen to sleep out the whole 2 s). Bounded: at a normal exit the
    # interpreter waits for us.
    deadline = time.monotonic() + 2
    poller = select.poll()
    events = {}  # path -> its cgroup.events, open
    try:
        while True:
            for path in list(paths):
                if removed(path):
                    paths.remove(path)
                    unwatch(path, events, poller)  # (a removed cgroup's file stays flagged)
                    continue
                kill_cgroup(path)
                watch(path, events, poller)
            left = deadline - time.monotonic()
            if not paths or left <= 0:
                return
            poller.poll(1000 * min(left, 0.005))
    finally:
        for fd in events.values():
            os.close(fd)

def watch(path, events, poller):
    # Its cgroup.events is read after each wake-up (else it stays flagged), and at most 64
    # are held (the descriptors kept for the work at the end are for killing).
    fd = events.get(path)
    try:
        if fd is None and len(events) < 64:
            fd = events[path] = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY)
            poller.register(fd, select.POLLPRI)
        if fd is not None:
            os.pread(fd, 64, 0)
    except OSError:
        unwatch(path, events, poller)

def unwatch(path, events, poller):
    if (fd := events.pop(path, None)) is not None:
        poller.unregister(fd)
        os.close(fd)

def removed(path):
    # Cgroups the members made inside it first, the deepest first.
    for inner, folders, _ in os.walk(path, topdown=False):
        for folder in folders:
            try:
                os.rmdir(os.path.join(inner, folder))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True

def kill_group(pgid, earliest, latest):
    fields = stat(pgid)
    if fields is not None and earliest <= int(fields[19]) <= latest:  # it pins the pgid
        for kill in (os.killpg, os.kill):  # (a leader may have left its group: setpgid)
            try:
                kill(pgid, signal.SIGKILL)
            except OSError:
                pass

# Linux 6.9+: a signal to the process group of a pidfd's process, reached through the
# kernel's object for the group's id, not through the number: it reaches the group's
# members even once its leader has been reaped (by init, which adopts it as we die, and
# may reap it before we look), and never a later group that took the same number.
PIDFD_SIGNAL_PROCESS_GROUP = 4

def group_signals_work():
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, 0, None, PIDFD_SIGNAL_PROCESS_GROUP)  # our own group
        return True
    except OSError:
        return False
    finally:
        os.close(fd)

def pin_leader(entry):
    # For a group entry, a pidfd of its leader, opened as the registration arrives (the
    # leader is then our parent's unreaped child, as a rule) and proven by its start time
    # read after it opened; None for other entries, or if that cannot be had.
    kind, _, rest = entry.partition(b" ")
    if kind != b"group" or not GROUP_SIGNALS or len(pinned) >= PINS_AT_MOST:
        return None
    pgid, earliest, latest = map(int, rest.split())
    try:
        fd = os.pidfd_open(pgid)
    except OSError:
        return None
    fields = stat(pgid)
    if fields is None or not earliest <= int(fields[19]) <= latest:
        os.close(fd)
        return None
    pinned.add(fd)
    return fd

def claim_home(entry):
    # A home entry's directory, open and share-locked for as long as we run (or until
    # it is unregistered); None if that cannot be had. A sweep of stale homes (another
    # process's, at its first tree) that finds the home of an owner that has died so held
    # waits for us to exit, 0.5 s at most, while we kill and remove what is in it. (Our
    # parent's death and our work took tens of ms on a loaded machine, in which that
    # sweep killed the same trees, warning on its stderr of an owner's leftovers.)
    try:
        fd = os.open(entry.partition(b" ")[2], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    return fd

def unpin(fd):
    pinned.discard(fd)
    os.close(fd)

def kill_pinned_group(fd):
    # The group, and its leader itself: one kept in our session may have left the group
    # for another of it (setpgid), which the group's signal misses.
    for flags in (PIDFD_SIGNAL_PROCESS_GROUP, 0):
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL, None, flags)
        except OSError:
            pass  # nothing is left in that group, or the leader has gone

def read_environ(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None

def environment(pid):
    # A process whose main thread has exited while others run on shows no environment at
    # /proc/PID/environ (it reads as gone, its state as zombie); a live thread's shows it.
    env = read_environ("/proc/%d/environ" % pid)
    if not env:  # (None: that thread has exited, or the process has)
        try:
            threads = os.listdir("/proc/%d/task" % pid)
        except OSError:
            threads = []
        for tid in threads:
            if tid != str(pid):
                other = read_environ("/proc/%d/task/%s/environ" % (pid, tid))
                if other:
                    return other
    return env

def marked(pid, entries):
    env = environment(pid)
    return env is not None and not entries.isdisjoint(env.split(b"\0"))

MARKED, BLANK = "marked", "blank"

def look(pid, entries):
    # MARKED, BLANK or None, from one read of the environment: read twice, a member that
    # finishes its exec in between would show none, then the marker, and be missed.
    # BLANK: no environment at all, and neither a kernel thread nor dying (PF_KTHREAD,
    # PF_EXITING): perhaps a member in the middle of execve, whose new image shows none
    # for a moment. Taken for a stranger, it would run on once the exec is done.
    env = environment(pid)
    if env is None:
        return None
    if env:
        return MARKED if not entries.isdisjoint(env.split(b"\0")) else None
    fields = stat(pid)
    if fields is None or fields[0] in (b"Z", b"X") or int(fields[6]) & 0x00200004:
        return None
    return BLANK

def kill_if_marked(pid, entries, killed):
    fields = stat(pid)
    if fields is None or (pid, fields[19]) in killed:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if marked(pid, entries):  # still the same process: the pidfd pins it
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            killed.add((pid, fields[19]))
            return True
    except OSError:
        pass
    finally:
        os.close(fd)
    return False

def sift(pids, entries, killed):
    # Kill those of pids that carry the marker: (whether any did, those showing no
    # environment).
    hit, blanks = False, []
    for pid in pids:
        seen = look(pid, entries)
        if seen == MARKED:
            hit = kill_if_marked(pid, entries, killed) or hit
        elif seen == BLANK:
            blanks.append(pid)
    return hit, blanks

def kill_marked(entries, deadline):
    # Every process that carries any of ``entries`` (markers), in the same passes over
    # /proc: a pass per marker made the kill of N trees take N passes (200 subreaper
    # trees took 2 s, against the 1 s promised).
    # Scan until a pass finds nobody new (a member may fork until its SIGKILL lands); a
    # process already sent SIGKILL is not counted again (it may sit in D state a while).
    # Processes that show no environment are looked at again, every ms until the
    # deadline: one that shows the marker is killed, and everything scanned again (for
    # what it forked meanwhile). A process started with an empty environment shows none
    # for good, and costs that wait: once, as the deadline is shared by all markers.
    # A pass that finds nobody is followed by quick ones over the pids it did not list: a
    # marked process that moved on to a new pid while the pass looked (fork, then exit:
    # a daemon that double-forks again and again) showed it a zombie, and its new self
    # only to a later listing. Passed over, it ran on. Ended by a listing with nothing
    # new, or after MISSES quick passes in a row with nobody marked (processes others
    # start all the time on a busy machine).
    killed = set()
    pids = all_pids()
    listed = set()
    misses = 0
    while pids:
        listed.update(pids)
        hit, blanks = sift(pids, entries, killed)
        while not hit and blanks and time.monotonic() < deadline:
            time.sleep(0.001)
            hit, blanks = sift(blanks, entries, killed)
        if hit:
            misses = 0
            listed = set()  # everything again: what a killed one forked meanwhile
        elif (misses := misses + 1) > MISSES:
            return
        pids = [pid for pid in all_pids() if pid not in listed]

MISSES = 20

def all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]

def kill_now():
    # Trees whose spawn failed after their leader ran (that process may be out of file
    # descriptors, which we are not), in a thread of their own: the waits here (a cgroup's
    # removal, a marked process caught in execve) must not keep the pipe unread, which
    # would hold up our parent's writes, and the kill of everything should it die.
    while (entry := urgent.get()) is not None:
        kind, _, rest = entry.partition(b" ")
        if kind == b"cgroup":
            path = os.fsdecode(rest)
            kill_cgroup(path)
            remove_cgroups([path])
        elif kind == b"marker":
            kill_marked({rest}, deadline=time.monotonic() + 0.5)

urgent = queue.SimpleQueue()
killing_now = threading.Thread(target=kill_now)

def watch_owner():
    # Our owner's death is the end of our socket, as a rule. But a child it forked in C
    # (no fork handlers run there: a C library's worker) keeps a copy of its end open, and
    # while that child lives the end never comes: the owner's pidfd says it died all the
    # same. Then our end is shut for reading, for every copy, so that the loop below reads
    # what was sent, then the end.
    # It is our parent until it dies (we are then someone else's child): so, seen to be
    # our parent once its pidfd is open, the pidfd names it, not a process that took its
    # pid after it died. It may have died before we got here (a SIGKILL as we started).
    parent = os.getppid()
    if parent == 0:
        return  # (our parent is in a pid namespace we cannot see: the socket's end alone)
    if parent == OWNER:
        try:
            fd = os.pidfd_open(OWNER)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                return  # (no pidfds, or no descriptor to spare: the socket's end alone)
            fd = None  # (it has died)
        if fd is not None and os.getppid() == OWNER:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll()
    import socket
    try:
        socket.socket(fileno=os.dup(0)).shutdown(socket.SHUT_RD)
    except OSError:
        pass

threading.Thread(target=watch_owner, daemon=True).start()

for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
# One pidfd per registered group, as many as the hard limit allows but for a reserve (256,
# or half of a lower limit): the work at the end opens files too (environments, cgroup
# files, pidfds of marked processes). A group beyond that is killed by its id, while its
# leader still pins it.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
except (OSError, ValueError):
    hard = soft
PINS_AT_MOST = hard - min(256, hard // 2)
pinned = set()
GROUP_SIGNALS = group_signals_work()
live = {}  # entry -> its leader's pidfd, or None
for line in sys.stdin.buffer:
    if not line.endswith(b"\n"):
        break  # a line cut short as our parent died writing it: the end all the same
    op, entry = line[:1], line[1:].rstrip(b"\n")
    if op == b"+":
        if entry not in live:
            live[entry] = claim_home(entry) if entry.startswith(b"home ") else pin_leader(entry)
        continue
    if (fd := live.pop(entry, None)) is not None:
        unpin(fd)
    if op == b"!":
        if not killing_now.is_alive():
            killing_now.start()
        urgent.put(entry)
urgent.put(None)  # (what is queued is done, while the rest is killed below)
for entry in sorted(live):
    kind, _, rest = entry.partition(b" ")
    if kind == b"group" and live[entry] is not None:
        kill_pinned_group(live[entry])
    elif kind == b"group":
        pgid, earliest, latest = map(int, rest.split())
        kill_group(pgid, earliest, latest)
cgroups, markers, homes = [], [], []
for entry in sorted(live):
    kind, _, rest = entry.partition(b" ")
    if kind == b"cgroup":
        cgroups.append(os.fsdecode(rest))
        kill_cgroup(cgroups[-1])
    elif kind == b"marker":
        markers.append(rest)
    elif kind == b"home":
        homes.append(os.fsdecode(rest))
# Every marked process first, without waiting on any that show no environment; then the
# killed cgroups go (a leader still joining one must not get in and run meanwhile); then
# the wait, once for all markers, on those that showed none.
if markers:
    kill_marked(set(markers), deadline=0)
remove_cgroups(cgroups)
deadline = time.monotonic() + 0.5
if markers:
    kill_marked(set(markers), deadline)
if killing_now.is_alive():
    killing_now.join()  # (the cgroups it removes are in a home)
for home in homes:
    removed(home)
"""


#: What the watchdog's command line runs: its source, read first from its stdin (as many
#: bytes as the first argument says; cut short, as our death would, it runs nothing).
#: Not the source itself: ``ps`` showed 14 kB of code, ``pgrep -f sleep`` (or kill, or
#: cgroup) found it in every program that had started a tree, and a ``pkill -f`` aimed
#: elsewhere took our backstop with it (helper-52). The last argument names it.
_BOOTSTRAP = (
    "import sys; size = int(sys.argv[1]); code = sys.stdin.buffer.read(size); "
    "exec(code) if len(code) == size else None"
)
_NAME = "trio_proctree-watchdog"


def command() -> tuple[list[str], bytes]:
    """The watchdog's command line, and what to write to its stdin before any entry.
    FileNotFoundError where no Python interpreter can be found to run it."""
    python = interpreter()
    if python is None:
        raise FileNotFoundError(
            errno.ENOENT,
            f"no Python interpreter to run the watchdog: sys.executable ({sys.executable!r}) "
            f"is the program that embeds this Python, and {sys.base_exec_prefix!r} has none",
        )
    code = f"OWNER = {os.getpid()}\n{_WATCHDOG}".encode()  # (the process it watches)
    return [python, "-I", "-S", "-c", _BOOTSTRAP, str(len(code)), _NAME], code


def interpreter() -> str | None:
    """The Python program to run the watchdog with: ``sys.executable`` where this process
    is one (its command line was Python's: ``sys.orig_argv``), else the interpreter
    installed with this Python, if there is one. In a program that embeds Python
    (Blender, uWSGI, gdb, a frozen bundle), ``sys.executable`` names the program itself:
    started as the watchdog, it ran as itself, its own main job, and no watchdog ran
    (helper-72)."""
    if sys.executable and sys.orig_argv and not getattr(sys, "frozen", False):
        return sys.executable
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for name in (f"python{version}", f"python{sys.version_info[0]}"):
        python = os.path.join(sys.base_exec_prefix, "bin", name)
        if os.access(python, os.X_OK) and not os.path.isdir(python):
            return python
    return None


class Watchdog:
    """Our end of the watchdog: registrations go down its stdin, a socket (a write to a
    watchdog that died fails with EPIPE, never with a SIGPIPE that may kill us: many
    programs set SIGPIPE back to its default)."""

    def __init__(self) -> None:
        forks = _forks
        #: The process this watchdog watches: only its exit ends the watchdog's socket.
        self.owner = os.getpid()
        ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # A child forked (by another thread: a multiprocessing worker, a prefork
        # server's) from here on lets go of our end (`_after_fork_in_child`): kept, it
        # would keep the watchdog from ever reading EOF, and our death would go unseen
        # while that child lives (helper-58).
        _being_started.append(ours)
        #: Whether a fork came before that line, whose child could not let go of it:
        #: then another watchdog is started (`_started`).
        self.forked_as_it_started = _forks != forks
        arguments, code = command()
        try:
            self._process = subprocess.Popen(
                arguments,
                stdin=its.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            its.close()
        # Bounded writes: a watchdog that stopped reading (SIGSTOPped, say) filled the
        # socket, and the write of the next tree's registration blocked its spawn, and
        # every later one, holding the lock (helper-26). It is given up on instead.
        ours.settimeout(SEND_WITHIN)
        self._socket = ours
        self.pid = self._process.pid
        try:
            ours.sendall(code, socket.MSG_NOSIGNAL)  # (fits the socket's buffer: ~14 kB)
        except BaseException:
            self._process.kill()  # (not yet a watchdog: it waits for the rest of its code)
            self._process.wait()
            ours.close()
            raise
        #: Says whether ``pid`` is still the watchdog (see `is_watchdog`). Opened while it
        #: is our unreaped child, so it names the watchdog. (-1: none, out of descriptors.)
        self._pidfd = -1
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(self.pid)
        logger.debug("watchdog pid %d started", self.pid)

    def is_at(self, pid: int) -> bool:
        """Whether ``pid`` is this watchdog, not yet reaped (so not a recycled pid)."""
        if pid != self.pid or self._pidfd < 0:
            return False
        try:
            os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except OSError:  # reaped (by code that waits for any child, say), or fd closed
            return False
        return True

    def is_stopped(self) -> bool:
        """Whether the watchdog is stopped (SIGSTOP, say): it reads nothing then, and would
        miss our death, while our writes still fit its socket's buffer for many trees and
        show nothing amiss (helper-75). One system call, which reaps nothing."""
        if self._pidfd < 0:
            return False
        try:
            stopped = os.waitid(os.P_PIDFD, self._pidfd, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except OSError:  # reaped (by code that waits for any child, say): the write says
            return False
        return stopped is not None and stopped.si_code == os.CLD_STOPPED

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def send(self, lines: list[str]) -> None:
        """Write ``lines`` (the caller holds the module lock: writers never interleave)."""
        data = "".join(line + "\n" for line in lines).encode()
        self._socket.sendall(data, socket.MSG_NOSIGNAL)

    def forget(self) -> None:
        """In a forked child: drop the parent's watchdog without telling it anything."""
        self._socket.close()
        self._process.returncode = 0  # not ours to reap, nor to warn about
        self._close_pidfd()

    def abandon(self) -> None:
        """Let go of a watchdog that is gone (killed, say) or stopped reading: killed
        first, through its pidfd (a watchdog that stopped reading, woken later, would read
        the end of its socket as our death, and kill the live trees); then its socket, its
        pidfd, and its exit status, if it has one yet (else Popen reaps it later)."""
        with contextlib.suppress(OSError):
            if self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:  # (no pidfd: Popen's kill, which asks first whether it is still ours)
                self._process.kill()
        self._socket.close()
        self._close_pidfd()
        with contextlib.suppress(OSError):
            self._process.poll()

    def stop(self) -> None:
        """End the socket (the watchdog kills what is still registered) and reap it,
        waiting no longer than its work can take: a watchdog stopped (SIGSTOP) held the
        interpreter's exit for as long as it was (helper-26). It is then left to do that
        work once continued."""
        # Shut, not only closed: a child forked in C (which runs no fork handlers) keeps a
        # copy of our end, and a close alone left the watchdog waiting for that child's
        # end, and this exit for the watchdog (5 s, then a warning).
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_WR)
        self._socket.close()
        try:
            self._process.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            logger.warning(
                "the parent-death backstop (pid %d) has not ended %gs after our exit began "
                "(stopped?); leaving it to finish",
                self.pid,
                STOP_WITHIN,
            )
            self._process.returncode = 0  # (not ours to reap now, nor to warn about)
        self._close_pidfd()


#: How long a write to the watchdog may wait for it to read (seconds): it reads at once,
#: as a rule; one that has not in this long is taken for lost (and replaced).
SEND_WITHIN = 2.0
#: How long the interpreter's exit waits for the watchdog: its own work at the end is
#: bounded (~2.5 s: cgroups removed within 2 s, 0.5 s for marked processes in an exec).
STOP_WITHIN = 5.0

_lock = threading.Lock()
renewed_in_forked_child(globals(), "_lock")
_current: list[Watchdog] = []
#: What is registered now (entry: times), told to a watchdog that replaces a lost one.
_registered: Counter[str] = Counter()


def _watchdog() -> Watchdog:
    with _lock:
        return _started()


def _started() -> Watchdog:
    """The watchdog, started if need be, and then told of everything registered: a
    watchdog that replaces a lost one, or one whose first start failed (out of memory,
    as when the last was OOM-killed), must kill the trees open before it too. (The
    caller holds `_lock`.)"""
    global _unavailable_said  # noqa: PLW0603 - one notice per outage, for the process
    _forget_if_forked_in_c()
    for attempt in range(1, _STARTS_AT_MOST + 1):
        if _current:
            break
        try:
            watchdog = Watchdog()
            if _registered:
                try:
                    watchdog.send(["+" + entry for entry in _registered])
                except OSError:
                    # Not kept with a line cut short in it (the next write would run on
                    # from there, and that entry be lost): the next registration starts
                    # another.
                    watchdog.abandon()
                    raise
            _current.append(watchdog)
        finally:
            _being_started.clear()  # (its socket: in `_current` now, or closed)
        _unavailable_said = False  # (a later loss is a new one: said again)
        if watchdog.forked_as_it_started and attempt < _STARTS_AT_MOST:
            # That child may hold our end of its socket: another is started, this one
            # killed. (Microseconds in which another thread must fork: rare, and rarer
            # twice.)
            _current.remove(watchdog)
            watchdog.abandon()
    return _current[0]


#: How many watchdogs are started, at most, while forks keep coming in other threads.
_STARTS_AT_MOST = 8
#: Forks of this process so far (`os.register_at_fork`'s hook, in the forking thread).
_forks = 0
#: Our end of the socket of a watchdog being started, not yet in `_current`.
_being_started: list[socket.socket] = []


def _before_fork() -> None:
    global _forks  # noqa: PLW0603 - counted for the process
    _forks += 1


def running() -> list[Watchdog]:
    """This process's watchdog, if it has started one (so leak checks can skip it)."""
    with _lock:
        return list(_current)


def is_watchdog(pid: int) -> bool:
    """Whether ``pid`` is this process's watchdog: a child of ours that is no tree's, and
    that a subreaper's listings skip (it sits where they look for re-parented members)."""
    current = _current[:]  # (no lock: a list copy is atomic, and the answer a moment's)
    return bool(current) and current[0].is_at(pid)


def ensure_started() -> None:
    """Start the watchdog if it is not running (blocking: spawns a process)."""
    try:
        _watchdog()
    except OSError as exc:
        _say_unavailable(exc)


#: Whether the backstop's loss was said since a watchdog last started: said once, at
#: WARNING. Each tree tries again (the cause may pass: no process could be made, say),
#: and three warnings a tree, for every tree, buried everything else in the log.
_unavailable_said = False


def _say_unavailable(why: OSError) -> None:
    global _unavailable_said  # noqa: PLW0603 - one notice per outage, for the process
    level = logging.DEBUG if _unavailable_said else logging.WARNING
    _unavailable_said = True
    logger.log(
        level,
        "parent-death backstop unavailable: %s (trees still start and are cleaned up, but "
        "a SIGKILL of this process would leave them running; tried again for each tree)",
        why,
    )


#: Unregistrations not yet written (they go with the next write).
_deferred: list[str] = []
#: Beyond this many, unregistrations are written at once (the watchdog's set stays small).
_DEFER_AT_MOST = 256


def register(*entries: str) -> None:
    """Have ``entries`` (``cgroup PATH``, ``group PGID EARLIEST LATEST``, ``marker VAR=VALUE``,
    ``home PATH``) killed or removed should this process die before `unregister`;
    written at once."""
    with _lock:
        # First: in a child forked in C, forgetting the parent's registrations then would
        # drop these too, and a watchdog that replaced a lost one would not know them.
        _forget_if_forked_in_c()
        _registered.update(entries)
        try:
            _write(_started(), ("+" + entry for entry in entries))
        except OSError as exc:
            # A lost watchdog must not stop trees from running: their cleanup still holds.
            _say_unavailable(exc)


def unregister(*entries: str) -> None:
    with _lock:
        _forget_if_forked_in_c()
        _registered.subtract(entries)
        for entry in entries:
            if _registered[entry] <= 0:
                del _registered[entry]
        if not _current:
            # No watchdog to tell (none could start): the next is told what is registered
            # as it starts. Kept for it, these grew without bound through an outage, and
            # struck out an entry registered again since (a kept cgroup a tree reused):
            # that tree then outlived its parent's SIGKILL (helper-77).
            return
        _deferred.extend("-" + entry for entry in entries)
        if len(_deferred) < _DEFER_AT_MOST:
            return
        with contextlib.suppress(OSError):  # (said at the next registration)
            _write(_current[0], ())


def kill_now(*entries: str) -> bool:
    """Have the watchdog kill ``entries`` now, and forget them: what a tree whose spawn
    failed after its leader ran may have started (that failure is most often running out
    of file descriptors, which the watchdog, a process of its own, has not). Whether
    there was a watchdog to tell."""
    with _lock:
        _forget_if_forked_in_c()
        if not _current:
            return False
        _registered.subtract(entries)
        for entry in entries:
            if _registered[entry] <= 0:
                del _registered[entry]
        try:
            _write(_current[0], ("!" + entry for entry in entries))
        except OSError:
            return False
    return True


def _write(watchdog: Watchdog, lines: Iterable[str]) -> None:
    """Write the unregistrations kept back, then ``lines`` (the caller holds `_lock`).

    A watchdog found gone (killed by someone, or by the OOM killer) or stopped is
    replaced at once, and the new one told of everything registered: else the trees
    started before the loss, and the entry of the write that found it, would have no
    backstop at all, and the next tree's would start a watchdog told of nothing else.
    """
    batch = [*_deferred, *lines]
    _deferred.clear()
    lost = "it is stopped"
    if not watchdog.is_stopped():
        try:
            watchdog.send(batch)
            return
        except OSError as exc:
            lost = str(exc)
    logger.warning("the parent-death backstop was lost (%s); starting another", lost)
    _current.remove(watchdog)
    watchdog.abandon()
    _started().send([line for line in batch if line[0] == "!"])


def _forget_if_forked_in_c() -> None:
    """In a child forked in C, which ran no fork handlers: forget the parent's watchdog,
    as `_after_fork_in_child` would have (the caller holds `_lock`). Its exit shut the
    parent's watchdog's socket, which the watchdog took for the parent's death, and its
    registrations went to the parent's watchdog, in lines mixed with the parent's."""
    if _current and _current[0].owner != os.getpid():
        _after_fork_in_child()


def _after_fork_in_child() -> None:
    # The child must not keep the parent's pipe open (the watchdog would then miss the
    # parent's death); it starts a watchdog of its own when it starts a tree.
    global _unavailable_said  # noqa: PLW0603 - the child's own outages are its own to say
    _unavailable_said = False
    for watchdog in _current:
        watchdog.forget()
    for ours in _being_started:
        ours.close()
    _being_started.clear()
    _current.clear()
    _deferred.clear()
    _registered.clear()


def _at_exit() -> None:
    # Under the lock: another thread's registration (a daemon thread starting a tree)
    # may be writing to the socket, and its close then failed that write (EBADF, a
    # ValueError out of the spawn once the list was emptied), or sent it to whatever took
    # the descriptor's number meanwhile (helper-97). One that comes later starts a
    # watchdog of its own, which ends with this process.
    with _lock:
        _forget_if_forked_in_c()
        _registered.clear()
        for watchdog in _current:
            with contextlib.suppress(OSError):
                watchdog.send(list(_deferred))  # what ended cleanly is not killed at EOF
            watchdog.stop()
        _current.clear()
        _deferred.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
