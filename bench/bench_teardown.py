"""Benchmarks: trio_proctree against a hand-rolled ``start_new_session`` + ``os.killpg``.

Reported as ratios measured in one run (absolute times depend on the machine). Rounds of
the two sides are interleaved and summed: single rounds are ~0.1 s and noisy on 2 cores.

    python bench/bench_teardown.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import trio

from trio_proctree import open_process_tree

COOPERATIVE = ["sh", "-c", "sleep 60 & sleep 61 & wait"]
CONTAINMENT = "auto"


async def _until(event: trio.Event) -> None:
    await event.wait()


# --- one cooperative tree: cancel -> leader reaped ------------------------------------


async def killpg_teardown() -> float:
    proc = await trio.lowlevel.open_process(COOPERATIVE, start_new_session=True)
    await trio.sleep(0.02)  # let the shell start its two sleeps
    started = time.perf_counter()
    os.killpg(proc.pid, signal.SIGTERM)
    await proc.wait()
    return time.perf_counter() - started


async def proctree_teardown() -> float:
    async with open_process_tree(COOPERATIVE, containment=CONTAINMENT) as tree:
        await trio.sleep(0.02)
        started = time.perf_counter()
        await tree.aclose()
    return time.perf_counter() - started


# --- many trees at once: spawn + teardown --------------------------------------------


async def killpg_many(count: int) -> float:
    started = time.perf_counter()
    procs = []
    for _ in range(count):
        procs.append(await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True))
    async with trio.open_nursery() as nursery:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            nursery.start_soon(proc.wait)
    return time.perf_counter() - started


async def proctree_many(count: int) -> float:
    started = time.perf_counter()
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
        nursery.cancel_scope.cancel()
    return time.perf_counter() - started


# --- CPU while cleanup waits out a grace ------------------------------------------------


async def grace_cpu(grace: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a cleanup that sits out ``grace`` before SIGKILL."""
    async with open_process_tree(["sh", "-c", "trap '' TERM; sleep 60"], grace=grace) as tree:
        await trio.sleep(0.05)
        cpu, wall = time.process_time(), time.perf_counter()
        await tree.aclose()
        return time.process_time() - cpu, time.perf_counter() - wall


async def interleaved(
    rounds: int, baseline: Callable[[], Awaitable[float]], ours: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    base_times, our_times = [], []
    await baseline()  # warm up both paths (imports, thread pool)
    await ours()
    for _ in range(rounds):
        base_times.append(await baseline())
        our_times.append(await ours())
    return base_times, our_times


def row(name: str, base: list[float], ours: list[float], target: str) -> str:
    ratio = sum(ours) / sum(base)
    base_ms, our_ms = statistics.median(base) * 1e3, statistics.median(ours) * 1e3
    return (
        f"{name:<44} {base_ms:>9.2f} ms {our_ms:>9.2f} ms {ratio:>6.2f}x"
        f" {our_ms / base_ms:>6.2f}x   {target}"
    )


async def main(rounds: int, many: int, grace: float) -> None:
    print(f"Python {sys.version.split()[0]}, trio {trio.__version__}, {os.cpu_count()} cores")
    print(f"containment: {CONTAINMENT}")
    print(f"{'benchmark':<44} {'killpg':>12} {'proctree':>12} {'sums':>7} {'medians':>7}   target")
    base, ours = await interleaved(rounds, killpg_teardown, proctree_teardown)
    print(row("cooperative teardown (cancel -> reaped)", base, ours, "<= 1.5x"))
    base, ours = await interleaved(
        max(3, rounds // 10), lambda: killpg_many(many), lambda: proctree_many(many)
    )
    print(row(f"{many} concurrent trees, spawn + teardown", base, ours, "<= 1.1x"))
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
