"""A pytest plugin that reports tests which leave processes running (off by default).

Turn it on for a whole run with ``--check-process-leaks`` or ``check_process_leaks = true``
in the ini file, or for one test with ``@pytest.mark.no_process_leaks``. After each checked
test's teardown, every process the test started that is still alive (its call phase,
against a snapshot taken just before it) fails the test, named by pid and command line in
its report (a section "process leaks" of the report of a test that failed anyway), and is
killed, so the next test starts clean. (One still in its exit, killed at the test's
end, say, is waited for instead: it never runs again.) Processes started by fixtures' setup are
not counted, so a session-wide server started on first use is not taken for a leak; nor are
multiprocessing's forkserver and resource tracker, kept for the session by design.

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
import sys
import time
from collections.abc import Generator

import pytest

from . import _watchdog
from ._orphans import become_subreaper, children, descendants
from ._pidfd import exited, open_pidfd, pin_process, signal_pidfd
from ._procfs import command_line, foreign_proc, on_one_line, read_stat
from ._spawn import boot_ticks

_SNAPSHOT = pytest.StashKey[set[tuple[int, int]]]()
#: The test's reports are held until its teardown is done (`pytest_runtest_protocol`).
_HELD = pytest.StashKey[bool]()
#: What a test whose reports are held left running, for its call's report.
_LEAKS = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trio_proctree")
    group.addoption(
        "--check-process-leaks",
        action="store_true",
        default=False,
        help="report an error for tests that leave processes running (and kill those processes)",
    )
    parser.addini(
        "check_process_leaks",
        type="bool",
        default=False,
        help="report an error for tests that leave processes running (and kill those processes)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_process_leaks: an error for this test if it leaves a process running (trio_proctree)",
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if not _checked(item):
        return None
    # A leak is known only once the fixtures' teardown has run (one may stop what the test
    # started), and pytest reports the call before that: the reports are held until then,
    # so that the test itself is reported failed, not passed with an error at teardown
    # (as it was: a count of failures missed it). (Where another plugin runs the test's
    # protocol instead, the leak is an error at its teardown, as before.)
    from _pytest.runner import runtestprotocol  # noqa: PLC0415 - (as pytest's own plugins)

    item.stash[_HELD] = True
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    if (leaks := item.stash.get(_LEAKS, None)) is not None:
        _fail_with(reports, leaks)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _fail_with(reports: list[pytest.TestReport], leaks: str) -> None:
    """Fail the test in its call's report: said there, or added to what it says where
    the test failed on its own."""
    call = next(report for report in reports if report.when == "call")
    if call.failed:
        call.sections.append(("process leaks", leaks))
        return
    call.outcome = "failed"
    call.longrepr = leaks
    with contextlib.suppress(AttributeError):
        del call.wasxfail  # (an expected failure that leaked is no longer expected)


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
    ours = {watchdog.pid for watchdog in _watchdog.running()} | _session_helpers()
    leaked = _kill_leaks(before, ours)
    if leaked:
        listing = "\n".join(
            f"  pid {pid}: {on_one_line(command)}" for (pid, _), command in sorted(leaked.items())
        )
        leaks = f"{item.nodeid} left {len(leaked)} process(es) running (killed now):\n{listing}"
        if item.stash.get(_HELD, False):
            item.stash[_LEAKS] = leaks
        else:
            pytest.fail(leaks, pytrace=False)
    return result


#: How many times the check lists the descendants, at most, while processes it listed end
#: before it is done with them.
_LISTINGS = 10


def _leaked(before: set[tuple[int, int]], ours: set[int]) -> dict[tuple[int, int], str]:
    """The live descendants not in ``before`` nor ``ours`` (pids), less the dying.

    A process that ended after the listing read it may have handed on to us a child the
    listing missed: read before its parent's exit, our children did not hold it yet, and
    read after, its parent's did not any more (the middle process of a double fork, gone
    an instant after the daemon's fork). Dropped as ended, it took that daemon out of the
    report, and the daemon outlived the session. So the listing is made again, until one
    lists no process that ends before the check is done with it.
    """
    leaked: dict[tuple[int, int], str] = {}
    # One wait for the dying in all: each listing waiting its own, a process stuck in its
    # exit made the check wait that long again at every listing (helper-36).
    deadline = time.monotonic() + _EXIT_WITHIN
    for _ in range(_LISTINGS):
        listed = {
            key: command
            for key, command in _descendants().items()
            if key not in before and key[0] not in ours
        }
        within = max(deadline - time.monotonic(), 0.0)
        leaked = _less_the_dying(listed, within=within) if listed else {}
        if leaked.keys() == listed.keys():
            break  # every process listed still runs: nothing was handed on meanwhile
    return leaked


def _kill_leaks(before: set[tuple[int, int]], ours: set[int]) -> dict[tuple[int, int], str]:
    """The leaks (`_leaked`), killed; listed again after each kill, until one lists none
    handed on by the killed.

    A process the listing saw running may hand a child on to us before its kill (the
    middle process of a double fork, forking the daemon and exiting in that instant).
    Killed once, the daemon outlived the check, then the session: ours from then on, it
    was in the next test's "before", so no test was blamed for it (helper-92: 15 sessions
    in 22 of 100 double forks). A clean test lists once, as before.
    """
    leaked: dict[tuple[int, int], str] = {}
    killed_at: int | None = None
    for _ in range(_LISTINGS):
        new = _leaked(before | leaked.keys(), ours)
        if killed_at is not None:
            # Only what the killed handed on: ours now, and started before their kill. Not
            # what others start meanwhile: a session fixture's server replaces the worker
            # killed here at once, and each replacement was taken for a leak and killed
            # in turn, ten times over (helper-93).
            new = {key: command for key, command in new.items() if _handed_on(key, killed_at)}
        if not new:
            break
        _kill(sorted(new))
        killed_at = boot_ticks()
        leaked |= new
    return leaked


def _handed_on(key: tuple[int, int], killed_at: int) -> bool:
    """Whether the process (pid, start time) was handed on to us by a process killed at
    ``killed_at`` (clock ticks after boot): our child by now, and started before that."""
    pid, started = key
    stat = read_stat(pid)
    return stat is not None and stat.starttime == started <= killed_at and stat.ppid == os.getpid()


def _session_helpers() -> set[int]:
    """The processes the standard library starts on first use and keeps, by design, for
    the rest of the session: multiprocessing's forkserver (the start method by default on
    Linux from Python 3.14) and its resource tracker. Taken for leaks, they were killed
    and reaped, and the next pool crashed in the standard library."""
    found = [
        getattr(getattr(sys.modules.get(module), instance, None), pid, None)
        for module, instance, pid in (
            ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
            ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
        )
    ]
    return {pid for pid in found if isinstance(pid, int)}


#: How long a process caught dying, or killed here, is given to finish its exit.
_EXIT_WITHIN = 5.0


def _less_the_dying(
    leaked: dict[tuple[int, int], str], *, within: float | None = None
) -> dict[tuple[int, int], str]:
    """``leaked`` without the processes that were only dying.

    A process killed as its test ended may still be in its exit when the listing runs
    (freeing its memory: tens of ms for a gigabyte). Not a zombie yet, it reads as alive,
    though it never runs again: reported, it would fail a test that leaked nothing. Each
    one caught in its exit is waited for, up to `_EXIT_WITHIN`; one still there then is
    reported after all (only its main thread may have exited, the rest running on). One
    that has ended its exit since the listing is no leak either (the watchdog of a tool a
    test ran, say: its owner gone, it finishes its work and exits as the check runs).
    ``within``: how long to wait for the dying (default `_EXIT_WITHIN`).
    """
    started = dict(leaked.keys())  # pid -> start time
    dying: dict[int, int] = {}
    running: set[int] = set()
    try:
        for pid, start in started.items():
            if (fd := open_pidfd(pid)) is None:
                continue  # ended since the listing, and reaped
            try:
                stat = read_stat(pid)  # (read once the pidfd pins the process it names)
            except BaseException:  # out of file descriptors for the read, say
                os.close(fd)
                raise
            if stat is None or stat.starttime != start or exited(fd):
                # Ended since the listing: its pid free, taken anew, or its zombie's.
                if stat is not None and stat.starttime == start:
                    _reap_if_ours(fd)
                os.close(fd)
            elif stat.exiting:
                dying[pid] = fd
            else:
                os.close(fd)
                running.add(pid)
        ended = _wait_exited(list(dying.values()), _EXIT_WITHIN if within is None else within)
        for fd in ended:
            _reap_if_ours(fd)
        return {
            key: command
            for key, command in leaked.items()
            if key[0] in running or (key[0] in dying and dying[key[0]] not in ended)
        }
    finally:
        for fd in dying.values():
            os.close(fd)


def _reap_if_ours(pidfd: int) -> None:
    """Reap an exited process if it is our child (a test's, or re-parented to us): no
    zombie left behind."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)


def _wait_exited(pidfds: list[int], within: float) -> set[int]:
    """Those of ``pidfds`` whose processes exited within ``within`` seconds (all, or
    fewer once that time is up): each turns readable at its exit."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    exited: set[int] = set()
    deadline = time.monotonic() + within
    while len(exited) < len(pidfds) and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            exited.add(fd)
            poller.unregister(fd)
    return exited


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
    _wait_exited(list(pidfds.values()), _EXIT_WITHIN)
    for fd in pidfds.values():
        _reap_if_ours(fd)
        os.close(fd)
