"""Bad input fails before anything is started, with a clear error, and leaks nothing."""

from __future__ import annotations

import asyncio
import errno
import io
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_proctree
import trio_proctree.asyncio
from trio_proctree import _exec_check, _watchdog, open_process_tree, run_process_tree

from . import procs
from .conftest import Tracked, kernel_refuses


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
    pytest.param(["sleep", "1"], {"grace": 10**400}, ValueError, "grace", id="huge-grace"),
    pytest.param(["sleep", "1"], {"grace": -(10**400)}, ValueError, "negative", id="huge-negative"),
    pytest.param(["true"], {"process_group": 0.0}, TypeError, "process_group", id="float-group"),
    pytest.param(["sleep", "1"], {"stop_signal": 0}, ValueError, "signal", id="signal-0"),
    pytest.param(["sleep", "1"], {"stop_signal": 12345}, ValueError, "signal", id="signal-12345"),
    pytest.param(["sleep", "1"], {"stop_signal": "SIGFOO"}, ValueError, "signal", id="signal-name"),
    pytest.param(
        ["sleep", "1"], {"stop_signal": signal.SIGSTOP}, ValueError, "SIGSTOP", id="sigstop"
    ),
    pytest.param(["sleep", "1"], {"text": True}, TypeError, "text", id="text-mode"),
    pytest.param(  # (trio.run_process's: the escalation stands for it here)
        ["true"],
        {"deliver_cancel": None},
        TypeError,
        r"deliver_cancel.* escalation=",
        id="deliver-cancel",
    ),
    # Popen's old recipes for a group of its own: the leader has one already, and its own
    # setsid()/setpgid() would fail in the child with an opaque "preexec_fn" error.
    pytest.param(["true"], {"preexec_fn": os.setsid}, ValueError, "setsid", id="preexec-setsid"),
    pytest.param(["true"], {"preexec_fn": os.setpgrp}, ValueError, "setpgrp", id="preexec-setpgrp"),
    pytest.param(
        ["no-such-program-xyz"], {}, FileNotFoundError, "no-such-program-xyz", id="missing"
    ),
    pytest.param(["/no/such/dir/prog"], {}, FileNotFoundError, "prog", id="missing-path"),
    pytest.param(  # (red before, helper-61: FileNotFoundError, where Popen's exec says ENOTDIR)
        ["/etc/passwd/x"], {}, NotADirectoryError, "Not a directory", id="path-through-a-file"
    ),
    pytest.param(  # (red before, helper-62: Popen reports the last place's ENOTDIR)
        ["x"],
        {"env": {"PATH": "/no/such/dir:/etc/passwd"}},
        NotADirectoryError,
        "Not a directory",
        id="path-ending-with-a-file",
    ),
    pytest.param(  # (as Popen does: the last place's ENOENT)
        ["x"],
        {"env": {"PATH": "/etc/passwd:/no/such/dir"}},
        FileNotFoundError,
        "no such executable on PATH",
        id="path-ending-with-nothing",
    ),
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
    pytest.param(  # (red before, helper-55: Popen's KeyError, once the tree was starting)
        ["true"],
        {"extra_groups": ["no-such-group-xyz"]},
        ValueError,
        "'no-such-group-xyz': no such group",
        id="unknown-extra-group",
    ),
    # Stream options Popen cannot take: red before (helper-55), an AttributeError naming
    # fileno, or an EBADF from the child, once the tree was starting.
    pytest.param(["true"], {"stdout": b"x"}, TypeError, "stdout must be a file", id="bytes-out"),
    pytest.param(["true"], {"stderr": 1.5}, TypeError, "not float", id="float-stderr"),
    pytest.param(["true"], {"stdout": True}, TypeError, "not bool", id="bool-stdout"),
    pytest.param(
        ["true"],
        {"stdout": subprocess.STDOUT},
        OSError,
        "Bad file descriptor: stdout=-2",
        id="out-to-out",
    ),
    pytest.param(
        ["true"], {"stderr": -5}, OSError, "Bad file descriptor: stderr=-5", id="negative-fd"
    ),
    pytest.param(
        ["true"], {"stderr": 987654}, OSError, "descriptor: stderr=987654", id="closed-fd"
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


@pytest.mark.parametrize("given", [b"data", "data"], ids=["bytes", "str"])
async def test_input_given_to_open_process_tree_as_its_stdin_says_where_it_belongs(
    nothing_leaks: None, given: Any
) -> None:
    # Red before (helper-55): "'bytes' object has no attribute 'fileno'", as the tree
    # was starting.
    with pytest.raises(TypeError, match=r"run_process_tree's stdin="):
        await _open(["cat"], stdin=given)()


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


#: Requests `subprocess.Popen` refuses with a ValueError before it starts anything.
POPEN_VALUE_ERRORS: dict[str, dict[str, Any]] = {
    "a-name-holding-=": {"env": {"GREETING": "hello", "GREETING=bye": "x"}},
    "a-name-that-is-=": {"env": {"=": "1"}},
    "a-nul-in-a-name": {"env": {"A\0B": "1"}},
    "a-nul-in-a-value": {"env": {"A": "x\0y"}},
    "a-nul-in-the-executable": {"executable": "/bin/tr\0ue"},
}


@pytest.mark.parametrize("case", list(POPEN_VALUE_ERRORS))
async def test_what_popen_refuses_as_a_bad_value_is_refused_alike(
    nothing_leaks: None, contained: dict[str, Any], case: str
) -> None:
    # Red before (helper-25): under cgroup containment through /bin/sh, env(1) took the
    # name "GREETING=bye" for GREETING and the command ran with GREETING=bye=x; a NUL in
    # the executable raised FileNotFoundError.
    request: dict[str, Any] = {**POPEN_VALUE_ERRORS[case]}
    if "env" in request:
        request["env"] = {**contained["env"], **request["env"]}
    expected = popen_refuses(["true"], request)
    with pytest.raises(ValueError) as raised:
        await _run(["true"], containment=contained["containment"], **request)()
    # Said as Popen says it ("embedded null byte"; 3.13's, which may posix_spawn, says
    # "posix_spawn: embedded null character in path").
    said = "illegal environment variable name" if "=" in case else "null"
    assert said in str(expected)
    assert said in str(raised.value)


def popen_refuses(command: list[str], request: dict[str, Any]) -> ValueError:
    """The ValueError `subprocess.Popen` raises for ``request``: the oracle (it starts
    nothing)."""
    with pytest.raises(ValueError) as raised:
        subprocess.Popen(command, **request)
    return raised.value


def popen_raises(command: list[str]) -> OSError:
    """What `subprocess.Popen` raises for ``command``: the oracle (it starts nothing)."""
    with pytest.raises(OSError) as raised:
        subprocess.Popen(command)
    return raised.value


#: #! lines the kernel refuses (ENOEXEC: no interpreter name, or one cut short by the 256
#: bytes it reads), each with text that, were it run by a shell, would leave a mark.
REFUSED_HASH_BANGS = {
    "no-name": b"#!\ntouch {mark}\n",
    "blank-name": b"#!  \t\ntouch {mark}\n",
    "name-cut-short": b"#!/bin/sh" + b"x" * 300 + b"\ntouch {mark}\n",
    "only-blanks-no-newline": b"#!" + b" " * 300,
}


@kernel_refuses
@pytest.mark.parametrize("case", list(REFUSED_HASH_BANGS))
async def test_a_hash_bang_line_the_kernel_refuses_raises_exec_format_error(
    nothing_leaks: None, tmp_path: Path, contained: dict[str, Any], case: str
) -> None:
    # Read as the kernel reads a #! line, and raised as Popen raises it. Red before under
    # cgroup containment through /bin/sh: the check let these through, and sh's exec ran
    # the file as a shell script (exit 0, the mark made).
    mark = tmp_path / "ran"
    script = tmp_path / "tool"
    script.write_bytes(REFUSED_HASH_BANGS[case].replace(b"{mark}", bytes(mark)))
    script.chmod(0o755)
    assert popen_raises([str(script)]).errno == errno.ENOEXEC
    with pytest.raises(OSError) as raised:
        await _run([str(script)], **contained)()
    assert raised.value.errno == errno.ENOEXEC
    assert not mark.exists()


def _interpreters(into: Path) -> dict[str, tuple[bytes, type[OSError]]]:
    """#! lines naming interpreters the kernel cannot start, and what Popen raises."""
    text = into / "text"  # executable, but of no format: the kernel refuses it (ENOEXEC)
    text.write_bytes(b"echo not a program\n")
    plain = into / "plain"  # not executable
    plain.write_bytes(b"#!/bin/sh\n")
    nested = into / "nested"  # a script whose own interpreter is missing
    nested.write_bytes(b"#!/nonexistent/interpreter\n")
    for path in (text, nested):
        path.chmod(0o755)
    return {
        "empty-name-at-a-nul": (b"#!\0/bin/sh\n", PermissionError),  # ("": the cwd)
        "no-newline-missing": (b"#!/nonexistent/interpreter", FileNotFoundError),
        "a-directory": (b"#!" + bytes(into) + b"\n", PermissionError),
        "not-executable": (b"#!" + bytes(plain) + b"\n", PermissionError),
        "of-no-format": (b"#!" + bytes(text) + b"\n", OSError),
        "whose-interpreter-is-missing": (b"#!" + bytes(nested) + b"\n", FileNotFoundError),
    }


@kernel_refuses
@pytest.mark.parametrize(
    "case",
    [
        "empty-name-at-a-nul",
        "no-newline-missing",
        "a-directory",
        "not-executable",
        "of-no-format",
        "whose-interpreter-is-missing",
    ],
)
async def test_a_hash_bang_interpreter_the_kernel_cannot_start_raises_as_popen_does(
    nothing_leaks: None, tmp_path: Path, contained: dict[str, Any], case: str
) -> None:
    # The interpreter is looked at as the kernel looks at a program: there, executable, of
    # a format it runs (another #! script, up to the kernel's depth). Red before under
    # cgroup containment through /bin/sh: only "is it there" was asked, and sh's exec
    # gave exit status 126 or 127 (or ran the file as a script) where Popen raises.
    line, error = _interpreters(tmp_path)[case]
    mark = tmp_path / "ran"
    script = tmp_path / "tool"
    # (The text after the line, were it run by a shell, would leave a mark.)
    script.write_bytes(line + b"\ntouch " + bytes(mark) + b"\n" if line.endswith(b"\n") else line)
    script.chmod(0o755)
    expected = popen_raises([str(script)])
    assert type(expected) is error
    with pytest.raises(OSError) as raised:
        await _run([str(script)], **contained)()
    assert type(raised.value) is error
    assert raised.value.errno == expected.errno
    assert raised.value.filename == str(script)
    assert not mark.exists()


@kernel_refuses
@pytest.mark.parametrize("scripts", [5, 6])
async def test_a_chain_of_scripts_runs_as_deep_as_linux_follows_it(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any], scripts: int
) -> None:
    # Each script's interpreter the next, the last's /bin/echo: Linux follows five, and
    # refuses a sixth (ELOOP), as Popen shows. Red before at five (helper-23): the check
    # counted the interpreter at the last depth as one too many, an ELF program as well.
    chain = [tmp_path / f"script-{index}" for index in range(scripts)]
    for script, interpreter in zip(chain, [*chain[1:], Path("/bin/echo")], strict=True):
        script.write_text(f"#!{interpreter}\n")
        script.chmod(0o755)
    if scripts == 6:
        assert popen_raises([str(chain[0])]).errno == errno.ELOOP
        with pytest.raises(OSError) as raised:
            await _run([str(chain[0])], **contained)()
        assert raised.value.errno == errno.ELOOP
    else:
        result = await run_process_tree([str(chain[0])], capture_stdout=True, **contained)
        assert result.stdout.split() == [bytes(script) for script in chain[::-1]]
    assert tracked.survivors() == []


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


