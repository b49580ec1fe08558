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
from trio_proctree._cgroupfs import own_cgroup
from trio_proctree._exec_check import exec_path
from trio_proctree._spawn import MARKER_PREFIX, joining_first

from . import procs
from .conftest import Tracked, kernel_refuses
from .test_containment import available

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
    for name, value in SHELL_MANGLED[variables].items():
        monkeypatch.setenv(name, value)
    tracked.mark_this_process(monkeypatch)
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


@pytest.mark.parametrize("variables", ["inherited", "given", "not-shell-names"])
async def test_a_removed_working_directory_adds_nothing_popen_would_not_show(
    tracked: Tracked,
    contained: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    variables: str,
) -> None:
    # A program started in a directory since removed runs there under Popen, with nothing
    # said. Red before under cgroup through /bin/sh: the wrapper shell, unable to find its
    # directory's name, printed "sh: 0: getcwd() failed" into the command's stderr.
    removed = tmp_path / "removed"
    removed.mkdir()
    held = os.open(removed, os.O_RDONLY | os.O_DIRECTORY)
    try:
        removed.rmdir()
        # The directory, reached through the descriptor that holds it (chdir follows it).
        cwd = f"/proc/{os.getpid()}/fd/{held}"
        if variables == "inherited":
            for name, value in procs.set_behind_os_environs_back().items():
                monkeypatch.setenv(name, value)  # (as the test of the inherited one above)
            tracked.mark_this_process(monkeypatch)
            env = None
        else:
            env = {**contained["env"], **SHELL_MANGLED.get(variables, {})}
        command = ["/usr/bin/env", "-0"]
        popen = await trio.run_process(
            command, cwd=cwd, env=env, capture_stdout=True, capture_stderr=True
        )
        ours = await run_process_tree(
            command,
            capture_stdout=True,
            capture_stderr=True,
            cwd=cwd,
            env=env,
            containment=contained["containment"],
        )
    finally:
        os.close(held)
    assert (received_environment(ours.stdout), ours.stderr) == (
        received_environment(popen.stdout),
        b"",
    )
    assert popen.stderr == b""
    assert tracked.survivors() == []


