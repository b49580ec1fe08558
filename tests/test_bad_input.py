"""Bad input fails before anything is started, with a clear error, and leaks nothing."""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trio_proctree import _spawn, _watchdog, open_process_tree, run_process_tree

from . import procs
from .conftest import Tracked


def our_children() -> set[int]:
    """Our children, but for the one watchdog process trio_proctree keeps per process."""
    return procs.children_of_self() - {watchdog.pid for watchdog in _watchdog.running()}


@pytest.fixture
def nothing_leaks() -> Any:
    _watchdog.ensure_started()  # (started by the first tree anyway; its pipe is one fd)
    children, fds = our_children(), procs.open_fds()
    yield
    assert our_children() == children
    assert procs.open_fds() == fds


def _open(command: Any, **kwargs: Any) -> Callable[[], Any]:
    async def enter() -> None:
        async with open_process_tree(command, **kwargs):
            pytest.fail("a bad request must not start anything")

    return enter


def _run(command: Any, **kwargs: Any) -> Callable[[], Any]:
    async def run() -> None:
        await run_process_tree(command, **kwargs)

    return run


BAD_REQUESTS = [
    pytest.param([], {}, ValueError, "empty", id="empty-list"),
    pytest.param("   ", {"shell": True}, ValueError, "empty", id="empty-shell-string"),
    pytest.param([""], {}, ValueError, "empty", id="empty-program"),
    pytest.param("sleep 1", {}, TypeError, "sequence", id="string-without-shell"),
    pytest.param(["sleep", "1"], {"shell": True}, TypeError, "string", id="list-with-shell"),
    pytest.param(["sleep", 1], {}, TypeError, "arguments", id="non-string-argument"),
    pytest.param(["sleep", "1"], {"grace": -1}, ValueError, "grace", id="negative-grace"),
    pytest.param(["sleep", "1"], {"grace": math.nan}, ValueError, "grace", id="nan-grace"),
    pytest.param(["sleep", "1"], {"grace": math.inf}, ValueError, "grace", id="inf-grace"),
    pytest.param(["sleep", "1"], {"stop_signal": 0}, ValueError, "signal", id="signal-0"),
    pytest.param(["sleep", "1"], {"stop_signal": 12345}, ValueError, "signal", id="signal-12345"),
    pytest.param(["sleep", "1"], {"stop_signal": "SIGFOO"}, ValueError, "signal", id="signal-name"),
    pytest.param(
        ["sleep", "1"], {"stop_signal": signal.SIGSTOP}, ValueError, "SIGSTOP", id="sigstop"
    ),
    pytest.param(["sleep", "1"], {"text": True}, TypeError, "text", id="text-mode"),
    # Popen's old recipes for a group of its own: the leader has one already, and its own
    # setsid()/setpgid() would fail in the child with an opaque "preexec_fn" error.
    pytest.param(["true"], {"preexec_fn": os.setsid}, ValueError, "setsid", id="preexec-setsid"),
    pytest.param(["true"], {"preexec_fn": os.setpgrp}, ValueError, "setpgrp", id="preexec-setpgrp"),
    pytest.param(
        ["no-such-program-xyz"], {}, FileNotFoundError, "no-such-program-xyz", id="missing"
    ),
    pytest.param(["/no/such/dir/prog"], {}, FileNotFoundError, "prog", id="missing-path"),
    pytest.param(["true"], {"cwd": "/no/such/dir"}, FileNotFoundError, "directory", id="bad-cwd"),
    pytest.param(  # as subprocess says it (chdir's ENOTDIR): the path exists
        ["true"], {"cwd": "/etc/passwd"}, NotADirectoryError, "not a directory", id="file-cwd"
    ),
    pytest.param(
        ["true"],
        {"cwd": "/etc/passwd/sub"},
        NotADirectoryError,
        "not a directory",
        id="file-on-the-way",
    ),
    pytest.param(
        ["sleep"], {"env": {"PATH": "/nonexistent"}}, FileNotFoundError, "PATH", id="env-path"
    ),
]


