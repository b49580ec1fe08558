"""Benchmarks at scale: many concurrent trees, file descriptors, and the fd limit.

Ratios measured in one run against two baselines, rounds interleaved and summed:
- ``killpg``: ``start_new_session=True``, ``os.killpg(SIGTERM)``, ``await proc.wait()``;
- ``bare``: ``trio.lowlevel.open_process`` and ``proc.kill()`` (the leader only).

    python bench/bench_scale.py [--rounds N] [--containment MODE]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable

import bench_teardown
import trio
from bench_teardown import killpg_many, proctree_many

from trio_proctree import open_process_tree

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
    held = 0.0
    async with trio.open_nursery() as nursery:
        ready = 0
        all_ready = trio.Event()

        async def one() -> None:
            nonlocal ready
            async with open_process_tree(["sleep", "60"], containment=CONTAINMENT):
                ready += 1
                if ready == count:
                    all_ready.set()
                await trio.sleep_forever()

        for _ in range(count):
            nursery.start_soon(one)
        await all_ready.wait()
        held = (len(os.listdir("/proc/self/fd")) - before) / count
        nursery.cancel_scope.cancel()
    return held


async def rounds_of(
    rounds: int, sides: dict[str, Callable[[], Awaitable[float]]]
) -> dict[str, float]:
    totals = dict.fromkeys(sides, 0.0)
    for side in sides.values():
        await side()  # warm up
    for _ in range(rounds):
        for name, side in sides.items():
            totals[name] += await side()
    return {name: total / rounds for name, total in totals.items()}


UNDER_LIMIT = textwrap.dedent(
    """
    import resource, sys, trio
    from trio_proctree import open_process_tree
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))

    async def main(count, containment):
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            started = 0
            async def one():
                nonlocal started
                async with open_process_tree(["sleep", "60"], containment=containment):
                    started += 1
                    if started == count:
                        ready.set()
                    await trio.sleep_forever()
            for _ in range(count):
                nursery.start_soon(one)
            await ready.wait()
            nursery.cancel_scope.cancel()
        print("ok")

    trio.run(main, int(sys.argv[1]), sys.argv[2])
    """
)


def under_soft_limit(count: int) -> str:
    result = subprocess.run(
        [sys.executable, "-c", UNDER_LIMIT, str(count), CONTAINMENT],
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
        means = await rounds_of(
            rounds if count < 500 else max(1, rounds // 3),
            {
                "bare": lambda count=count: bare_many(count),
                "killpg": lambda count=count: killpg_many(count),
                "proctree": lambda count=count: proctree_many(count),
            },
        )
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
