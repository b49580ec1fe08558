"""What a leader's way into its cgroup costs, where glibc cannot create it there (before 2.41).

A prototype, measured and set aside: the library does not take the paused route (below).
It times one spawn and reap of ``/bin/true``, in turns, by:

- ``popen``: `subprocess.Popen` in a new session, in no cgroup of its own (the killpg
  baseline's spawn);
- ``sh-join``: the same through ``/bin/sh``, which writes its pid into a cgroup and then
  ``exec``\\ s the command (what cgroup containment does on glibc before 2.41);
- ``paused``: glibc's ``posix_spawn`` (no extra ``exec``), whose child waits in its file
  actions, before its ``exec``, while a thread started for it moves it into the cgroup;
- ``paused-1``: the same, moved by one long-lived placing thread.

The pause is two FIFOs. The child opens ``arrived`` for writing and closes it (the thread
holding its read end sees POLLHUP: the child is there), then opens ``release`` for
reading, which blocks until a writer comes. The thread finds the child among the
spawning thread's children (the one that has not exec'd yet), writes its pid into
``cgroup.procs``, then opens ``release`` for writing. Stop 34's runs on the development
machine, medians (sums are swayed by the other load it had): ``sh-join`` 1.92-2.0x
``popen``, ``paused`` 1.44-4.2x (a thread's start costs most under load), ``paused-1``
1.12-1.26x; stop 35, idle: 1.89x, 1.45x and 1.26x.

Why the library does not take it (stop 35 built it as a route, ``paused-1``'s design,
and measured it in ``bench_teardown.py``'s 100 concurrent trees):

- **It was slower there, not faster**: 1.48-1.56x the killpg baseline (1.96-1.99x in
  runs taking turns with the floors below), against 1.33-1.35x through ``/bin/sh``.
  One thread makes every move, one after the other, and each of its system calls gives
  up Python's GIL and must win it back from the threads starting the other trees (its
  mean move took ~0.6 ms, its median 48 us);
  ``/bin/sh`` makes its move in the child, outside our process. Making the moves with
  the GIL held (ctypes ``PyDLL``) was slower still: a move may wait for an RCU grace
  period, and the whole process waited with it.
- **The move is not what costs most**: the killpg baseline with each leader moved into
  a cgroup by a thread beside the spawns (``moved_killpg_many`` in ``bench_teardown.py``)
  comes to 1.05-1.17x; holding the leader until it is moved costs the rest, here a round
  of wake-ups through one thread that must win the GIL, for ``/bin/sh`` an exec.
- **A FIFO that serves two spawns releases the wrong child**: a child waits in its file
  actions holding a copy of every descriptor we had when it was cloned, the writer that
  let another child go included; a child next paused on that FIFO found a writer there
  and went on, unmoved (103 of 500 in one run). Each pause needs FIFOs of its own.

    python bench/bench_spawn_routes.py [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import queue
import select
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from trio_proctree._cgroup_home import cgroup_home
from trio_proctree._cgroupfs import own_cgroup
from trio_proctree._through_sh import JOIN_AND_EXEC

TRUE = "/bin/true"
#: posix_spawn's flag for a new session, as `subprocess.Popen(start_new_session=True)`.
SETSID = 0x80
#: The task flags (``/proc/PID/stat``) of a child that has not exec'd yet, and of one
#: exiting.
PF_FORKNOEXEC = 0x40
PF_EXITING = 0x4
#: Where the child holds each FIFO while it waits (closed again before its exec).
PAUSE_FD = 900


class _Opaque(ctypes.Structure):
    """Room for ``posix_spawnattr_t`` or ``posix_spawn_file_actions_t``."""

    _fields_ = [("_", ctypes.c_char * 1024)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    p, i = ctypes.c_void_p, ctypes.c_int
    for name, argtypes in {
        "posix_spawn_file_actions_init": [p],
        "posix_spawn_file_actions_destroy": [p],
        "posix_spawn_file_actions_addopen": [p, i, ctypes.c_char_p, i, i],
        "posix_spawn_file_actions_addclose": [p, i],
        "posix_spawn_file_actions_addclosefrom_np": [p, i],
        "posix_spawnattr_init": [p],
        "posix_spawnattr_destroy": [p],
        "posix_spawnattr_setflags": [p, ctypes.c_short],
        "posix_spawn": [p, ctypes.c_char_p, p, p, p, p],
    }.items():
        function = getattr(libc, name)
        function.argtypes = argtypes
        function.restype = i
    return libc


LIBC = _libc()
ENVIRON = ctypes.c_void_p.in_dll(LIBC, "environ")


def _unexeced_child(spawner: int) -> int:
    """The child of thread ``spawner`` that has not exec'd yet (it spawns one at a time)."""
    with open(f"/proc/self/task/{spawner}/children") as listing:
        children = listing.read().split()
    for pid in children:
        with open(f"/proc/{pid}/stat") as stat:
            flags = int(stat.read().rsplit(")", 1)[1].split()[6])
        if flags & PF_FORKNOEXEC and not flags & PF_EXITING:
            return int(pid)
    raise LookupError(f"no child of thread {spawner} waits for its exec")