def with_interpreter(program: str, interpreter: bytes, into: Path) -> Path:
    """A copy of ELF ``program`` (dynamically linked) whose program interpreter (PT_INTERP,
    the dynamic loader the kernel starts it with) is ``interpreter``, of the same length
    as the one it names now (no longer than that, NUL-padded: the kernel reads up to it)."""
    data = Path(program).read_bytes()
    phoff, phentsize, phnum = struct.unpack_from("<QxxxxxxxxxxxxxxHH", data, 32)
    for index in range(phnum):
        entry = phoff + index * phentsize
        kind, _flags, offset, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", data, entry)
        if kind == 3:  # PT_INTERP
            assert len(interpreter) < size
            patched = interpreter.ljust(size, b"\0")
            into.write_bytes(data[:offset] + patched + data[offset + size :])
            into.chmod(0o755)
            return into
    raise AssertionError(f"{program} has no program interpreter")


async def test_an_elf_program_whose_interpreter_is_missing_raises_file_not_found(
    nothing_leaks: None, tmp_path: Path, contained: dict[str, Any]
) -> None:
    # A program built for another C library (a musl build on a glibc system, say) names a
    # dynamic loader that is not there: the kernel's ENOENT, which subprocess raises as
    # "No such file or directory" for a file that is plainly there. Said here with the
    # loader's name, under every containment. Red before under cgroup containment
    # through /bin/sh: exit status 127 and "not found", from a message naming the wrapper.
    program = with_interpreter(
        shutil.which("true") or "/bin/true", b"/lib/ld-musl-x86_64.so.1", tmp_path / "tool"
    )
    with pytest.raises(FileNotFoundError) as raised:
        await _run([str(program)], **contained)()
    assert "no such interpreter '/lib/ld-musl-x86_64.so.1'" in str(raised.value)
    assert raised.value.filename == str(program)


