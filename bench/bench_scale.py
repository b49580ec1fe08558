"""Benchmarks at scale: many concurrent trees, file descriptors, and the fd limit.

Ratios measured in one run against two baselines, rounds interleaved and summed:
- ``killpg``: ``start_new_session=True``, ``os.killpg(SIGTERM)``, ``await proc.wait()``;
- ``bare``: ``trio.lowlevel.open_process`` and ``proc.kill()`` (the leader only).

    python bench/bench_scale.py [--rounds N] [--containment MODE]
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import subprocess
import sys
import textwrap
import time

import bench_teardown
import trio
from bench_teardown import interleaved, killpg_many, proctree_many, trees_running

CONTAINMENT = "auto"


async def bare_many(count: int) -> float:
    started = time.perf_counter()
    procs = [await trio.lowlevel.open_process(["sleep", "60"]) for _ in range(count)]
    async with trio.open_nursery() as nursery:
        for proc in procs:
            proc.kill()
            nursery.start_soon(proc.wait)
    return time.perf_counter() - started


async def fds_per_tree(count: int) -> float:
    """File descriptors this process holds per open tree (no pipes)."""
    before = len(os.listdir("/proc/self/fd"))
    async with trees_running(count, CONTAINMENT):
        return (len(os.listdir("/proc/self/fd")) - before) / count


UNDER_LIMIT = textwrap.dedent(
    """
    import resource, sys, trio
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    sys.path.insert(0, sys.argv[3])
    from bench_teardown import trees_running

    async def main(count, containment):
        async with trees_running(count, containment):
            pass
        print("ok")

    trio.run(main, int(sys.argv[1]), sys.argv[2])
    """
)


def under_soft_limit(count: int) -> str:
    result = subprocess.run(
        [sys.executable, "-c", UNDER_LIMIT, str(count), CONTAINMENT, os.path.dirname(__file__)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode == 0:
        return "works"
    last = (result.stderr.strip().splitlines() or ["?"])[-1]
    return f"fails: {last}"


async def main(rounds: int) -> None:
    print(f"Python {sys.version.split()[0]}, trio {trio.__version__}, {os.cpu_count()} cores")
    print(f"containment: {CONTAINMENT}")
    header = f"{'concurrent trees':<20} {'bare':>10} {'killpg':>10} {'proctree':>10}"
    print(f"{header} {'vs killpg':>10} {'vs bare':>9}")
    for count in (10, 100, 500):
        times = await interleaved(
            rounds if count < 500 else max(1, rounds // 3),
            {
                "bare": functools.partial(bare_many, count),
                "killpg": functools.partial(killpg_many, count),
                "proctree": functools.partial(proctree_many, count),
            },
        )
        means = {name: sum(side) / len(side) for name, side in times.items()}
        print(
            f"{count:<20} {means['bare'] * 1e3:>7.1f} ms {means['killpg'] * 1e3:>7.1f} ms"
            f" {means['proctree'] * 1e3:>7.1f} ms {means['proctree'] / means['killpg']:>9.2f}x"
            f" {means['proctree'] / means['bare']:>8.2f}x"
        )
    print(f"file descriptors per open tree: {await fds_per_tree(100):.2f}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"500 concurrent trees under a soft fd limit of 1024: {under_soft_limit(500)}")
    print(f"(this process: soft fd limit {soft}, hard {hard}; times are means per round)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--containment", default="auto")
    args = parser.parse_args()
    CONTAINMENT = bench_teardown.CONTAINMENT = args.containment
    trio.run(main, args.rounds)
