"""The test suite's own harness: what it adds to pytest so a test's outcome says why."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import lock_path

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
