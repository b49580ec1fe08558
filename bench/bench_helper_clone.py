"""What 100 trees cost where each leader is created in its cgroup by a helper process, on
any C library: a prototype for the spawn route that glibc before 2.41 lacks, not a route
the library takes yet.

Only ``clone3(CLONE_INTO_CGROUP)`` creates a process in a cgroup (no move into it, so
no ``cgroup.procs`` write, no exec of ``/bin/sh``), and only glibc 2.41's ``posix_spawn``
offers it. Called through `ctypes` it makes a child that runs Python, which is unsafe
in a threaded program like ours (locks held by other threads at the fork, the GIL). So a
helper does it: one small single-threaded Python process, started once, which clones
with ``CLONE_PARENT`` too, so that the leader is *our* child (we reap it, as every tree's
leader is reaped), and the child calls ``setsid`` and ``execv`` at once. An independent
review (helper-50, stop 35) proposed it and checked the mechanism by hand.

It times, in turns, 100 ``sleep 60`` leaders started one after another then stopped
(``killpg`` + wait), as ``bench_teardown.py``'s killpg baseline does:

- ``killpg``: the baseline, `trio.lowlevel.open_process`, no cgroup;
- ``helper-born``: each leader created in a cgroup of its own by the helper (asked and
  answered over two pipes, from a worker thread, as trio forks from one);
- ``sh-join``: each leader started through the ``/bin/sh`` join (what cgroup
  containment does on glibc before 2.41), for comparison.

    python bench/bench_helper_clone.py [--rounds N] [--trees N]

What a library route would still need (not here): every option `subprocess.Popen` takes
(stdio, ``cwd``, ``env``, ``close_fds``, the signals it restores, a group in the
caller's session, ``pass_fds``...) done in the child; an exec error reported back; the
helper started where it shares our session, and never used by a forked child of ours
(its leaders would be our parent's children); its death while a spawn waits.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import trio
from bench_teardown import interleaved, joined_killpg_many, killpg_many

from trio_proctree._cgroup_home import cgroup_home
from trio_proctree._cgroupfs import own_cgroup

#: The helper: reads ``cgroup\0program\0arg...\n`` requests, answers each with the new
#: leader's pid once it has exec'd (or minus an errno). The child runs nothing but dup2,
#: setsid and execv. (A child that failed its exec is left for us to reap: a prototype.)
HELPER = r"""
import ctypes, os, sys
FIELDS = ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack",
          "stack_size", "tls", "set_tid", "set_tid_size", "cgroup")
class CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in FIELDS]
CLONE_PARENT, CLONE_INTO_CGROUP, SYS_CLONE3 = 0x8000, 0x200000000, 435
libc = ctypes.PyDLL(None, use_errno=True)  # (the GIL held: nothing else runs anyway)
devnull = os.open(os.devnull, os.O_RDWR)
for line in sys.stdin.buffer:
    cgroup, *argv = line.rstrip(b"\n").split(b"\0")
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    failed, failing = os.pipe2(os.O_CLOEXEC)  # (as Popen does: EOF once it has exec'd)
    args = CloneArgs(flags=CLONE_PARENT | CLONE_INTO_CGROUP, cgroup=fd)
    pid = libc.syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
    if pid == 0:
        try:
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.setsid()
            os.execv(argv[0], argv)
        except OSError as exc:
            os.write(failing, b"%d" % exc.errno)
        finally:
            os._exit(127)
    os.close(fd)
    os.close(failing)
    error = os.read(failed, 16)
    os.close(failed)
    if pid < 0:
        error = b"%d" % ctypes.get_errno()
    sys.stdout.buffer.write(b"-%s\n" % error if error else b"%d\n" % pid)
    sys.stdout.buffer.flush()
"""

SLEEP = "/bin/sleep"


class Helper:
    """The helper process, asked from one thread at a time."""

    def __init__(self) -> None:
        command = [sys.executable, "-I", "-S", "-c", HELPER]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()

    def born_in(self, cgroup: str, argv: list[str]) -> int:
        """A new child of ours, created in ``cgroup``, running ``argv``: its pid."""
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            self.process.stdin.write(b"\0".join(os.fsencode(part) for part in [cgroup, *argv]))
            self.process.stdin.write(b"\n")
            self.process.stdin.flush()
            pid = int(self.process.stdout.readline())
        if pid < 0:
            raise OSError(-pid, os.strerror(-pid))
        return pid

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


async def _ended(pidfd: int) -> None:
    await trio.lowlevel.wait_readable(pidfd)
    os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222 - it has exited
    os.close(pidfd)


async def helper_born_many(helper: Helper, count: int) -> float:
    """The killpg baseline with each leader created in a cgroup of its own by the helper
    (the cgroups taken before the clock starts, given back after it stops)."""
    home = cgroup_home()
    cgroups = [home.take_tree()[0] for _ in range(count)]
    started = time.perf_counter()
    pidfds = []
    for cgroup in cgroups:
        pid = await trio.to_thread.run_sync(helper.born_in, cgroup, [SLEEP, "60"])
        pidfds.append((pid, os.pidfd_open(pid)))
    async with trio.open_nursery() as nursery:
        for pid, pidfd in pidfds:
            os.killpg(pid, signal.SIGTERM)
            nursery.start_soon(_ended, pidfd)
    elapsed = time.perf_counter() - started
    for cgroup in cgroups:
        home.give_back(cgroup, killed=False)  # (each held one process: reaped, so empty)
    return elapsed


def _check_the_helper(helper: Helper) -> None:
    """One leader, checked to be born in its cgroup, as our child."""
    home = cgroup_home()
    cgroup, _ = home.take_tree()
    pid = helper.born_in(cgroup, [SLEEP, "60"])
    try:
        with open(f"/proc/{pid}/cgroup") as where:
            landed = own_cgroup(where.read()) or ""
        with open(f"/proc/{pid}/stat") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    finally:
        os.kill(pid, signal.SIGKILL)  # (our child, unreaped: its pid is nobody else's)
        os.waitpid(pid, 0)
        home.give_back(cgroup, killed=False)
    if not cgroup.endswith(landed) or parent != os.getpid():
        raise SystemExit(f"the helper's child is not ours in its cgroup: {landed!r}, {parent}")


async def main(rounds: int, trees: int) -> None:
    helper = Helper()
    try:
        _check_the_helper(helper)
        sides: dict[str, Callable[[], Awaitable[float]]] = {
            "killpg": lambda: killpg_many(trees),
            "helper-born": lambda: helper_born_many(helper, trees),
            "sh-join": lambda: joined_killpg_many(trees, None),
        }
        times = await interleaved(rounds, sides)
    finally:
        helper.close()
    base, base_median = sum(times["killpg"]), statistics.median(times["killpg"])
    print(f"{trees} trees started one by one, then stopped; {rounds} rounds taking turns:")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(
            f"  {name:11} median {median * 1e3:7.2f} ms   "
            f"{sum(spent) / base:5.2f}x sums {median / base_median:5.2f}x medians"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--trees", type=int, default=100)
    arguments = parser.parse_args()
    trio.run(main, arguments.rounds, arguments.trees)