@pytest.mark.parametrize("entry", [_open, _run], ids=["open_process_tree", "run_process_tree"])
@pytest.mark.parametrize(("command", "kwargs", "error", "message"), BAD_REQUESTS)
async def test_bad_request_fails_early_and_leaks_nothing(
    nothing_leaks: None,
    entry: Callable[..., Callable[[], Any]],
    command: Any,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        await entry(command, **kwargs)()


@pytest.fixture
def not_executable(tmp_path: Path) -> Path:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    return script


@pytest.mark.parametrize("entry", [_open, _run], ids=["open_process_tree", "run_process_tree"])
async def test_file_that_is_not_executable_raises_permission_error(
    nothing_leaks: None, entry: Callable[..., Callable[[], Any]], not_executable: Path
) -> None:
    with pytest.raises(PermissionError, match=r"script\.sh"):
        await entry([str(not_executable)])()
    with pytest.raises(PermissionError, match=r"script\.sh"):
        await entry(["script.sh"], env={"PATH": str(not_executable.parent)})()


#: #! lines whose interpreter the kernel does not find, and the name it looks for.
MISSING_INTERPRETERS = {
    "missing": (b"#! /nonexistent/interpreter -x\n", "/nonexistent/interpreter"),
    "saved-with-crlf": (b"#!/bin/sh\r\n", "/bin/sh\r"),
}


@pytest.mark.parametrize("case", list(MISSING_INTERPRETERS))
@pytest.mark.parametrize("entry", [_open, _run], ids=["open_process_tree", "run_process_tree"])
async def test_a_script_whose_interpreter_is_missing_raises_file_not_found(
    nothing_leaks: None,
    entry: Callable[..., Callable[[], Any]],
    tmp_path: Path,
    contained: dict[str, Any],
    case: str,
) -> None:
    # As subprocess raises it, from the kernel's ENOENT (a #!/bin/bash on a system
    # without bash; a script saved with CRLF line ends, whose interpreter is "/bin/sh\r").
    # Red before under cgroup containment through /bin/sh, which runs the command with
    # sh's exec: exit status 127, and a message naming the wrapper's cgroup.procs.
    line, interpreter = MISSING_INTERPRETERS[case]
    script = tmp_path / "tool"
    script.write_bytes(line + b"echo hi\n")
    script.chmod(0o755)
    with pytest.raises(FileNotFoundError) as raised:
        await entry([str(script)], **contained)()
    assert f"no such interpreter {interpreter!r}" in str(raised.value)
    assert raised.value.filename == str(script)


async def test_a_script_whose_interpreter_is_there_runs(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # The kernel's reading of a #! line, not a looser one: spaces and tabs around the
    # name, its arguments, and a NUL ending the line early all leave /bin/sh to run it.
    script = tmp_path / "tool"
    script.write_bytes(b"#! \t/bin/sh\t-e\0 ignored\necho ran\n")
    script.chmod(0o755)
    result = await run_process_tree([str(script)], capture_stdout=True, **contained)
    assert result.stdout == b"ran\n"
    assert tracked.survivors() == []


#: Executable files of no format the kernel runs (with no binfmt_misc handler registered):
#: execve fails with ENOEXEC, and Popen raises it. The text, were it run by a shell,
#: would leave a mark.
NOT_PROGRAMS = {
    "text-without-#!": b"touch {mark}\n",
    "empty": b"",
    "bytes": b"\0\1\2 not a program\ntouch {mark}\n",
}


@pytest.mark.skipif(
    _spawn.binfmt_misc_handlers(), reason="binfmt_misc handlers may run any file: exec decides"
)
@pytest.mark.parametrize("case", list(NOT_PROGRAMS))
@pytest.mark.parametrize("entry", [_open, _run], ids=["open_process_tree", "run_process_tree"])
async def test_an_executable_file_that_is_no_program_raises_exec_format_error(
    nothing_leaks: None,
    entry: Callable[..., Callable[[], Any]],
    tmp_path: Path,
    contained: dict[str, Any],
    case: str,
) -> None:
    # As subprocess raises it, from the kernel's ENOEXEC, under every containment. Red
    # before under cgroup containment through /bin/sh: sh's exec runs a file the kernel
    # cannot as a shell script (POSIX asks it to), so the text of a file that was never
    # meant to run ran as shell commands (and an empty file "succeeded"), where the other
    # containments, and the same code on another machine, raised.
    mark = tmp_path / "ran"
    tool = tmp_path / "tool"
    tool.write_bytes(NOT_PROGRAMS[case].replace(b"{mark}", bytes(mark)))
    tool.chmod(0o755)
    with pytest.raises(OSError) as raised:
        await entry([str(tool)], **contained)()
    assert raised.value.errno == errno.ENOEXEC
    assert raised.value.filename == str(tool)
    assert not mark.exists()


def test_a_registered_binfmt_misc_handler_leaves_the_file_to_the_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Such a handler may run a file by any bytes or by its name (a .jar, a .exe): trio_proctree
    # cannot tell, and refuses nothing then. (A stand-in for the mounted file system: no
    # test may register a handler, which would change how every exec on the machine runs.)
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir()
    (binfmt / "register").write_text("")
    monkeypatch.setattr(_spawn, "BINFMT_MISC", str(binfmt))
    assert _spawn.binfmt_misc_handlers() == []  # no status: not mounted
    (binfmt / "status").write_text("enabled\n")
    (binfmt / "jar").write_text("disabled\ninterpreter /usr/bin/jexec\n")
    assert _spawn.binfmt_misc_handlers() == []  # one, switched off
    (binfmt / "wine").write_text("enabled\ninterpreter /usr/bin/wine\nextension .exe\n")
    assert _spawn.binfmt_misc_handlers() == ["wine"]
    tool = tmp_path / "tool.exe"
    tool.write_bytes(b"MZ not a Linux program\n")
    tool.chmod(0o755)
    open_process_tree([str(tool)])  # checked, and not refused: the exec decides
    (binfmt / "status").write_text("disabled\n")
    assert _spawn.binfmt_misc_handlers() == []
    with pytest.raises(OSError) as raised:
        open_process_tree([str(tool)])
    assert raised.value.errno == errno.ENOEXEC


async def test_directory_is_not_an_executable(nothing_leaks: None, tmp_path: Path) -> None:
    with pytest.raises(PermissionError):
        await _open([str(tmp_path)])()


async def test_path_search_passes_over_what_is_not_executable(tmp_path: Path) -> None:
    # As Popen's exec does: missing, a directory, a file without the x bit: the next entry.
    (tmp_path / "missing").mkdir()
    (tmp_path / "folder" / "prog").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "prog").write_text("#!/bin/sh\necho plain\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "prog").write_text("#!/bin/sh\necho runs\n")
    (tmp_path / "runs" / "prog").chmod(0o755)
    path = os.pathsep.join(str(tmp_path / name) for name in ("missing", "folder", "plain", "runs"))
    result = await run_process_tree(["prog"], env={"PATH": path}, capture_stdout=True)
    assert result.stdout == b"runs\n"


@pytest.mark.parametrize("then", ["removed", "made-plain"])
async def test_a_program_found_before_is_looked_for_again_once_gone(
    nothing_leaks: None, tmp_path: Path, then: str
) -> None:
    # Where a command was found on PATH is kept (one stat then, not one per entry), and
    # checked again each time: gone or no longer executable, the search starts over and
    # the error comes before anything is started.
    program = tmp_path / "prog"
    program.write_text("#!/bin/sh\necho here\n")
    program.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    assert (await run_process_tree(["prog"], env=env, capture_stdout=True)).stdout == b"here\n"
    if then == "removed":
        program.unlink()
        with pytest.raises(FileNotFoundError, match="prog"):
            await _open(["prog"], env=env)()
    else:
        program.chmod(0o644)
        with pytest.raises(PermissionError, match="prog"):
            await _open(["prog"], env=env)()


async def test_relative_program_is_found_from_cwd(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho from-cwd\n")
    script.chmod(0o755)
    result = await run_process_tree(["./run.sh"], cwd=tmp_path, capture_stdout=True)
    assert result.stdout == b"from-cwd\n"


@pytest.mark.parametrize("containment", ["cgroup", "subreaper", "group"])
async def test_a_spawn_failing_after_the_checks_leaks_nothing(
    nothing_leaks: None, containment: str
) -> None:
    # A preexec_fn that fails passes every early check; Popen then fails in the child,
    # after the containment was made: it must be released, and Popen's error kept.
    def fail() -> None:
        raise RuntimeError("in the child")

    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        await _open(["true"], preexec_fn=fail, containment=containment)()


def test_errors_come_from_the_call_itself_before_any_await() -> None:
    # open_process_tree() checks eagerly: no event loop, nothing started.
    with pytest.raises(FileNotFoundError):
        open_process_tree(["no-such-program-xyz"])
    with pytest.raises(ValueError, match="grace"):
        open_process_tree(["true"], grace=-1)
