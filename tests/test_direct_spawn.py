"""Leaders started directly in their cgroup (glibc 2.41 or newer): in it from their first
instruction, with no /bin/sh between, and started exactly as `subprocess` starts them.

Where the C library is older these tests that need it skip; ``nox -s tests_glibc`` runs the
whole suite once more with Debian 13's C library so that they run here too.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_proctree import _spawn_into_cgroup, open_process_tree, run_process_tree
from trio_proctree._cgroupfs import find_cgroup2_mount, own_cgroup

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
        # posix_spawn returns once the exec is past its point of no return: no moment as
        # /bin/sh, none outside. (Its arguments may take a moment more: procs.arguments.)
        assert procs.arguments(tree.pid) == b"sleep\x0060\x00"
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
            if _spawn_into_cgroup.available():
                # Started in its cgroup directly, not through /bin/sh after a death at
                # birth (which a reused killed cgroup would cost).
                assert tree._core.leader.popen is None
        assert tree.outcome is not None
        assert tree.outcome.signals[-1] == signal.SIGKILL  # its cgroup was killed
    assert tracked.survivors() == []


def tree_cgroup(tree: Any) -> str:
    path: str = tree._core.containment.path
    return path


@needs_direct
async def test_a_cgroup_emptied_without_a_kill_serves_the_next_tree(tracked: Tracked) -> None:
    # Saves a mkdir and an rmdir per tree; red where direct starts never reused one.
    paths = []
    for _ in range(2):
        async with open_process_tree(
            ["sleep", "60"], env=tracked.env, containment="cgroup"
        ) as tree:
            paths.append(tree_cgroup(tree))
            assert (cgroup_of(tree.pid) or "").endswith("/" + Path(paths[-1]).name)
        assert tree.outcome is not None and tree.outcome.signals == (signal.SIGTERM, signal.SIGCONT)
    assert paths[0] == paths[1]
    assert tracked.survivors() == []


async def test_a_tree_starts_in_a_cgroup_its_last_tree_killed_itself(tracked: Tracked) -> None:
    # A member may write cgroup.kill to its own cgroup, unknown to us; Linux then kills a
    # child created directly in that cgroup at birth. The next tree to reuse the cgroup
    # must still run its command (through /bin/sh, which can join). Red without the check.
    with open("/proc/self/mountinfo") as f:
        mount = find_cgroup2_mount(f.read())
    assert mount is not None
    kills_its_own_cgroup = 'echo 1 > "$0$(sed -n "s/^0:://p" /proc/self/cgroup)/cgroup.kill"'
    async with open_process_tree(
        ["sh", "-c", kills_its_own_cgroup, mount], env=tracked.env, containment="cgroup"
    ) as killed:
        assert await killed.wait() == -signal.SIGKILL
    async with open_process_tree(
        ["sh", "-c", "echo ran"], stdout=subprocess.PIPE, env=tracked.env, containment="cgroup"
    ) as tree:
        assert tree_cgroup(tree) == tree_cgroup(killed)  # the same cgroup, reused
        assert tree.stdout is not None
        assert await tree.stdout.receive_some() == b"ran\n"
        assert await tree.wait() == 0
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
    capture: dict[str, Any] = {"capture_stdout": True, "capture_stderr": "stderr" not in options}
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
    with procs.cgroup_in_ours(f"killed-before-{tracked.token}", {"cgroup.kill": "1"}) as killed:
        code, output, refused = procs.run_python(
            IN_A_KILLED_CGROUP, killed, env=tracked.env
        ).split()
    assert (code, output) == ("0", "b'ran\\n'")
    assert refused in ("True", "False")
    assert tracked.survivors() == []


# Moves itself into the cgroup given, then starts two trees; prints how each started.
IN_A_CAPPED_CGROUP = textwrap.dedent(
    """
    import sys, trio
    from trio_proctree import open_process_tree
    with open(sys.argv[1] + "/cgroup.procs", "w") as f:
        f.write("0")

    async def main():
        for _ in range(2):
            async with open_process_tree(["true"], containment="cgroup") as tree:
                print(tree._core.leader.popen is None, await tree.wait())

    trio.run(main)
    """
)


@needs_direct
def test_direct_starts_work_with_room_for_one_tree_cgroup(tracked: Tracked) -> None:
    # cgroup.max.descendants = 2: our home and one tree's cgroup. The first direct start
    # proves itself in that new tree cgroup. Red before: in a cgroup made for the proof,
    # one too many, and every tree failed to start (EAGAIN).
    with procs.cgroup_in_ours(f"capped-{tracked.token}", {"cgroup.max.descendants": "2"}) as capped:
        output = procs.run_python(IN_A_CAPPED_CGROUP, capped, env=tracked.env)
    assert output.splitlines() == ["True 0", "True 0"]  # both direct, the second reused
    assert tracked.survivors() == []


def script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


async def test_a_path_through_a_symlink_and_dotdot_runs_the_file_subprocess_runs(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # Red before (direct starts): the path was made absolute by text, so "link/.." meant
    # the symlink's directory, not its target's parent, and another file ran.
    script(tmp_path / "real" / "x", '#!/bin/sh\necho "right program: $0"\n')
    script(tmp_path / "wd" / "x", '#!/bin/sh\necho "WRONG program: $0"\n')
    (tmp_path / "real" / "dir").mkdir()
    (tmp_path / "wd" / "link").symlink_to(tmp_path / "real" / "dir")
    for command, cwd in [(["../x"], tmp_path / "wd" / "link"), (["wd/link/../x"], tmp_path)]:
        expected = await trio.run_process(
            command, cwd=cwd, env=contained["env"], capture_stdout=True
        )
        assert expected.stdout.startswith(b"right program: ")
        result = await run_process_tree(command, cwd=cwd, capture_stdout=True, **contained)
        assert result.stdout == expected.stdout  # the same file, and the same $0
    assert tracked.survivors() == []


async def test_the_path_search_goes_on_past_a_file_that_will_not_exec(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path
) -> None:
    # Red before (direct starts): the first executable file on PATH was the only one tried.
    # (Through /bin/sh such a file would run as a script: a documented difference.)
    if contained["containment"] == "cgroup" and not _spawn_into_cgroup.available():
        pytest.skip("through /bin/sh, a file with no #! runs as a shell script")
    script(tmp_path / "a" / "tool", "\x7fELF not really\n")
    script(tmp_path / "b" / "tool", "#!/bin/sh\necho the real tool\n")
    env = {**contained["env"], "PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}:/usr/bin:/bin"}
    expected = await trio.run_process(["tool"], env=env, capture_stdout=True)
    result = await run_process_tree(
        ["tool"], env=env, capture_stdout=True, containment=contained["containment"]
    )
    assert result.stdout == expected.stdout == b"the real tool\n"
    assert tracked.survivors() == []


@needs_direct
async def test_a_program_gone_from_where_the_plan_found_it_is_looked_for_again(
    tracked: Tracked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A direct start execs the file the planned search settled on, without searching PATH
    # again; should that exec fail (the file removed in between), the whole search runs,
    # as Popen's would. Red with the settled file tried alone: FileNotFoundError.
    first, later = tmp_path / "a" / "tool", tmp_path / "b" / "tool"
    script(first, "#!/bin/sh\necho the first tool\n")
    script(later, "#!/bin/sh\necho a later tool\n")
    env = {**tracked.env, "PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}:/usr/bin:/bin"}
    real_start = _spawn_into_cgroup.start

    def removed_first(request: Any, *args: Any) -> int:
        assert request.settled == os.fsencode(first)  # (what the plan found)
        first.unlink()  # between the plan and the exec
        return real_start(request, *args)

    monkeypatch.setattr(_spawn_into_cgroup, "start", removed_first)
    async with open_process_tree(
        ["tool"], env=env, stdout=subprocess.PIPE, containment="cgroup"
    ) as tree:
        assert tree._core.leader.popen is None  # started directly, not through /bin/sh
        assert tree.stdout is not None
        assert await tree.stdout.receive_some() == b"a later tool\n"
        assert await tree.wait() == 0
    assert tracked.survivors() == []


@pytest.mark.parametrize("change", ["PATH changed", "a file put before"])
async def test_what_changes_on_path_after_the_plan_is_searched_for_as_popen_would(
    tracked: Tracked, contained: dict[str, Any], tmp_path: Path, change: str
) -> None:
    # open_process_tree() plans (finds b/tool); the spawn comes when its block is entered.
    # Whatever changed on PATH in between, the leader is the file Popen runs then. Red
    # with direct starts taking the planned answer as it was (helper-51): the new PATH's
    # entry at the old index ran (d/tool), or the planned file past one put before it.
    for folder in "bcd":
        script(tmp_path / folder / "tool", f"#!/bin/sh\necho {folder}\n")
    env = {**contained["env"], "PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}
    scope = open_process_tree(
        ["tool"], env=env, stdout=subprocess.PIPE, containment=contained["containment"]
    )
    if change == "PATH changed":
        env["PATH"] = f"{tmp_path / 'c'}:{tmp_path / 'd'}"  # (the same dict, as Popen reads it)
    else:
        script(tmp_path / "a" / "tool", "#!/bin/sh\necho a\n")
    expected = (await trio.run_process(["tool"], env=env, capture_stdout=True)).stdout
    async with scope as tree:
        assert tree.stdout is not None
        assert (
            await tree.stdout.receive_some()
            == expected
            == (b"c\n" if change == "PATH changed" else b"a\n")
        )
        assert await tree.wait() == 0
    assert tracked.survivors() == []


async def test_options_popen_refuses_are_refused_the_same(
    tracked: Tracked, contained: dict[str, Any]
) -> None:
    # Red before (direct starts): pass_fds=None was taken, and the process started.
    with pytest.raises(TypeError):
        await trio.run_process(["true"], pass_fds=None)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        await run_process_tree(["true"], pass_fds=None, **contained)
    assert tracked.survivors() == []


@needs_direct
async def test_a_bad_stdio_descriptor_is_not_blamed_on_the_program(tracked: Tracked) -> None:
    # Red before: EBADF named the program, as if its exec had failed.
    unused = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1  # the last number we may have
    assert unused not in procs.open_fds()
    with pytest.raises(OSError, match="Bad file descriptor") as raised:
        await run_process_tree(["true"], stdin=unused, env=tracked.env, containment="cgroup")
    assert raised.value.errno == errno.EBADF
    assert raised.value.filename is None
    assert tracked.survivors() == []


# The first tree's cgroup vanishes before its spawn (its first, proving, one); reports
# what that spawn raised, and whether later trees still start directly.
FIRST_SPAWN_FAILS = textwrap.dedent(
    """
    import os, trio
    from trio_proctree import _cgroup, _spawn_into_cgroup, run_process_tree

    prepare = _cgroup.CgroupContainment.prepare
    def vanishing(self, plan):
        os.rmdir(self.path)
        _cgroup.CgroupContainment.prepare = prepare
        return prepare(self, plan)
    _cgroup.CgroupContainment.prepare = vanishing

    async def main():
        try:
            await run_process_tree(["true"], containment="cgroup")
        except OSError as exc:
            print(type(exc).__name__)
        await run_process_tree(["true"], containment="cgroup")
        print(_spawn_into_cgroup.available())

    trio.run(main)
    """
)


@needs_direct
def test_a_failed_first_spawn_does_not_turn_direct_starts_off(tracked: Tracked) -> None:
    # Red before: any error of the proving spawn sent every later leader through /bin/sh.
    output = procs.run_python(FIRST_SPAWN_FAILS, env=tracked.env)
    assert output.split() == ["FileNotFoundError", "True"]
    assert tracked.survivors() == []
