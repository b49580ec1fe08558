"""The pytest leak check, run on real test files in a real pytest subprocess."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from . import procs
from .conftest import Tracked

pytest_plugins = ["pytester"]


def unique_sleep() -> str:
    return f"60.{uuid.uuid4().int % 10**9}"  # a sleep nobody else runs


LEAKY_TESTS = """
import asyncio, ctypes, subprocess, trio

def test_leaks_a_child():
    subprocess.Popen(["sleep", "{child}"])

def test_leaks_a_setsid_escapee():
    subprocess.run(["setsid", "-f", "sleep", "{escapee}"], check=True)

async def test_leaks_from_trio():
    await trio.lowlevel.open_process(["sh", "-c", "sleep {from_trio} & wait"])

def test_leaks_from_asyncio():
    async def main():
        await asyncio.create_subprocess_exec("sleep", "{from_asyncio}")
    asyncio.run(main())

def test_clean():
    subprocess.run(["sh", "-c", "sleep 0.01 & wait"], check=True)
"""


@pytest.fixture
def leaky(pytester: pytest.Pytester, tracked: Tracked, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(procs.TOKEN_VAR, tracked.token)  # the inner run's processes carry it
    sleeps = {name: unique_sleep() for name in ("child", "escapee", "from_trio", "from_asyncio")}
    pytester.makepyfile(test_leaky=LEAKY_TESTS.format(**sleeps))
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    return sleeps


def check_report(result: pytest.RunResult, sleeps: dict[str, str]) -> None:
    result.assert_outcomes(passed=5, errors=4)
    output = result.stdout.str()
    for name, seconds in sleeps.items():
        assert f"sleep {seconds}" in output, name  # named, with its command line
    assert "left 1 process(es) running (killed now)" in output
    assert "test_clean" not in "".join(line for line in result.stdout.lines if "ERROR" in line)


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
    result.assert_outcomes(passed=2, errors=1)
    assert f"sleep {marked}" in result.stdout.str()
    assert f"sleep {unmarked}" not in result.stdout.str()
    leftovers = tracked.survivors()
    assert len(leftovers) == 1  # the unmarked test's sleep, which nobody checked
    assert procs.kill_survivors(tracked.token) == leftovers
