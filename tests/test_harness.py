"""The test suite's own harness: what it adds to pytest so a test's outcome says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trio_proctree import ContainmentUnavailable
from trio_proctree._choose import choose_containment

from . import procs
from .conftest import lock_path, steers_pids
from .mutation.named_mutants import MUTANTS, ROOT, run
from .test_group_and_pid_safety import RECYCLE_TRIES, needs_root, next_pid_after

pytest_plugins = ["pytester"]


def test_a_skip_inside_a_trio_test_keeps_its_reason(pytester: pytest.Pytester) -> None:
    # Red before: pytest-trio 0.8 re-raised a skip from inside trio.run as a bare
    # pytest.skip(), so -rs said "Skipped" at a line of pytest's own, and a pid-reuse test
    # that could not arrange its race was indistinguishable from any other skip.
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest("pytest_plugins = ['tests.skip_reasons']\n")
    pytester.makepyfile(
        test_skipping="""
        import pytest

        async def test_gives_up():
            pytest.skip("could not arrange the race")
        """
    )
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skipping.py:4: could not arrange the race"])


TRIES_THE_LOCK = """
import fcntl, sys
with open(sys.argv[1], "w") as lock:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("held")
    else:
        print("free")
"""


@pytest.mark.parametrize("what", ["pid-allocation", "pid-namespaces"])
def test_a_test_alone_on_the_machine_keeps_other_workers_waiting(
    request: pytest.FixtureRequest, what: str
) -> None:
    # A test that steers pids or makes pid namespaces holds its lock for its length, so
    # another worker's such test waits (red without the flock: the other process got it).
    # (Not pytest-xdist's xdist_group: under pytest 9.2 it is silently ignored.)
    request.getfixturevalue(f"{what.replace('-', '_')}_alone")
    other_worker = subprocess.run(
        [sys.executable, "-c", TRIES_THE_LOCK, lock_path(what)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert other_worker.stdout == "held\n"


@steers_pids
@needs_root
def test_a_remembered_pid_that_went_to_another_process_is_not_alive() -> None:
    # The pid of a process a test was told of may, once it ended, go to a new process of
    # anyone's: `procs.alive` must not say the test's process lives on (red without the
    # identity check: the successor made it "alive"; red with the start time alone, as
    # both are born within one clock tick).
    for _ in range(RECYCLE_TRIES):  # another process on the machine may take the pid first
        first = subprocess.Popen(["sleep", "60"])
        procs.remember(first.pid)
        first.kill()
        first.wait()
        with next_pid_after(first.pid - 1):
            successor = subprocess.Popen(["sleep", "60"])
        if successor.pid == first.pid:
            break
        successor.kill()
        successor.wait()
    else:  # pragma: no cover
        pytest.skip("another process took the pid first, every time")
    try:
        if procs.starttime(successor.pid) == procs.BORN[first.pid][0] and not pidfds_unique():
            pytest.skip("born within one clock tick, and pidfds do not tell processes apart")
        assert procs.state(successor.pid) in ("R", "S")
        assert not procs.alive(first.pid)
    finally:
        successor.kill()
        successor.wait()


def test_a_shell_is_reading_only_once_it_sleeps_in_read() -> None:
    # Tests that signal a shell in its `read` builtin wait for this, so its trap cannot miss
    # the signal; a process that sleeps elsewhere (in nanosleep) is not reading.
    script = "echo $$; read x"
    with (
        subprocess.Popen(
            ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as reading,
        subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE) as waiting,
    ):
        try:
            assert reading.stdout is not None
            assert int(reading.stdout.readline()) == reading.pid
            assert procs.wait_reading(reading.pid)
            assert procs.state(waiting.pid) in ("R", "S")
            assert not procs.wait_reading(waiting.pid, within=0.2)
        finally:
            reading.kill()
            waiting.kill()
    assert not procs.wait_reading(reading.pid)  # gone: reaped by the `with`


# Ends its main thread (exit(2) of that thread alone) while another thread sleeps on;
# says its pid once that thread runs.
MAIN_THREAD_ENDS_FIRST = (
    "import ctypes, os, threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,)).start()\n"
    "print(os.getpid(), flush=True)\n"
    "libc = ctypes.CDLL(None)\n"
    "libc.syscall.argtypes = [ctypes.c_long, ctypes.c_long]\n"
    "libc.syscall({'x86_64': 60, 'aarch64': 93}[os.uname().machine], 0)\n"  # SYS_exit
)


def test_a_survivor_whose_main_thread_ended_is_still_found_by_its_token() -> None:
    # Its /proc/PID/environ then fails (ESRCH) and only its thread's entry shows the
    # environment. Red before: the faster scan took the failed read for a process gone.
    if os.uname().machine not in ("x86_64", "aarch64"):  # pragma: no cover
        pytest.skip("the exit system call's number is known here for x86_64 and aarch64")
    token = procs.new_token()
    with subprocess.Popen(
        [sys.executable, "-c", MAIN_THREAD_ENDS_FIRST],
        stdout=subprocess.PIPE,
        env={**os.environ, procs.TOKEN_VAR: token},
    ) as survivor:
        try:
            assert survivor.stdout is not None
            pid = int(survivor.stdout.readline())
            deadline = time.monotonic() + 5
            while procs.state(pid) != "Z" and time.monotonic() < deadline:
                time.sleep(0.001)  # (its main thread's end: no event to wait on)
            assert procs.state(pid) == "Z"  # (the main thread, as /proc/PID/stat shows)
            assert procs.survivors(token) == [pid]
        finally:
            survivor.kill()
    assert procs.survivors(token) == []


def pidfds_unique() -> bool:
    """Whether a pidfd's inode names its process (Linux 6.9+: pidfs); before, every
    pidfd has the same one."""
    with subprocess.Popen(["sleep", "60"]) as one, subprocess.Popen(["sleep", "60"]) as two:
        try:
            return procs.identity(one.pid)[1] != procs.identity(two.pid)[1]
        finally:
            one.kill()
            two.kill()


def test_every_named_mutant_still_applies_to_exactly_one_place() -> None:
    # Red before: seven named mutants' original text had gone from the code it mutates
    # (changed since), two more matched two places; the mutation run stops at the first
    # stale one, so the rest went unrun, and nothing else in the suite said so.
    assert len(MUTANTS) > 100
    places = {
        name: (ROOT / "trio_proctree" / path).read_text().count(original)
        for name, path, original, _mutated, _tests in MUTANTS
    }
    assert {name: count for name, count in places.items() if count != 1} == {}


def test_a_named_mutant_that_changes_nothing_survives() -> None:
    # The runner's verdict must come from the mutant's tests. Red before: its copy of the
    # project lacked README.md, test_readme.py failed to collect, and with -x that error
    # ended every run red before a test ran: every mutant, this one too, was "killed".
    unchanged = "import errno, fcntl, os, queue,"
    survived = not run("nothing", "_watchdog.py", unchanged, unchanged, "package_has_a_version")
    assert survived


def test_every_named_mutant_has_its_row_in_the_testing_docs() -> None:
    # The table in docs/testing.rst is where a reader finds what the suite is known to
    # catch: ten mutants had been added without a row (found in stop 36).
    shown = (ROOT / "docs" / "testing.rst").read_text().replace("``", "")
    rows = {name.replace("[glibc]", "(under glibc 2.41)") for name, *_ in MUTANTS}
    assert len(rows) == len(MUTANTS)  # (names are unique)
    assert sorted(row for row in rows if f"\n{row} " not in shown) == []


def test_every_named_mutant_is_code_that_compiles() -> None:
    # A mutant that is no longer valid Python (an indent that no longer matches the code
    # it replaces) fails every test at import: "killed", and proving nothing.
    broken = {}
    for name, path, original, mutated, _tests in MUTANTS:
        source = (ROOT / "trio_proctree" / path).read_text().replace(original, mutated, 1)
        try:
            compile(source, path, "exec")
        except SyntaxError as exc:
            broken[name] = str(exc)
    assert len(MUTANTS) > 100
    assert broken == {}


LEAVES_ITS_TREE_TO_THE_NET = """
import os, signal
import pytest
from trio_proctree import CleanupError, Escalation, open_process_tree

