"""A program that starts trees for as long as it lives: nothing of ours piles up.

Language servers, build daemons and job workers start thousands of trees in one process.
Each tree's file descriptors, registrations and cgroup must go with it, whichever way its
block ends: at its end, by an exception, by a cancellation, or through run_process_tree.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from typing import Any

import pytest
import trio

import trio_proctree.asyncio
from trio_proctree import (
    _cgroup_home,
    _core,
    _leader,
    _orphans,
    open_process_tree,
    run_process_tree,
)

from . import procs
from .conftest import Tracked

LINGERS = ["sh", "-c", "sleep 60 & exit 0"]  # the leader exits at once, its child lingers
SLEEPS = ["sh", "-c", "sleep 60 & sleep 61 & wait"]
ROUNDS = 30


class Failed(Exception):
    pass


def held() -> dict[str, set[Any]]:
    """What this process holds for trio_proctree's sake: any of it that grows is a leak."""
    home = _cgroup_home._homes.get(os.getpid())
    cgroups = 0  # counted, not named: a cgroup that was killed is replaced, not reused
    if home is not None:
        with os.scandir(home.path) as entries:
            cgroups = sum(entry.is_dir() for entry in entries)
    return {
        "file descriptors": procs.open_fds(),
        "children": procs.children_of_self(),  # (the watchdog)
        "unreaped leaders": set(_leader._unreaped),
        "open trees": {id(tree) for tree in _core._open_trees},
        "zombies kept for their reaper": set(_orphans._zombies),
        "cgroups": set(range(cgroups)),
    }


def grown(before: dict[str, set[Any]], after: dict[str, set[Any]]) -> dict[str, set[Any]]:
    return {what: after[what] - before[what] for what in before if after[what] - before[what]}


async def one_tree_the_trio_way(way: int, contained: dict[str, Any]) -> None:
    if way == 0:  # the block ends; the leader has exited, its child lingers
        async with open_process_tree(LINGERS, grace=0.2, **contained) as tree:
            await tree.wait()
    elif way == 1:  # an exception leaves the block, with pipes open
        with pytest.raises(Failed):
            async with open_process_tree(
                SLEEPS, grace=0.2, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **contained
            ):
                raise Failed
    elif way == 2:  # a cancellation
        with trio.CancelScope() as scope:
            async with open_process_tree(SLEEPS, grace=0.2, **contained):
                scope.cancel()
                await trio.sleep_forever()
        assert scope.cancelled_caught
    elif way == 3:  # run_process_tree, output captured, input given
        result = await run_process_tree(
            ["sh", "-c", "cat; sleep 60 &"], stdin=b"in", capture_stdout=True, **contained
        )
        assert result.stdout == b"in"
    else:  # started in a nursery, which is cancelled
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_process_tree, SLEEPS, grace=0.2, **contained))
            nursery.cancel_scope.cancel()


async def test_trees_started_one_after_another_leave_nothing_behind(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Mutant: a leader's pidfd left open once its tree ended.
    for way in range(5):  # the first of each kind sets up what is kept for good
        await one_tree_the_trio_way(way, contained)
    before = held()
    for round_ in range(ROUNDS):
        await one_tree_the_trio_way(round_ % 5, contained)
    assert grown(before, held()) == {}
    assert tracked.survivors() == []


async def one_tree_the_asyncio_way(way: int, contained: dict[str, Any]) -> None:
    if way == 0:
        async with trio_proctree.asyncio.open_process_tree(LINGERS, grace=0.2, **contained) as tree:
            await tree.wait()
    elif way == 1:
        with pytest.raises(Failed):
            async with trio_proctree.asyncio.open_process_tree(
                SLEEPS, grace=0.2, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **contained
            ):
                raise Failed
    elif way == 2:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                trio_proctree.asyncio.run_process_tree(SLEEPS, grace=0.2, **contained), 0.05
            )
    else:
        result = await trio_proctree.asyncio.run_process_tree(
            ["sh", "-c", "cat; sleep 60 &"], stdin=b"in", capture_stdout=True, **contained
        )
        assert result.stdout == b"in"


def test_trees_started_one_after_another_on_asyncio_leave_nothing_behind(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    async def main() -> dict[str, set[Any]]:
        for way in range(4):
            await one_tree_the_asyncio_way(way, contained)
        before = held()
        for round_ in range(ROUNDS):
            await one_tree_the_asyncio_way(round_ % 4, contained)
        return grown(before, held())

    assert asyncio.run(main()) == {}
    assert tracked.survivors() == []
