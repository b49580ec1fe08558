"""Benchmark: subreaper teardown when other code's orphans lie unreaped under us.

A child subreaper adopts the orphans of every child of the process, not only of its
trees; trio_proctree reaps only its own, so zombies of other code can pile up. Every
subreaper listing meets them all. This times one cooperative teardown with ``--zombies``
such zombies present (the first that meets them, and the next: a zombie's stat is read
once) against one with none, rounds interleaved and summed, and reports the cost per
zombie.

    python bench/bench_zombies.py [--rounds N] [--zombies N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import trio
from bench_teardown import COOPERATIVE, running

from trio_proctree import open_process_tree
from trio_proctree._orphans import become_subreaper, children


async def teardown() -> float:
    async with open_process_tree(
        COOPERATIVE, containment="subreaper", stdout=subprocess.PIPE
    ) as tree:
        await running(tree.stdout)
        started = time.perf_counter()
        await tree.aclose()
    return time.perf_counter() - started


def leave_zombies(count: int) -> list[int]:
    """``count`` orphans of a child that is not a tree, re-parented to us, then exited."""
    before = set(children(os.getpid()))
    # Each waits for EOF on the pipe, so that it exits only after the shell, as our child.
    # (A background job's stdin is /dev/null unless redirected: the pipe goes via fd 3.)
    hold, release = os.pipe()
    script = f"exec 3<&0; i=0; while [ $i -lt {count} ]; do (read x <&3) & i=$((i+1)); done"
    subprocess.run(["sh", "-c", script], check=True, stdin=hold)
    os.close(hold)
    os.close(release)
    deadline = time.monotonic() + 10
    while True:
        zombies = [pid for pid in children(os.getpid()) if pid not in before]
        dead = [
            pid
            for pid in zombies
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        ]
        if len(dead) == count:
            return dead
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(dead)} of {count} orphans became our zombies")
        time.sleep(0.01)


def reap(zombies: list[int]) -> None:
    """Ours to reap here: this benchmark made them."""
    for pid in zombies:
        os.waitpid(pid, 0)


async def main(rounds: int, count: int) -> None:
    become_subreaper()
    await teardown()  # warm up
    first: list[float] = []  # the first teardown that meets the zombies
    again: list[float] = []  # the next one: their stats are known by then
    without: list[float] = []
    for _ in range(rounds):
        without.append(await teardown())
        zombies = leave_zombies(count)
        first.append(await teardown())
        again.append(await teardown())
        reap(zombies)
    base = statistics.median(without)
    print(f"subreaper cooperative teardown, {rounds} interleaved rounds")
    print(f"  no zombies under us:            {base * 1e3:8.2f} ms (median)")
    for name, times in (("first to meet them", first), ("every one after", again)):
        slow = statistics.median(times)
        print(
            f"  {count} zombies, {name + ':':<19} {slow * 1e3:8.2f} ms (median),"
            f" {sum(times) / sum(without):.2f}x (sums), {(slow - base) / count * 1e6:.1f} us"
            " per zombie"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--zombies", type=int, default=200)
    args, _ = parser.parse_known_args()  # (nox passes every benchmark the same options)
    trio.run(main, args.rounds, args.zombies)
