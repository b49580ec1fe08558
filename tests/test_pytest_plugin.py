"""The pytest leak check, run on real test files in a real pytest subprocess."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trio_proctree import pytest_plugin
from trio_proctree._orphans import become_subreaper
from trio_proctree._procfs import command_line, read_stat

from . import procs
from .conftest import Tracked, makes_pid_namespaces
from .test_containment import MAIN_THREAD_GOES_ON_A_LINE

pytest_plugins = ["pytester"]


def unique_sleep() -> str:
    return f"60.{uuid.uuid4().int % 10**9}"  # a sleep nobody else runs


#: The start of a test file whose tests leak ``sleep``s: ``exec_done`` waits until the one
#: given runs its own command line, so the report can be checked for it (a process caught
#: between fork and exec still shows its parent's, or none).
LEAKING = """
import asyncio, ctypes, os, subprocess, time, trio

def exec_done(seconds):
    wanted = ("sleep", str(seconds))
    while True:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if tuple(f.read().decode().split("\\0")[:2]) == wanted:
                        return
            except OSError:
                pass
        time.sleep(0.005)
"""

LEAKY_TESTS = """
def test_leaks_a_child():
    subprocess.Popen(["sleep", "{child}"])
    exec_done("{child}")

def test_leaks_a_setsid_escapee():
    subprocess.run(["setsid", "-f", "sleep", "{escapee}"], check=True)
    exec_done("{escapee}")

async def test_leaks_from_trio():
    await trio.lowlevel.open_process(["sh", "-c", "sleep {from_trio} & wait"])
    exec_done("{from_trio}")

def test_leaks_from_asyncio():
    async def main():
        await asyncio.create_subprocess_exec("sleep", "{from_asyncio}")
    asyncio.run(main())
    exec_done("{from_asyncio}")

def test_clean():
    subprocess.run(["sh", "-c", "sleep 0.01 & wait"], check=True)
"""


#: The leaking tests' sleeps, and the tests' names.
LEAKY_SLEEPS = ("child", "escapee", "from_trio", "from_asyncio")
LEAKY_NAMES = ("a_child", "a_setsid_escapee", "from_trio", "from_asyncio")


@pytest.fixture
def leaky(pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)  # the inner run's processes carry it
    sleeps = {name: unique_sleep() for name in LEAKY_SLEEPS}
    pytester.makepyfile(test_leaky=LEAKING + LEAKY_TESTS.format(**sleeps))
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    return sleeps


def check_report(result: pytest.RunResult, sleeps: dict[str, str]) -> None:
    # Each leaking test is itself failed (red before: passed, with an error at teardown).
    result.assert_outcomes(passed=1, failed=4)
    output = result.stdout.str()
    for name, seconds in sleeps.items():
        assert f"sleep {seconds}" in output, name  # named, with its command line
    assert "left 1 process(es) running (killed now)" in output
    failed = {line.split()[1] for line in result.stdout.lines if line.startswith("FAILED ")}
    assert failed == {f"test_leaky.py::test_leaks_{name}" for name in LEAKY_NAMES}


def test_check_process_leaks_option_fails_leaking_tests_and_kills_their_processes(
    pytester: pytest.Pytester, tracked: Tracked, leaky: dict[str, str]
) -> None:
    result = pytester.runpytest_subprocess("--check-process-leaks", "-p", "no:cacheprovider")
    check_report(result, leaky)
    assert tracked.survivors() == []  # all killed by the plugin, the escapee included


def test_check_process_leaks_ini_setting_does_the_same(
    pytester: pytest.Pytester, tracked: Tracked, leaky: dict[str, str]
) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\ncheck_process_leaks = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    check_report(result, leaky)
    assert tracked.survivors() == []


def test_marker_checks_one_test_and_the_check_is_off_by_default(
    pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)
    marked, unmarked = unique_sleep(), unique_sleep()
    pytester.makepyfile(
        f"""
        import ctypes, subprocess, pytest

        def subreaper():
            flag = ctypes.c_int()
            ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
            return flag.value

        def test_unmarked_leak_goes_unnoticed():
            assert subreaper() == 0  # off: not even the subreaper is set
            subprocess.Popen(["sleep", "{unmarked}"])

        @pytest.mark.no_process_leaks
        def test_marked_leak_fails():
            subprocess.Popen(["sleep", "{marked}"])
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert f"sleep {marked}" in result.stdout.str()
    assert f"sleep {unmarked}" not in result.stdout.str()
    leftovers = tracked.survivors()
    assert len(leftovers) == 1  # the unmarked test's sleep, which nobody checked
    assert procs.kill_survivors(tracked.token) == leftovers


