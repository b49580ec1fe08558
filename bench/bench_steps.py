"""Where a cooperative teardown's time goes: each step's median offset from its start.

Wraps the functions on the path with timestamps (so each step runs a little slower than
unwrapped) and times ``tree.aclose()`` of the same tree as ``bench_teardown.py``, the
hand-rolled killpg baseline in between, as its rounds do. Prints, per mark, how many
rounds passed it and its median offset in microseconds; ``>`` is a call, ``<`` its return,
``#N`` the Nth time in a round. The last ``end`` is when ``aclose()`` returned.

    python bench/bench_steps.py [--rounds N]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import trio
from bench_teardown import COOPERATIVE, killpg_teardown, running

import trio_proctree._cgroup as cgroup
import trio_proctree._cgroupfs as cgroupfs
import trio_proctree._core as core
import trio_proctree._leader as leader
import trio_proctree._member_tracking as member_tracking
from trio_proctree import open_process_tree

marks: list[tuple[str, int]] = []
clock = {"started": 0}


def mark(name: str) -> None:
    marks.append((name, time.perf_counter_ns() - clock["started"]))


def timed(owner: Any, attribute: str, name: str) -> None:
    """Mark each call of ``owner.attribute`` and its return."""
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(name + ">")
        try:
            return original(*args, **kwargs)
        finally:
            mark(name + "<")

    setattr(owner, attribute, wrapper)


def timed_async(owner: Any, attribute: str, name: str) -> None:
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(name + ">")
        try:
            return await original(*args, **kwargs)
        finally:
            mark(name + "<")

    setattr(owner, attribute, wrapper)


timed(os, "killpg", "killpg")
timed(cgroup.CgroupContainment, "_populated", "cgroup.events")
timed(cgroupfs, "processes_in", "cgroup.procs")
timed(member_tracking.MemberTracking, "release", "release")
timed(leader.Leader, "reap", "reap")
timed(leader.Leader, "poll", "waitid")
timed(core.TreeCore, "_step", "step")
timed_async(core.TreeCore, "cleanup", "cleanup")
timed_async(trio.lowlevel, "wait_readable", "wait")


async def one_teardown() -> list[tuple[str, int]]:
    async with open_process_tree(COOPERATIVE, stdout=subprocess.PIPE) as tree:
        await running(tree.stdout)
        marks.clear()
        clock["started"] = time.perf_counter_ns()
        await tree.aclose()
        mark("end")
    return list(marks)


async def main(rounds: int) -> None:
    offsets: dict[str, list[float]] = defaultdict(list)
    for index in range(rounds + 5):
        await killpg_teardown()
        taken = await one_teardown()
        if index < 5:
            continue  # warming up
        seen: dict[str, int] = defaultdict(int)
        for name, offset in taken:
            offsets[f"{name}#{seen[name]}"].append(offset / 1000)
            seen[name] += 1
    print(f"{'mark':<22} {'rounds':>6} {'median':>9}")
    for name, values in sorted(offsets.items(), key=lambda item: statistics.median(item[1])):
        print(f"{name:<22} {len(values):>6} {statistics.median(values):>7.0f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    trio.run(main, parser.parse_args().rounds)
