"""The ``trio-proctree`` command, run as a user would: a real subprocess."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from trio_proctree import _demo

from . import procs
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


def test_the_demo_counts_a_daemon_tree_running_only_once_its_daemon_left_the_group(
    tracked: Tracked,
) -> None:
    # Three processes of the daemon's tree may run before its setsid(): killpg then got
    # the daemon too, and the demo said killpg leaves nothing of such a tree (seen in CI;
    # 8 of 200 trees under load were counted running that early). Red before: three
    # members were enough, with none of them out of the group.
    run = _demo._Run(_demo.WITH_DAEMON)
    run.env.update(tracked.env)

    def sleeping() -> list[int]:  # the tree's members once both sleeps have exec'd
        members = run.members()
        sleeps = [pid for pid in members if procs.command_name(pid) == "sleep"]
        return members if len(members) == _demo.TREE_SIZE and len(sleeps) == 2 else []

    three_in_the_group = ["sh", "-c", "sleep 60 & sleep 61 & wait"]
    with procs.killed_on_failure(subprocess.Popen(three_in_the_group, env=run.env)) as tree:
        try:
            deadline = time.monotonic() + 5
            # (Nothing tells of an exec: looked at until both show.)
            while not (members := sleeping()) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert len(members) == _demo.TREE_SIZE  # (nothing execs any more: stable)
            assert not run.ready()
        finally:
            members = run.members()
            for pid in members:
                procs.kill_ours(pid, tracked.token)
            for pid in members:
                procs.wait_exited(pid)  # (a SIGKILL just sent may not have landed yet)
            tree.wait()
    assert tracked.survivors() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_an_interrupted_demo_leaves_nothing_running(tracked: Tracked, sig: int) -> None:
    # Its first strategies leave trees running on purpose, until it kills them. Red
    # before: SIGTERM or SIGHUP ended the demo at once, and those trees ran on (their
    # sleeps for a minute); a Ctrl-C could land in its clean-up and cut it short.
    with procs.killed_on_failure(subprocess.Popen(
        [sys.executable, "-m", "trio_proctree", "demo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tracked.env,
    )) as demo:  # fmt: skip
        deadline = time.monotonic() + 10
        # Until a strategy's tree runs (the demo says nothing before its table).
        while time.monotonic() < deadline and not any(
            procs.command_name(pid) == "sleep" for pid in tracked.survivors()
        ):
            time.sleep(0.005)
        demo.send_signal(sig)  # our own child, by pid
        _, said = demo.communicate(timeout=30)
    # Ended by the signal, not an exit of 128+N: a shell loop that ran the demo stops at
    # a Ctrl-C only when its command died of SIGINT (bash's wait-for-child-exit rule).
    assert demo.returncode == -sig, said
    assert "demo interrupted; nothing it started still runs" in said
    assert tracked.survivors() == []


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full", "a reader that left"])
def test_an_interrupted_demo_that_cannot_say_so_still_ends_by_the_signal(
    tracked: Tracked, cli_env: dict[str, str], stderr: str
) -> None:
    # Red before: its "demo interrupted" was a bare write to stderr, which raised (full:
    # OSError; closed: None, AttributeError), and the demo exited 1 instead of ending by
    # the Ctrl-C, a status a shell loop running it does not stop on. And to a reader that
    # left (`demo 2>&1 | head`, the Ctrl-C ending head too), 141: the signal wins.
    with procs.pipe_whose_reader_left() as write_end:
        if stderr == "a reader that left":
            command, errors = [sys.executable, "-m", "trio_proctree", "demo"], write_end
        else:
            command = ["sh", "-c", f'exec "$@" {stderr}', "sh", sys.executable, "-m"]
            command, errors = [*command, "trio_proctree", "demo"], subprocess.PIPE
        with procs.killed_on_failure(subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, env=cli_env,
        )) as demo:  # fmt: skip
            deadline = time.monotonic() + 10
            # Until a strategy's tree runs: its signal receiver is in place by then.
            while time.monotonic() < deadline and not any(
                procs.command_name(pid) == "sleep" for pid in tracked.survivors()
            ):
                time.sleep(0.005)
            demo.send_signal(signal.SIGINT)  # our own child (the shell exec'd it), by pid
            said = demo.communicate(timeout=30)
    assert (demo.returncode, said[0], said[1] or b"") == (-signal.SIGINT, b"", b"")
    assert tracked.survivors() == []


def test_a_demo_whose_reader_left_ends_as_by_sigpipe_and_leaves_nothing(
    tracked: Tracked, cli_env: dict[str, str]
) -> None:
    # Red before (helper-61: `trio-proctree demo | head -1`): a BrokenPipeError traceback.
    # And with its output buffered (no PYTHONUNBUFFERED), the write failed only in
    # Python's flush at exit: "Exception ignored", status 120.
    with procs.pipe_whose_reader_left() as write_end:  # (gone before the first line)
        demo = subprocess.run(
            [sys.executable, "-m", "trio_proctree", "demo"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=cli_env,
            timeout=60, check=False,
        )  # fmt: skip
    assert (demo.returncode, demo.stderr) == (128 + signal.SIGPIPE, "")
    assert tracked.survivors() == []


def test_a_demo_that_cannot_write_its_report_fails_saying_so_and_leaves_nothing(
    tracked: Tracked, cli_env: dict[str, str]
) -> None:
    # Red before (helper-111): into a full disk, buffered, status 0 and nothing said.
    with open("/dev/full", "wb") as full:
        demo = subprocess.run(
            [sys.executable, "-m", "trio_proctree", "demo"],
            stdout=full, stderr=subprocess.PIPE, text=True, env=cli_env, timeout=60,
            check=False,
        )  # fmt: skip
    said = "trio-proctree: could not write its report: No space left on device\n"
    assert (demo.returncode, demo.stderr) == (2, said)
    assert tracked.survivors() == []


@pytest.mark.parametrize("asked", [["--help"], ["run", "--help"], ["--version"]])
def test_help_to_a_reader_that_left_ends_as_by_sigpipe(
    cli_env: dict[str, str], asked: list[str]
) -> None:
    # Red before: argparse (3.11 on) drops its own write errors, so unbuffered the tool
    # exited 0, buffered 141 (the flush was ours); on 3.10 a traceback, status 1.
    with procs.pipe_whose_reader_left() as write_end:
        result = subprocess.run(
            [sys.executable, "-m", "trio_proctree", *asked],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=cli_env,
            timeout=60, check=False,
        )  # fmt: skip
    assert (result.returncode, result.stderr) == (128 + signal.SIGPIPE, "")


@pytest.mark.parametrize("asked", [["--help"], ["--version"]])
@pytest.mark.parametrize(
    ("stdout", "why"),
    [(">/dev/full", "No space left on device"), (">&-", "stdout is closed")],
)
def test_help_that_cannot_be_written_fails_saying_so(
    cli_env: dict[str, str], asked: list[str], stdout: str, why: str
) -> None:
    # Red before: into a full disk, status 0 with nothing said (argparse dropped the
    # error), where the tool's other reports exit 2 and say why; with stdout closed, the
    # version went to stderr instead.
    result = subprocess.run(
        ["sh", "-c", f'"$@" {stdout}', "sh", sys.executable, "-m", "trio_proctree", *asked],
        capture_output=True, text=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    said = f"trio-proctree: could not write its report: {why}\n"
    assert (result.returncode, result.stdout, result.stderr) == (2, "", said)


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"])
def test_a_usage_error_that_cannot_be_said_still_exits_2(
    cli_env: dict[str, str], stderr: str
) -> None:
    # Red before on 3.10 (its argparse lets the write error through): status 1, or 120
    # buffered; on 3.11 and later argparse drops it, and the status was 2 already.
    result = subprocess.run(
        ["sh", "-c", f'"$@" {stderr}', "sh", sys.executable, "-m", "trio_proctree", "frobnicate"],
        capture_output=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (2, b"", b"")


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