def synthetic_elf(*, is_64: bool, byte_order: str, machine: int, interpreter: bytes) -> bytes:
    """The headers of an ELF program that names ``interpreter`` (NUL-ended), laid out as
    the ELF specification says for each class and byte order: nothing that would run."""
    elf_class, data = (2 if is_64 else 1), (1 if byte_order == "<" else 2)
    ident = b"\x7fELF" + bytes([elf_class, data, 1]).ljust(12, b"\0")  # (16 bytes in all)
    if is_64:
        header_size, entry_size = 64, 56
        header = struct.pack(
            byte_order + "HHIQQQIHHHHHH", 2, machine, 1, 0, header_size, 0, 0, 64, 56, 2, 0, 0, 0
        )
        entries = [(1, 5, 0, 0, 0, 0, 0, 0), (3, 4, 0, 0, 0, 0, 0, 1)]
        entry_format = byte_order + "IIQQQQQQ"
        where = header_size + 2 * entry_size
        entries[1] = (3, 4, where, 0, 0, len(interpreter), len(interpreter), 1)
    else:
        header_size, entry_size = 52, 32
        header = struct.pack(
            byte_order + "HHIIIIIHHHHHH", 2, machine, 1, 0, header_size, 0, 0, 52, 32, 2, 0, 0, 0
        )
        entry_format = byte_order + "IIIIIIII"
        where = header_size + 2 * entry_size
        entries = [(1, 0, 0, 0, 0, 0, 5, 0), (3, where, 0, 0, len(interpreter), 0, 4, 1)]
    table = b"".join(struct.pack(entry_format, *entry) for entry in entries)
    return ident + header + table + interpreter