def _place(spawner: int, arrived: int, release: str, procs: str, placed: list[int]) -> None:
    """In the placing thread: wait for the child, move it into the cgroup, let it go on."""
    waiting = select.poll()
    waiting.register(arrived, select.POLLHUP)
    waiting.poll(2000)
    pid = _unexeced_child(spawner)
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)
    placed.append(pid)
    # Blocks until the child opens ``release`` (it may be on its way from ``arrived``): a
    # route in the library would need a way out for a child killed on that way.
    os.close(os.open(release, os.O_WRONLY | os.O_CLOEXEC))


@contextlib.contextmanager
def _fifos() -> Iterator[tuple[str, str]]:
    folder = tempfile.mkdtemp(prefix="bench-spawn-routes-")
    arrived, release = os.path.join(folder, "arrived"), os.path.join(folder, "release")
    os.mkfifo(arrived, 0o600)
    os.mkfifo(release, 0o600)
    try:
        yield arrived, release
    finally:
        os.unlink(arrived)
        os.unlink(release)
        os.rmdir(folder)


_placements: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()


def _placing_thread() -> None:
    """The long-lived placing thread (``paused-1``): one placement after the other."""
    while True:
        _placements.get()()


def paused_spawn(procs: str, fifos: tuple[str, str], *, long_lived: bool = False) -> int:
    """``/bin/true`` started with ``posix_spawn``, moved into the cgroup before its exec by
    a thread started for it, or by the ``long_lived`` placing thread."""
    arrived, release = fifos
    actions, attr = _Opaque(), _Opaque()
    a, t = ctypes.byref(actions), ctypes.byref(attr)
    LIBC.posix_spawn_file_actions_init(a)
    LIBC.posix_spawnattr_init(t)
    LIBC.posix_spawnattr_setflags(t, SETSID)
    LIBC.posix_spawn_file_actions_addopen(a, PAUSE_FD, arrived.encode(), os.O_WRONLY, 0)
    LIBC.posix_spawn_file_actions_addclose(a, PAUSE_FD)
    LIBC.posix_spawn_file_actions_addopen(a, PAUSE_FD, release.encode(), os.O_RDONLY, 0)
    LIBC.posix_spawn_file_actions_addclose(a, PAUSE_FD)
    LIBC.posix_spawn_file_actions_addclosefrom_np(a, 3)
    argv = (ctypes.c_char_p * 2)(TRUE.encode(), None)
    watching = os.open(arrived, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    placed: list[int] = []
    done = threading.Event()
    spawner = threading.get_native_id()

    def placement() -> None:
        try:
            _place(spawner, watching, release, procs, placed)
        finally:
            done.set()

    if long_lived:
        _placements.put(placement)
    else:
        threading.Thread(target=placement).start()
    pid = ctypes.c_int()
    error = LIBC.posix_spawn(ctypes.byref(pid), TRUE.encode(), a, t, argv, ENVIRON.value)
    done.wait()
    os.close(watching)
    LIBC.posix_spawn_file_actions_destroy(a)
    LIBC.posix_spawnattr_destroy(t)
    if error or placed != [pid.value]:
        raise OSError(error, f"paused spawn failed (placed {placed}, spawned {pid.value})")
    return pid.value


def timed(spawn: Callable[[], Callable[[], object]]) -> float:
    """Seconds to spawn one child and reap it (``spawn`` returns what reaps it)."""
    started = time.perf_counter()
    spawn()()
    return time.perf_counter() - started


def _reaper(pid: int) -> Callable[[], object]:
    return lambda: os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    rounds = parser.parse_args().rounds
    cgroup = os.path.join(cgroup_home().path, "bench-spawn-routes")
    os.mkdir(cgroup)
    procs = os.path.join(cgroup, "cgroup.procs")
    try:
        with _fifos() as fifos:
            # (A Popen is waited on through itself: dropped, it may reap its child first.)
            routes: dict[str, Callable[[], Callable[[], object]]] = {
                "popen": lambda: subprocess.Popen([TRUE], start_new_session=True).wait,
                "sh-join": lambda: (
                    subprocess.Popen(
                        ["/bin/sh", "-c", JOIN_AND_EXEC, procs, TRUE], start_new_session=True
                    ).wait
                ),
                "paused": lambda: _reaper(paused_spawn(procs, fifos)),
                "paused-1": lambda: _reaper(paused_spawn(procs, fifos, long_lived=True)),
            }
            threading.Thread(target=_placing_thread, daemon=True).start()
            pid = paused_spawn(procs, fifos)  # (proven to land in the cgroup, once)
            with open(f"/proc/{pid}/cgroup") as where:
                landed = own_cgroup(where.read()) or ""
            os.waitpid(pid, 0)
            if not landed.endswith("/bench-spawn-routes"):
                raise SystemExit(f"the paused child is not in the cgroup: {landed!r}")
            times: dict[str, list[float]] = {name: [] for name in routes}
            for _ in range(rounds):
                for name, spawn in routes.items():
                    times[name].append(timed(spawn))
    finally:
        os.rmdir(cgroup)
    base, base_median = sum(times["popen"]), statistics.median(times["popen"])
    print(f"spawn + reap of {TRUE}, {rounds} rounds taking turns (ratios: sums, medians):")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(
            f"  {name:8} median {median * 1e3:6.3f} ms   sum {sum(spent) * 1e3:7.1f} ms   "
            f"{sum(spent) / base:5.2f}x {median / base_median:5.2f}x popen"
        )


if __name__ == "__main__":
    main()