async def test_a_cleanup_that_failed():
    def failing_hard_stop():
        raise OSError("injected")

    with pytest.raises(CleanupError):
        async with open_process_tree(
            ["sh", "-c", "trap '' TERM; sleep 60 & echo ready; wait"],
            escalation=Escalation(steps=[(signal.SIGTERM, 0.1)], kill_wait=0.1),
            stdout=-1,
            containment="group",
        ) as tree:
            # (Once the trap is set: SIGTERMed before, the shell stopped, and no cleanup
            # failed, 1 run in ~10 on a loaded machine.)
            assert await tree.stdout.receive_some() == b"ready\\n"
            tree._core.containment.kill = failing_hard_stop
    del tree._core.containment.kill
    os.killpg(tree.pid, signal.SIGKILL)  # (its leader, unreaped, pins the group)
    os.waitid(os.P_PID, tree.pid, os.WEXITED | os.WNOWAIT)  # a zombie as the test ends
"""


def test_the_leader_of_a_tree_left_to_the_net_at_exit_is_not_reaped_after_its_test(
    pytester: pytest.Pytester,
) -> None:
    # Red before: the harness reaped every zombie child a test left, this one too, and
    # the net at interpreter exit said "pid N was reaped by someone else" (six times at
    # the end of each full run, from the tests that make a cleanup fail).
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest("from tests.conftest import pytest_runtest_protocol  # noqa: F401\n")
    pytester.makepyfile(test_left_open=LEAVES_ITS_TREE_TO_THE_NET)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    said = result.stderr.str()
    assert result.ret == 0, (result.stdout.str(), said)
    assert "reaped by someone else" not in said, said
    assert "processes outlived cleanup" not in said, said


def test_a_cgroup_a_gone_test_process_left_is_removed_by_the_next() -> None:
    # A run cut short (a timeout's SIGKILL) runs no teardown: its cgroups stayed for good.
    # The next test cgroup made removes those of gone processes, emptied; never a live one's.
    try:
        choose_containment("cgroup")
    except ContainmentUnavailable as exc:  # pragma: no cover - on machines without cgroups
        pytest.skip(str(exc))
    gone = subprocess.Popen(["sleep", "60"])
    started = procs.starttime(gone.pid)
    gone.kill()
    gone.wait()
    parent = os.path.dirname(procs.cgroup_path_for_a_test("probe"))
    left = os.path.join(parent, f"tests-{gone.pid}-{started}-left-{procs.new_token()}")
    live = procs.cgroup_path_for_a_test(f"live-{procs.new_token()}")
    os.makedirs(os.path.join(left, "inside"))
    os.mkdir(live)
    try:
        made = procs.cgroup_path_for_a_test("another")
        assert not os.path.exists(left)
        assert os.path.isdir(live)
        assert not os.path.exists(made)  # (a path: the test makes it)
    finally:
        procs.remove_emptied(left)
        procs.remove_emptied(live)


def test_a_process_left_in_a_tests_cgroup_fails_it_named_and_is_killed() -> None:
    # Before: the rmdir's bare EBUSY, naming nothing, and what was left ran on.
    try:
        choose_containment("cgroup")
    except ContainmentUnavailable as exc:  # pragma: no cover - on machines without cgroups
        pytest.skip(str(exc))
    marker = f"60.{time.time_ns() % 10**9}"  # a sleep nobody else runs
    said = rf": still populated 0.5 s after its test: \['{{}}: sleep {marker}'\]"
    with subprocess.Popen(["sleep", marker]) as left:
        try:
            with pytest.raises(AssertionError, match=said.format(left.pid)):  # noqa: SIM117
                with procs.cgroup_in_ours("left-running", emptied_within=0.5) as cgroup:
                    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                        f.write(str(left.pid))
            assert left.wait(timeout=5) == -signal.SIGKILL  # (killed by the harness)
            assert not os.path.exists(cgroup)
        finally:
            left.kill()
