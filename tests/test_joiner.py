"""The joiner: the program that writes itself into a tree's cgroup, then execs the command
as Popen's child would (where the C library cannot start a process in a cgroup).

Its behaviour as a tree's leader (the environment, argv[0], the search of PATH, signal
dispositions, ...) is pinned by the whole suite's parity tests, which run through it on
this machine's C library; these pin the program itself, and when it is used.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import attrs
import pytest
import trio

from trio_proctree import (
    ContainmentUnavailable,
    _joiner,
    _spawn_into_cgroup,
    open_process_tree,
    run_process_tree,
)
from trio_proctree._cgroupfs import own_cgroup
from trio_proctree._choose import choose_containment

from . import procs
from .conftest import Tracked

MACHINE = os.uname().machine
#: This machine's joiner, where there is one: the one trees start through here.
JOINER = _joiner.PROGRAMS / _joiner._BY_MACHINE.get(MACHINE, "none")

with_a_joiner_here = pytest.mark.skipif(
    MACHINE not in _joiner._BY_MACHINE, reason=f"no joiner is built for {MACHINE}"
)

#: A committed joiner's machine, as its ELF header says it (e_machine).
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}


@attrs.frozen
class Joiner:
    """A committed joiner, and how to run it here: at once on its own machine, else
    under qemu's user-mode emulator (its system calls are the host's, the cgroup it
    joins a real one, the command it execs a program of this machine)."""

    machine: str
    path: Path
    emulator: str | None

    @property
    def source(self) -> Path:
        return self.path.with_name(f"{self.machine}.S")

    def command(self, *args: bytes | str | Path) -> tuple[list[Any], Path | None]:
        """The arguments to run it with, named as trees name it; and the executable."""
        if self.emulator is None:
            return ["trio_proctree-join", *args], self.path
        return [self.emulator, "-0", "trio_proctree-join", self.path, *args], None


def _emulator(machine: str) -> str | None:
    if machine == MACHINE:
        return None
    for name in (f"qemu-{machine}-static", f"qemu-{machine}"):
        if (found := shutil.which(name)) is not None:
            return found
    return None


def _not_here(why: str) -> NoReturn:
    """Skip, saying ``why``; fail where the tools were to be there (``nox -s joiners``)."""
    if os.environ.get("TRIO_PROCTREE_EXPECT_EMULATED_JOINERS") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(params=sorted(_joiner._BY_MACHINE))
def joiner(request: pytest.FixtureRequest) -> Joiner:
    """Each committed joiner that can run here (emulated where it is not this machine's)."""
    machine = request.param
    emulator = _emulator(machine)
    if machine != MACHINE and emulator is None:
        _not_here(f"the {machine} joiner runs here under qemu-{machine}, not installed")
    return Joiner(machine, _joiner.PROGRAMS / _joiner._BY_MACHINE[machine], emulator)


@pytest.fixture(params=sorted(_joiner._BY_MACHINE))
def committed(request: pytest.FixtureRequest) -> Joiner:
    """Each committed joiner, whether or not it can run here."""
    machine = request.param
    return Joiner(machine, _joiner.PROGRAMS / _joiner._BY_MACHINE[machine], None)


@pytest.fixture
def needs_cgroup() -> None:
    try:
        choose_containment("cgroup")
    except ContainmentUnavailable as exc:  # pragma: no cover - on machines without cgroups
        pytest.skip(str(exc))  # (in the joiners session too: said, as the machine's limit)


def in_a_tree_cgroup(line: bytes) -> bool:
    """Whether a ``0::`` line of /proc/PID/cgroup names a tree's cgroup of ours."""
    return line.startswith(b"0::/") and os.path.basename(line.strip()).startswith(b"tree-")


async def cgroup_line(tracked: Tracked, first: str = "", **options: Any) -> bytes:
    """The ``0::`` line of /proc/PID/cgroup of a leader started under cgroup containment,
    after the shell commands ``first``."""
    result = await run_process_tree(
        ["sh", "-c", first + "exec grep ^0:: /proc/self/cgroup"],
        capture_stdout=True,
        containment="cgroup",
        env=tracked.env,
        **options,
    )
    return result.stdout


def cgroup_of(pid: int) -> str | None:
    with open(f"/proc/{pid}/cgroup") as f:
        return own_cgroup(f.read())


def run_joiner(
    joiner: Joiner, *args: bytes | str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    command, executable = joiner.command(*args)
    return subprocess.run(command, executable=executable, capture_output=True, env=env, check=False)


def _binutils_for(machine: str) -> str | None:
    """The prefix of GNU binutils' names for ``machine`` here (Debian's
    ``binutils-aarch64-linux-gnu`` names them ``aarch64-linux-gnu-as``, ...; this
    machine's own are also there unprefixed), or None where they are not installed."""
    for prefix in (f"{machine}-linux-gnu-", "" if machine == MACHINE else None):
        if prefix is not None and all(
            shutil.which(f"{prefix}{tool}") for tool in ("as", "ld", "strip")
        ):
            return prefix
    return None


def test_the_committed_joiner_is_built_from_its_source(committed: Joiner, tmp_path: Path) -> None:
    # The commands its source names; the file must be byte for byte the committed one
    # (its headers too: entry point, segments, a stack not executable).
    tools = _binutils_for(committed.machine)
    if tools is None:
        why = f"GNU binutils for {committed.machine} (as, ld, strip) are not installed"
        if committed.machine == MACHINE:
            pytest.skip(why)  # (the joiners session fetches only the other machines')
        _not_here(why)
    built = tmp_path / committed.path.name
    subprocess.run([f"{tools}as", "-o", tmp_path / "join.o", committed.source], check=True)
    subprocess.run(
        [f"{tools}ld", "-static", "-nostdlib", "--build-id=none", "-z", "noseparate-code",
         "-z", "noexecstack", "-o", built, tmp_path / "join.o"],
        check=True,
    )  # fmt: skip
    subprocess.run([f"{tools}strip", built], check=True)
    code = built.read_bytes()
    assert len(code) > 500
    assert code == committed.path.read_bytes()


def test_the_committed_joiner_is_an_executable_for_its_machine_needing_no_loader(
    committed: Joiner,
) -> None:
    assert os.access(committed.path, os.X_OK)
    header = committed.path.read_bytes()
    assert header[:5] == b"\x7fELF\x02"  # (64-bit)
    assert int.from_bytes(header[18:20], "little") == ELF_MACHINES[committed.machine]
    # Static: no program header names an interpreter (PT_INTERP) to load.
    first, size, count = (
        int.from_bytes(header[at : at + width], "little")
        for at, width in ((32, 8), (54, 2), (56, 2))
    )
    types = [int.from_bytes(header[first + i * size :][:4], "little") for i in range(count)]
    assert 1 in types  # (a PT_LOAD: the headers were read where they are)
    assert 3 not in types


@pytest.mark.usefixtures("needs_cgroup")
def test_the_joiner_joins_then_runs_the_first_path_that_execs(
    joiner: Joiner, tracked: Tracked, tmp_path: Path
) -> None:
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    shows = 'printf "%s|%s|%s" "$0" "$TOKEN_SEEN" "$(grep ^0:: /proc/self/cgroup)"'
    with procs.cgroup_in_ours(f"joiner-{tracked.token}") as cgroup:
        ran = run_joiner(
            joiner,
            f"{cgroup}/cgroup.procs",
            tmp_path / "missing",
            not_executable,
            "/bin/sh",
            "",
            "named apart",
            "-c",
            shows,
            env={**tracked.env, "TOKEN_SEEN": "as given"},
        )
    assert ran.returncode == 0, ran.stderr
    argv0, seen, line = ran.stdout.decode().split("|")
    assert (argv0, seen) == ("named apart", "as given")
    assert line.startswith("0::/") and cgroup.endswith(line[3:])  # (the mount, then it)
    assert tracked.survivors() == []


def test_the_joiner_says_127_when_no_path_is_there_and_126_when_none_runs(
    joiner: Joiner, tmp_path: Path
) -> None:
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("")
    # (A path through a file is not there either, as for Popen: ENOTDIR, not ENOENT.)
    through_a_file = not_executable / "x"
    missing = run_joiner(
        joiner, os.devnull, tmp_path / "missing", through_a_file, "", "the command"
    )
    refused = run_joiner(
        joiner, os.devnull, tmp_path / "missing", not_executable, "", "the command"
    )
    assert (missing.returncode, missing.stderr) == (
        _joiner.NOT_FOUND,
        b"trio_proctree: cannot run the command\n",
    )
    assert (refused.returncode, refused.stderr) == (
        _joiner.NOT_RUN,
        b"trio_proctree: cannot run the command\n",
    )


@pytest.mark.parametrize("procs_file", ["no-cgroup/cgroup.procs", "/dev/full"])
def test_the_joiner_says_125_and_runs_nothing_when_it_cannot_join(
    joiner: Joiner, tmp_path: Path, procs_file: str
) -> None:
    # Not there (the open fails), or there and refusing the write (/dev/full): a joiner
    # that took a failed write for a join ran the command in no cgroup of ours.
    marker = tmp_path / "ran"
    procs = tmp_path / procs_file
    ran = run_joiner(joiner, procs, "/bin/touch", "", "touch", marker)
    assert ran.returncode == _joiner.CANNOT_JOIN
    assert ran.stderr == f"trio_proctree: cannot join the cgroup of {procs}\n".encode()
    assert not marker.exists()


def test_the_joiner_refuses_arguments_without_the_end_of_its_paths(joiner: Joiner) -> None:
    assert run_joiner(joiner, os.devnull, "/bin/true").returncode == 2
    assert run_joiner(joiner, os.devnull, "").returncode == 2  # (no command after it)
    assert run_joiner(joiner, os.devnull).returncode == 2  # (not even the end)


def _leader_started_by(containment: Any) -> Any:
    """What the cgroup containment asks Popen to start for ``true``."""
    from trio_proctree._spawn import plan_spawn  # noqa: PLC0415

    plan = plan_spawn(["true"], {})
    return containment.prepare(plan)


@with_a_joiner_here
@pytest.mark.usefixtures("needs_cgroup")
async def test_leaders_join_through_the_joiner_unless_it_is_switched_off(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _spawn_into_cgroup.available():
        pytest.skip("leaders start in their cgroup here (glibc 2.41+): no joiner")
    monkeypatch.delenv(_joiner.SWITCH, raising=False)
    tracked.mark_this_process(monkeypatch)
    for switched_off in (False, True):
        if switched_off:
            monkeypatch.setenv(_joiner.SWITCH, "1")
        async with open_process_tree(
            ["sh", "-c", "echo up; exec sleep 60"], containment="cgroup", stdout=subprocess.PIPE
        ) as tree:
            assert tree.stdout is not None
            assert await tree.stdout.receive_some() == b"up\n"  # (joined, and running)
            cgroup = tree._core.containment.path  # type: ignore[attr-defined]
            plan = _leader_started_by(tree._core.containment)
            through = "/bin/sh" if switched_off else str(JOINER)
            assert os.fsencode(plan.command[0]) == (
                b"/bin/sh" if switched_off else b"trio_proctree-join"
            )
            assert plan.options.get("executable", "/bin/sh") == through
            joined = cgroup_of(tree.pid)
            assert joined is not None and joined != "/" and cgroup.endswith(joined)
    assert tracked.survivors() == []


@with_a_joiner_here
@pytest.mark.usefixtures("needs_cgroup")
async def test_a_joiner_that_cannot_run_leaves_the_leaders_to_sh(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A copy that lost its mode, as an installer may leave it: the first tree still starts
    # in its cgroup, through /bin/sh, and so do the next.
    monkeypatch.delenv(_joiner.SWITCH, raising=False)
    shutil.copyfile(JOINER, tmp_path / JOINER.name)  # (without its mode)
    monkeypatch.setattr(_joiner, "PROGRAMS", tmp_path)
    monkeypatch.setattr(_joiner, "_proven", None)
    monkeypatch.setattr(_joiner, "_refused", False)
    for _ in range(2):
        assert in_a_tree_cgroup(await cgroup_line(tracked))
    assert _joiner.path() is None
    assert _joiner._refused
    assert tracked.survivors() == []


@pytest.mark.usefixtures("needs_cgroup")
async def test_a_setsid_escapee_of_a_leader_started_by_the_joiner_is_killed(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (The suite's containment tests do this for every shape; one here, so that this file
    # alone says the joiner's leaders are contained.) The escapee has started by the time
    # the leader exits (setsid -f forks it first); its environment carries the token.
    monkeypatch.delenv(_joiner.SWITCH, raising=False)
    with trio.fail_after(10):
        line = await cgroup_line(tracked, "setsid -f sleep 60; ")
    assert in_a_tree_cgroup(line)
    assert tracked.survivors() == []


# Prints the SigIgn masks of this Python, of a leader trio_proctree starts, and of one
# Popen starts.
IGNORES = """
import trio
from trio_proctree import run_process_tree

def mask(text):
    return text.split("SigIgn:")[1].split()[0]

async def main():
    command = ["grep", "SigIgn", "/proc/self/status"]
    ours = await run_process_tree(command, capture_stdout=True, containment="cgroup")
    popen = await trio.run_process(command, capture_stdout=True)
    with open("/proc/self/status") as f:
        print(mask(f.read()), mask(ours.stdout.decode()), mask(popen.stdout.decode()))

trio.run(main)
"""

#: rt_sigaction's number, where this test knows it.
_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}
#: glibc's own signals (SIGCANCEL, SIGSETXID) in a SigIgn mask.
GLIBCS = 0b11 << 31


def _disposing_glibcs_signals(handler: int) -> Callable[[], None]:
    """A preexec_fn that sets glibc's own signals to ``handler`` (SIG_DFL, SIG_IGN) with
    the system call itself: glibc's sigaction refuses them, and so Python's signal."""
    libc = ctypes.CDLL(None, use_errno=True)
    action = (ctypes.c_ulong * 4)(handler, 0, 0, 0)  # (handler, then flags, ... all 0)
    number = _RT_SIGACTION[os.uname().machine]

    def dispose() -> None:
        for sig in (32, 33):
            libc.syscall(number, sig, action, None, 8)

    return dispose


@pytest.mark.usefixtures("needs_cgroup")
@pytest.mark.skipif(os.uname().machine not in _RT_SIGACTION, reason="rt_sigaction's number")
@pytest.mark.parametrize("ours", ["ignored", "not ignored"])
def test_a_leader_ignores_glibcs_own_signals_only_where_we_do(tracked: Tracked, ours: str) -> None:
    # glibc's posix_spawn (before 2.41) leaves the signals glibc handles itself (32, 33)
    # ignored in the child, and a program kept that through its exec: a leader started
    # so ignored them where a forked child gets the default. A leader now ignores them
    # only where we do, as a child forked or vforked gets them (or one glibc 2.41 starts);
    # the other signals as Popen's child. Red before: ignored where we did not ignore
    # them; then, with them always set back to the default, not ignored where we did.
    handler = 1 if ours == "ignored" else 0  # SIG_IGN, SIG_DFL
    said = subprocess.run(
        [*procs.python(), "-c", IGNORES],
        env=tracked.env,
        preexec_fn=_disposing_glibcs_signals(handler),
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split()
    mine, leaders, popens = (int(mask, 16) for mask in said)
    assert bool(mine & GLIBCS) == (ours == "ignored")  # (as the test set them)
    assert leaders & GLIBCS == mine & GLIBCS
    assert leaders & ~GLIBCS == popens & ~GLIBCS
    assert tracked.survivors() == []


@pytest.mark.usefixtures("needs_cgroup")
def test_the_joiner_writes_nothing_more_into_the_cgroup_with_stderr_closed(
    joiner: Joiner, tracked: Tracked
) -> None:
    # With fd 2 closed, cgroup.procs opens as 2: a message said there would move the
    # process its argv[0] names into the cgroup. Red before (helper-107): the sleep here,
    # named as the command, was moved into the joiner's cgroup.
    with procs.cgroup_in_ours(f"stderr-{tracked.token}") as cgroup:
        sleeper = subprocess.Popen(["sleep", "60"], env=tracked.env)
        try:
            before = cgroup_of(sleeper.pid)
            # (Under qemu too: its own descriptors are above 2, which the joiner gets.)
            command, executable = joiner.command(f"{cgroup}/cgroup.procs", "", str(sleeper.pid))
            ran = subprocess.run(
                command,
                executable=executable,
                preexec_fn=functools.partial(os.close, 2),
                check=False,
            )
            assert ran.returncode == _joiner.NOT_FOUND
            assert cgroup_of(sleeper.pid) == before
        finally:
            sleeper.kill()
            sleeper.wait()
    assert tracked.survivors() == []


@with_a_joiner_here
@pytest.mark.usefixtures("needs_cgroup")
@pytest.mark.parametrize("started_by", ["posix_spawn", "Popen"])
async def test_a_joiner_gone_since_it_was_proven_starts_nothing_uncontained(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, started_by: str
) -> None:
    # Removed after it was proven (a package upgraded under a running program): the tree
    # does not start, with an error that says why, and the next ones join through
    # /bin/sh. Red before (helper-107): posix_spawn then started the program itself, in
    # no cgroup of ours (and under the joiner's arguments).
    if _spawn_into_cgroup.available():
        pytest.skip("leaders start in their cgroup here (glibc 2.41+): no joiner")
    monkeypatch.delenv(_joiner.SWITCH, raising=False)
    copy = tmp_path / JOINER.name
    shutil.copy(JOINER, copy)
    monkeypatch.setattr(_joiner, "_proven", str(copy))
    monkeypatch.setattr(_joiner, "_refused", False)
    copy.unlink()
    options: dict[str, Any] = {} if started_by == "posix_spawn" else {"umask": 0o22}
    marker = tmp_path / "ran"
    with pytest.raises(FileNotFoundError, match="joiner cannot run any more") as raised:
        await run_process_tree(
            ["touch", str(marker)], containment="cgroup", env=tracked.env, **options
        )
    assert raised.value.filename == str(copy)
    assert not marker.exists()
    assert _joiner.path() is None
    assert in_a_tree_cgroup(await cgroup_line(tracked, **options))
    assert tracked.survivors() == []


@with_a_joiner_here
@pytest.mark.usefixtures("needs_cgroup")
def test_a_spawn_that_fails_for_the_command_leaves_the_joiner_in_use(
    tracked: Tracked, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # posix_spawn says which error, not which step: a directory gone between the plan and
    # the spawn reads as the joiner's own ENOENT. Red before: taken for a joiner gone, it
    # failed the tree as such and sent every later tree through /bin/sh.
    if not _spawn_into_cgroup.can_start_joiner({}):
        pytest.skip("glibc's posix_spawn does not start the joiner here")
    monkeypatch.delenv(_joiner.SWITCH, raising=False)
    monkeypatch.setattr(_joiner, "_proven", str(JOINER))
    monkeypatch.setattr(_joiner, "_refused", False)
    gone = tmp_path / "gone"
    argv = _joiner.command(os.devnull, "true", ["true"], env=None, settled=None)
    request = _spawn_into_cgroup.IntoCgroup(str(tmp_path), "true", argv, joiner=str(JOINER))
    with pytest.raises(FileNotFoundError) as raised:
        _spawn_into_cgroup.start(request, {"cwd": str(gone)}, [None, None, None])
    assert raised.value.filename == str(gone)
    assert _joiner.path() == str(JOINER)
    assert tracked.survivors() == []
