"""Property-based cancellation tests: random tree shapes, random cancel instants, random
grace values, and the invariants that must hold for every one of them:

- nothing of the tree survives;
- cleanup ran exactly once (one escalation, at most one stop signal);
- it took no longer than the policy's worst case, plus a margin.

Bounded for CI (profile ``ci``); ``HYPOTHESIS_PROFILE=nightly`` runs many more examples.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Iterator

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trio_proctree
import trio_proctree.asyncio

from . import procs

settings.register_profile(
    "ci",
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples on every run: CI never flakes on a new one
)
settings.register_profile(
    "nightly", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Slack over the policy's worst case for scheduling and process start-up on a busy box.
MARGIN = 1.5


@attrs.frozen
class Node:
    """One shell in the tree: its children, and how it behaves."""

    children: tuple[Node, ...] = ()
    escapes: bool = False  # started with setsid -f: leaves session and group
    ignores_term: bool = False  # trap '' TERM: only SIGKILL ends it
    stops: bool = False  # SIGSTOPs itself once its children are started

    def script(self) -> str:
        parts = ["trap '' TERM"] if self.ignores_term else []
        for child in self.children:
            inner = shlex.quote(child.script())
            parts.append(f"setsid -f sh -c {inner}" if child.escapes else f"sh -c {inner} &")
        if self.stops:
            parts.append("kill -STOP $$")
        parts.append("sleep 60 & wait")
        return "; ".join(parts)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


flags = {"escapes": st.booleans(), "ignores_term": st.booleans(), "stops": st.booleans()}
trees = st.recursive(
    st.builds(Node, **flags),
    lambda inner: st.builds(Node, children=st.lists(inner, max_size=3).map(tuple), **flags),
    max_leaves=6,
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Node, str, float, float, str]:
    tree = draw(trees)
    escapes = any(node.escapes for node in tree.walk())
    # A process group alone cannot hold escapees (that limit has its own test).
    containment = draw(st.sampled_from(["cgroup", "subreaper"] + ([] if escapes else ["group"])))
    cancel_at = draw(st.floats(min_value=0.0, max_value=0.05))
    grace = draw(st.floats(min_value=0.05, max_value=0.3))
    driver = draw(st.sampled_from(["trio", "asyncio"]))
    return tree, containment, cancel_at, grace, driver


class Escalations(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stop_signals = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "sending SIGTERM" in record.getMessage():
            self.stop_signals += 1


async def in_trio(command: list[str], options: dict[str, object], cancel_at: float) -> list[object]:
    opened: list[object] = []
    with trio.move_on_after(cancel_at):
        async with trio_proctree.open_process_tree(command, **options) as tree:  # type: ignore[arg-type]
            opened.append(tree)
            await trio.sleep_forever()
    return opened


async def in_asyncio(
    command: list[str], options: dict[str, object], cancel_at: float
) -> list[object]:
    opened: list[object] = []

    async def hold() -> None:
        async with trio_proctree.asyncio.open_process_tree(command, **options) as tree:  # type: ignore[arg-type]
            opened.append(tree)
            await asyncio.Event().wait()

    task = asyncio.get_running_loop().create_task(hold())
    await asyncio.sleep(cancel_at)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return opened


@given(scenarios())
def test_any_tree_cancelled_at_any_instant_leaves_nothing(
    scenario: tuple[Node, str, float, float, str],
) -> None:
    tree, containment, cancel_at, grace, driver = scenario
    token = procs.new_token()
    options = {
        "grace": grace,
        "containment": containment,
        "env": {**os.environ, procs.TOKEN_VAR: token},
    }
    command = ["sh", "-c", tree.script()]
    counter = Escalations()
    logger = logging.getLogger("trio_proctree")
    level = logger.level
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    try:
        if driver == "trio":
            opened = trio.run(in_trio, command, options, cancel_at)
        else:
            opened = asyncio.run(in_asyncio(command, options, cancel_at))
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)
        leaked = procs.kill_survivors(token)
    assert leaked == [], f"survived: {leaked} of {command}"
    assert counter.stop_signals <= 1  # one escalation at most: never restarted
    for handle in opened:
        outcome = handle.outcome  # type: ignore[attr-defined]
        assert outcome is not None, "cleanup ran"
        policy = trio_proctree.Escalation.graceful(grace)
        assert outcome.duration <= policy.worst_case + MARGIN
