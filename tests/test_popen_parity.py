"""The command runs as `subprocess.Popen` would run it, under every containment: the same
file, found the same way, with the same environment and the same process group."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_proctree import open_process_tree, run_process_tree
from trio_proctree._spawn import MARKER_PREFIX
from trio_proctree._through_sh import NAMED_APART_EXEC

from . import procs
from .conftest import Tracked, kernel_refuses

#: Variables a POSIX shell does not pass on as it got them: names that are no shell
#: identifier (dropped), and those the shell sets itself (IFS, OPTIND, PPID).
SHELL_MANGLED = {
    "not-shell-names": {"FOO-BAR": "1", "my.setting": "dotted", "1X": "leading digit"},
    "set-by-the-shell": {"IFS": ":", "OPTIND": "5", "PPID": "42", "LINES": "two\nlines"},
}


def received_environment(output: bytes) -> dict[str, str]:
    """What ``env -0`` printed, but for the marker subreaper containment adds (documented:
    how it knows the tree's escapees)."""
    entries = [os.fsdecode(entry).split("=", 1) for entry in output.split(b"\0") if entry]
    return {name: value for name, value in entries if not name.startswith(MARKER_PREFIX)}


@pytest.mark.parametrize("variables", list(SHELL_MANGLED))
async def test_the_environment_reaches_the_command_unchanged(
    tracked: Tracked, contained: dict[str, Any], variables: str
) -> None:
    # Red before under cgroup containment through /bin/sh (helper-20): the wrapper shell
    # dropped FOO-BAR and my.setting, reset IFS and OPTIND, and put its own pid in PPID.
    env = {**contained["env"], **SHELL_MANGLED[variables]}
    result = await run_process_tree(
        ["/usr/bin/env", "-0"], capture_stdout=True, env=env, containment=contained["containment"]
    )
    assert received_environment(result.stdout) == env
    assert tracked.survivors() == []


@pytest.mark.parametrize("variables", list(SHELL_MANGLED))
async def test_the_inherited_environment_reaches_the_command_unchanged(
    tracked: Tracked, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch, variables: str
) -> None:
    # env=None: what this process has, as Popen passes it on. (Variables C code set behind
    # os.environ's back are put into it first: documented, and not this test's concern.
    # GNU readline sets LINES and COLUMNS so where TERM names a terminal, and pytest
    # imports it: this test failed run from a terminal.)
    for name, value in procs.set_behind_os_environs_back().items():
        monkeypatch.setenv(name, value)
    for name, value in {**SHELL_MANGLED[variables], procs.TOKEN_VAR: tracked.token}.items():
        monkeypatch.setenv(name, value)
    result = await run_process_tree(
        ["/usr/bin/env", "-0"], capture_stdout=True, containment=contained["containment"]
    )
    assert received_environment(result.stdout) == dict(os.environ)
    assert tracked.survivors() == []


async def test_a_large_environment_that_sh_cannot_pass_on_runs_as_under_popen(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # ~1.2 MB of variables and one name that is no shell identifier: Popen runs it. Red
    # before under cgroup through /bin/sh (helper-23): the environment went to the wrapper
    # twice, as its environment and as env(1)'s arguments, and the exec failed (E2BIG).
    env = {**contained["env"], "A-B": "1"}
    env.update({f"V{index}": "x" * 1000 for index in range(1200)})
    await trio.run_process(["/bin/true"], env=env)  # the oracle
    result = await run_process_tree(
        ["/usr/bin/env", "-0"], capture_stdout=True, env=env, containment=contained["containment"]
    )
    assert received_environment(result.stdout) == env
    assert tracked.survivors() == []


@kernel_refuses
async def test_a_refused_file_that_appears_earlier_on_path_is_passed_over_as_popen_does(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # Where a program was found is remembered; a file the kernel refuses that appears
    # earlier on PATH afterwards must still be passed over, as Popen's search does. Red
    # before under cgroup through /bin/sh (helper-20): the remembered answer said nothing
    # was passed over, so sh's search was trusted, and it ran the new file as a script.
    mark = tmp_path / "ran"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "tool").write_bytes(b"#!/bin/sh\necho second\n")
    (second / "tool").chmod(0o755)
    env = {**contained["env"], "PATH": f"{first}:{second}:{os.environ['PATH']}"}
    kwargs: dict[str, Any] = {"capture_stdout": True, **contained, "env": env}
    assert (await run_process_tree(["tool"], **kwargs)).stdout == b"second\n"
    (first / "tool").write_bytes(b"touch " + bytes(mark) + b"\n")  # no format the kernel runs
    (first / "tool").chmod(0o755)
    popen = await trio.run_process(["tool"], env=env, capture_stdout=True)
    assert popen.stdout == b"second\n"
    assert (await run_process_tree(["tool"], **kwargs)).stdout == b"second\n"
    assert not mark.exists()
    assert tracked.survivors() == []


#: Runs in a private mount namespace where /usr/local/bin has an `id` of its own, which a
#: search of sh's default PATH (dash's starts with /usr/local/sbin:/usr/local/bin) finds
#: before /usr/bin/id, and Popen's (os.defpath, "/bin:/usr/bin") does not.
WITHOUT_PATH = """
import sys, trio
from trio_proctree import run_process_tree

async def main():
    popen = __import__("subprocess").run(["id", "-u"], env={}, capture_output=True)
    tree = await run_process_tree(
        ["id", "-u"], env={}, capture_stdout=True, containment=sys.argv[1]
    )
    print(popen.stdout.decode().strip(), tree.stdout.decode().strip())

trio.run(main)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
async def test_without_path_the_search_is_popens_default(
    tmp_path: Path, contained: dict[str, Any]
) -> None:
    # Red before under cgroup through /bin/sh (helper-20): with no PATH in the
    # environment, sh searched its own default and ran /usr/local/bin/id.
    fake = tmp_path / "local-bin"
    fake.mkdir()
    (fake / "id").write_text("#!/bin/sh\necho fake\n")
    (fake / "id").chmod(0o755)
    script = tmp_path / "without_path.py"
    script.write_text(WITHOUT_PATH)
    shell = (
        f"mount --bind {fake} /usr/local/bin && "
        f"exec {sys.executable} {script} {contained['containment']}"
    )
    result = await trio.run_process(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        env=contained["env"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.split() == [str(os.geteuid()).encode()] * 2


async def test_process_group_0_keeps_the_callers_session_as_popen_does(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Popen(process_group=0): a group of its own, in the caller's session. Red before
    # (helper-20): accepted, and the tree got a new session anyway.
    async with open_process_tree(["sleep", "60"], process_group=0, **contained) as tree:
        assert procs.pgid_of(tree.pid) == tree.pid
        assert os.getsid(tree.pid) == os.getsid(0)
    assert tracked.survivors() == []


async def test_executable_runs_with_the_name_given_as_argv0_as_under_popen(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Popen(args, executable=X) runs X with args[0] as its argv[0]: a multi-call program
    # (busybox), a login shell ("-sh") or Python finding its prefix from argv[0] acts on
    # it. Red before under cgroup through /bin/sh: argv[0] was X, as sh's exec cannot set
    # it apart.
    command = ["-named apart", "-c", "import sys; print(sys.orig_argv[0])"]
    oracle = await trio.run_process(command, executable=sys.executable, capture_stdout=True)
    assert oracle.stdout == b"-named apart\n"
    result = await run_process_tree(
        command, executable=sys.executable, capture_stdout=True, **contained
    )
    assert result.stdout == oracle.stdout
    assert tracked.survivors() == []


@pytest.mark.parametrize("variables", list(SHELL_MANGLED))
async def test_a_command_named_apart_gets_the_environment_unchanged(
    tracked: Tracked, contained: dict[str, Any], variables: str
) -> None:
    # The way in that gives the command a name of its own passes the environment as well.
    env = {**contained["env"], **SHELL_MANGLED[variables]}
    result = await run_process_tree(
        ["named apart", "-0"],
        executable="/usr/bin/env",
        capture_stdout=True,
        env=env,
        containment=contained["containment"],
    )
    assert received_environment(result.stdout) == env
    assert tracked.survivors() == []


@pytest.mark.parametrize("restore_signals", [True, False])
async def test_a_command_named_apart_gets_the_signal_dispositions_popen_gives(
    tracked: Tracked, contained: dict[str, Any], restore_signals: bool
) -> None:
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays so across an exec:
    # Popen gives them back their defaults unless told not to (`restore_signals`).
    command = ["named apart", "^SigIgn", "/proc/self/status"]
    options: dict[str, Any] = {"executable": "/bin/grep", "restore_signals": restore_signals}
    oracle = await trio.run_process(command, capture_stdout=True, **options)
    result = await run_process_tree(command, capture_stdout=True, **options, **contained)
    assert result.stdout == oracle.stdout
    assert (int(oracle.stdout.split()[1], 16) >> (signal.SIGPIPE - 1) & 1) != restore_signals
    assert tracked.survivors() == []


@pytest.mark.parametrize(
    ("procs", "file", "status", "said"),
    [
        ("/nonexistent/cgroup.procs", "/bin/true", 125, b"cannot join cgroup /nonexistent"),
        ("/dev/null", "/nonexistent/program", 127, b"cannot exec /nonexistent/program"),
        ("/dev/null", "/dev/null", 126, b"cannot exec /dev/null"),
    ],
)
def test_the_way_in_for_a_command_named_apart_fails_as_the_shell_wrapper_does(
    procs: str, file: str, status: int, said: bytes
) -> None:
    # Its exit statuses are those of the /bin/sh wrapper: 125 when the cgroup cannot be
    # joined (as env(1) and timeout(1) fail themselves), 126 or 127 when the exec fails.
    # (A tree's start looks at the file first: these are races, or a cgroup removed.)
    result = subprocess.run(
        [sys.executable, "-c", NAMED_APART_EXEC, procs, "1", file, "0", "named apart"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (status, b"")
    assert said in result.stderr, result.stderr
