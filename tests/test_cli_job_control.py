"""``trio-proctree run`` under a shell with job control: Ctrl-Z, ``fg`` and ``bg`` do to the
tool and its command what they do to any job.

An interactive command's tree gets the terminal, in a process group of its own that the
shell does not know of: Ctrl-Z stops the tree, not the tool, and the shell, waiting for
the tool, would wait for ever. These tests type at a real bash on a fresh pseudo-terminal.
"""

from __future__ import annotations

import functools
import os
import select
import shlex
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from . import procs
from .conftest import Tracked
from .test_cli_tools import LATE_HANDOVER, tool

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("setsid") is None,
    reason="needs bash and setsid(1) for a shell with job control",
)

CTRL_Z = b"\x1a"


class InteractiveShell:
    """bash with job control on a fresh pseudo-terminal, typed at as a user would."""

    def __init__(self, env: dict[str, str]) -> None:
        self.master, terminal = os.openpty()
        try:
            # setsid -c: a session of its own, with this terminal as its controlling one.
            self.bash = subprocess.Popen(
                ["setsid", "-c", "bash", "--norc", "--noprofile", "--noediting", "-i"],
                stdin=terminal, stdout=terminal, stderr=terminal,
                env={**env, "PS1": "$ ", "TERM": "dumb"},
            )  # fmt: skip
        finally:
            os.close(terminal)
        self.shown = b""
        self.expect(b"$ ")

    def type(self, text: str | bytes) -> None:
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def expect(self, wanted: bytes, within: float = 20) -> bytes:
        """Wait until the terminal shows ``wanted``; what it showed before."""
        deadline = time.monotonic() + within
        while wanted not in self.shown:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(left, 0))
            chunk = b""
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: nothing holds the terminal any more
                    pass
            if not chunk:
                raise AssertionError(f"{wanted!r} not shown; the terminal showed {self.shown!r}")
            self.shown += chunk
        before, _, self.shown = self.shown.partition(wanted)
        return before

    def said_pid(self, label: bytes) -> int:
        """Wait for a line ``label PID``; the pid."""
        self.expect(label)
        return int(self.expect(b"\r\n"))

    def answer(self) -> bytes:
        """Type a line for the command that reads the terminal; what showed before it said
        it got it."""
        self.type("hello\n")
        return self.expect(b"got hello")

    def foreground(self) -> int:
        """The terminal's foreground process group."""
        return os.tcgetpgrp(self.master)

    def wait_foreground(self, pgid: int, within: float = 10) -> None:
        wait_until(lambda: self.foreground() == pgid, within, f"group {pgid} in the foreground")

    def close(self) -> None:
        if self.bash.poll() is None:
            self.bash.kill()  # (by pid: ours)
        self.bash.wait()
        os.close(self.master)


def release(fifo: Path, within: float = 10) -> None:
    """Write a line to ``fifo`` once its reader has it open (never blocks for ever: a
    reader that never comes fails the test)."""
    deadline = time.monotonic() + within
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            assert time.monotonic() < deadline, f"nothing read {fifo} within {within} s"
            time.sleep(0.005)
            continue
        try:
            os.write(fd, b"\n")
        finally:
            os.close(fd)
        return


