"""The ``trio-proctree`` command, run as a user would: a real subprocess."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from .conftest import Tracked, makes_pid_namespaces


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_proctree", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_demo_shows_what_each_strategy_leaves_and_leaves_nothing(tracked: Tracked) -> None:
    result = run_cli("demo", env=tracked.env)
    assert result.returncode == 0, result.stderr
    survivors = {
        m.group("strategy").strip(): int(m.group("count"))
        for m in re.finditer(
            r"^(?P<strategy>.+?)\s+(?P<count>\d+)\s+[\d.]+ ms$", result.stdout, re.M
        )
    }
    assert survivors == {
        "no cleanup (cancel the awaiting task)": 3,
        "kill the leader (asyncio-style proc.kill())": 2,
        "trio.run_process, default cancel": 2,
        "new session + os.killpg": 0,
        "trio_proctree.open_process_tree": 0,
        "with a setsid daemon: new session + os.killpg": 1,
        "with a setsid daemon: trio_proctree": 0,
    }
    assert re.search(r"contains trees here with: (cgroup|subreaper|group)", result.stdout)
    # Everything the demo started carried our token: none of it may still run.
    assert tracked.survivors() == []


def test_help_explains_every_command(tracked: Tracked) -> None:
    top = run_cli("--help", env=tracked.env)
    assert top.returncode == 0
    assert "demo" in top.stdout
    demo = run_cli("demo", "--help", env=tracked.env)
    assert demo.returncode == 0
    assert "survived" in demo.stdout


def test_unknown_command_is_a_usage_error(tracked: Tracked) -> None:
    result = run_cli("frobnicate", env=tracked.env)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@makes_pid_namespaces
def test_under_a_proc_of_another_pid_namespace_the_demo_and_orphans_refuse(
    tracked: Tracked,
) -> None:
    # Their counts and listings would be of the outer namespace's processes: no demo
    # (which would start its uncontained trees first), no list of strangers' pids.
    if shutil.which("unshare") is None:  # pragma: no cover - util-linux is everywhere
        pytest.skip("needs unshare(1)")
    for command in ("demo", "orphans"):
        result = subprocess.run(
            ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "trio_proctree",
             command],
            capture_output=True, text=True, env=tracked.env, timeout=60, check=False,
        )  # fmt: skip
        if result.stderr.startswith("unshare:"):  # pragma: no cover - not root
            pytest.skip(f"cannot make a pid namespace: {result.stderr!r}")
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert result.stdout == ""
        assert "/proc shows another pid namespace" in result.stderr
    assert tracked.survivors() == []
