"""How users write against the public API, for the type checkers (not collected as tests).

``nox -s typecheck`` runs mypy --strict and pyright strict over this module: a public
signature that makes ordinary code fail to type-check fails the session.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess

import anyio
import anyio.abc
import trio

import trio_proctree
import trio_proctree.asyncio
from trio_proctree import CleanupOutcome, Escalation, ProcessTree


async def leader_status(command: list[str]) -> int:
    # A return from inside the block: the scope never swallows an exception, so nothing
    # after the block is needed (a scope typed as swallowing made this "missing a return").
    async with trio_proctree.open_process_tree(command, grace=0.5) as tree:
        return await tree.wait()


async def leader_status_on_asyncio(command: list[str]) -> int:
    async with trio_proctree.asyncio.open_process_tree(command, grace=0.5) as tree:
        return await tree.wait()


async def output_of(command: list[str]) -> bytes:
    result = await trio_proctree.run_process_tree(command, capture_stdout=True)
    return result.stdout


async def output_on_asyncio(command: list[str]) -> bytes:
    result = await trio_proctree.asyncio.run_process_tree(command, capture_stdout=True)
    return result.stdout


async def started_in_a_nursery(command: list[str]) -> CleanupOutcome | None:
    async with trio.open_nursery() as nursery:
        tree: ProcessTree = await nursery.start(trio_proctree.run_process_tree, command)
        tree.send_signal(signal.SIGTERM)
        nursery.cancel_scope.cancel()
    return tree.outcome


async def piped(command: list[str]) -> bytes:
    policy = Escalation(steps=[(signal.SIGINT, 0.5)], close_stdin=0.2)
    async with trio_proctree.open_process_tree(
        command, escalation=policy, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as tree:
        assert tree.stdin is not None and tree.stdout is not None
        await tree.stdin.send_all(b"input")
        await tree.stdin.aclose()
        return bytes(await tree.stdout.receive_some())


async def closed_from_a_task_of_its_own(command: list[str]) -> None:
    # aclose() starts the cleanup when called; what it returns is a coroutine, which
    # create_task and TaskGroup.create_task insist on (a bare Awaitable was refused).
    async with trio_proctree.asyncio.open_process_tree(command) as tree:
        closing = asyncio.get_running_loop().create_task(tree.aclose())
        await closing


async def started_in_an_anyio_task_group(
    tg: anyio.abc.TaskGroup, command: list[str]
) -> trio_proctree.asyncio.ProcessTree:
    # anyio's task_status is what the asyncio driver's run_process_tree takes.
    tree: trio_proctree.asyncio.ProcessTree = await tg.start(
        functools.partial(trio_proctree.asyncio.run_process_tree, command, grace=0.5)
    )
    return tree