def wait_until(condition: Callable[[], bool], within: float, what: str) -> None:
    """No event tells these (a terminal's foreground group, a process's stop): look again
    in short pauses."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {within} s"
        time.sleep(0.005)


@pytest.fixture
def shell(tracked: Tracked) -> Iterator[InteractiveShell]:
    terminal = InteractiveShell(tracked.env)
    try:
        yield terminal
    finally:
        terminal.close()


# The command says its pid, then reads the terminal and says what it read. (Each word
# split by quotes, so that the terminal's echo of the typed command never matches.)
READS_THE_TERMINAL = 'echo "lea""der $$"; read x; echo "go""t $x"'


def run_line(script: str, *options: str) -> str:
    """The command line of a `trio-proctree run` of the shell script ``script``."""
    return shlex.join([*tool(), "run", *options, "--", "sh", "-c", script])


def start_reader(shell: InteractiveShell, *extra: str) -> int:
    """Type a `trio-proctree run` of a command that reads the terminal; its leader's pid,
    once the tree has the terminal."""
    shell.type(run_line(READS_THE_TERMINAL, *extra) + "\n")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)  # handed over: Ctrl-Z now goes to the tree's group
    return leader


def test_a_command_that_read_the_terminal_before_the_hand_over_is_not_a_stopped_job(
    shell: InteractiveShell, tracked: Tracked, tmp_path: Path
) -> None:
    # Started before the hand-over, it read the terminal as a background reader and
    # stopped (SIGTTIN): the hand-over wakes it, and that stop is no reason to stop the
    # job. Red without the SIGCONT at the hand-over: the shell said the job stopped.
    late = tmp_path / "late.py"
    late.write_text(LATE_HANDOVER)
    command = [*procs.python(), str(late), "run", "--", "sh", "-c", READS_THE_TERMINAL]
    shell.type(shlex.join(command) + "\n")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)
    shown = shell.answer()
    shown += shell.expect(b"$ ")
    assert b"Stopped" not in shown
    assert tracked.survivors() == [shell.bash.pid]


def suspend(shell: InteractiveShell, leader: int) -> None:
    """Ctrl-Z; the shell must then say the job stopped and have the terminal back."""
    shell.type(CTRL_Z)
    shell.expect(b"Stopped")
    shell.expect(b"$ ")
    assert shell.foreground() == shell.bash.pid
    assert procs.state(leader) == "T"


def test_ctrl_z_stops_run_as_a_job_and_fg_resumes_its_command(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # Red before: Ctrl-Z stopped the tree alone, the shell waited for the tool for ever.
    leader = start_reader(shell)
    suspend(shell, leader)
    shell.type("fg\n")
    shell.wait_foreground(leader)  # the terminal is the command's again
    shell.answer()
    shell.expect(b"$ ")
    shell.type('echo "sta""tus=$?"\n')
    shell.expect(b"status=0")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_command_sent_to_the_background_stops_when_it_reads_the_terminal(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # bg continues the command without the terminal: its read stops it (SIGTTIN), and the
    # tool stops with it, as a job reading in the background does; fg lets it read.
    leader = start_reader(shell)
    suspend(shell, leader)
    shell.type("bg\n")
    # bash marks the job running at bg, stopped only once it sees it stop again.
    wait_until(lambda: "Stopped" in shell_jobs(shell), 10, "job stopped on its read")
    assert shell.foreground() == shell.bash.pid
    assert procs.state(leader) == "T"
    shell.type("fg\n")
    shell.wait_foreground(leader)
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def shell_jobs(shell: InteractiveShell) -> str:
    """What ``jobs`` says now."""
    shell.type('jobs; echo "end ""of jobs"\n')
    return shell.expect(b"end of jobs").decode(errors="replace")


def test_a_command_ending_in_the_background_leaves_the_terminal_to_the_shell(
    shell: InteractiveShell, tracked: Tracked, tmp_path: Path
) -> None:
    # Red before: the tool, ending, took the terminal back for its own group although the
    # shell had it: the shell was left without it.
    go = tmp_path / "go"
    os.mkfifo(go)
    waits = f'echo "lea""der $$"; read x < {go}; echo "do""ne"'
    shell.type(run_line(waits) + "\n")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)
    suspend(shell, leader)
    shell.type("bg\n")
    shell.expect(b"$ ")
    release(go)  # (once the command opens it: it runs again)
    shell.expect(b"done")
    wait_until(lambda: "Done" in shell_jobs(shell), 10, "job done")
    assert shell.foreground() == shell.bash.pid
    shell.type('echo "ali""ve"\n')
    shell.expect(b"alive")
    assert tracked.survivors() == [shell.bash.pid]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_run_asked_to_stop_stops_its_whole_tree(
    shell: InteractiveShell, tracked: Tracked, sig: signal.Signals
) -> None:
    # `kill %1` on a stopped job (bash sends SIGCONT after the signal); a closed terminal
    # (SIGHUP, then SIGCONT, to each stopped job).
    leader = start_reader(shell, "--grace", "0.2")
    suspend(shell, leader)
    shell.type(f"kill -{sig.name[3:]} %1\n")
    wait_until(lambda: procs.state(leader) in (None, "Z"), 10, "leader ended")
    wait_until(lambda: tracked.survivors() == [shell.bash.pid], 10, "tree gone")
    # The job ended by that signal (the tool passes it on: `_end_by`).
    said = "Terminated" if sig == signal.SIGTERM else "Hangup"
    wait_until(lambda: said in shell_jobs(shell), 10, f"job {said}")
    assert shell.foreground() == shell.bash.pid


def _blocks(pid: int, task: int, signals: set[int]) -> bool:
    return signals <= procs.blocked_signals(pid, task)


def test_only_the_tools_main_thread_takes_the_job_control_signals(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # bash's `kill %1` on a stopped job sends SIGTERM, then SIGCONT: taken by the spawn's
    # worker thread and flagged late, the SIGTERM was answered after the SIGCONT, and the
    # tool, stopped again by its command's next stop for the terminal, waited for ever
    # (the suspected cause of one red CI run of the test above). The worker blocks them.
    leader = start_reader(shell)
    tool_pid = procs.stat_field(leader, 4)
    answered: set[int] = {
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGCHLD,
        signal.SIGCONT,
        signal.SIGTSTP,
    }
    workers = [int(task) for task in os.listdir(f"/proc/{tool_pid}/task")]
    workers.remove(tool_pid)
    assert workers  # (the spawn's, idle for 10 s)
    for worker in workers:
        blocks_them = functools.partial(_blocks, tool_pid, worker, answered)
        wait_until(blocks_them, 5, "the worker blocks them")  # (it retires after 10 s)
    assert not answered & procs.blocked_signals(tool_pid, tool_pid)
    assert not answered & procs.blocked_signals(leader, leader)
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_job_brought_back_running_gets_the_terminal_when_it_reads_it(
    shell: InteractiveShell, tracked: Tracked, tmp_path: Path
) -> None:
    # bash's fg of a job running in the background gives this tool's group the terminal
    # and sends no SIGCONT: the command, reading, stops for it (SIGTTIN), and the tool,
    # in the foreground, hands it over. Red before: the tool stopped as well.
    go = tmp_path / "go"
    os.mkfifo(go)
    waits_then_reads = f'echo "lea""der $$"; read x < {go}; read y; echo "go""t $y"'
    shell.type(run_line(waits_then_reads) + "\n")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)
    suspend(shell, leader)
    shell.type("bg\n")
    shell.expect(b"$ ")
    wait_until(lambda: procs.state(leader) == "S", 10, "command running again")
    shell.type("fg\n")
    tool_pid = procs.stat_field(leader, 4)
    shell.wait_foreground(procs.pgid_of(tool_pid))
    # Ctrl-Z now reaches the tool: the whole job stops, the command too.
    shell.type(CTRL_Z)
    shell.expect(b"Stopped")
    shell.expect(b"$ ")
    wait_until(lambda: procs.state(leader) == "T", 10, "command stopped")
    shell.type("bg\n")
    shell.expect(b"$ ")
    wait_until(lambda: procs.state(leader) == "S", 10, "command running again")
    shell.type("fg\n")
    shell.wait_foreground(procs.pgid_of(tool_pid))
    release(go)
    shell.wait_foreground(leader)
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


# Hands the terminal over only once the file named by $CUE (a FIFO) is written to, then
# says so on stderr.
HANDOVER_ON_CUE = textwrap.dedent(
    """
    import os, sys
    from trio_proctree import _cli, _job_control

    hand_to = _job_control.Terminal.hand_to

    def on_cue(terminal, group):
        with open(os.environ["CUE"]) as cue:
            cue.read()
        hand_to(terminal, group)
        print("hand-over " "done", file=sys.stderr)

    _job_control.Terminal.hand_to = on_cue
    sys.exit(_cli.main(sys.argv[1:]))
    """
)


def test_a_tool_stopped_before_the_hand_over_and_sent_to_the_background_keeps_off_the_terminal(
    shell: InteractiveShell, tracked: Tracked, tmp_path: Path
) -> None:
    # Stopped before the hand-over (a SIGSTOP; a Ctrl-Z there is passed on after it), and
    # continued by bg in the background: its hand-over must then leave the terminal to
    # the shell. Red before: it took it (SIGTTOU ignored), and the shell exited.
    cue, wrapper = tmp_path / "cue", tmp_path / "on_cue.py"
    os.mkfifo(cue)
    wrapper.write_text(HANDOVER_ON_CUE)
    command = [*procs.python(), str(wrapper), "run", "--", "sh", "-c", READS_THE_TERMINAL]
    shell.type(f"CUE={shlex.quote(str(cue))} {shlex.join(command)}\n")
    leader = shell.said_pid(b"leader ")
    tool_pid = procs.stat_field(leader, 4)
    os.kill(tool_pid, signal.SIGSTOP)  # (ours, by pid)
    shell.expect(b"Stopped")
    shell.expect(b"$ ")
    shell.type("bg\n")
    shell.expect(b"$ ")
    release(cue)
    shell.expect(b"hand-over done")
    assert shell.foreground() == shell.bash.pid
    shell.type('echo "ali""ve"\n')
    shell.expect(b"alive")
    # Its read in the background stops it again; fg gives it the terminal at last.
    wait_until(lambda: "Stopped" in shell_jobs(shell), 10, "job stopped on its read")
    shell.type("fg\n")
    shell.wait_foreground(leader)
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_ctrl_z_stops_a_script_that_runs_the_tool_as_one_job(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # The script's shell is in the tool's group, waiting for it: the job is stopped only
    # once it is stopped too. Red before: the tool stopped alone, and the shell waited.
    run = run_line(READS_THE_TERMINAL)
    shell.type(f"""bash -c {shlex.quote(run + '; echo "af""ter"')}\n""")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)
    suspend(shell, leader)
    shell.type("fg\n")
    shell.wait_foreground(leader)
    shell.answer()
    shell.expect(b"after")
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_fg_continues_the_commands_group_not_members_stopped_elsewhere(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # As a shell continues a job: a member that stopped itself in a session of its own (a
    # nested shell's job, say) stays stopped. Red before: the whole tree was continued.
    member = 'echo "mem""ber $$"; kill -STOP $$; echo "resu""med"'
    # (The leader reads on, so that its exit cannot continue the member: the member's
    # group is orphaned then, and the kernel sends a stopped one SIGHUP and SIGCONT.)
    leader_script = f"setsid sh -c {shlex.quote(member)} & {READS_THE_TERMINAL}; read z"
    shell.type(run_line(leader_script) + "\n")
    stopped_member = shell.said_pid(b"member ")
    wait_until(lambda: procs.state(stopped_member) == "T", 10, "member stopped")
    leader = procs.stat_field(stopped_member, 4)
    shell.wait_foreground(leader)
    suspend(shell, leader)
    shell.type("fg\n")
    shell.wait_foreground(leader)
    shown = shell.answer()
    assert procs.state(stopped_member) == "T"
    assert b"resumed" not in shown
    shell.type("bye\n")
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_stopped_command_keeps_the_terminal_until_it_has_stopped(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # An editor stopped by --timeout or a stop request restores the terminal's settings
    # as it ends: only in the foreground can it. Red before: the terminal was taken back
    # first, its stty stopped (SIGTTOU), and the terminal was left without echo.
    # (At --timeout, as a stop request ends the tool by its signal, and bash restores the
    # terminal's settings after a job that a signal ended.)
    restores = 'trap "stty echo; exit 3" TERM; stty -echo; echo "lea""der $$"; sleep 60 & wait'
    shell.type(run_line(restores, "--timeout", "4", "--grace", "5") + "\n")
    shell.expect(b"leader ")
    shell.expect(b"$ ")
    shell.type('echo "sta""tus=$?"\n')
    shell.expect(b"status=124")
    shell.type('echo "ec""hoed"\n')
    shell.expect(b'echo "ec""hoed"')  # the terminal echoes what is typed again
    shell.expect(b"echoed")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_sigstop_with_no_shell_to_continue_the_tool_leaves_its_timeout_working(
    tracked: Tracked,
) -> None:
    # setsid -c: the tool leads a session on a terminal of its own, with no shell: its
    # group is orphaned, and a tool stopped there would never be continued. The command
    # stops itself by SIGSTOP. Red before: the tool followed that stop, stopped for good,
    # and its --timeout never came.
    master, terminal = os.openpty()
    command = [*tool(), "run", "--timeout", "1", "--grace", "0.2", "--", "sh", "-c"]
    try:
        runner = subprocess.Popen(
            ["setsid", "-c", *command, 'echo "lea""der $$"; kill -STOP $$; sleep 60'],
            stdin=terminal, stdout=terminal, stderr=terminal, env=tracked.env,
        )  # fmt: skip
    finally:
        os.close(terminal)
    try:
        shown = b""
        while b"leader " not in shown or not shown.endswith(b"\r\n"):
            ready, _, _ = select.select([master], [], [], 20)
            assert ready, f"no leader said: {shown!r}"
            shown += os.read(master, 4096)
        assert runner.wait(timeout=30) == 124
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        os.close(master)
    assert tracked.survivors() == []


@pytest.mark.parametrize("reads", [False, True], ids=["not-reading", "reading"])
def test_ctrl_c_stops_a_script_that_runs_the_tool_in_a_loop_at_a_terminal(
    shell: InteractiveShell, tracked: Tracked, reads: bool
) -> None:
    # bash stops a script on Ctrl-C only if it got SIGINT too. A command that never reads
    # the terminal leaves it to the script's group, which gets Ctrl-C; one that reads it
    # gets it (SIGTTIN, then the hand-over), and its death by Ctrl-C is passed on to the
    # script. Red before: the tree had the terminal from the start, and the loop went on.
    command = (
        'echo "lea""der $$"; read x; echo "go""t $x"' if reads else 'echo "lea""der $$"; sleep 60'
    )
    run = run_line(command)
    loop = f'for i in 1 2 3; do {run}; echo "it=$i"; done; echo "lo""op over"'
    shell.type(f"bash -c {shlex.quote(loop)}\n")
    leader = shell.said_pid(b"leader ")
    if reads:
        shell.wait_foreground(leader)
    else:
        wait_until(lambda: procs.state(leader) == "S", 10, "command running")
    shell.type(b"\x03")  # Ctrl-C
    shown = shell.expect(b"$ ")
    assert b"it=" not in shown
    assert b"loop over" not in shown
    assert shell.foreground() == shell.bash.pid
    assert tracked.survivors() == [shell.bash.pid]


IGNORES_CTRL_C = 'trap \'\' INT; echo "lea""der $$"; sleep 60'


def test_ctrl_c_reaches_a_python_program_that_runs_the_tool(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # subprocess.run(["trio-proctree", "run", ...], stdin=DEVNULL), as xargs runs it: the
    # caller shares the tool's group, and Ctrl-C is the caller's too, whatever the command
    # does with it (this one ignores it: the tool stops it). Red before: the tree took the
    # terminal, and the program carried on.
    program = textwrap.dedent(
        f"""
        import subprocess
        subprocess.run({[*tool(), "run", "--", "sh", "-c", IGNORES_CTRL_C]!r},
                       stdin=subprocess.DEVNULL)
        print("carried " "on")
        """
    )
    shell.type(shlex.join([*procs.python(), "-c", program]) + "\n")
    leader = shell.said_pid(b"leader ")
    wait_until(lambda: procs.state(leader) == "S", 10, "command running")
    shell.type(b"\x03")
    shown = shell.expect(b"$ ")
    assert b"KeyboardInterrupt" in shown
    assert b"carried on" not in shown
    assert tracked.survivors() == [shell.bash.pid]


def test_a_command_of_a_tool_in_the_background_stops_when_it_reads_the_terminal(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # `trio-proctree run -- cmd &`: a reader in the background stops (SIGTTIN), as any
    # job's does, until fg. Red before: the command, in a session of its own with the
    # terminal as stdin, read what was typed at the shell.
    shell.type(run_line(READS_THE_TERMINAL) + " &\n")
    leader = shell.said_pid(b"leader ")
    wait_until(lambda: "Stopped" in shell_jobs(shell), 10, "job stopped on its read")
    shell.type('echo "ali""ve"\n')
    shell.expect(b"alive")  # the shell's, not read by the command
    shell.type("fg\n")
    shell.wait_foreground(leader)
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_the_terminal_comes_back_from_a_job_of_a_shell_stopped_with_the_tree(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # The command is an interactive shell, which gives the terminal to a job of its own;
    # a stop request ends them all. The terminal must not be left to that dead job's
    # group: the script running the tool reads it next. Red before: its read stopped it.
    inner = 'PS1="inner> " exec bash --norc --noprofile --noediting -i'
    run = run_line(inner, "--grace", "0.2")
    script = f'{run}; read x; echo "go""t $x"'
    shell.type(f"bash -c {shlex.quote(script)}\n")
    shell.expect(b"inner> ")
    shell.type("""sh -c 'trap "" TERM; echo "lea""der $$"; sleep 100'\n""")
    job = shell.said_pid(b"leader ")
    shell.wait_foreground(job)
    inner_shell = procs.stat_field(job, 4)
    os.kill(procs.stat_field(inner_shell, 4), signal.SIGTERM)  # (the tool: ours, by pid)
    wait_until(lambda: procs.state(job) in (None, "Z"), 10, "job ended")
    shell.answer()
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_tool_leading_a_pipeline_leaves_the_terminal_to_the_pipeline(
    shell: InteractiveShell, tracked: Tracked, tmp_path: Path
) -> None:
    # `trio-proctree run -- git log | less` at a shell with job control: the tool leads
    # the pipeline's group, the job's. Handed to the tree, the terminal would be taken
    # from the reader beside it, whose read would stop it. The tree waits 0.5 s before it
    # lets the reader read: a hand-over, if any, is done by then.
    started, done = tmp_path / "started", tmp_path / "done"
    os.mkfifo(started)
    os.mkfifo(done)
    tree = f"sleep 0.5; echo > {started}; read x < {done}"
    reader = f'read x < {started}; read typed < /dev/tty; echo "go""t $typed"; echo > {done}'
    run = run_line(tree)
    shell.type(f"{run} | sh -c {shlex.quote(reader)}\n")
    shell.type("typed\n")  # (kept by the terminal for the reader: a line per read)
    shell.expect(b"got typed")
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]


def test_a_sigquit_the_tool_passed_on_is_no_ctrl_backslash_for_its_caller(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # `kill -QUIT` to the tool is passed on to its command (a JVM prints its threads):
    # one that dies of it, holding the terminal, got no key from the terminal. Red
    # before: it was taken for Ctrl-\\ and passed on to the script that ran the tool
    # (whose trap said so), and the tool ended by SIGQUIT (bash said "Quit"), not 131.
    run = run_line(READS_THE_TERMINAL)
    script = f'trap \'echo "QU""IT caught"\' QUIT; {run}; echo "af""ter=$?"'
    shell.type(f"bash -c {shlex.quote(script)}\n")
    leader = shell.said_pid(b"leader ")
    shell.wait_foreground(leader)
    tool_pid = procs.stat_field(leader, 4)  # (its parent: the tool, our grandchild)
    procs.remember(tool_pid)
    os.kill(tool_pid, signal.SIGQUIT)
    shown = shell.expect(b"after=131")
    shown += shell.expect(b"$ ")
    assert b"QUIT caught" not in shown
    assert b"Quit" not in shown  # (bash's word for a child that died of SIGQUIT)
    assert tracked.survivors() == [shell.bash.pid]


def test_a_command_that_dies_of_sigint_away_from_the_terminal_is_no_ctrl_c(
    shell: InteractiveShell, tracked: Tracked
) -> None:
    # Only a tree that had the terminal got a Ctrl-C: one that kills itself with SIGINT
    # while the script has the terminal is not passed on, and the script goes on.
    run = run_line("kill -INT $$")
    shell.type(f"""bash -c {shlex.quote(run + '; echo "af""ter=$?"')}\n""")
    shell.expect(b"after=130")
    shell.expect(b"$ ")
    assert tracked.survivors() == [shell.bash.pid]
