"""Leaders started directly in their cgroup (glibc 2.41 or newer): in it from their first
instruction, with no /bin/sh between, and started exactly as `subprocess` starts them.

Where the C library is older these tests that need it skip; ``nox -s tests_glibc`` runs the
whole suite once more with Debian 13's C library so that they run here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_proctree import _spawn_into_cgroup, open_process_tree, run_process_tree
from trio_proctree._cgroup import find_cgroup2_mount, own_cgroup

from . import procs
from .conftest import Tracked

needs_direct = pytest.mark.skipif(
    not _spawn_into_cgroup.available() and os.environ.get("TRIO_PROCTREE_EXPECT_DIRECT") != "1",
    reason="this C library cannot start a process in a cgroup (glibc < 2.41)",
)


def cgroup_of(pid: int) -> str | None:
    with open(f"/proc/{pid}/cgroup") as f:
        return own_cgroup(f.read())


def test_the_session_that_expects_direct_starts_gets_them() -> None:
    # nox -s tests_glibc sets this: it must not pass by testing the /bin/sh way instead.
    if os.environ.get("TRIO_PROCTREE_EXPECT_DIRECT") != "1":
        pytest.skip("only where direct starts are expected (nox -s tests_glibc)")
    assert _spawn_into_cgroup.available()


@needs_direct
async def test_a_leader_is_its_command_in_its_cgroup_from_the_start(tracked: Tracked) -> None:
    async with open_process_tree(["sleep", "60"], env=tracked.env, containment="cgroup") as tree:
        # posix_spawn returns once the exec is done: no moment as /bin/sh, none outside.
        with open(f"/proc/{tree.pid}/cmdline", "rb") as f:
            assert f.read() == b"sleep\x0060\x00"
        assert cgroup_of(tree.pid) != cgroup_of(os.getpid())
        assert (cgroup_of(tree.pid) or "").endswith("/" + Path(tree._core.containment.path).name)  # type: ignore[attr-defined]
    assert tracked.survivors() == []


async def test_a_tree_starts_after_the_one_before_was_killed(tracked: Tracked) -> None:
    # Linux kills a child created in a cgroup that cgroup.kill was written to (6.18 here),
    # so a killed tree's cgroup must not be the next tree's. Red with cgroups reused.
    ignores_term = ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]
    for _ in range(3):
        async with open_process_tree(
            ignores_term, grace=0.1, stdout=subprocess.PIPE, env=tracked.env, containment="cgroup"
        ) as tree:
            assert tree.stdout is not None
            assert await tree.stdout.receive_some() == b"ready\n"
        assert tree.outcome is not None
        assert tree.outcome.signals[-1] == signal.SIGKILL  # its cgroup was killed
    assert tracked.survivors() == []


# What subprocess gives, and what a tree must give the same: (command, options).
SAME_AS_SUBPROCESS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "env and cwd": (["sh", "-c", 'echo "$GREETING"; pwd'], {"env": {"GREETING": "hi"}}),
    "signals Python ignores are restored": (["grep", "SigIgn", "/proc/self/status"], {}),
    "signals stay ignored without restore": (
        ["grep", "SigIgn", "/proc/self/status"],
        {"restore_signals": False},
    ),
    "stderr into stdout": (["sh", "-c", "echo out; echo err >&2"], {"stderr": subprocess.STDOUT}),
    "stdin from devnull": (["cat"], {"stdin": subprocess.DEVNULL}),
}


@pytest.mark.parametrize("case", list(SAME_AS_SUBPROCESS))
async def test_a_leader_starts_as_subprocess_starts_it(
    tracked: Tracked, contained: dict[str, Any], case: str, tmp_path: Path
) -> None:
    command, options = SAME_AS_SUBPROCESS[case]
    options = {**options, "cwd": tmp_path, "env": {**contained["env"], **options.get("env", {})}}
    capture = {"capture_stdout": True, "capture_stderr": "stderr" not in options}
    expected = await trio.run_process(command, **capture, **options)
    result = await run_process_tree(
        command, containment=contained["containment"], **capture, **options
    )
    assert (result.stdout, result.stderr) == (expected.stdout, expected.stderr)
    assert tracked.survivors() == []


async def test_descriptors_not_passed_are_closed(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    inherited, other_end = os.pipe()
    os.set_inheritable(inherited, True)
    try:
        command = ["sh", "-c", f"test -e /proc/self/fd/{inherited} && echo open || echo closed"]
        result = await run_process_tree(command, capture_stdout=True, **contained)
        assert result.stdout == b"closed\n"
        kept = await run_process_tree(command, capture_stdout=True, close_fds=False, **contained)
        assert kept.stdout == b"open\n"
    finally:
        os.close(inherited)
        os.close(other_end)
    assert tracked.survivors() == []


@needs_direct
async def test_executable_runs_under_the_argv0_given(tracked: Tracked) -> None:
    # (Through /bin/sh, argv[0] becomes the executable: sh's exec cannot set it.)
    result = await run_process_tree(
        ["custom-name", "-c", 'echo "$0"'],
        executable="/bin/sh",
        capture_stdout=True,
        env=tracked.env,
        containment="cgroup",
    )
    assert result.stdout == b"custom-name\n"


@needs_direct
async def test_a_file_that_is_no_program_is_an_exec_format_error(
    tracked: Tracked, tmp_path: Path
) -> None:
    # As subprocess raises it; through /bin/sh, such a file would run as a shell script.
    script = tmp_path / "no-shebang"
    script.write_text("echo ran\n")
    script.chmod(0o755)
    with pytest.raises(OSError, match="Exec format error") as raised:
        await run_process_tree([str(script)], env=tracked.env, containment="cgroup")
    assert raised.value.errno == 8  # ENOEXEC
    assert tracked.survivors() == []


# A Python process that joins the cgroup given (after cgroup.kill was written to it, so
# its count of kills differs from a new cgroup's), then starts a tree and reports.
IN_A_KILLED_CGROUP = textwrap.dedent(
    """
    import sys, trio
    from trio_proctree import run_process_tree, _spawn_into_cgroup
    with open(sys.argv[1] + "/cgroup.procs", "w") as f:
        f.write("0")

    async def main():
        result = await run_process_tree(["echo", "ran"], capture_stdout=True, containment="cgroup")
        print(result.returncode, result.stdout, _spawn_into_cgroup._refused)

    trio.run(main)
    """
)


@needs_direct
def test_leaders_go_through_sh_where_children_made_in_their_cgroup_die_at_birth(
    tracked: Tracked,
) -> None:
    # Red without the throwaway child that proves direct starts work: every leader would
    # get SIGKILL at birth (Linux 6.18). On a kernel without that behaviour it proves that
    # direct starts go on (the last field is False).
    with open("/proc/self/mountinfo") as f:
        mount = find_cgroup2_mount(f.read())
    assert mount is not None
    here = os.path.join(mount, (cgroup_of(os.getpid()) or "/").lstrip("/"))
    killed = os.path.join(here, f"killed-before-{tracked.token}")
    os.mkdir(killed)
    try:
        with open(os.path.join(killed, "cgroup.kill"), "w") as f:
            f.write("1")
        child = subprocess.run(
            [*procs.python(), "-c", IN_A_KILLED_CGROUP, killed],
            capture_output=True,
            env=tracked.env,
            timeout=60,
            check=False,
        )
        assert child.returncode == 0, child.stderr.decode()
        code, output, refused = child.stdout.decode().split()
        assert (code, output) == ("0", "b'ran\\n'")
        assert refused in ("True", "False")
    finally:
        # Empty once the child's watchdog has seen it exit (the child removed its home).
        deadline = time.monotonic() + 5
        while procs.populated(killed) and time.monotonic() < deadline:
            time.sleep(0.01)  # a stranger's exit: no event to wait on
        os.rmdir(killed)
    assert tracked.survivors() == []
