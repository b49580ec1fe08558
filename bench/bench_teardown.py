"""Benchmarks: trio_proctree against a hand-rolled ``start_new_session`` + ``os.killpg``.

Reported as ratios measured in one run (absolute times depend on the machine). Rounds of
the two sides are interleaved and summed: single rounds are ~0.1 s and noisy on 2 cores.

    python bench/bench_teardown.py [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio
import trio.testing

from trio_proctree import ContainmentUnavailable, _joiner, open_process_tree
from trio_proctree import _spawn_into_cgroup as direct_spawn
from trio_proctree._cgroup_home import cgroup_home
from trio_proctree._choose import choose_containment
from trio_proctree._orphans import children
from trio_proctree._procfs import read_file, read_stat
from trio_proctree._through_sh import JOIN_AND_EXEC

COOPERATIVE = ["sh", "-c", "sleep 60 & sleep 61 & echo running; wait"]
#: The same with a daemon: a ``setsid`` escapee (its pid said first), which a process
#: group misses and the tree's cgroup does not.
ESCAPING = ["sh", "-c", "setsid sleep 60 & echo $!; sleep 61 & echo running; wait"]
CONTAINMENT = "auto"


# --- one cooperative tree: cancel -> leader reaped ------------------------------------


async def running(stdout: trio.abc.ReceiveStream | None) -> bytes:
    """Wait until the tree says it runs, then let it sit idle for 20 ms; what it said.

    Not only a sleep: a leader joining its cgroup through /bin/sh may wait for an RCU
    grace period in that write (tens of ms, now and then, on an idle VM), and a tree not
    yet running its command is not what this benchmark times (the spawn benchmark
    includes that wait).
    """
    assert stdout is not None
    said = b""
    while not said.endswith(b"running\n"):
        chunk = await stdout.receive_some()
        if not chunk:
            raise RuntimeError(f"the tree ended before it said it runs: {said!r}")
        said += chunk
    await trio.sleep(0.02)
    return said


#: The baseline's process groups whose members may yet die as zombies of ours.
_baseline_groups: list[int] = []


def reap_baseline_orphans() -> None:
    """Reap the baseline's dead members, as init would (not timed).

    The baseline waits for its leader only; the leader's children re-parent to this
    process once a subreaper tree has run here (the setting is process-wide), and die
    as zombies no one reaps. Left, they would pile up and slow every later subreaper
    listing on our side (`bench_zombies.py` times that on its own).
    """
    for pid in children(os.getpid()):
        stat = read_stat(pid)
        if stat is not None and not stat.alive and stat.pgid in _baseline_groups:
            os.waitpid(pid, os.WNOHANG)


async def cancelled_in_wait(
    body: Callable[[Callable[[], None], Callable[[], None]], Awaitable[None]],
) -> float:
    """Seconds from the cancellation of a task that waits for its tree to the first line
    of that task's own code once the teardown is done (the leader reaped).

    ``body(ready, done)`` starts its tree, calls ``ready()`` just before it waits for the
    leader, and ``done()`` as soon as its teardown returns. The clock starts when every
    task is blocked (the body in its wait) and the body's cancel scope is cancelled: the
    issue's "cancel -> leader reaped", the cancellation's delivery to the waiting task
    included on both sides.
    """
    times = {"cancelled": 0.0, "done": 0.0}
    waiting = trio.Event()

    def ready() -> None:
        waiting.set()

    def done() -> None:
        times["done"] = time.perf_counter()

    async def cancel_once_waiting(scope: trio.CancelScope) -> None:
        await waiting.wait()
        await trio.testing.wait_all_tasks_blocked()
        times["cancelled"] = time.perf_counter()
        scope.cancel()

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_waiting, scope)
            await body(ready, done)
    if not (times["done"] > times["cancelled"] > 0):
        raise RuntimeError("the body was not cancelled in its wait")
    return times["done"] - times["cancelled"]


async def killpg_cancelled() -> float:
    """The hand-rolled baseline as a program would write it: a new session, and on
    cancellation ``os.killpg`` then a shielded ``await proc.wait()``."""
    reap_baseline_orphans()

    async def body(ready: Callable[[], None], done: Callable[[], None]) -> None:
        proc = await trio.lowlevel.open_process(
            COOPERATIVE, start_new_session=True, stdout=subprocess.PIPE
        )
        _baseline_groups.append(proc.pid)
        assert proc.stdout is not None
        try:
            await running(proc.stdout)
            ready()
            await proc.wait()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            with trio.CancelScope(shield=True):
                await proc.wait()
                await proc.stdout.aclose()  # its pipe, as cleanup closes the tree's
            done()

    return await cancelled_in_wait(body)


async def proctree_cancelled() -> float:
    async def body(ready: Callable[[], None], done: Callable[[], None]) -> None:
        try:
            async with open_process_tree(
                COOPERATIVE, containment=CONTAINMENT, stdout=subprocess.PIPE
            ) as tree:
                await running(tree.stdout)
                ready()
                await tree.wait()
        finally:
            done()

    return await cancelled_in_wait(body)


async def killpg_teardown() -> float:
    reap_baseline_orphans()  # of the rounds before: dead by now
    proc = await trio.lowlevel.open_process(
        COOPERATIVE, start_new_session=True, stdout=subprocess.PIPE
    )
    _baseline_groups.append(proc.pid)
    await running(proc.stdout)
    started = time.perf_counter()
    os.killpg(proc.pid, signal.SIGTERM)
    await proc.wait()
    assert proc.stdout is not None
    await proc.stdout.aclose()  # its pipe, as cleanup closes the tree's
    return time.perf_counter() - started


async def proctree_teardown() -> float:
    async with open_process_tree(
        COOPERATIVE, containment=CONTAINMENT, stdout=subprocess.PIPE
    ) as tree:
        await running(tree.stdout)
        started = time.perf_counter()
        await tree.aclose()
        # (Before the block's end: its __aexit__ finds cleanup done, but yields once.)
        return time.perf_counter() - started


async def killpg_escaping_teardown() -> float:
    """The baseline on a tree with a daemon: ``killpg`` stops the group and misses the
    escapee, which is then killed untimed, through a pidfd."""
    reap_baseline_orphans()
    proc = await trio.lowlevel.open_process(
        ESCAPING, start_new_session=True, stdout=subprocess.PIPE
    )
    _baseline_groups.append(proc.pid)
    escapee = os.pidfd_open(int((await running(proc.stdout)).split()[0]))
    try:
        started = time.perf_counter()
        os.killpg(proc.pid, signal.SIGTERM)
        await proc.wait()
        took = time.perf_counter() - started
        with contextlib.suppress(ProcessLookupError):  # (it joined the group after all)
            signal.pidfd_send_signal(escapee, signal.SIGKILL)
        await trio.lowlevel.wait_readable(escapee)
        with contextlib.suppress(ChildProcessError):  # ours only under a subreaper
            os.waitid(os.P_PIDFD, escapee, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222 - exited
    finally:
        os.close(escapee)
    assert proc.stdout is not None
    await proc.stdout.aclose()
    return took


async def proctree_escaping_teardown() -> float:
    async with open_process_tree(ESCAPING, containment=CONTAINMENT, stdout=subprocess.PIPE) as tree:
        await running(tree.stdout)
        started = time.perf_counter()
        await tree.aclose()
        took = time.perf_counter() - started
    assert tree.outcome is not None
    if CONTAINMENT != "group" and tree.outcome.escapees_killed != 1:
        raise RuntimeError(f"the escapee was not stopped as one: {tree.outcome}")
    return took


async def floor_teardown() -> float:
    """The least any teardown that waits for the whole tree can cost: the same tree, in a
    cgroup of its own like ours, its members pinned by pidfd before the clock starts;
    timed: one ``killpg``, a wait for every member's exit, one read of ``cgroup.events``.
    (Not timed: the reap, the pipe, the cgroup's removal, escapees. Our cleanup then runs
    and finds the tree empty.) Only with cgroup containment: it uses that tree's cgroup.
    """
    async with open_process_tree(COOPERATIVE, containment="cgroup", stdout=subprocess.PIPE) as tree:
        await running(tree.stdout)
        cgroup = tree._core.containment.path  # type: ignore[attr-defined]
        listed = read_file(os.path.join(cgroup, "cgroup.procs")).split()
        members = [int(pid) for pid in listed if int(pid) != tree.pid]
        pidfds = [os.pidfd_open(pid) for pid in members]
        try:
            started = time.perf_counter()
            os.killpg(tree.pid, signal.SIGTERM)
            for pidfd in [tree._core.leader.pidfd, *pidfds]:
                await trio.lowlevel.wait_readable(pidfd)
            if b"populated 0" not in read_file(os.path.join(cgroup, "cgroup.events")):
                raise RuntimeError("the tree's cgroup is still populated")
            return time.perf_counter() - started
        finally:
            for pidfd in pidfds:
                os.close(pidfd)


# --- many trees at once: spawn + teardown --------------------------------------------


#: The spawn phase of each round of `killpg_many` and `proctree_many` (until every tree
#: runs), by side: the rest of the round is the teardown.
SPAWNED: dict[str, list[float]] = {"killpg": [], "ours": []}


async def killpg_many(count: int) -> float:
    started = time.perf_counter()
    procs = []
    for _ in range(count):
        procs.append(await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True))
    SPAWNED["killpg"].append(time.perf_counter() - started)
    async with trio.open_nursery() as nursery:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            nursery.start_soon(proc.wait)
    return time.perf_counter() - started


@asynccontextmanager
async def killpg_tree() -> AsyncIterator[None]:
    """A ``sleep 60`` in a session of its own for the length of the block, ended as a
    program would hand-roll it: ``os.killpg``, then a shielded ``await proc.wait()``."""
    proc = await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True)
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            os.killpg(proc.pid, signal.SIGTERM)
            await proc.wait()


async def killpg_tasks_many(count: int) -> float:
    """The baseline shaped as ours is (`held_at_once`): a task per tree, started at once
    (trio spawns them in its worker threads, as many at a time as it has), each cancelled
    in its wait."""
    started = time.perf_counter()
    async with held_at_once(count, killpg_tree):
        pass
    return time.perf_counter() - started


async def joined_killpg_many(count: int, joiner: str | None) -> float:
    """The baseline with its leaders started as ours are where the C library cannot
    start a process in a cgroup: through the ``joiner`` given (else ``/bin/sh``), which
    joins a cgroup of its own (taken from, and given back to, trio_proctree's own pool)
    and then execs the command.

    The floor of the spawn benchmark through that wrapper: one exec and one join per tree
    that no design with it avoids, and nothing of trio_proctree's own.
    """
    home = cgroup_home()
    started = time.perf_counter()
    procs = []
    for _ in range(count):
        cgroup, _reused = home.take_tree()
        procs_file = f"{cgroup}/cgroup.procs"
        if joiner is None:
            command = ["/bin/sh", "-c", JOIN_AND_EXEC, procs_file, "sleep", "60"]
        else:
            command = _joiner.command(procs_file, "sleep", ["sleep", "60"], env=None, settled=None)
        procs.append(
            (
                cgroup,
                await trio.lowlevel.open_process(
                    command, executable=joiner, start_new_session=True
                ),
            )
        )
    async with trio.open_nursery() as nursery:
        for _cgroup, proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            nursery.start_soon(proc.wait)
    for cgroup, _proc in procs:
        home.give_back(cgroup, killed=False)  # (each held one process: reaped, so empty)
    return time.perf_counter() - started


async def moved_killpg_many(count: int) -> float:
    """The baseline with each leader moved into a cgroup of its own once it runs, and
    nothing else: what the move itself costs.

    Where the C library cannot create a leader in its cgroup (glibc before 2.41), it is
    moved there, by a write of its pid into ``cgroup.procs``, which Linux may make wait
    for an RCU grace period (unless cgroup2 is mounted ``favordynmods``). Here one thread
    makes the moves while the next leaders start (the cgroups are taken before the clock
    starts and given back after it stops): the move alone, made beside the spawns, not
    on the event loop. (Made after the exec, too late for containment: no design, a
    measure. An independent review found the first form, writing on the event loop
    between spawns, overstated it: each write then waited out its own grace period.)
    """
    home = cgroup_home()
    cgroups = [home.take_tree()[0] for _ in range(count)]
    to_move, moves = trio.open_memory_channel[tuple[str, int]](count)

    async def mover() -> None:
        async for cgroup, pid in moves:
            await trio.to_thread.run_sync(_move, cgroup, pid)

    started = time.perf_counter()
    procs = []
    async with trio.open_nursery() as moving:
        moving.start_soon(mover)
        async with to_move:
            for cgroup in cgroups:
                proc = await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True)
                procs.append(proc)
                to_move.send_nowait((cgroup, proc.pid))
    async with trio.open_nursery() as nursery:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            nursery.start_soon(proc.wait)
    elapsed = time.perf_counter() - started
    for cgroup in cgroups:
        home.give_back(cgroup, killed=False)  # (each held one process: reaped, so empty)
    return elapsed


def _move(cgroup: str, pid: int) -> None:
    fd = os.open(f"{cgroup}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


@asynccontextmanager
async def held_at_once(
    count: int, open_one: Callable[[], AbstractAsyncContextManager[object]]
) -> AsyncIterator[None]:
    """``count`` tasks, each in the block ``open_one()`` opens, all of them in theirs for
    the length of this one; then all cancelled, and so all torn down."""
    async with trio.open_nursery() as nursery:
        ready = 0
        all_ready = trio.Event()

        async def one() -> None:
            nonlocal ready
            async with open_one():
                ready += 1
                if ready == count:
                    all_ready.set()
                await trio.sleep_forever()

        for _ in range(count):
            nursery.start_soon(one)
        await all_ready.wait()
        yield
        nursery.cancel_scope.cancel()


def trees_running(count: int, containment: str) -> AbstractAsyncContextManager[None]:
    """``count`` concurrent ``sleep 60`` trees, all running for the length of the block,
    then all torn down."""
    return held_at_once(count, lambda: open_process_tree(["sleep", "60"], containment=containment))


async def proctree_many(count: int) -> float:
    reap_baseline_orphans()
    started = time.perf_counter()
    async with trees_running(count, CONTAINMENT):
        SPAWNED["ours"].append(time.perf_counter() - started)
    return time.perf_counter() - started


# --- CPU while cleanup waits out a grace ------------------------------------------------


async def grace_cpu(grace: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a cleanup that sits out ``grace`` before SIGKILL."""
    async with open_process_tree(["sh", "-c", "trap '' TERM; sleep 60"], grace=grace) as tree:
        await trio.sleep(0.05)
        cpu, wall = time.process_time(), time.perf_counter()
        await tree.aclose()
        return time.process_time() - cpu, time.perf_counter() - wall


def cgroup_available() -> bool:
    try:
        choose_containment("cgroup", changes_user=False)
    except ContainmentUnavailable:
        return False
    return True


async def interleaved(
    rounds: int, sides: dict[str, Callable[[], Awaitable[float]]]
) -> dict[str, list[float]]:
    """The times of each side over ``rounds`` rounds, the sides taking turns.

    Each round starts with the garbage collector's generations emptied (off the clock):
    else a side paid for what the side before it allocated, whenever that tipped a full
    collection into its round (~20 ms in a 100-tree round, measured; three rounds of it
    were once summed). Collections a side's own allocations bring about stay on its clock.
    """
    times: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        await side()  # warm up every path (imports, thread pool)
    for _ in range(rounds):
        for name, side in sides.items():
            gc.collect()
            times[name].append(await side())
    return times


def row(name: str, killpg: list[float], ours: list[float], target: str) -> str:
    ratio = sum(ours) / sum(killpg)
    base_ms, our_ms = statistics.median(killpg) * 1e3, statistics.median(ours) * 1e3
    return (
        f"{name:<44} {base_ms:>9.2f} ms {our_ms:>9.2f} ms {ratio:>6.2f}x"
        f" {our_ms / base_ms:>6.2f}x   {target}"
    )


def print_phases(times: dict[str, list[float]]) -> None:
    """The 100-tree rounds' two halves: the spawns (ours, two at a time, on both cores;
    the baseline's one by one) and the teardowns (all of it on the event loop's thread)."""
    spawned = {side: SPAWNED[side][1:] for side in SPAWNED}  # (not the warm-up round)
    torn = {
        side: [total - spawn for total, spawn in zip(times[side], spawned[side], strict=True)]
        for side in SPAWNED
    }
    print(row("  the spawns alone", spawned["killpg"], spawned["ours"], target="(no target)"))
    print(row("  the teardowns alone", torn["killpg"], torn["ours"], target="(no target)"))


async def many_trees(rounds: int, many: int, *, floor: bool) -> None:
    """The rows of ``many`` concurrent trees, spawned and torn down, against the baselines."""
    spawn_sides: dict[str, Callable[[], Awaitable[float]]] = {
        "killpg": lambda: killpg_many(many),
        "ours": lambda: proctree_many(many),
        "killpg tasks": lambda: killpg_tasks_many(many),
    }
    through_wrapper = floor and not direct_spawn.available()
    joiner = _joiner.path()
    if floor:
        spawn_sides["moved"] = lambda: moved_killpg_many(many)
    if through_wrapper:
        spawn_sides["floor"] = lambda: joined_killpg_many(many, joiner)
        if joiner is not None:
            spawn_sides["sh floor"] = lambda: joined_killpg_many(many, None)
    times = await interleaved(max(5, rounds // 3), spawn_sides)
    name = f"{many} concurrent trees, spawn + teardown"
    print(row(name, times["killpg"], times["ours"], target="<= 1.1x"))
    print_phases(times)
    # The baseline above spawns one tree after another from one task and kills them in a
    # loop; ours start in a task each, two at a time. Shaped as ours, the baseline's
    # spawns overlap in trio's worker threads, and each task is cancelled as ours are.
    name = "  against killpg with a task per tree"
    print(row(name, times["killpg tasks"], times["ours"], target="(no target)"))
    if floor:
        # Where a leader is not created in its cgroup, it is moved there: the move alone,
        # made by a thread beside the spawns, nothing of trio_proctree's.
        name = "  killpg, each leader moved into a cgroup"
        print(row(name, times["killpg"], times["moved"], target="(no target)"))
    if through_wrapper:
        # The same baseline, its leaders through the wrapper ours take here (this C
        # library cannot start a process in a cgroup): no design with that wrapper gets
        # below it, and the ratio of ours to it is trio_proctree's own share.
        way = "the joiner" if joiner is not None else "the /bin/sh join"
        name = f"  floor: killpg, leaders via {way}"
        print(row(name, times["killpg"], times["floor"], target="(no target)"))
        name = "  ours against that floor"
        print(row(name, times["floor"], times["ours"], target="(no target)"))
        if joiner is not None:
            # Where the joiner cannot run, leaders join through /bin/sh: what that costs.
            name = "  floor: killpg, leaders via the /bin/sh join"
            print(row(name, times["killpg"], times["sh floor"], target="(no target)"))


async def main(rounds: int, many: int, grace: float) -> None:
    print(f"Python {sys.version.split()[0]}, trio {trio.__version__}, {os.cpu_count()} cores")
    print(f"containment: {CONTAINMENT}")
    print(f"{'benchmark':<44} {'killpg':>12} {'proctree':>12} {'sums':>7} {'medians':>7}   target")
    sides: dict[str, Callable[[], Awaitable[float]]] = {
        "killpg cancelled": killpg_cancelled,
        "ours cancelled": proctree_cancelled,
        "killpg": killpg_teardown,
        "ours": proctree_teardown,
    }
    floor = CONTAINMENT in ("auto", "cgroup") and cgroup_available()
    if floor:
        sides["floor"] = floor_teardown
    times = await interleaved(rounds, sides)
    name = "cooperative teardown (cancel -> leader reaped)"
    print(row(name, times["killpg cancelled"], times["ours cancelled"], target="<= 1.5x"))
    # The teardown alone, no cancellation to deliver: aclose() against killpg + wait.
    name = "  aclose() -> returned, against killpg + wait"
    print(row(name, times["killpg"], times["ours"], target="(no target)"))
    if floor:
        # What the baseline leaves out (waiting for the leader's children, the cgroup),
        # done by hand with nothing else: no teardown of the whole tree gets below it.
        name = "  floor: killpg + wait for all + cgroup empty"
        print(row(name, times["killpg"], times["floor"], target="(no target)"))
    times = await interleaved(
        rounds, {"killpg": killpg_escaping_teardown, "ours": proctree_escaping_teardown}
    )
    name = "  with a setsid daemon (killpg misses it)"
    print(row(name, times["killpg"], times["ours"], target="(no target)"))
    await many_trees(rounds, many, floor=floor)
    cpu, wall = await grace_cpu(grace)
    name = f"CPU during a {grace:g} s grace wait"
    print(f"{name:<44} {cpu * 1e3:>9.2f} ms of CPU in {wall:.2f} s    target < 20 ms")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"(soft fd limit {soft}; times are medians; ratios of the sums and of the medians")
    print(" over interleaved rounds: a few slow outliers weigh on the sums)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--containment", default="auto")
    args = parser.parse_args()
    CONTAINMENT = args.containment
    trio.run(main, args.rounds, args.trees, args.grace)