@pytest.mark.parametrize("is_64", [True, False], ids=["64-bit", "32-bit"])
@pytest.mark.parametrize("byte_order", ["<", ">"], ids=["little-endian", "big-endian"])
def test_the_elf_interpreter_is_read_in_each_class_and_byte_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, is_64: bool, byte_order: str
) -> None:
    # Only programs of this machine's layout are read (where the kernel would look for
    # their loader): each is stood in for here by declaring it this machine's.
    machine = 183  # (EM_AARCH64: any number, the same on both sides)
    monkeypatch.setattr(_exec_check, "_own_elf_layout", lambda: (byte_order, is_64, machine))
    data = synthetic_elf(
        is_64=is_64, byte_order=byte_order, machine=machine, interpreter=b"/lib/ld-x.so.1\0"
    )
    program = tmp_path / "program"
    program.write_bytes(data)
    with program.open("rb") as file:
        assert _exec_check._elf_interpreter(file.fileno(), data[:256]) == "/lib/ld-x.so.1"
    # Another machine's program is the kernel's (or a binfmt_misc handler's) to judge.
    monkeypatch.setattr(_exec_check, "_own_elf_layout", lambda: (byte_order, is_64, machine + 1))
    with program.open("rb") as file:
        assert _exec_check._elf_interpreter(file.fileno(), data[:256]) is None


