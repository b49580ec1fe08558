"""``trio-proctree run`` and ``trio-proctree orphans``, driven as a user would: the real
console script in a subprocess, real signals, real process trees."""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from . import procs
from .conftest import Tracked, kernel_refuses

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespace)")


def tool() -> list[str]:
    script = shutil.which("trio-proctree", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "trio_proctree"]


#: What the tool says on stderr when its first tree sweeps another process's stale cgroup
#: home: another test's, made on purpose (a dead owner, its watchdog stopped), swept by
#: whichever process comes first. Not the command's stderr, which the tests compare.
SWEPT_ANOTHERS_HOME = "trio-proctree: killing what outlived its owner in "


def run_tool(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*tool(), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    lines = result.stderr.splitlines(keepends=True)
    result.stderr = "".join(line for line in lines if not line.startswith(SWEPT_ANOTHERS_HOME))
    return result


# --- run: exit statuses ----------------------------------------------------------------


def test_run_passes_the_commands_own_exit_status_and_output(tracked: Tracked) -> None:
    result = run_tool("run", "--", "sh", "-c", "echo out; echo err >&2; exit 7", env=tracked.env)
    assert (result.returncode, result.stdout, result.stderr) == (7, "out\n", "err\n")


@pytest.mark.parametrize("sig", ["USR1", "KILL", "INT"])
def test_run_exits_128_plus_n_when_signal_n_ended_its_command(tracked: Tracked, sig: str) -> None:
    # Issue 5's exit status, for a program that runs the tool as for a shell. Red before:
    # the tool ended by the signal itself (returncode -N). A Ctrl-C that reached only a
    # command holding the terminal still ends the tool by SIGINT (test_cli_job_control).
    number = signal.Signals[f"SIG{sig}"]
    result = run_tool("run", "--", "sh", "-c", f"kill -{sig} $$", env=tracked.env)
    assert result.returncode == 128 + number
    in_a_shell = subprocess.run(
        ["sh", "-c", '"$@"; echo $?', "sh", *tool(), "run", "--", "sh", "-c", f"kill -{sig} $$"],
        capture_output=True, text=True, env=tracked.env, timeout=60, check=False,
    )  # fmt: skip
    assert in_a_shell.stdout == f"{128 + number}\n"
    assert tracked.survivors() == []


def test_run_passes_stdin_through(tracked: Tracked) -> None:
    result = subprocess.run(
        [*tool(), "run", "--", "cat"], input="typed", capture_output=True, text=True,
        env=tracked.env, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "typed")


def test_run_timeout_stops_a_sigterm_ignoring_tree_with_124(tracked: Tracked) -> None:
    started = time.monotonic()
    result = run_tool(
        "run", "--timeout", "0.3", "--grace", "0.3", "--",
        "sh", "-c", "trap '' TERM; sleep 60 & setsid -f sleep 61; wait",
        env=tracked.env,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 124
    assert tracked.survivors() == []  # the setsid escapee too (with the auto containment)
    # timeout + grace + SIGKILL, plus Python's start-up: seconds, not the sleep's minute.
    assert elapsed < 0.3 + 0.3 + 10


def test_run_durations_take_timeouts_suffixes(tracked: Tracked) -> None:
    # As timeout(1) reads them: s, m, h, d (red before: "0.3s" was a usage error).
    started = time.monotonic()
    result = run_tool(
        "run", "--timeout", "0.005m", "--grace", "0.2s", "--",
        "sh", "-c", "trap '' TERM; sleep 60", env=tracked.env,
    )  # fmt: skip
    assert result.returncode == 124, result.stderr
    [warned] = [line for line in result.stderr.splitlines() if "0.2s after SIGTERM" in line]
    # Red before (helper-44): with no tool's name, CI logs did not say who wrote it.
    assert warned.startswith("trio-proctree: pid ")  # (the grace, as given)
    assert time.monotonic() - started < 0.3 + 0.2 + 10  # (and Python's start-up), not 60 s
    assert tracked.survivors() == []


@pytest.mark.parametrize("no_limit", ["0", "0s", "0m", "inf", "infinity", "INF"])
def test_run_timeout_of_zero_or_inf_means_no_timeout(tracked: Tracked, no_limit: str) -> None:
    # As timeout(1): "a duration of 0 disables the timeout", so that a script's
    # `--timeout "${LIMIT:-0}"` works (red before, helper-27: a usage error, exit 2); and
    # it takes inf, as a script's `${LIMIT:-inf}` has it (red before, helper-52).
    result = run_tool(
        "run", "--timeout", no_limit, "--", "sh", "-c", "sleep 0.2; exit 7", env=tracked.env
    )  # fmt: skip
    assert result.returncode == 7, result.stderr
    assert tracked.survivors() == []


def test_run_missing_command_exits_127_with_a_message(tracked: Tracked) -> None:
    result = run_tool("run", "--", "no-such-command-xyz", env=tracked.env)
    assert result.returncode == 127
    assert "no-such-command-xyz" in result.stderr
    assert "not found" in result.stderr


def test_run_started_with_sigchld_ignored_passes_its_commands_exit_status(
    tracked: Tracked,
) -> None:
    # Started by a program that ignores SIGCHLD (inherited across exec, as timeout(1)
    # meets it): Linux would reap the tool's children itself, and their exit statuses
    # with them. Red before (helper-70): status 125, "exit status lost", for any command.
    with subprocess.Popen(
        [*tool(), "run", "--", "sh", "-c", "exit 3"],
        env=tracked.env,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),  # noqa: PLW1509
    ) as runner:
        _, said = runner.communicate(timeout=60)
    assert (runner.returncode, said) == (3, b"")
    assert tracked.survivors() == []


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"])
def test_run_that_cannot_say_why_still_exits_with_the_status_that_says_it(
    cli_env: dict[str, str], stderr: str
) -> None:
    # Red before (helper-70): with stderr closed, the message's write raised and the tool
    # exited 1, which a caller takes for the command's own status. And with stderr full
    # and buffered (no PYTHONUNBUFFERED), the message stayed in the buffer, whose flush
    # at exit failed: "Exception ignored", status 120.
    result = subprocess.run(
        ["sh", "-c", f'"$@" {stderr}', "sh", *tool(), "run", "--", "no-such-command-xyz"],
        capture_output=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (127, b"", b"")


def test_run_not_executable_exits_126(tracked: Tracked, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = run_tool("run", "--", str(script), env=tracked.env)
    assert result.returncode == 126
    assert "script.sh" in result.stderr


@kernel_refuses
def test_run_a_file_of_no_program_format_exits_126(tracked: Tracked, tmp_path: Path) -> None:
    # Found, but not a program the kernel can run (no #! line): 126, POSIX's status for a
    # command found but not run, as for a file without the x bit; 125 is for trio-proctree
    # failing itself. (sh and env(1) would run it as a script: their exec falls back.)
    tool_file = tmp_path / "notes"
    tool_file.write_text("echo hi\n")
    tool_file.chmod(0o755)
    result = run_tool("run", "--", str(tool_file), env=tracked.env)
    assert result.returncode == 126, result.stderr
    assert "notes" in result.stderr
    assert "Exec format error" in result.stderr


def test_run_an_empty_program_name_exits_127_with_a_message(tracked: Tracked) -> None:
    # Red before (helper-61): a ValueError traceback and exit status 1, which a script
    # running `trio-proctree run -- "$CMD"` took for the command's own failure. 127, as
    # timeout(1) says it.
    result = run_tool("run", "--", "", env=tracked.env)
    assert result.returncode == 127, result.stderr
    assert result.stderr.startswith("trio-proctree: '': command not found")
    assert "Traceback" not in result.stderr


def test_run_whose_stderr_reader_left_and_stdout_is_closed_ends_as_by_sigpipe(
    tracked: Tracked, cli_env: dict[str, str]
) -> None:
    # Red before (helper-62): the handler of the broken pipe failed on the closed stdout,
    # and the tool ended with status 1, a failed command's.
    command = shlex.join([*tool(), "run", "--", "no-such-command-xyz"])
    with procs.pipe_whose_reader_left() as write_end:
        result = subprocess.run(
            ["sh", "-c", f"exec >&-; exec {command}"],
            stderr=write_end, env=cli_env, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 128 + signal.SIGPIPE
    assert tracked.survivors() == []


def test_run_a_path_through_a_file_exits_126(tracked: Tracked) -> None:
    # Red before (helper-61): "command not found", 127; the exec fails with ENOTDIR, which
    # timeout(1) reports as a command it could not invoke: 126.
    result = run_tool("run", "--", "/etc/passwd/x", env=tracked.env)
    assert result.returncode == 126, result.stderr
    assert "/etc/passwd/x: Not a directory" in result.stderr


#: Writes the list of its open file descriptors to the one its argument names.
LISTS_ITS_DESCRIPTORS = textwrap.dedent(
    """
    import os, sys

    def is_open(fd):
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True

    os.write(int(sys.argv[1]), repr([fd for fd in range(1024) if is_open(fd)]).encode())
    """
)


def test_run_passes_the_descriptors_it_inherited_and_no_other(tracked: Tracked) -> None:
    # As timeout(1) does: a process substitution's /dev/fd/63, make's jobserver, a lock
    # held open for the command. Red before (helper-61): closed, as Popen closes what it
    # is not told to pass; and none of the tool's own (its watchdog's socket, trio's).
    read_end, write_end = os.pipe()
    passed = write_end
    try:
        result = subprocess.run(
            [*tool(), "run", "--", *procs.python(), "-c", LISTS_ITS_DESCRIPTORS, str(passed)],
            capture_output=True, text=True, env=tracked.env, timeout=60, check=False,
            pass_fds=(passed,),
        )  # fmt: skip
        os.close(write_end)
        write_end = -1
        assert result.returncode == 0, result.stderr
        said = os.read(read_end, 4096)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert said == repr([0, 1, 2, passed]).encode()
    assert tracked.survivors() == []


CLEANUP_FAILS = textwrap.dedent(
    """
    import sys
    from trio_proctree import CleanupError, _cli, _core

    real = _core.TreeCore.cleanup

    async def cleanup_that_fails(self, io):
        await real(self, io)
        raise CleanupError(f"{self.label}: processes outlived SIGKILL (injected)")

    _core.TreeCore.cleanup = cleanup_that_fails
    sys.exit(_cli.main(sys.argv[1:]))
    """
)


def test_run_whose_cleanup_fails_says_so_and_exits_125(tracked: Tracked) -> None:
    # Red before: the CleanupError came out as a traceback, with exit status 1.
    result = subprocess.run(
        [*procs.python(), "-c", CLEANUP_FAILS, "run", "--", "true"],
        capture_output=True, text=True, env=tracked.env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 125, result.stderr
    assert result.stderr.startswith("trio-proctree: pid ")
    assert "processes outlived SIGKILL (injected)" in result.stderr
    assert "Traceback" not in result.stderr
    assert tracked.survivors() == []


@needs_root
def test_run_failing_itself_exits_125(tracked: Tracked) -> None:
    # In a mount namespace without the cgroup v2 hierarchy, --containment cgroup cannot be.
    if shutil.which("unshare") is None:  # pragma: no cover
        pytest.skip("unshare(1) is not installed")
    mounts = Path("/proc/self/mountinfo").read_text()
    cgroup2 = [
        line.split(" - ")[0].split()[4] for line in mounts.splitlines() if " - cgroup2 " in line
    ]
    if not cgroup2:  # pragma: no cover
        pytest.skip("no cgroup v2 here to hide")
    hide = "; ".join(f"umount -l {path}" for path in cgroup2)
    command = " ".join([*tool(), "run", "--containment", "cgroup", "--", "true"])
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f"{hide}; exec {command}"],
        capture_output=True, text=True, env=tracked.env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 125, result.stderr
    assert "cgroup" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--grace", "-3", "--", "true"],
        ["run", "--grace", "nan", "--", "true"],
        ["run", "--signal", "BOGUS", "--", "true"],
        ["run", "--signal", "STOP", "--", "true"],
        ["run", "--timeout", "-1", "--", "true"],
        ["run", "--timeout", "5x", "--", "true"],
        ["run", "--timeout", "s", "--", "true"],
        ["run", "--containment", "jail", "--", "true"],
        ["run"],
        ["orphans", "--match", "("],
        ["orphans", "--reaper", "0"],
        ["orphans", "--reaper", "-5"],
        ["frobnicate"],
    ],
    ids=" ".join,
)
def test_usage_errors_exit_2(tracked: Tracked, args: list[str]) -> None:
    result = run_tool(*args, env=tracked.env)
    assert result.returncode == 2
    assert "usage:" in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run"], "error: no command given"),
        (["run", "--"], "error: no command given"),
        (["run", "--grace", "abc", "--", "true"], "'abc': not a duration (a number of"),
        (["run", "--timeout", "5x", "--", "true"], "'5x': not a duration (a number of"),
    ],
    ids=["run", "run --", "--grace abc", "--timeout 5x"],
)
def test_run_usage_errors_show_runs_usage_and_say_what_is_wrong(
    tracked: Tracked, args: list[str], said: str
) -> None:
    # Red before (helper-52): no command showed the top-level usage, and a duration that
    # is no number said Python's "could not convert string to float".
    result = run_tool(*args, env=tracked.env)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: trio-proctree run ")
    assert "trio-proctree run: error: " in result.stderr
    assert said in result.stderr


