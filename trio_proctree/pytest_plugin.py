"""A pytest plugin that fails tests which leave processes running (off by default).

Turn it on for a whole run with ``--check-process-leaks`` or ``check_process_leaks = true``
in the ini file, or for one test with ``@pytest.mark.no_process_leaks``. After each checked
test's teardown, every process the test started that is still alive (its call phase,
against a snapshot taken just before it) fails the test, naming pids and command lines,
and is killed, so the next test starts clean. Processes started by fixtures' setup are
not counted, so a session-wide server started on first use is not taken for a leak.

To see re-parented grandchildren and ``setsid`` escapees, the pytest process becomes their
child subreaper when checking starts: orphans then re-parent to it, not to init, and stay
among its descendants. Sync, trio and asyncio tests alike: only processes are looked at.
When off, the hooks return at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Generator

import pytest

from . import _watchdog
from ._containment import pin_process, signal_pidfd
from ._orphans import become_subreaper, children, descendants
from ._procfs import command_line, foreign_proc

_SNAPSHOT = pytest.StashKey[set[tuple[int, int]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trio_proctree")
    group.addoption(
        "--check-process-leaks",
        action="store_true",
        default=False,
        help="fail tests that leave processes running (and kill those processes)",
    )
    parser.addini(
        "check_process_leaks",
        type="bool",
        default=False,
        help="fail tests that leave processes running (and kill those processes)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_process_leaks: fail this test if it leaves a process running (trio_proctree)",
    )
    if _checking_everything(config):
        # Under a /proc of another pid namespace, this process's descendants would be read
        # from strangers' entries: leaks would pass, and other processes be reported (and
        # killed). Said before any test runs; a marked test fails with it (below).
        if (foreign := foreign_proc()) is not None:
            raise pytest.UsageError(
                f"check_process_leaks: processes cannot be checked here: {foreign}"
            )
        become_subreaper()


def _checking_everything(config: pytest.Config) -> bool:
    return bool(config.getoption("check_process_leaks") or config.getini("check_process_leaks"))


def _checked(item: pytest.Item) -> bool:
    return (
        _checking_everything(item.config) or item.get_closest_marker("no_process_leaks") is not None
    )


def _descendants() -> dict[tuple[int, int], str]:
    """Every live descendant of this process: (pid, start time) -> command line."""
    return {
        (stat.pid, stat.starttime): command_line(stat.pid)
        for stat in descendants(children(os.getpid()))
        if stat.alive
    }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    if _checked(item):
        if (foreign := foreign_proc()) is not None:
            pytest.fail(f"processes cannot be checked here: {foreign}", pytrace=False)
        become_subreaper()
        item.stash[_SNAPSHOT] = set(_descendants())
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    result = yield
    before = item.stash.get(_SNAPSHOT, None)
    if before is None:
        return result
    ours = {watchdog.pid for watchdog in _watchdog.running()}
    leaked = {
        key: command
        for key, command in _descendants().items()
        if key not in before and key[0] not in ours
    }
    if leaked:
        _kill(sorted(leaked))
        listing = "\n".join(
            f"  pid {pid}: {command}" for (pid, _), command in sorted(leaked.items())
        )
        pytest.fail(
            f"{item.nodeid} left {len(leaked)} process(es) running (killed now):\n{listing}",
            pytrace=False,
        )
    return result


def _kill(leaked: list[tuple[int, int]]) -> None:
    """SIGKILL each (pid, start time), wait, and reap the ones re-parented to us.

    Through pidfds, checked after opening against the start time the listing saw: a pid
    recycled since the listing is never hit.
    """
    started = dict(leaked)
    pidfds: dict[int, int] = {}
    for pid in started:
        pinned = pin_process(pid, lambda stat: stat.starttime == started[stat.pid])
        if pinned is not None:
            pidfds[pid] = pinned[0]
            signal_pidfd(pinned[0], signal.SIGKILL)
    poller = select.poll()
    for fd in pidfds.values():
        poller.register(fd, select.POLLIN)
    waiting = set(pidfds.values())
    deadline = time.monotonic() + 5
    while waiting and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            waiting.discard(fd)
            poller.unregister(fd)
    for fd in pidfds.values():
        with contextlib.suppress(ChildProcessError):  # ours to reap only if our child
            os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        os.close(fd)