#: Executable files of no format the kernel runs (with no binfmt_misc handler registered):
#: execve fails with ENOEXEC, and Popen raises it. The text, were it run by a shell,
#: would leave a mark.
NOT_PROGRAMS = {
    "text-without-#!": b"touch {mark}\n",
    "empty": b"",
    "bytes": b"\0\1\2 not a program\ntouch {mark}\n",
}


@kernel_refuses
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
    monkeypatch.setattr(_exec_check, "BINFMT_MISC", str(binfmt))
    assert _exec_check.binfmt_misc_handlers() == []  # no status: not mounted
    (binfmt / "status").write_text("enabled\n")
    (binfmt / "jar").write_text("disabled\ninterpreter /usr/bin/jexec\n")
    assert _exec_check.binfmt_misc_handlers() == []  # one, switched off
    (binfmt / "wine").write_text("enabled\ninterpreter /usr/bin/wine\nextension .exe\n")
    assert _exec_check.binfmt_misc_handlers() == ["wine"]
    tool = tmp_path / "tool.exe"
    tool.write_bytes(b"MZ not a Linux program\n")
    tool.chmod(0o755)
    assert _exec_check.refusal(str(tool), "tool.exe", None) is None  # the exec decides
    (binfmt / "status").write_text("disabled\n")
    assert _exec_check.binfmt_misc_handlers() == []
    refused = _exec_check.refusal(str(tool), "tool.exe", None)
    assert refused is not None
    assert refused.errno == errno.ENOEXEC


#: Files the kernel refuses to run, which Popen's search passes over for the next on PATH.
REFUSED_ON_PATH = {
    "no-format": b"touch {mark}\n",
    "no-interpreter": b"#!/nonexistent/interpreter\ntouch {mark}\n",
}


@kernel_refuses
@pytest.mark.parametrize("case", list(REFUSED_ON_PATH))
async def test_the_search_passes_over_a_file_the_kernel_refuses_as_popen_does(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any], case: str
) -> None:
    # Popen's exec goes on down PATH past a file the kernel refuses, and runs the next.
    # Red before (no-format) under every containment: the early check refused the first
    # file found (and before that, under cgroup, sh's exec ran it as a script).
    mark = tmp_path / "ran"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "tool").write_bytes(REFUSED_ON_PATH[case].replace(b"{mark}", bytes(mark)))
    (second / "tool").write_bytes(b"#!/bin/sh\necho second\n")
    for tool in (first / "tool", second / "tool"):
        tool.chmod(0o755)
    env = {**contained["env"], "PATH": f"{first}:{second}:{os.environ['PATH']}"}
    result = await run_process_tree(
        ["tool"], capture_stdout=True, env=env, containment=contained["containment"]
    )
    assert result.stdout == b"second\n"
    assert not mark.exists()
    assert tracked.survivors() == []