# --- run: signals to the tool ----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_the_tool_stops_the_whole_tree(tracked: Tracked, sig: signal.Signals) -> None:
    with procs.killed_on_failure(subprocess.Popen(
        [*tool(), "run", "--grace", "2", "--",
         "sh", "-c", "sleep 60 & echo $!; setsid -f sh -c 'echo $$; exec sleep 61'; wait"],
        stdout=subprocess.PIPE, env=tracked.env,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None
        pids = [int(runner.stdout.readline()) for _ in range(2)]
        assert all(procs.alive(pid) for pid in pids)
        runner.send_signal(sig)  # our own child, by pid
        # Ended by the request, once the tree is gone: a shell sees what it sent.
        assert runner.wait(timeout=30) == -sig
    assert not any(procs.alive(pid) for pid in pids)
    assert tracked.survivors() == []


def test_a_signal_the_tool_inherited_ignored_stays_ignored(tracked: Tracked) -> None:
    # nohup ignores SIGHUP; a script's background command inherits SIGINT ignored, so
    # that a Ctrl-C for the foreground leaves it running. Red before: the tool took the
    # SIGINT for a stop request (and ended by it, not by the SIGTERM after it).
    # (Its command takes a second to stop: a SIGINT wrongly taken for a request is still
    # stopping it when the SIGTERM comes, and the tool then ends by the SIGINT.)
    stops_slowly = 'trap "sleep 1; exit 0" TERM; echo ready; sleep 60 & wait'
    run = shlex.join([*tool(), "run", "--", "sh", "-c", stops_slowly])
    with procs.killed_on_failure(subprocess.Popen(
        ["sh", "-c", f"trap '' INT; exec {run}"],
        stdout=subprocess.PIPE, env=tracked.env, text=True,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None
        assert runner.stdout.readline() == "ready\n"
        runner.send_signal(signal.SIGINT)  # our own child, by pid
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == -signal.SIGTERM
    assert tracked.survivors() == []


def test_sigpipe_and_sigxfsz_reach_the_command_at_their_defaults_whatever_the_tool_inherited(
    tracked: Tracked,
) -> None:
    # The documented limit (helper-86): Python's own startup ignores both before the
    # tool's code runs, so it cannot tell that its caller had ignored them, and gives the
    # command their defaults, as any Python program's subprocess does (`timeout` keeps
    # them ignored). Another signal it inherited ignored, SIGHUP here, stays ignored.
    run = shlex.join([*tool(), "run", "--", "cat", "/proc/self/status"])
    status = subprocess.run(
        ["sh", "-c", f"trap '' HUP PIPE XFSZ; exec {run}"],
        capture_output=True, env=tracked.env, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    [ignored] = [
        int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:")
    ]
    assert ignored & (1 << (signal.SIGHUP - 1))
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))
    assert tracked.survivors() == []


def test_only_the_tools_main_thread_takes_the_signals_it_answers(tracked: Tracked) -> None:
    # The kernel hands a signal to any thread that does not block it; one taken by a
    # worker thread descheduled before its handler ran was answered after signals sent
    # later (bash's `kill %1` on a stopped job: SIGTERM, then SIGCONT; with the SIGCONT
    # answered first, the command's next stop for the terminal stopped this tool again,
    # and nobody continued it). The spawn's worker thread, idle for seconds after it,
    # now blocks them; the command, which that thread started, blocks none of them.
    answered = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1}
    with procs.killed_on_failure(subprocess.Popen(
        [*tool(), "run", "--", "sh", "-c", "echo $$; exec sleep 60"],
        stdout=subprocess.PIPE, env=tracked.env, text=True,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None
        command = int(runner.stdout.readline())
        workers = [int(task) for task in os.listdir(f"/proc/{runner.pid}/task")]
        workers.remove(runner.pid)
        assert workers  # (the spawn's, idle for 10 s)
        for worker in workers:
            # (It blocks them once the spawn's work is done, which may end after the
            # command said its pid.)
            deadline = time.monotonic() + 5  # (it retires after 10 s idle)
            while not answered <= procs.blocked_signals(runner.pid, worker):
                assert time.monotonic() < deadline, (
                    worker,
                    procs.blocked_signals(runner.pid, worker),
                )
                time.sleep(0.01)
        assert not answered & procs.blocked_signals(runner.pid, runner.pid)
        assert not answered & procs.blocked_signals(command, command)
        runner.send_signal(signal.SIGTERM)  # our own child, by pid
        assert runner.wait(timeout=30) == -signal.SIGTERM
    assert tracked.survivors() == []


# Three trees, each a command saying the signals it blocks: two while the spawn's worker
# keeps SIGTERM from itself (`main_thread_only`), one after; all from the same worker.
KEPT_FROM_A_REUSED_WORKER = textwrap.dedent(
    """
    import signal, trio
    from trio_proctree import run_process_tree
    from trio_proctree._trio import main_thread_only

    async def blocked():
        command = ["grep", "SigBlk", "/proc/self/status"]
        said = (await run_process_tree(command, capture_stdout=True)).stdout
        return int(said.split()[1], 16) >> (signal.SIGTERM - 1) & 1

    async def main():
        with main_thread_only({signal.SIGTERM}):
            during = [await blocked(), await blocked()]
        print(*during, await blocked())

    trio.run(main)
    """
)


def test_a_tree_started_by_a_worker_that_kept_signals_from_itself_gets_them(
    tracked: Tracked,
) -> None:
    # A worker reused for the next spawn unblocks what it blocked before forking, in the
    # block and after it. Red before (helper-53): after the block, the worker forked with
    # SIGTERM blocked, and the tree could not be stopped by it.
    assert procs.run_python(KEPT_FROM_A_REUSED_WORKER, env=tracked.env) == "0 0 0\n"
    assert tracked.survivors() == []


def test_sigquit_to_the_tool_is_passed_to_its_command(tracked: Tracked) -> None:
    # Ctrl-\\ where the tool's group has the terminal (run by a script), or a kill -QUIT:
    # as timeout(1) does, the command gets it (a JVM prints its threads and runs on).
    # Red before: the tool died of it at once, and the watchdog SIGKILLed the tree.
    quits = 'ulimit -c 0; trap "echo got QUIT; exit 5" QUIT; echo ready; sleep 60 & wait'
    with procs.killed_on_failure(subprocess.Popen(
        [*tool(), "run", "--", "sh", "-c", quits],
        stdout=subprocess.PIPE, env=tracked.env, text=True,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None
        assert runner.stdout.readline() == "ready\n"
        runner.send_signal(signal.SIGQUIT)  # our own child, by pid
        assert runner.stdout.read() == "got QUIT\n"
        assert runner.wait(timeout=30) == 5
    assert tracked.survivors() == []


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM])
def test_a_signal_for_the_command_to_act_on_is_passed_to_it(
    tracked: Tracked, sig: signal.Signals
) -> None:
    # A supervisor's `kill -USR1` asks a server under the tool to reopen its logs (nginx,
    # gunicorn), and goes on running. Red before: the tool died of it at once (its default
    # action), and the watchdog SIGKILLed the tree with no grace.
    name = sig.name[3:]
    acts = f'trap "echo got {name}" {name}; echo ready; while :; do sleep 0.05; done'
    with procs.killed_on_failure(subprocess.Popen(
        [*tool(), "run", "--grace", "0.5", "--", "sh", "-c", acts],
        stdout=subprocess.PIPE, env=tracked.env, text=True,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None
        assert runner.stdout.readline() == "ready\n"
        runner.send_signal(sig)  # our own child, by pid
        assert runner.stdout.readline() == f"got {name}\n"
        assert runner.poll() is None  # the tool runs on, and so does its command
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == -signal.SIGTERM  # (the shell dies of it)
    assert tracked.survivors() == []


@pytest.mark.parametrize(
    ("options", "first", "then"),
    [
        pytest.param([], signal.SIGINT, signal.SIGINT, id="a second Ctrl-C"),
        pytest.param([], signal.SIGINT, signal.SIGTERM, id="a SIGTERM after a Ctrl-C"),
        pytest.param(["--timeout", "0.2"], None, signal.SIGINT, id="a Ctrl-C after the timeout"),
    ],
)
def test_a_stop_request_during_a_stop_under_way_kills_the_tree_at_once(
    tracked: Tracked, options: list[str], first: signal.Signals | None, then: signal.Signals
) -> None:
    # The tree ignores SIGTERM and the grace is long: a request once its graceful stop is
    # under way (from a first request, or from the timeout) is the caller wanting out now.
    # Red before: a second request waited in trio's queue for the whole grace, then was
    # redelivered as the tool left (a KeyboardInterrupt traceback, or death by SIGTERM
    # with the command's status lost); one after the timeout waited the whole grace too.
    # The tool ends by the first request (a bash loop running it stops).
    grace = 20.0
    stubborn = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.05; done"
    with procs.killed_on_failure(subprocess.Popen(
        [*tool(), "run", *options, "--grace", str(grace), "--", "sh", "-c", stubborn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tracked.env,
    )) as runner:  # fmt: skip
        assert runner.stdout is not None and runner.stderr is not None
        assert runner.stdout.readline() == "ready\n"
        if first is not None:
            runner.send_signal(first)  # our own child, by pid
        assert runner.stdout.readline() == "got TERM\n"  # the graceful stop is under way
        started = time.monotonic()
        runner.send_signal(then)
        assert runner.wait(timeout=grace) == -(first or then)
        assert time.monotonic() - started < grace / 4
        assert "Traceback" not in runner.stderr.read()
    assert tracked.survivors() == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ctrl_c_stops_a_bash_script_running_the_tool_in_a_loop(tracked: Tracked) -> None:
    # Ctrl-C reaches the script and the tool alike (their process group, as a terminal
    # sends it). bash then waits for its child and stops the script only if that child
    # died of SIGINT; one that exited 130 handled it, and the loop goes on. Red before:
    # the loop ran the tool again.
    with procs.killed_on_failure(subprocess.Popen(
        ["bash", "-c", 'for i in 1 2; do "$@"; echo "next $?"; done', "bash",
         *tool(), "run", "--", "sh", "-c", "echo ready; exec sleep 60"],
        stdout=subprocess.PIPE, text=True, env=tracked.env, start_new_session=True,
    )) as loop:  # fmt: skip
        assert loop.stdout is not None
        assert loop.stdout.readline() == "ready\n"
        os.killpg(loop.pid, signal.SIGINT)  # the group we made for it, as Ctrl-C does
        assert loop.wait(timeout=30) == -signal.SIGINT
        assert loop.stdout.read() == ""  # no "next": the loop stopped
    assert tracked.survivors() == []


def test_run_help_explains_itself(tracked: Tracked) -> None:
    result = run_tool("run", "--help", env=tracked.env)
    assert result.returncode == 0
    for words in ("--timeout", "--grace", "--signal", "--containment", "124", "127", "example"):
        assert words in result.stdout
    assert "at most --grace + 2 seconds" in result.stdout  # the bound, as every entry point


# --- orphans ---------------------------------------------------------------------------


def test_orphans_finds_a_real_reparented_process_and_then_none(tracked: Tracked) -> None:
    marker = f"60.{uuid.uuid4().int % 10**9}"  # a sleep nobody else runs
    # The shell exits at once; its background sleep is adopted (by init or a subreaper).
    subprocess.run(
        ["sh", "-c", f"sleep {marker} &"],
        env=tracked.env, start_new_session=True, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    [orphan] = tracked.survivors()
    listed = run_tool("orphans", "--match", f"sleep {marker}", env=tracked.env)
    assert listed.returncode == 1, listed
    assert str(orphan) in listed.stdout
    as_json = json.loads(run_tool("orphans", "--json", "--match", marker, env=tracked.env).stdout)
    assert [row["pid"] for row in as_json] == [orphan]
    assert as_json[0]["command"] == f"sleep {marker}"
    assert as_json[0]["age"] >= 0

    assert procs.kill_survivors(tracked.token) == [orphan]
    clean = run_tool("orphans", "--match", f"sleep {marker}", env=tracked.env)
    assert clean.returncode == 0, clean
    assert clean.stdout == "no orphans\n"


def test_orphans_whose_reader_left_ends_as_by_sigpipe(cli_env: dict[str, str]) -> None:
    # Red before, buffered (no PYTHONUNBUFFERED): the write failed only in Python's flush
    # at exit, which said "Exception ignored ... BrokenPipeError" and exited 120. (--help
    # alike: tests/test_cli.py.)
    with procs.pipe_whose_reader_left() as write_end:
        result = subprocess.run(
            [*tool(), "orphans", "--match", "^$"],
            stdout=write_end, stderr=subprocess.PIPE, env=cli_env, timeout=60, check=False,
        )  # fmt: skip
    assert (result.returncode, result.stderr) == (128 + signal.SIGPIPE, b"")


def test_orphans_that_cannot_write_its_report_fails_saying_so(cli_env: dict[str, str]) -> None:
    # Red before (helper-111): into a full disk, buffered, the report was lost and the
    # status 0, a check's "no orphans"; unbuffered, a traceback and status 1, its "found".
    with open("/dev/full", "wb") as full:
        result = subprocess.run(
            [*tool(), "orphans", "--match", "^$"],
            stdout=full, stderr=subprocess.PIPE, env=cli_env, timeout=60, check=False,
        )  # fmt: skip
    said = result.stderr.decode()
    assert (result.returncode, said) == (2, "trio-proctree: could not write its report: "
                                            "No space left on device\n")  # fmt: skip


def test_orphans_shows_a_newline_in_a_command_line_escaped_not_as_a_row(
    tracked: Tracked,
) -> None:
    # Red before: an argument with a newline in it forged a row of the table (here one
    # claiming to be pid 1); --json was right all along.
    marker = f"60.{uuid.uuid4().int % 10**9}"
    forged = "forged\n      1       0       9s  /sbin/init"
    # (The inner shell's "; :" keeps it from exec'ing sleep: it stays, its $0 forged.)
    subprocess.run(
        ["sh", "-c", f"sh -c 'sleep {marker}; :' '{forged}' &"],
        env=tracked.env, start_new_session=True, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # The shell, once its sleep has exec'd (a fork not yet exec'd shows its arguments
        # too). No event says an exec is done: looked at again in short pauses.
        deadline = time.monotonic() + 10
        while True:
            said = {pid: procs.arguments(pid) or b"" for pid in tracked.survivors()}
            shells = [pid for pid, arguments in said.items() if b"forged" in arguments]
            if len(shells) == 1 and any(a.startswith(b"sleep\0") for a in said.values()):
                break
            assert time.monotonic() < deadline, said
            time.sleep(0.005)
        [orphan] = shells
        listed = run_tool("orphans", "--match", "forged", env=tracked.env)
        assert listed.returncode == 1, listed
        header, row = listed.stdout.splitlines()  # one row, not two
        assert header.split() == ["PID", "PARENT", "AGE", "COMMAND"]
        assert row.split()[0] == str(orphan)
        assert row.endswith("forged\\n      1       0       9s  /sbin/init")
        listed = run_tool("orphans", "--json", "--match", "forged", env=tracked.env)
        [as_json] = json.loads(listed.stdout)
        assert forged in as_json["command"]  # (as it is)
    finally:
        procs.kill_survivors(tracked.token)  # (the shell and its sleep)
    assert tracked.survivors() == []


def test_orphans_ignores_plain_children_when_the_session_leader_is_gone(tracked: Tracked) -> None:
    # CI runners and `setsid cmd &` leave programs in a session whose leader has exited.
    # Children such a program started itself are not orphans, although the group and
    # session they inherited have lost their leader.
    marker = f"60.{uuid.uuid4().int % 10**9}"
    program = (
        "import os, subprocess, sys\n"
        "print(os.getpid(), flush=True)\n"
        "sys.stdin.readline()\n"  # until the session leader has exited and been reaped
        "child = subprocess.Popen(['sleep', os.environ['MARKER']])\n"
        "listed = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "child.kill(); child.wait()\n"
        "print(listed.returncode); print(listed.stdout, end='')\n"
    )
    lister = [*tool(), "orphans", "--match", f"sleep {marker}"]
    with procs.killed_on_failure(subprocess.Popen(
        # The shell leads a new session, starts the program in the background and exits.
        ["sh", "-c", shlex.join([sys.executable, "-c", program, *lister]) + " &"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**tracked.env, "MARKER": marker}, start_new_session=True,
    )) as shell:  # fmt: skip
        assert shell.stdout is not None
        program_exited = os.pidfd_open(int(shell.stdout.readline()))
        assert shell.wait(timeout=30) == 0
        output, _ = shell.communicate("go\n", timeout=60)
    # Not our child (it was adopted when the shell exited): wait for its exit on a pidfd.
    select.select([program_exited], [], [], 30)
    os.close(program_exited)
    assert output == "0\nno orphans\n"
    assert tracked.survivors() == []


def test_orphans_lists_the_children_of_a_named_reaper(tracked: Tracked) -> None:
    marker = f"60.{uuid.uuid4().int % 10**9}"
    # A small init of our own: a subreaper whose child shell leaves a sleep behind.
    reaper_code = (
        "import ctypes, subprocess, sys\n"
        "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
        f"subprocess.run(['sh', '-c', 'sleep {marker} &'])\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"  # lives until we close its stdin, on every way out of the block
    )
    with procs.killed_on_failure(subprocess.Popen(
        [sys.executable, "-c", reaper_code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=tracked.env,
    )) as reaper:  # fmt: skip
        assert reaper.stdout is not None
        assert reaper.stdout.readline() == b"ready\n"
        listed = run_tool(
            "orphans", "--reaper", str(reaper.pid), "--match", marker, env=tracked.env
        )
        assert listed.returncode == 1, listed
        [line] = [line for line in listed.stdout.splitlines() if marker in line]
        assert line.split()[1] == str(reaper.pid)  # the parent column: our reaper
        procs.kill_survivors(tracked.token)
    assert tracked.survivors() == []


def test_orphans_with_a_reaper_that_does_not_exist_says_so(tracked: Tracked) -> None:
    # A monitoring check with a wrong pid must not report "no orphans". Red before: it
    # looked at nothing under that pid and exited 0.
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    result = run_tool("orphans", "--reaper", str(no_such_pid), env=tracked.env)
    assert result.returncode == 2
    assert f"no process {no_such_pid}" in result.stderr


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"])
def test_orphans_with_a_missing_reaper_that_cannot_say_so_still_exits_2(
    cli_env: dict[str, str], stderr: str
) -> None:
    # Red before: the message's write raised with stderr closed or full, and the tool
    # exited 1 (buffered: 120), which the check's caller reads as "orphans found".
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    result = subprocess.run(
        ["sh", "-c", f'"$@" {stderr}', "sh", *tool(), "orphans", "--reaper", str(no_such_pid)],
        capture_output=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (2, b"", b"")


def test_orphans_usage_errors_show_orphans_usage(tracked: Tracked) -> None:
    # Red before (helper-61): the top-level usage, where run's errors show run's.
    result = run_tool("orphans", "--match", "(", env=tracked.env)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: trio-proctree orphans ")
    assert "trio-proctree orphans: error: --match is not a valid regular expression" in (
        result.stderr
    )


def test_orphans_help_explains_itself(tracked: Tracked) -> None:
    result = run_tool("orphans", "--help", env=tracked.env)
    assert result.returncode == 0
    for words in ("--match", "--json", "--reaper", "Exit status 1"):
        assert words in result.stdout


# The tool, made to hand the terminal over 0.3 s after the command started.
needs_a_terminal = pytest.mark.skipif(
    shutil.which("script") is None, reason="needs script(1) for a terminal"
)


def typed_at_a_terminal(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the shell ``command`` on a fresh pseudo-terminal (script(1)), "typed" typed
    into it; what it printed there."""
    return subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        input="typed\n", capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


LATE_HANDOVER = textwrap.dedent(
    """
    import sys, time
    from trio_proctree import _cli, _job_control

    hand_to = _job_control.Terminal.hand_to

    def stopped(pid):
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] == b"T"

    def late(terminal, group):
        # Once the command has read the terminal too soon and stopped (SIGTTIN).
        deadline = time.monotonic() + 10
        while not stopped(group) and time.monotonic() < deadline:
            time.sleep(0.005)
        hand_to(terminal, group)

    _job_control.Terminal.hand_to = late
    sys.exit(_cli.main(sys.argv[1:]))
    """
)


@needs_a_terminal
def test_run_hands_the_terminal_to_a_command_that_read_it_too_soon(tracked: Tracked) -> None:
    # A command that reads the terminal before it is handed over is stopped (SIGTTIN, as
    # a background reader); the hand-over must wake it. Red before: it stayed stopped.
    read_tty = "read x < /dev/tty; echo got $x"
    inner = shlex.join([*procs.python(), "-c", LATE_HANDOVER, "run", "--", "sh", "-c", read_tty])
    result = typed_at_a_terminal(inner, tracked.env)
    assert result.returncode == 0, result
    assert "got typed" in result.stdout
    assert tracked.survivors() == []


@needs_a_terminal
def test_run_in_a_pipeline_leaves_the_terminal_to_the_pipeline(
    tracked: Tracked, tmp_path: Path
) -> None:
    # `trio-proctree run -- git log | less`: the commands of a pipeline share a process
    # group, and the terminal is theirs. Handed to the tree's group, it was taken from
    # the reader beside it, whose read of it failed (EIO here, where that group has no
    # parent in the session; SIGTTIN, a stopped job, under a shell with job control).
    # The tree waits 0.5 s before it lets the reader read: a hand-over, if any, is done.
    started, done = tmp_path / "started", tmp_path / "done"
    os.mkfifo(started)
    os.mkfifo(done)
    tree = f"sleep 0.5; echo > {started}; read x < {done}"
    reader = f"read x < {started}; read typed < /dev/tty; echo got $typed; echo > {done}"
    pipeline = " ".join(
        [*tool(), "run", "--", "sh", "-c", shlex.quote(tree), "|", "sh", "-c", shlex.quote(reader)]
    )
    result = typed_at_a_terminal(f"bash -c {shlex.quote(pipeline)}", tracked.env)
    assert "got typed" in result.stdout, result
    assert tracked.survivors() == []


@needs_a_terminal
def test_run_fed_by_a_pipeline_leaves_the_terminal_to_the_pipeline(
    tracked: Tracked, tmp_path: Path
) -> None:
    # `sudo cat secrets | trio-proctree run -- cmd`: the writer beside the tool prompts on
    # the terminal. The tree says when the writer may read it: a hand-over, if any, is done.
    started = tmp_path / "started"
    os.mkfifo(started)
    writer = f"read x < {started}; read typed < /dev/tty; echo $typed"
    tree = f"sleep 0.5; echo > {started}; read line; echo got $line"
    pipeline = " ".join(
        ["sh", "-c", shlex.quote(writer), "|", *tool(), "run", "--", "sh", "-c", shlex.quote(tree)]
    )
    result = typed_at_a_terminal(f"bash -c {shlex.quote(pipeline)}", tracked.env)
    assert "got typed" in result.stdout, result
    assert tracked.survivors() == []


@needs_a_terminal
def test_run_with_stdin_redirected_still_hands_its_command_the_terminal(tracked: Tracked) -> None:
    # `trio-proctree run -- sudo make < input`: sudo, ssh and gpg prompt on /dev/tty, not
    # on stdin. Red before: stdin not a terminal, the command got a session of its own,
    # and no terminal to open.
    command = shlex.join([*tool(), "run", "--", "sh", "-c", "read x < /dev/tty; echo got $x"])
    result = typed_at_a_terminal(f"{command} < /dev/null", tracked.env)
    assert result.returncode == 0, result
    assert "got typed" in result.stdout
    assert tracked.survivors() == []


@needs_a_terminal
def test_run_in_a_script_still_hands_its_command_the_terminal(tracked: Tracked) -> None:
    # A shell running a script (no job control) is in the group of the commands it runs,
    # and waits for them: the terminal is the command's to read (an ssh password prompt).
    # So is a job it left in the background (`&`): no pipeline's other command. (Red
    # before, with that job: taken for one, and the command had no terminal at all.)
    command = shlex.join([*tool(), "run", "--", "sh", "-c", "read x < /dev/tty; echo got $x"])
    # (`wait`: the job's death is seen before bash returns; under load, once, the sleep
    # was still alive when the test looked.)
    script = f"sleep 60 & job=$!; {command}; kill $job; wait $job"
    result = typed_at_a_terminal(f"bash -c {shlex.quote(script)}", tracked.env)
    assert "got typed" in result.stdout, result
    assert tracked.survivors() == []


@needs_a_terminal
def test_run_hands_an_interactive_command_the_terminal(tracked: Tracked) -> None:
    # script(1) runs the tool on a fresh pseudo-terminal and types our input into it. The
    # command reads /dev/tty: that only works if it still has a controlling terminal, in
    # the foreground group (a new session, as for non-interactive use, has none).
    inner = " ".join([*tool(), "run", "--", "sh", "-c", "'read x < /dev/tty; echo got $x'"])
    result = typed_at_a_terminal(inner, tracked.env)
    assert result.returncode == 0, result
    assert "got typed" in result.stdout
    assert tracked.survivors() == []
