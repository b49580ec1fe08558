"""Waiting is event-driven: a longer grace costs no more wake-ups than a short one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio
import trio.lowlevel

from trio_proctree import open_process_tree

from .conftest import Tracked


class StepCounter(trio.abc.Instrument):
    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@contextmanager
def counting_steps() -> Iterator[StepCounter]:
    """Count the scheduler steps of the current task for the length of the block."""
    counter = StepCounter(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)


async def cleanup_steps(grace: float, contained: dict[str, Any]) -> int:
    """Scheduler steps the cleanup of a SIGTERM-ignoring tree takes (it sits out the grace)."""
    async with open_process_tree(
        ["sh", "-c", "trap '' TERM; echo ready; sleep 60"],
        grace=grace,
        stdout=subprocess.PIPE,
        **contained,
    ) as tree:
        assert tree.stdout is not None
        await tree.stdout.receive_some()
        with counting_steps() as counter:
            await tree.aclose()
    assert tree.outcome is not None
    assert tree.outcome.grace_expired
    return counter.steps


async def test_a_longer_grace_costs_no_extra_wakeups(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    short = await cleanup_steps(0.05, contained)
    long = await cleanup_steps(0.5, contained)
    # A sleep-poll loop (every 20 ms, say) would add ~22 steps to the longer grace. What
    # follows SIGKILL takes 3 to 6 steps either way (one wake-up per process still to exit
    # when cleanup looks: measured 3-6 on both sides), hence the margin.
    assert long - short <= 5, (short, long)
    assert short < 20
    assert tracked.survivors() == []