@kernel_refuses
async def test_the_search_in_relative_folders_from_a_relative_cwd_runs_what_popen_runs(
    tracked: Tracked, tmp_path: Path, contained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # PATH entries relative to a relative cwd, a refused file in the first: Popen runs the
    # second, from the cwd. Red before under cgroup (helper-4): the wrapper's sh, already
    # in the cwd, was given the path from ours ("exec: sub/second/tool: not found", 127).
    work = tmp_path / "sub"
    for folder, text in (
        ("first", b"echo not a program\n"),
        ("second", b"#!/bin/sh\necho second\n"),
    ):
        (work / folder).mkdir(parents=True)
        (work / folder / "tool").write_bytes(text)
        (work / folder / "tool").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    env = {**contained["env"], "PATH": f"first:second:{os.environ['PATH']}"}
    result = await run_process_tree(
        ["tool"], capture_stdout=True, cwd="sub", env=env, containment=contained["containment"]
    )
    assert result.stdout == b"second\n"
    assert tracked.survivors() == []


#: A command prefix: root without the capabilities that let it into any directory, so
#: that a directory's mode counts for it as for any user.
WITHOUT_DAC_OVERRIDE = (
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
)

#: Asks Popen and trio_proctree to run the program given (a path, or a name looked for on
#: the PATH given), and prints what each raised.
RAISED_BY_EACH = """
import subprocess, sys, trio
from trio_proctree import open_process_tree

program, path = sys.argv[1], sys.argv[2]
env = {"PATH": path}

def popen():
    subprocess.Popen([program], env=env)

async def ours():
    async with open_process_tree([program], env=env, containment="group"):
        pass

for attempt in (popen, lambda: trio.run(ours)):
    try:
        attempt()
    except OSError as exc:
        print(type(exc).__name__, exc.errno)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv(1)"
)
@pytest.mark.parametrize("named", ["by-path", "on-path"])
def test_a_program_in_a_directory_we_may_not_search_raises_permission_error(
    tmp_path: Path, named: str
) -> None:
    # As Popen raises it, from the exec's EACCES. Red before (helper-20): every error in
    # looking at the file counted as "not there", and FileNotFoundError was raised.
    locked = tmp_path / "unsearchable"
    locked.mkdir()
    (locked / "prog").write_text("#!/bin/sh\necho ran\n")
    (locked / "prog").chmod(0o755)
    locked.chmod(0o000)
    try:
        program = str(locked / "prog") if named == "by-path" else "prog"
        said = procs.run_python(
            RAISED_BY_EACH, program, f"{locked}:/usr/bin", before=WITHOUT_DAC_OVERRIDE
        )
    finally:
        locked.chmod(0o755)
    assert said.splitlines() == [f"PermissionError {errno.EACCES}"] * 2


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


class NoOpenDescriptor:
    """A file-like object whose file descriptor is not open."""

    def fileno(self) -> int:
        return -5


class NoDescriptorAtAll:
    """A file-like object whose "file descriptor" is no number."""

    def fileno(self) -> str:
        return "3"


def closed_file() -> Any:
    file = open(os.devnull, "rb")  # noqa: SIM115 - closed at once, as the case needs
    file.close()
    return file


@pytest.mark.parametrize(
    ("option", "make", "error", "message"),
    [
        ("stdin", io.BytesIO, io.UnsupportedOperation, "fileno"),
        ("stdout", closed_file, ValueError, "closed file"),
        ("stderr", NoOpenDescriptor, OSError, "Bad file descriptor: stderr=-5"),
        ("stdout", NoDescriptorAtAll, TypeError, r"stdout.fileno\(\) returned str, not int"),
    ],
    ids=["in-memory", "closed", "not-open", "not-a-number"],
)
def test_a_file_object_with_no_open_descriptor_is_refused_by_the_call(
    nothing_leaks: None, option: str, make: Callable[[], Any], error: type[Exception], message: str
) -> None:
    # Red before (helper-60): accepted by the call, refused by Popen once the block was
    # entered. Popen's own error, with the request.
    with pytest.raises(error, match=message):
        open_process_tree(["cat"], **{option: make()})


def test_errors_come_from_the_call_itself_before_any_await() -> None:
    # open_process_tree() checks eagerly: no event loop, nothing started.
    with pytest.raises(FileNotFoundError):
        open_process_tree(["no-such-program-xyz"])
    with pytest.raises(ValueError, match="grace"):
        open_process_tree(["true"], grace=-1)


async def _use(module: Any, entry: str, command: list[str]) -> None:
    """Start ``command`` through ``module``'s ``entry`` (a driver's two entry points)."""
    if entry == "open_process_tree":
        async with module.open_process_tree(command):
            pytest.fail("a tree started under the other event loop")
    else:
        await module.run_process_tree(command)


def _in_asyncio(main: Callable[..., Any], *args: Any) -> None:
    asyncio.run(main(*args))


@pytest.mark.parametrize("entry", ["open_process_tree", "run_process_tree"])
@pytest.mark.parametrize(
    ("module", "run_in", "twin"),
    [
        (trio_proctree, _in_asyncio, trio_proctree.asyncio),
        (trio_proctree.asyncio, trio.run, trio_proctree),
    ],
    ids=["trio_under_asyncio", "asyncio_under_trio"],
)
def test_a_driver_under_the_other_event_loop_names_the_one_to_use(
    nothing_leaks: None,
    tmp_path: Path,
    entry: str,
    module: Any,
    run_in: Callable[..., None],
    twin: Any,
) -> None:
    # Red before (helper-100): trio's "must be called from async context", asyncio's "no
    # running event loop", which say nothing of the twin (under anyio, the backend
    # decides which one works).
    ran = tmp_path / "ran"
    under = "trio" if module is trio_proctree else "asyncio"
    with pytest.raises(
        RuntimeError,
        match=rf"^{re.escape(module.__name__)}\.{entry} runs under {under}; "
        rf".* {re.escape(twin.__name__)}\.{entry}$",
    ):
        run_in(_use, module, entry, ["sh", "-c", f"echo ran > {ran}"])
    assert not ran.exists()


# A program that ignores SIGCHLD starts a tree (asks the driver named as its argument).
STARTS_WITH_SIGCHLD_IGNORED = textwrap.dedent(
    """
    import asyncio, signal, sys, trio
    import trio_proctree, trio_proctree.asyncio
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    command = ["sh", "-c", "echo ran > " + sys.argv[2]]
    try:
        if sys.argv[1] == "trio":
            trio.run(trio_proctree.run_process_tree, command)
        else:
            asyncio.run(trio_proctree.asyncio.run_process_tree(command))
    except RuntimeError as exc:
        print(type(exc).__name__, exc)
    """
)


@pytest.mark.parametrize("driver", ["trio", "asyncio"])
def test_a_tree_is_refused_before_it_starts_where_sigchld_is_ignored(
    tracked: Tracked, tmp_path: Path, driver: str
) -> None:
    # Linux reaps the children of a process that ignores SIGCHLD at once: the tree's exit
    # status would be lost, and what run_process_tree captured with it. Red before
    # (helper-70): the command ran, and cleanup raised "exit status lost (reaped
    # elsewhere)", naming no cause.
    ran = tmp_path / "ran"
    result = subprocess.run(
        [sys.executable, "-c", STARTS_WITH_SIGCHLD_IGNORED, driver, str(ran)],
        capture_output=True, env=tracked.env, timeout=60, check=False,
    )  # fmt: skip
    said = result.stdout.decode()
    assert said.startswith("RuntimeError "), (said, result.stderr)
    assert "SIGCHLD is ignored" in said
    assert not ran.exists()
    assert tracked.survivors() == []