@kernel_refuses
async def test_an_argument_list_too_long_names_the_program_as_popen_does(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before under cgroup through /bin/sh (helper-70): the error named "/bin/sh", the
    # wrapper whose exec failed. (The wrapper takes a few hundred bytes of the kernel's
    # bound for itself: documented.)
    command = ["true", *["x" * 1000] * 3000]
    with pytest.raises(OSError) as popen:
        await trio.run_process(command)  # the oracle
    with pytest.raises(OSError) as ours:
        await run_process_tree(command, **contained)
    assert (ours.value.errno, ours.value.filename) == (popen.value.errno, "true")
    assert tracked.survivors() == []


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


#: Environments no shell passes on, and one that only Popen's own exec does: one name
#: given as str and as bytes (both go, in order). (Not an empty name: Popen passes one
#: where it forks, and refuses it where it uses posix_spawn, as 3.13 does here.)
NAMED_APART_ENVIRONMENTS: dict[str, dict[Any, Any]] = {
    **SHELL_MANGLED,
    "str-and-bytes": {"TWICE": "as str", b"TWICE": b"as bytes"},
}


def received_entries(output: bytes) -> list[bytes]:
    """What ``env -0`` printed, entry by entry, but for subreaper containment's marker."""
    return [
        entry
        for entry in output.split(b"\0")
        if entry and not entry.startswith(MARKER_PREFIX.encode())
    ]


@pytest.mark.parametrize("variables", list(NAMED_APART_ENVIRONMENTS))
async def test_a_command_named_apart_gets_the_environment_popen_gives(
    tracked: Tracked, contained: dict[str, Any], variables: str
) -> None:
    # Started by Popen itself (it joins its cgroup in a preexec_fn), it gets what Popen
    # passes, as Popen passes it. (Red against a first form, which started it through a
    # Python of ours: an empty name killed it there, helper-72.)
    env = {**contained["env"], **NAMED_APART_ENVIRONMENTS[variables]}
    command = ["named apart", "-0"]
    options: dict[str, Any] = {"executable": "/usr/bin/env", "env": env}
    oracle = await trio.run_process(command, capture_stdout=True, **options)
    result = await run_process_tree(
        command, capture_stdout=True, containment=contained["containment"], **options
    )
    assert received_entries(result.stdout) == received_entries(oracle.stdout)
    assert tracked.survivors() == []


@pytest.mark.parametrize("ours", ["ignored", "default"])
@pytest.mark.parametrize("restore_signals", [True, False])
async def test_a_command_named_apart_gets_the_signal_dispositions_popen_gives(
    tracked: Tracked, contained: dict[str, Any], restore_signals: bool, ours: str
) -> None:
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays so across an exec:
    # Popen gives them back their defaults unless told not to (`restore_signals`), and
    # then passes on ours, ignored or not. (Red against the first form, with ours at
    # their defaults and restore_signals=False: helper-72.)
    command = ["named apart", "^SigIgn", "/proc/self/status"]
    options: dict[str, Any] = {"executable": "/bin/grep", "restore_signals": restore_signals}
    handler = signal.SIG_IGN if ours == "ignored" else signal.SIG_DFL
    kept = {sig: signal.signal(sig, handler) for sig in (signal.SIGPIPE, signal.SIGXFSZ)}
    try:
        oracle = await trio.run_process(command, capture_stdout=True, **options)
        result = await run_process_tree(command, capture_stdout=True, **options, **contained)
    finally:
        for sig, before in kept.items():
            signal.signal(sig, before)
    # Signals 1 to 31: a child of Popen's posix_spawn (3.13 uses it here, where the one
    # started with a preexec_fn is forked) shows glibc's own two (32, 33) ignored.
    oracle_ignores, ignores = (
        int(out.split()[1], 16) & 0x7FFFFFFF for out in (oracle.stdout, result.stdout)
    )
    assert ignores == oracle_ignores
    assert (ignores >> (signal.SIGPIPE - 1) & 1) == (ours == "ignored" and not restore_signals)
    assert tracked.survivors() == []


@pytest.mark.parametrize(
    ("procs", "status"), [("/dev/full", 125), ("/nonexistent/cgroup.procs", None)]
)
def test_a_leader_that_cannot_join_its_cgroup_in_its_preexec_fn_ends_as_the_wrapper_does(
    procs: str, status: int | None
) -> None:
    # As the /bin/sh wrapper: status 125 and a message (ENOSPC writing to /dev/full, here,
    # where a cgroup.procs write fails as the cgroup goes); one that cannot even be opened
    # raises before anything is started.
    options: dict[str, Any] = {}
    if status is None:
        with pytest.raises(FileNotFoundError), joining_first(procs, options):
            pytest.fail("entered")
        assert options == {}
        return
    with joining_first(procs, options):
        result = subprocess.run(["true"], capture_output=True, check=False, timeout=60, **options)
    assert (result.returncode, result.stdout) == (status, b"")
    assert result.stderr == b"trio_proctree: cannot join cgroup /dev\n"


@pytest.mark.parametrize("named", ["as its file", "apart"])
async def test_a_programs_preexec_fn_runs_in_its_cgroup(tracked: Tracked, named: str) -> None:
    # The join comes first in the child, then the program's own preexec_fn, as a leader
    # started directly in its cgroup runs it there: what it forks is in the tree. Red
    # before for a command named as its file, whose wrapper joined after the preexec_fn.
    available("cgroup")
    command, executable = (
        (["sleep", "60"], None) if named == "as its file" else (["named apart", "60"], "/bin/sleep")
    )
    said, told = os.pipe()
    try:
        async with open_process_tree(
            command,
            executable=executable,
            preexec_fn=lambda: os.write(told, Path("/proc/self/cgroup").read_bytes()),
            env=tracked.env,
            containment="cgroup",
        ) as tree:
            os.close(told)
            told = -1
            seen = own_cgroup(os.read(said, 4096).decode())
            tree_cgroup = tree._core.containment._relative  # type: ignore[attr-defined]
            assert seen == tree_cgroup  # (not the leader's now: a wrapper may still join)
    finally:
        os.close(said)
        if told != -1:
            os.close(told)
    assert tracked.survivors() == []


@pytest.mark.parametrize("path", ["/usr/bin:/bin", "", ":/opt/x::", None])
def test_our_path_is_read_as_popen_reads_it(
    monkeypatch: pytest.MonkeyPatch, path: str | None
) -> None:
    # Read directly (os.get_exec_path enters a warnings filter at each call): the entries
    # are os.get_exec_path's, with no PATH at all too (its default then).
    if path is None:
        monkeypatch.delenv("PATH", raising=False)
    else:
        monkeypatch.setenv("PATH", path)
    assert exec_path(None) == os.get_exec_path(None)
    given: Any = {"PATH": "/given"} if path is None else {b"PATH": os.fsencode(path)}
    assert exec_path(given) == os.get_exec_path(given)
