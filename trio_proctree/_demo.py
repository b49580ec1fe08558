"""``trio-proctree demo``: what each way of cancelling a subprocess leaves behind, measured live.

Each strategy runs ``sh -c "sleep 60 & sleep 61 & wait"`` (three processes), cancels the
task awaiting it once all three run, and counts what is still alive shortly after the
teardown returned. Then a tree whose member escapes with ``setsid -f`` (a daemon) runs
under killpg and under trio_proctree. Every process the demo starts carries a marker in
its environment, so whatever a strategy leaves behind is found and killed (through
pidfds, by pid, never by name) before the next one runs.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TextIO

import attrs
import trio

from ._choose import choose_containment
from ._cmd_run import PASSED_ON
from ._pidfd import pin_process, signal_pidfd
from ._procfs import is_alive, read_stat
from ._trio import open_process_tree

COMMAND = ["sh", "-c", "sleep 60 & sleep 61 & wait"]
#: The same size of tree, but one member calls setsid(): it leaves session and group.
WITH_DAEMON = ["sh", "-c", "setsid -f sleep 60; sleep 61 & wait"]
TREE_SIZE = 3
_MARKER = "TRIO_PROCTREE_DEMO"
#: Survivors are counted this long after the teardown returned, so that processes still
#: dying from a signal are not counted against a strategy.
SETTLE = 0.2
#: Signals that end the demo early: the comparison stops, and what it started is killed
#: first (ended by one at once, a strategy's uncontained tree would run on for a minute).
#: (Those a process has no handler for end it: SIGUSR1 left them running, once.)
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *PASSED_ON)
_CLEAN_UP_ROUNDS = 10


class Interrupted(Exception):
    """The demo was stopped by ``signal`` before it was done; nothing it started runs."""

    def __init__(self, signal: int) -> None:
        super().__init__(f"interrupted by signal {signal}")
        self.signal = signal


@attrs.frozen
class Row:
    strategy: str
    survivors: int
    teardown: float  # seconds from the cancellation to the strategy's return


class _Run:
    """One strategy's processes: the environment that marks them, and finding them."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.marker = uuid.uuid4().hex
        self.env = {**os.environ, _MARKER: self.marker}
        self.leaders: list[trio.Process] = []

    def marked(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return f"{_MARKER}={self.marker}".encode() in f.read().split(b"\0")
        except OSError:
            return False

    def members(self) -> list[int]:
        pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
        return [pid for pid in pids if self.marked(pid) and is_alive(pid)]

    def ready(self) -> bool:
        """All of the tree runs, and its daemon, if any, has left the group: counted as
        running before its setsid(), killpg got it too (seen in CI: 0 survivors)."""
        members = self.members()
        if len(members) < TREE_SIZE:
            return False
        return self.command is not WITH_DAEMON or any(map(_daemon, members))

    async def until_running(self) -> None:
        with trio.fail_after(5):
            # The demo's command says nothing when it is ready: look for its processes.
            while not self.ready():  # noqa: ASYNC110
                await trio.sleep(0.005)

    async def clean_up(self) -> None:
        """Kill what the strategy left (by pidfd: a recycled pid is never hit), looking
        again until nothing is left (a shell interrupted early may fork between a look and
        its kill), then reap. Shielded: the demo's interruption ends here."""
        with trio.CancelScope(shield=True):
            for _ in range(_CLEAN_UP_ROUNDS):
                pidfds: list[int] = []
                for pid in self.members():
                    pinned = pin_process(pid, lambda stat: self.marked(stat.pid))
                    if pinned is not None:
                        signal_pidfd(pinned[0], signal.SIGKILL)
                        pidfds.append(pinned[0])
                if not pidfds:
                    break
                try:
                    for pidfd in pidfds:  # killed: each exits within milliseconds
                        await trio.lowlevel.wait_readable(pidfd)
                finally:
                    for pidfd in pidfds:
                        os.close(pidfd)
            for leader in self.leaders:
                await leader.wait()


def _daemon(pid: int) -> bool:
    """Whether ``pid`` is WITH_DAEMON's daemon, as it runs: a sleep leading a session."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            sleeps = f.read() == b"sleep\n"
    except OSError:
        return False
    stat = read_stat(pid)
    return sleeps and stat is not None and stat.sid == pid


Strategy = Callable[[_Run, trio.CancelScope], Awaitable[None]]


async def no_cleanup(run: _Run, scope: trio.CancelScope) -> None:
    proc = await trio.lowlevel.open_process(run.command, env=run.env)
    run.leaders.append(proc)
    with scope:
        await proc.wait()


async def kill_leader(run: _Run, scope: trio.CancelScope) -> None:
    proc = await trio.lowlevel.open_process(run.command, env=run.env)
    run.leaders.append(proc)
    with scope:
        try:
            await proc.wait()
        finally:
            proc.kill()
            # Shielded, as a careful hand-rolled cleanup is: the scope is cancelled by
            # now, and an unshielded wait would leave the leader unreaped (its row then
            # counts a zombie, not the strategy's survivors).
            with trio.CancelScope(shield=True):
                await proc.wait()


async def trio_run_process(run: _Run, scope: trio.CancelScope) -> None:
    with scope:
        await trio.run_process(run.command, env=run.env)


async def killpg(run: _Run, scope: trio.CancelScope) -> None:
    proc = await trio.lowlevel.open_process(run.command, env=run.env, start_new_session=True)
    run.leaders.append(proc)
    with scope:
        try:
            await proc.wait()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            with trio.CancelScope(shield=True):  # (as in kill_leader)
                await proc.wait()


async def proctree(run: _Run, scope: trio.CancelScope) -> None:
    with scope:
        async with open_process_tree(run.command, env=run.env) as tree:
            await tree.wait()


STRATEGIES: list[tuple[str, list[str], Strategy]] = [
    ("no cleanup (cancel the awaiting task)", COMMAND, no_cleanup),
    ("kill the leader (asyncio-style proc.kill())", COMMAND, kill_leader),
    ("trio.run_process, default cancel", COMMAND, trio_run_process),
    ("new session + os.killpg", COMMAND, killpg),
    ("trio_proctree.open_process_tree", COMMAND, proctree),
    ("with a setsid daemon: new session + os.killpg", WITH_DAEMON, killpg),
    ("with a setsid daemon: trio_proctree", WITH_DAEMON, proctree),
]


async def measure(name: str, command: list[str], strategy: Strategy) -> Row:
    run = _Run(command)
    scope = trio.CancelScope()
    cancelled_at = 0.0
    returned_at = 0.0
    try:
        async with trio.open_nursery() as nursery:

            async def run_strategy() -> None:
                nonlocal returned_at
                await strategy(run, scope)
                returned_at = time.perf_counter()

            nursery.start_soon(run_strategy)
            await run.until_running()
            cancelled_at = time.perf_counter()
            scope.cancel()
        await trio.sleep(SETTLE)
        survivors = len(run.members())
    finally:
        await run.clean_up()
    return Row(name, survivors, returned_at - cancelled_at)


async def compare() -> list[Row]:
    """Every strategy's row. Raises `Interrupted` once what the demo started is gone, if
    one of `INTERRUPTS` came first."""
    rows: list[Row] = []
    received: list[int] = []
    with trio.open_signal_receiver(*INTERRUPTS) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_a_signal() -> None:
                async for sig in signals:
                    received.append(sig)
                    nursery.cancel_scope.cancel()  # each measure cleans up as it ends

            nursery.start_soon(stop_on_a_signal)
            for strategy in STRATEGIES:
                rows.append(await measure(*strategy))
            nursery.cancel_scope.cancel()
    if received:
        raise Interrupted(received[0])
    return rows


def containment_here() -> str:
    """What containment="auto" picks on this machine."""
    return choose_containment("auto").name


def _shell(command: list[str]) -> str:
    return " ".join(shlex.quote(arg) for arg in command)


def render(rows: list[Row], out: TextIO) -> None:
    width = max(len(row.strategy) for row in rows)
    out.write(f"Command: {_shell(COMMAND)}  ({TREE_SIZE} processes)\n")
    out.write(f"Daemon:  {_shell(WITH_DAEMON)}  ({TREE_SIZE} processes)\n")
    out.write("The awaiting task is cancelled once all of them run.\n")
    out.write(f"trio_proctree contains trees here with: {containment_here()}\n\n")
    out.write(f"{'strategy':<{width}}  survivors  teardown\n")
    out.write(f"{'-' * width}  ---------  --------\n")
    for row in rows:
        out.write(f"{row.strategy:<{width}}  {row.survivors:>9}  {row.teardown * 1000:>6.2f} ms\n")
    out.write(
        f"\nSurvivors were counted {SETTLE:g} s after each teardown returned, then killed:"
        " nothing the demo started is left running.\n"
    )
