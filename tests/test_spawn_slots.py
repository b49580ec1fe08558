"""Spawns under trio run a few at a time: one per CPU the process may use, two at least.

A spawn is mostly Python in a worker thread; more of them at once than cores only fight
over the GIL. What waits for a slot has forked nothing, so a cancellation there is taken
at once.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio

from trio_proctree import _trio, open_process_tree

from .conftest import Tracked


def slots_here() -> int:
    return max(2, len(os.sched_getaffinity(0)))


async def test_spawns_run_one_per_cpu_at_once(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = threading.Lock()
    running, most = 0, 0
    start = _trio._start_tree_in_worker

    def counted(*args: Any) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            threading.Event().wait(0.02)  # (so that spawns overlap, wherever they may)
            return start(*args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(_trio, "_start_tree_in_worker", counted)
    count = 3 * slots_here()
    started = 0

    async def one() -> None:
        nonlocal started
        async with open_process_tree(["true"], env=tracked.env):
            started += 1

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
    assert started == count
    assert most == slots_here()  # (not one at a time, nor trio's 40 threads)
    assert tracked.survivors() == []


async def test_a_spawn_cancelled_while_waiting_for_a_slot_forks_nothing(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every slot held by a spawn that waits for our word: the next spawn waits for a slot,
    # and its cancellation ends it at once, with nothing started (nothing carries the
    # token but the held spawns' trees, which go once let through).
    release = threading.Event()
    lock = threading.Lock()
    holding = 0
    held_all = trio.Event()
    token = trio.lowlevel.current_trio_token()
    start = _trio._start_tree_in_worker
    reached = []

    def held(*args: Any) -> Any:
        nonlocal holding
        if args[0].command == ["sleep", "60"]:
            reached.append(args)
            return start(*args)
        with lock:
            holding += 1
            if holding == slots_here():
                token.run_sync_soon(held_all.set)
        release.wait(10)
        return start(*args)

    monkeypatch.setattr(_trio, "_start_tree_in_worker", held)

    async def holder() -> None:
        async with open_process_tree(["true"], env=tracked.env):
            pass

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for _ in range(slots_here()):
                nursery.start_soon(holder)
            await held_all.wait()
            with trio.move_on_after(0.2) as waited:
                async with open_process_tree(["sleep", "60"], env=tracked.env):
                    pytest.fail("started without a slot")  # pragma: no cover
            release.set()
    assert waited.cancelled_caught
    assert reached == []  # (never handed to a worker thread)
    assert tracked.survivors() == []
