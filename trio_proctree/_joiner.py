"""The joiner: a program of a few hundred bytes that writes itself into a tree's cgroup and
then execs the command, where the C library cannot start a process in a cgroup.

A leader must be in its cgroup before the user's program runs (moved after it forked,
its children would stay outside). glibc 2.41's ``posix_spawn`` creates it there
(`._spawn_into_cgroup`); with an older C library, `subprocess.Popen` starts the joiner
in the leader's place, with every option as given: it writes ``0`` into the cgroup's
``cgroup.procs`` and execs the command, trying the paths Popen's child would try, in the
same order, with the environment and ``argv[0]`` it got. It has no C library and no
loader (sources: ``_joiner_programs/x86_64.S`` and ``aarch64.S``): its exec costs a few
microseconds where ``/bin/sh``, the way in before it, cost ~0.2 ms of CPU a spawn: the
killpg baseline through it alone came to 1.2-1.4x the plain one (``bench/HISTORY.md``).

Where there is no joiner for the machine (x86-64 and 64-bit Arm have one), where it
cannot be run (a file system mounted ``noexec``, an installer that dropped its mode, a
policy that refuses it) or where ``TRIO_PROCTREE_NO_JOINER`` is set to a non-empty value,
leaders join through ``/bin/sh`` instead (`._through_sh`), as before.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._after_fork import renewed_in_forked_child
from ._exec_check import exec_path

logger = logging.getLogger("trio_proctree")

#: The joiners shipped, by the kernel's machine name (`os.uname`): the kernel runs the
#: program whatever our own interpreter's word size.
PROGRAMS = Path(__file__).resolve().with_name("_joiner_programs")  # (absolute: cwd= moves)
_BY_MACHINE = {"x86_64": "join-x86_64", "aarch64": "join-aarch64"}

#: What turns the joiner off (any non-empty value): leaders then join through /bin/sh.
SWITCH = "TRIO_PROCTREE_NO_JOINER"

#: The joiner's name in its own argv (``ps`` shows it for the microseconds it runs).
_NAME = b"trio_proctree-join"
#: Its exit status when no path it was given could be found (127) or run (126), and when
#: the cgroup could not be joined (125): sh's and env(1)'s statuses.
NOT_FOUND, NOT_RUN, CANNOT_JOIN = 127, 126, 125

#: The joiner's path once it has been seen to run here.
_proven: str | None = None
#: Set once the joiner cannot run here (or there is none for this machine).
_refused = False
_proving = threading.Lock()
renewed_in_forked_child(globals(), "_proving")


def path() -> str | None:
    """The joiner to start leaders with, or None: then they join through /bin/sh.

    The first call in a process runs it once (~1 ms, blocking: called where the spawn
    is), to see that the kernel will: an exec refused only at the first tree's spawn
    would fail that tree, where /bin/sh could have started it.
    """
    global _proven, _refused  # noqa: PLW0603 - one answer for the whole process
    if os.environ.get(SWITCH):
        return None
    if _proven is None and not _refused:
        with _proving:
            if _proven is None and not _refused:
                answer = _prove()
                if isinstance(answer, str):
                    _proven = answer
                elif answer is False:
                    _refused = True
    return _proven


def _prove() -> str | bool | None:
    """The joiner's path if it runs here, False if it cannot (said once, at DEBUG), None
    if there is no answer yet."""
    name = _BY_MACHINE.get(os.uname().machine)
    if name is None:
        return False  # (no joiner for this machine: nothing to say)
    program = str(PROGRAMS / name)
    # Joins /dev/null (a write that succeeds) and finds no path to run: NOT_FOUND, said
    # only where the joiner ran. Anything else, and leaders go through /bin/sh.
    try:
        ran = subprocess.run(
            [_NAME, os.devnull, b"", b"proof"],
            executable=program,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except OSError as exc:
        logger.debug("the joiner %s cannot run (%s); leaders join through /bin/sh", program, exc)
        return False
    if ran.returncode == NOT_FOUND:
        return program
    if ran.returncode == 0 or ran.returncode < 0:
        # Reaped by other code (a waitpid(-1) in the program), or killed by a signal (a
        # Ctrl-C to the terminal's group): no answer yet. This leader goes through
        # /bin/sh; the next spawn asks again.
        return None
    logger.debug(
        "the joiner %s exited with status %d where 127 was due; leaders join through /bin/sh",
        program,
        ran.returncode,
    )
    return False


def runs(program: str) -> bool:
    """Whether the joiner at ``program`` is (still) an executable file: where its exec
    failed and it is, the error is the command's (its arguments too long, its cwd gone:
    posix_spawn says which error, not which step)."""
    return os.path.isfile(program) and os.access(program, os.X_OK)


def lost(error: int, program: str) -> OSError:
    """The error for a tree whose joiner could not be started after all (gone or changed
    since it was proven: a package upgraded under a running program, say): that tree is
    not started (the program, run in the joiner's place, would be in no cgroup of ours),
    and the next join through /bin/sh."""
    global _proven, _refused
    with _proving:
        _proven, _refused = None, True
    logger.warning(
        "the joiner %s cannot run any more (%s); trees join their cgroup through /bin/sh",
        program,
        os.strerror(error),
    )
    return OSError(
        error,
        f"trio_proctree's joiner cannot run any more ({os.strerror(error)}); the tree was "
        "not started, and later trees join their cgroup through /bin/sh",
        program,
    )


def command(
    procs: str,
    program: Any,
    argv: Sequence[Any],
    *,
    env: Mapping[Any, Any] | None,
    settled: bytes | None,
) -> list[Any]:
    """The arguments to start the joiner with (as Popen's ``executable``) so that it joins
    the cgroup whose ``procs`` file is given and then runs ``program`` under ``argv``.

    The paths are those Popen's child tries (``program`` as given if it has a slash, else
    joined to each entry of ``env``'s PATH), none looked at here; ``settled``, where the
    planned search settled, first (the entries before it were empty then)."""
    name = os.fsencode(program)
    if os.path.dirname(name):
        paths = [name]
    else:
        paths = _on_path(name, tuple(exec_path(env)))
        if settled is not None:
            paths = [settled, *paths]
    return [_NAME, os.fsencode(procs), *paths, b"", *argv]


@functools.lru_cache(maxsize=64)
def _on_path(name: bytes, entries: tuple[Any, ...]) -> list[bytes]:
    """``name`` joined to each PATH entry, as Popen's child joins them (kept: commands
    and PATHs are few; the list is only ever copied)."""
    return [os.path.join(os.fsencode(entry), name) for entry in entries]