def one_leaking_test(leaked: str, *, then: str = "pass") -> str:
    """A test file of one test that leaks ``sleep LEAKED`` and then runs ``then``."""
    return LEAKING + textwrap.dedent(
        f"""
        def test_leaks():
            subprocess.Popen(["sleep", "{leaked}"])
            exec_done("{leaked}")
            {then}
        """
    )


def test_a_test_that_fails_and_leaks_is_one_failure_that_lists_the_leak(
    pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its own failure stays what the report says first; the leak is a section of it.
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)
    leaked = unique_sleep()
    pytester.makepyfile(one_leaking_test(leaked, then='assert 1 == 2, "its own failure"'))
    result = pytester.runpytest_subprocess("--check-process-leaks", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "its own failure" in output
    assert "process leaks" in output
    assert f"sleep {leaked}" in output
    assert tracked.survivors() == []


def test_a_leak_under_another_plugins_protocol_is_an_error_at_the_tests_teardown(
    pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin that runs tests itself (as one that runs them again does) logs each report
    # at once: the leak, known after teardown, still fails the run, as a teardown error.
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)
    leaked = unique_sleep()
    pytester.makeconftest(
        """
        import pytest
        from _pytest.runner import runtestprotocol

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_protocol(item, nextitem):
            item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            runtestprotocol(item, nextitem=nextitem, log=True)
            item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            return True
        """
    )
    pytester.makepyfile(one_leaking_test(leaked))
    result = pytester.runpytest_subprocess("--check-process-leaks", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    assert f"sleep {leaked}" in result.stdout.str()
    assert tracked.survivors() == []


FORKSERVER_POOLS = """
import multiprocessing

def square(n):
    return n * n

def test_a_pool_closed_as_it_should_be():
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        assert pool.map(square, [1, 2, 3]) == [1, 4, 9]

def test_another_pool_after_it():
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        assert pool.map(square, [4]) == [16]
"""


def test_multiprocessings_own_helpers_are_no_leak(
    pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The forkserver (the start method by default on Linux from Python 3.14) and the
    # resource tracker live on, by design, for the rest of the session. Red before: the
    # first test failed for them, they were killed and reaped, and the next pool crashed
    # in the standard library (ChildProcessError).
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)
    pytester.makepyfile(test_pools=FORKSERVER_POOLS)
    result = pytester.runpytest_subprocess("--check-process-leaks", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    # They end with the session, a moment after it (each reads its end off a pipe).
    assert all(procs.wait_exited(pid) for pid in tracked.survivors())
    assert tracked.survivors() == []


KILLS_WITHOUT_WAITING = """
import os, subprocess, sys

def dying(pid):
    # Killed, and still in its exit: PF_EXITING set, not yet a zombie.
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return fields[0] != b"Z" and int(fields[6]) & 0x4

def test_kills_its_process_and_ends():
    # A gigabyte of its own to free makes its exit last tens of ms.
    big = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys; x = b'1' * (1 << 30); print(flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    big.stdout.readline()
    big.kill()  # with no wait(), as many a test's cleanup does
    while not dying(big.pid):
        pass
    print("DYING AT THE END", big.pid)
    DIED.append(big.pid)

DIED = []

def test_what_died_at_the_last_ones_end_was_reaped():
    # Our child: the check that waited for it reaped it too, no zombie left behind.
    [pid] = DIED
    assert not os.path.exists(f"/proc/{pid}")
"""


def test_a_process_still_dying_when_its_test_ends_is_no_leak(pytester: pytest.Pytester) -> None:
    # A process killed at a test's end may still be freeing its memory when the check
    # lists the test's processes: not a zombie yet, so "alive", though it will never run
    # again. Red before: reported as a leak ("[python]"), as a watchdog caught exiting
    # was once in this suite; and then, waited for, it was left a zombie of ours.
    pytester.makepyfile(test_kills=KILLS_WITHOUT_WAITING)
    result = pytester.runpytest_subprocess("--check-process-leaks", "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=2)
    assert "DYING AT THE END" in result.stdout.str()  # caught in its exit, as meant


def test_a_process_without_arguments_is_named_by_its_command_name() -> None:
    # A zombie (or a process caught inside exec) has no arguments to show: reports name
    # it by its command name, as ps does, rather than by an empty string.
    child = subprocess.Popen(["sleep", "0"])
    try:
        while (stat := read_stat(child.pid)) is not None and stat.alive:
            time.sleep(0.005)
        assert command_line(child.pid) == "[sleep]"
    finally:
        child.wait()
    assert command_line(child.pid) == "?"  # reaped: gone


def test_a_running_process_without_arguments_is_named_once_its_wait_is_over() -> None:
    # A live process showing no arguments is given a moment (one caught inside exec
    # shows them within microseconds: the marker test once read a leaked sleep as
    # "[sleep]"); one that never shows any, its argv all empty, is named by its command.
    # (Through ctypes: Python's own exec and posix_spawn refuse an empty argv[0].)
    becomes_cat_without_arguments = (
        "import ctypes; argv = (ctypes.c_char_p * 2)(b'', None); "
        "ctypes.CDLL(None).execv(b'/bin/cat', argv)"
    )
    with procs.killed_on_failure(
        subprocess.Popen(
            [sys.executable, "-c", becomes_cat_without_arguments], stdin=subprocess.PIPE
        )
    ) as child:
        try:
            while read_stat(child.pid) is not None and not command_line(child.pid).startswith(
                "[cat"
            ):
                time.sleep(0.005)  # until its exec is done (no event for that)
            started = time.monotonic()
            assert command_line(child.pid) == "[cat]"
            assert time.monotonic() - started >= 0.01  # (it did wait: it runs)
        finally:
            child.kill()


@makes_pid_namespaces
def test_under_a_proc_of_another_pid_namespace_the_check_refuses_rather_than_guess(
    pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest is pid 1 of its namespace, and /proc/1 the outer init: red before, its
    # children were taken for the run's descendants, so a leak passed, and an outer
    # process started during a test was reported (and killed) as its leak.
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)
    leak = unique_sleep()
    pytester.makepyfile(
        f"""
        import subprocess, pytest

        @pytest.mark.no_process_leaks
        def test_marked_leak():
            subprocess.Popen(["sleep", "{leak}"])

        def test_unmarked():
            pass
        """
    )
    inner = ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "pytest"]
    marked = pytester.run(*inner, "-p", "no:cacheprovider")
    if marked.ret != 0 and "unshare:" in marked.stderr.str():  # pragma: no cover - not root
        pytest.skip(f"cannot make a pid namespace: {marked.stderr.str()!r}")
    marked.assert_outcomes(passed=1, failed=1)
    assert "processes cannot be checked here: /proc shows another pid namespace" in (
        marked.stdout.str()
    )
    everything = pytester.run(*inner, "-p", "no:cacheprovider", "--check-process-leaks")
    assert everything.ret == pytest.ExitCode.USAGE_ERROR
    assert "check_process_leaks: processes cannot be checked here: /proc shows" in (
        everything.stderr.str()
    )
    assert tracked.survivors() == []  # (the namespace's processes die with its first)


def test_a_process_done_with_its_exit_before_the_check_looks_again_is_no_leak(
    tracked: Tracked,
) -> None:
    # The check lists the live descendants, then looks again at each new one, to wait for
    # those caught in their exit. One that ended its exit in between (the watchdog of a
    # tool a test ran, its main thread gone and its last thread ending) is no leak. Red
    # before: reported as one, by its command name alone ("[python]"): CI went red so.
    with procs.killed_on_failure(subprocess.Popen(["sleep", "60"], env=tracked.env)) as ended:
        started = procs.starttime(ended.pid)
        assert procs.wait_exited(ended.pid, kill=True)  # our own child, by its pidfd
        assert pytest_plugin._less_the_dying({(ended.pid, started): "sleep 60"}) == {}
        assert procs.state(ended.pid) is None  # and it was reaped, as ours
    assert tracked.survivors() == []


def test_a_process_reaped_before_the_check_looks_again_is_no_leak(tracked: Tracked) -> None:
    # Listed alive, then exited and reaped (by its own code) before the second look: its
    # pid names nothing any more.
    with procs.killed_on_failure(subprocess.Popen(["sleep", "60"], env=tracked.env)) as ended:
        started = procs.starttime(ended.pid)
        ended.kill()  # our own child, by pid
        ended.wait()
        assert pytest_plugin._less_the_dying({(ended.pid, started): "sleep 60"}) == {}
    assert tracked.survivors() == []


# Once told (a line on stdin), starts a daemon in a session of its own, says its pid, and
# exits: the middle process of a double fork, with the timing under the test's control.
STARTS_A_DAEMON_AND_EXITS = textwrap.dedent(
    """
    import os, sys
    sys.stdin.readline()
    daemon = os.fork()
    if daemon == 0:
        os.setsid()
        os.execvp("sleep", ["sleep", "60"])
    os.write(1, b"%d\\n" % daemon)
    """
)


@contextlib.contextmanager
def a_middle_process(
    tracked: Tracked,
) -> Iterator[tuple[set[tuple[int, int]], subprocess.Popen[bytes], Callable[[], int]]]:
    """The descendants before it, then the middle process of a double fork (a child of
    ours, `STARTS_A_DAEMON_AND_EXITS`), and what has it start the daemon and exit: the
    daemon's pid, once the middle one has ended. This process is made a subreaper first,
    as the check does: the daemon is handed on to us."""
    become_subreaper()
    before = set(pytest_plugin._descendants())
    with procs.killed_on_failure(
        subprocess.Popen(
            [*procs.python(), "-c", STARTS_A_DAEMON_AND_EXITS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
        )
    ) as middle:
        assert middle.stdin is not None and middle.stdout is not None
        stdin, stdout = middle.stdin, middle.stdout

        def hand_on() -> int:
            stdin.write(b"\n")
            stdin.flush()
            daemon = int(stdout.readline())
            assert procs.wait_exited(middle.pid)  # (a zombie: ended)
            return daemon

        yield before, middle, hand_on
        middle.wait()


def test_a_daemon_handed_on_by_a_process_that_ended_after_the_listing_is_a_leak(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Red before (helper-33: 0 to 2 daemons in 30 went unreported, and outlived pytest):
    # the listing read the middle process, not yet the daemon; the middle one had ended by
    # the second look and was dropped, and the daemon with it. Here the middle process
    # starts the daemon and exits right after the listing, and the check must list again.
    with a_middle_process(tracked) as (before, middle, hand_on):
        daemons: list[int] = []
        second_look = pytest_plugin._less_the_dying

        def after_the_listing(
            leaked: dict[tuple[int, int], str], *, within: float | None = None
        ) -> dict[tuple[int, int], str]:
            if not daemons:
                assert [pid for pid, _ in leaked] == [middle.pid]  # the premise
                daemons.append(hand_on())
            return second_look(leaked, within=within)

        monkeypatch.setattr(pytest_plugin, "_less_the_dying", after_the_listing)
        leaked = pytest_plugin._leaked(before, ours=set())
    assert [pid for pid, _ in leaked] == daemons
    assert procs.kill_survivors(tracked.token) == daemons  # (ours, by the test's token)
    assert tracked.survivors() == []


def test_a_daemon_handed_on_between_the_listing_and_the_kill_is_killed_and_reported(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Red before (helper-92: in 15 of 22 sessions of 100 double forks, daemons outlived
    # the session): the listing saw the middle process running, and it started the daemon
    # and exited before the kill, which found it gone and never looked again. The daemon,
    # ours then, was in the next test's "before", so no test was blamed for it, and no
    # check killed it. Here the middle process does so right after the listing.
    with a_middle_process(tracked) as (before, middle, hand_on):
        daemons: list[int] = []
        listing = pytest_plugin._leaked

        def before_the_kill(
            before: set[tuple[int, int]], ours: set[int]
        ) -> dict[tuple[int, int], str]:
            leaked = listing(before, ours)
            if not daemons:
                assert [pid for pid, _ in leaked] == [middle.pid]  # the premise
                daemons.append(hand_on())
            return leaked

        monkeypatch.setattr(pytest_plugin, "_leaked", before_the_kill)
        leaked = pytest_plugin._kill_leaks(before, ours=set())
    try:
        assert sorted(pid for pid, _ in leaked) == sorted([middle.pid, *daemons])
        assert not procs.alive(daemons[0])
    finally:
        procs.kill_survivors(tracked.token)
    assert tracked.survivors() == []


# A supervisor (as gunicorn's master, or supervisord): on a line, starts a worker; then
# replaces each worker that ends, at once (20 at most), and prints each worker's pid.
SUPERVISOR = textwrap.dedent(
    """
    import os, sys

    def start():
        worker = os.fork()
        if worker == 0:
            os.execvp("sleep", ["sleep", "60"])
        os.write(1, b"%d\\n" % worker)

    sys.stdin.readline()
    start()
    for _ in range(20):
        os.wait()
        start()
    """
)


def test_a_worker_a_fixtures_server_starts_in_place_of_a_killed_one_is_left_to_it(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test's leak (a worker its call had the session's server start) is killed; the
    # worker the server starts in its place is the server's, not the test's. Red before
    # (helper-93: 10 workers killed in turn, in 15 runs of 20): the listing after each
    # kill took each replacement for a leak handed on by the killed.
    become_subreaper()  # (as the check does)
    with procs.killed_on_failure(
        subprocess.Popen(
            [*procs.python(), "-c", SUPERVISOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
        )
    ) as server:  # (a session fixture's: started before the test)
        assert server.stdin is not None and server.stdout is not None
        before = set(pytest_plugin._descendants())
        server.stdin.write(b"\n")  # the test has it start a worker
        server.stdin.flush()
        workers = [int(server.stdout.readline())]
        kill = pytest_plugin._kill

        def until_replaced(leaked: list[tuple[int, int]]) -> None:
            kill(leaked)
            if len(workers) == 1:  # (the replacement is running by the next listing)
                workers.append(int(server.stdout.readline()))  # type: ignore[union-attr]

        monkeypatch.setattr(pytest_plugin, "_kill", until_replaced)
        try:
            leaked = pytest_plugin._kill_leaks(before, ours=set())
            assert [pid for pid, _ in leaked] == workers[:1]
            assert procs.alive(workers[1])
        finally:
            server.kill()
            server.wait()
            procs.kill_survivors(tracked.token)
    assert tracked.survivors() == []


@contextlib.contextmanager
def main_thread_gone_running_on(
    tracked: Tracked,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A child Python whose main thread has exited while another thread runs on (/proc
    shows it "in its exit", for good), and its start time; killed on failure."""
    with procs.killed_on_failure(
        subprocess.Popen(
            [*procs.python(), "-c", MAIN_THREAD_GOES_ON_A_LINE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=tracked.env,
        )
    ) as runs_on:
        assert runs_on.stdin is not None and runs_on.stdout is not None
        assert int(runs_on.stdout.readline()) == runs_on.pid
        started = procs.starttime(runs_on.pid)
        runs_on.stdin.write(b"\n")
        runs_on.stdin.flush()
        assert procs.wait_main_thread_gone(runs_on.pid)
        yield runs_on, started


def test_the_check_waits_for_the_dying_once_however_often_it_lists(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process stuck "in its exit" (its main thread gone, another running on) is waited
    # for, up to the bound, then reported. Red before (helper-36): each listing waited
    # the bound again, and a listing that met a process ending meanwhile was made again,
    # so one check waited up to ten times the bound.
    monkeypatch.setattr(pytest_plugin, "_EXIT_WITHIN", 0.3)
    listing = pytest_plugin._descendants

    def with_one_that_ends_meanwhile() -> dict[tuple[int, int], str]:
        ended = subprocess.Popen(["true"], env=tracked.env)  # (listed, then gone)
        assert procs.wait_unreaped(ended.pid, within=5)
        key = (ended.pid, procs.starttime(ended.pid))
        ended.wait()
        return {**listing(), key: "true"}

    before = set(listing())
    with main_thread_gone_running_on(tracked) as (runs_on, _):
        monkeypatch.setattr(pytest_plugin, "_descendants", with_one_that_ends_meanwhile)
        started = time.monotonic()
        leaked = pytest_plugin._leaked(before, ours=set())
        waited = time.monotonic() - started
        runs_on.kill()  # our own child, by pid
    assert [pid for pid, _ in leaked] == [runs_on.pid]
    assert waited < 1.5  # one 0.3 s wait, not one per listing (ten: 3 s)
    assert tracked.survivors() == []


def test_a_process_whose_main_thread_exited_and_runs_on_is_a_leak(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /proc shows it a zombie (its main thread's state) while another thread runs: it is
    # caught "in its exit", waited for, and reported once that wait is over.
    monkeypatch.setattr(pytest_plugin, "_EXIT_WITHIN", 0.2)
    with main_thread_gone_running_on(tracked) as (runs_on, started):
        leaked = {(runs_on.pid, started): "python"}
        assert pytest_plugin._less_the_dying(leaked) == leaked
        runs_on.kill()  # our own child, by pid
    assert tracked.survivors() == []


# Runs `_less_the_dying` with one descriptor left: the pidfd takes it, and reading the
# process's stat fails (EMFILE); prints what it raised and the pidfds still open.
OUT_OF_DESCRIPTORS_AT_THE_SECOND_LOOK = textwrap.dedent(
    """
    import os, resource, subprocess
    from trio_proctree import pytest_plugin

    listed = subprocess.Popen(["sleep", "60"])
    with open(f"/proc/{listed.pid}/stat", "rb") as f:
        data = f.read()
    started = int(data[data.rindex(b")") + 2 :].split()[19])
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        os.close(held.pop())  # one left
    try:
        pytest_plugin._less_the_dying({(listed.pid, started): "sleep 60"})
        print("raised nothing")
    except OSError as exc:
        print("raised", exc.errno)
    for fd in held:
        os.close(fd)
    links = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    print("pidfds left", sum("pidfd" in link for link in links))
    listed.kill()
    listed.wait()
    """
)


def test_out_of_descriptors_at_the_second_look_the_check_leaves_no_pidfd_open(
    tracked: Tracked,
) -> None:
    # Red before (helper-31): the pidfd opened for the second look stayed open.
    output = procs.run_python(OUT_OF_DESCRIPTORS_AT_THE_SECOND_LOOK, env=tracked.env)
    assert output == f"raised {errno.EMFILE}\npidfds left 0\n"
    assert tracked.survivors() == []
