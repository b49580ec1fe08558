"""Starting the tree's leader: checking the request before anything runs, then spawning it.

`plan_spawn` validates everything it can without starting a process, so bad input fails
early and leaks nothing; `spawn` is the blocking part (fork + exec), run by the drivers in
a worker thread. Both drivers use the same two functions.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import inspect
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Union, cast

import attrs
import trio

from . import _spawn_into_cgroup as direct
from ._exec_check import EXECUTABLE, MISSING, NOT_EXECUTABLE, exec_path, look_at, refusal
from ._joiner import lost as joiner_lost
from ._joiner import runs as joiner_runs
from ._leader import LOST
from ._pidfd import open_pidfd
from ._spawn_into_cgroup import IntoCgroup

StrOrPath = Union[str, bytes, "os.PathLike[str]"]
Command = Union[StrOrPath, Sequence[StrOrPath]]  # noqa: UP007 - a runtime alias with a string part

# trio's streams carry bytes, unbuffered: these options would silently not apply.
_TEXT_OPTIONS = ("universal_newlines", "text", "encoding", "errors", "bufsize")
#: What subprocess.Popen takes on this Python (the command aside), and process_group,
#: which is handled here even where Popen lacks it (Python 3.10).
_POPEN_OPTIONS = frozenset(inspect.signature(subprocess.Popen).parameters) - {"args"} | {
    "process_group"
}


def require_supported_platform() -> None:
    """Raise NotImplementedError where trio_proctree cannot keep its guarantees."""
    if sys.platform == "win32":
        raise NotImplementedError(
            "trio_proctree does not support Windows yet (it needs process groups and pidfds; "
            "job objects are planned)"
        )
    if not sys.platform.startswith("linux"):
        raise NotImplementedError(
            f"trio_proctree supports Linux only for now, not {sys.platform!r}: it waits on "
            "pidfds and finds the tree's members in /proc"
        )
    _require_pidfd()


#: What a kernel (or a seccomp filter in front of it) answers for a call it does not offer.
_NOT_OFFERED = frozenset({errno.ENOSYS, errno.EPERM})


@functools.cache  # (not an error: that is raised again at the next call, asked anew)
def _require_pidfd() -> None:
    try:
        pidfd = os.pidfd_open(os.getpid())
    except AttributeError as exc:  # a Python built without it
        raise NotImplementedError("trio_proctree needs os.pidfd_open (Python on Linux)") from exc
    except OSError as exc:
        # Out of file descriptors (EMFILE), say, is no old kernel: said as it is.
        if exc.errno not in _NOT_OFFERED:
            raise
        raise NotImplementedError("trio_proctree needs pidfd_open (Linux 5.3 or newer)") from exc
    try:
        # Every tree is waited for and reaped through its leader's pidfd. Asked of our own
        # (not a child of ours), the kernel that has it says ECHILD; Linux 5.3, EINVAL.
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        pass
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in {errno.EINVAL, *_NOT_OFFERED}:
            raise
        raise NotImplementedError(
            "trio_proctree needs waitid(P_PIDFD) (Linux 5.4 or newer)"
        ) from exc
    finally:
        os.close(pidfd)


@attrs.frozen
class Resolved:
    """Where Popen's search for a program settles, read off the files before it runs."""

    #: The file it execs: the first on the search that the kernel would run, or None
    #: where none would (then ``refused`` says why).
    path: str | None
    #: Whether it passed over a file the kernel refuses (of no format it runs, or whose
    #: interpreter is missing) to get there: sh's exec may stop at that one (dash runs
    #: the first as a script, bash stops at either), and must be given ``path``.
    passed_over: bool = False
    #: What the exec would fail with, where no file on the search runs and only the exec
    #: itself would say it (ENOEXEC: a binfmt_misc handler we cannot see may run it).
    refused: OSError | None = None
    #: Taken from what an earlier search found (checked to be there still, but not what
    #: appeared before it on PATH since: ``passed_over`` may be out of date).
    remembered: bool = False
    #: The places the search looked before ``path`` (where nothing ran), to look at
    #: again when a remembered answer must also say what it passed over.
    looked_before: tuple[str, ...] = ()
    #: The PATH entries searched (`os.get_exec_path`), for an answer found on PATH.
    searched: tuple[Any, ...] = ()


@attrs.frozen
class SpawnPlan:
    """A checked request to start a tree's leader."""

    command: str | bytes | list[Any]
    #: `subprocess.Popen` keyword arguments, stdio excluded.
    options: Mapping[str, Any]
    stdin: Any
    stdout: Any
    stderr: Any
    #: ``"sleep 60"``: how logs and errors name the command.
    label: str
    #: The program to run, as Popen will look for it: ``executable``, else the command's
    #: first argument (``/bin/sh`` with ``shell``).
    program: Any = ""
    #: Where the containment would have the leader start without `subprocess.Popen`, when
    #: it can be (``command`` is then the fallback, which Popen starts).
    into_cgroup: IntoCgroup | None = None
    #: The command as the caller gave it (a tuple, a path, ...), which ``args``,
    #: ``CompletedProcess.args`` and ``CalledProcessError.cmd`` show, as `subprocess` does.
    args: Any = None
    #: Whether the leader runs as another user or group than ours (``user=``, ``group=``,
    #: ``extra_groups=`` naming others): then it cannot join a cgroup that we own.
    changes_user: bool = False
    #: Where Popen's search for ``program`` settles (None until it was looked for).
    resolved: Resolved | None = None
    #: Whether ``command`` runs the program by a wrapper's exec (`CgroupContainment`: the
    #: joiner's, or /bin/sh's), which cannot raise the exec's error as Popen does: what the
    #: files say of it is raised before (`_refuse_what_the_wrapper_would_run_anyway`).
    through_wrapper: bool = False
    #: The joiner ``command`` starts in the program's place (`._joiner`), if any.
    joiner: str | None = None
    #: The environment ``command`` starts with, where not ``options``' own (the wrapper
    #: that passes the environment on in its arguments starts with none).
    command_env: Mapping[Any, Any] | None = None
    #: The ``cgroup.procs`` file the leader writes itself into before its exec, where
    #: Popen starts it as given (`joining_first`); None where it needs not.
    joins: str | None = None


@attrs.define
class Spawned:
    """A started leader, with our ends of its pipes (raw fds; the drivers wrap them)."""

    pid: int
    #: None when the leader was started without `subprocess` (directly in its cgroup).
    popen: subprocess.Popen[bytes] | None
    pidfd: int
    stdin: int | None
    stdout: int | None
    stderr: int | None
    #: The clock ticks after boot (``/proc/PID/stat``'s start time) read just before the
    #: fork and just after it: the leader's start time is between them.
    started_within: tuple[int, int] = (0, 0)
    #: The thread that forked it (its parent, while that thread lives).
    parent_thread: int = 0
    #: Other code reaped it before its pidfd could be opened (``pidfd`` names no process).
    lost: bool = False


class StartedUnwatched(Exception):
    """The spawn failed with ``error`` after the leader had run (its program started):
    what it started may run still, and only its containment can tell."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def plan_spawn(command: Command, options: Mapping[str, Any]) -> SpawnPlan:
    """Check ``command`` and ``options`` (those of `trio.lowlevel.open_process`).

    Raises:
        NotImplementedError: on an unsupported platform.
        TypeError: for a command of the wrong shape for ``shell``, or text-mode options.
        ValueError: for an empty command or an option that would break containment.
        FileNotFoundError: if the executable (or ``cwd``) does not exist.
        PermissionError: if the executable is not an executable file.
        RuntimeError: where this process ignores SIGCHLD.
    """
    require_supported_platform()
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        # Linux then reaps our children itself as they exit: the leader's exit status
        # would be lost (and what run_process_tree captured with it, to a CleanupError
        # after the command ran), and its zombie would not hold its process group.
        raise RuntimeError(
            "SIGCHLD is ignored in this process (SIG_IGN, set here or inherited), so Linux "
            "reaps its children at once and a tree's exit status would be lost: set it "
            "back (signal.signal(signal.SIGCHLD, signal.SIG_DFL)) before starting trees"
        )
    options = dict(options)
    unknown = sorted(set(options) - _POPEN_OPTIONS)
    if unknown:
        hint = ""
        if "deliver_cancel" in unknown:  # (code moving over from trio.run_process)
            hint = "; trio.run_process's deliver_cancel is the escalation= policy here"
        raise TypeError(f"unknown option(s) for a process tree: {', '.join(unknown)}{hint}")
    for key in _TEXT_OPTIONS:
        if options.get(key):
            raise TypeError(
                f"process trees talk in unbuffered bytes; the {key!r} option is not supported"
            )
    shell = bool(options.get("shell"))
    argv = _check_command(command, shell)
    stdin, stdout, stderr = (options.pop(name, None) for name in ("stdin", "stdout", "stderr"))
    for name, value in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
        _check_stream_option(name, value)
    _own_process_group(options)
    if options.get("preexec_fn") is not None:
        options["preexec_fn"] = _dying_with_us(options["preexec_fn"])
    changes_user = _check_user_and_group(options)
    if options.get("env") is not None:
        options["env"] = _with_outer_markers(options["env"])
    if shell:
        program = options.get("executable") or "/bin/sh"
    else:
        program = options.get("executable") or argv[0]
    _check_program(program)
    resolved = resolve_executable(program, env=options.get("env"), cwd=options.get("cwd"))
    return SpawnPlan(
        command=command if isinstance(command, (str, bytes)) else argv,
        options=options,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        label=_describe(command, argv),
        program=program,
        args=command,
        changes_user=changes_user,
        resolved=resolved,
    )


#: The start of each tree's marker: a variable in its processes' environment, by which the
#: subreaper containment and the watchdog know them (`SubreaperContainment`).
MARKER_PREFIX = "TRIO_PROCTREE_TREE_"


def _with_outer_markers(env: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``env``, with the markers of the trees this process runs in added (where it is a
    member of a subreaper tree that starts trees of its own). Given an environment of its
    own, a nested tree carried its own marker alone, and the outer tree's watchdog, which
    kills by marker, missed its processes when the outer parent was SIGKILLed (helper-59).
    """
    prefix = MARKER_PREFIX.encode()
    markers: dict[Any, Any] = {
        name: value for name, value in os.environb.items() if name.startswith(prefix)
    }
    if not markers:
        return env
    if not any(isinstance(name, bytes) for name in env):
        markers = {os.fsdecode(name): os.fsdecode(value) for name, value in markers.items()}
    missing = {name: value for name, value in markers.items() if name not in env}
    return {**env, **missing} if missing else env


def _describe(command: Command, argv: list[Any]) -> str:
    """How logs name the command: ``sleep 60``, shortened to fit a log line."""
    if isinstance(command, (str, bytes)):
        label = os.fsdecode(command)
    else:
        label = shlex.join(os.fsdecode(arg) for arg in argv)
    return label if len(label) <= 120 else label[:117] + "..."


def _asyncio_stream_kind(value: object) -> str | None:
    """``"asyncio.StreamReader"`` (or Writer) for one, else None. (Without importing
    asyncio: not imported, there is none.)"""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    for kind in (asyncio.StreamReader, asyncio.StreamWriter):
        if isinstance(value, kind):
            return f"asyncio.{kind.__name__}"
    return None


def _check_stream_option(name: str, value: Any) -> None:
    """``stdin``/``stdout``/``stderr`` must be what Popen takes: else it fails in the child
    (an opaque EBADF) or with an AttributeError naming ``fileno``, once the tree's
    containment is made (helper-55: ``stdin=b"..."``, run_process_tree's input given to
    open_process_tree, said "'bytes' object has no attribute 'fileno'"). A file object's
    descriptor is asked for as Popen asks, and raises as it would (an in-memory file, a
    closed one), but with the request (helper-60)."""
    if value is None:
        return
    if hasattr(value, "fileno") and not isinstance(value, (str, bytes)):
        descriptor = value.fileno()
        if isinstance(descriptor, bool) or not isinstance(descriptor, int):
            raise TypeError(f"{name}.fileno() returned {type(descriptor).__name__}, not int")
        _check_open(name, descriptor)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = type(value).__name__
        hint = ""
        if name == "stdin" and kind in ("bytes", "bytearray", "memoryview", "str"):
            hint = " (input to feed the command is run_process_tree's stdin=)"
        elif (stream := _asyncio_stream_kind(value)) is not None:
            # (Another tree's stream, as in a trio pipeline: helper-70 met the class's
            # private name, and no way forward.)
            kind = stream
            hint = (
                " (an asyncio tree's streams cannot be handed to another process: for a "
                "pipeline, make the pipe with os.pipe() and give each tree its end)"
            )
        raise TypeError(
            f"{name} must be a file, a file descriptor, subprocess.PIPE, subprocess.DEVNULL "
            f"or None, not {kind}{hint}"
        )
    if value in (subprocess.PIPE, subprocess.DEVNULL) or (
        name == "stderr" and value == subprocess.STDOUT
    ):
        return
    _check_open(name, value)


def _check_open(name: str, descriptor: int) -> None:
    try:
        os.fstat(descriptor)  # (a negative number: EBADF, as Popen fails on it in the child)
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}: {name}={descriptor}") from None


def _check_command(command: Command, shell: bool) -> list[Any]:
    if isinstance(command, (str, bytes)):
        if not shell:
            raise TypeError("command must be a sequence (not a string) unless shell=True")
        if not command.strip():
            raise ValueError("command is empty")
        if "\0" in os.fsdecode(command):
            raise ValueError("command contains a NUL byte")
        return [command]
    if shell:
        raise TypeError("command must be a string (not a sequence) when shell=True")
    if isinstance(command, os.PathLike):
        argv: list[Any] = [command]
    else:
        argv = list(command)
    if not argv:
        raise ValueError("command is empty")
    for arg in argv:
        if not isinstance(arg, (str, bytes, os.PathLike)):
            raise TypeError(f"command arguments must be str, bytes or paths, not {arg!r}")
        if "\0" in os.fsdecode(cast("StrOrPath", arg)):
            raise ValueError(f"command argument {arg!r} contains a NUL byte")
    if not os.fsdecode(argv[0]):
        raise ValueError("command is empty: its program name is ''")
    return argv


def _check_program(program: Any) -> None:
    """Refuse a NUL in the program's path as Popen does (ValueError): our own look at the
    file would take it for a missing one. (Popen checks the rest before it starts
    anything, as `_through_sh.wrapped` does for the environment it hands to env(1).)"""
    if "\0" in os.fsdecode(program):
        raise ValueError("embedded null byte")


def _check_user_and_group(options: dict[str, Any]) -> bool:
    """Names given for ``user=`` / ``group=`` must exist (else Popen fails after forking).

    Returns whether the leader is to run as another user or group than ours, such that it
    may not join a cgroup of ours: naming our own (a service that passes ``user=``
    whoever it runs as) changes nothing, nor do other groups for a leader that stays root.
    """
    import grp  # noqa: PLC0415 - Unix only: importing the package must work on Windows
    import pwd  # noqa: PLC0415

    user, group = options.get("user"), options.get("group")
    extra_groups = options.get("extra_groups")
    if isinstance(user, str):
        try:
            user = pwd.getpwnam(user).pw_uid
        except KeyError:
            raise ValueError(f"user={user!r}: no such user") from None
    if isinstance(group, str):
        try:
            group = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"group={group!r}: no such group") from None
    other_groups = group is not None and group != os.getegid()
    if extra_groups is not None:
        # Any iterable will do, as for Popen: read once, here, and handed on as a list (an
        # iterator read here would reach Popen empty, and the leader get no groups at all).
        extra_groups = options["extra_groups"] = list(extra_groups)
        other_groups |= _other_than_ours(extra_groups)
    if user is not None and user != os.geteuid():
        return True
    # Still our user, the leader joins its cgroup as we would, whatever its groups: root
    # may write any cgroup's files (CAP_DAC_OVERRIDE), and without that capability, owns
    # those it writes (its tree's cgroup, made by us; the cgroup.procs above it, root's in
    # any hierarchy delegated to root). Other groups took its tree off cgroup containment
    # for nothing, with an error naming user=/group= (helper-55). Another user's right
    # to write them may rest on its groups. (Root whose right rests on group bits alone,
    # without the capability, helper-57's contrived case, gets the join's error.)
    return other_groups and os.geteuid() != 0


def _other_than_ours(extra_groups: list[Any]) -> bool:
    """Whether ``extra_groups`` are other supplementary groups than ours."""
    import grp  # noqa: PLC0415 - Unix only: importing the package must work on Windows

    gids: set[int] = set()
    for extra in extra_groups:
        try:
            gids.add(grp.getgrnam(extra).gr_gid if isinstance(extra, str) else extra)
        except KeyError:
            # As for user= and group= (Popen's KeyError came only as the tree started).
            raise ValueError(f"extra_groups: {extra!r}: no such group") from None
    return gids != set(os.getgroups())


def _own_process_group(options: dict[str, Any]) -> None:
    """Make the leader head its own process group: a new session, or a new group in ours."""
    process_group = options.pop("process_group", None)
    if process_group is not None and (
        isinstance(process_group, bool) or not isinstance(process_group, int)
    ):
        raise TypeError(f"process_group must be an int, not {process_group!r}")
    if process_group not in (None, 0):
        raise ValueError(
            f"process_group={process_group!r} would put the tree into another group; "
            "every tree gets a group of its own (use start_new_session=False to stay in "
            "the caller's session)"
        )
    preexec_fn = options.get("preexec_fn")
    recipe = next((name for name in ("setsid", "setpgrp") if preexec_fn is getattr(os, name)), None)
    if recipe is not None:
        # Popen's old way to a group of its own: the leader heads one already, so its own
        # call would fail in the child, with nothing but "Exception occurred in preexec_fn".
        raise ValueError(
            f"preexec_fn=os.{recipe} is not needed: every tree's leader starts in a process "
            "group of its own (in a new session unless start_new_session=False)"
        )
    new_session = options.pop("start_new_session", None)
    if process_group == 0:
        # Popen's "a group of its own, in the caller's session" (with both, its child's
        # setpgid would fail, a session leader's).
        if new_session:
            raise ValueError(
                "start_new_session=True and process_group=0 ask for a new session and for "
                "the caller's: pass one of them"
            )
        new_session = False
    if new_session is None or new_session:
        options["start_new_session"] = True
    elif sys.version_info >= (3, 11):
        options["process_group"] = 0
    else:  # pragma: no cover - Python 3.10 only
        # Popen(process_group=...) is 3.11+. setpgrp() is async-signal-safe, so running it
        # between fork and exec is as safe as a preexec_fn gets.
        user_preexec: Callable[[], object] | None = options.get("preexec_fn")

        def join_new_group() -> None:
            os.setpgrp()
            if user_preexec is not None:
                user_preexec()

        options["preexec_fn"] = join_new_group


#: prctl's "send me this signal when the thread that forked me exits", and its reading.
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2


def _dying_with_us(user_preexec: Callable[[], object]) -> Callable[[], None]:
    """``preexec_fn``, run by a leader that dies with us while it runs.

    A preexec_fn can take any time, and until the exec the leader shows our environment,
    not its tree's marker, and heads no registered group: a parent SIGKILLed meanwhile
    left it to exec and run on for good (helper-26, subreaper and group containment). So
    it has PR_SET_PDEATHSIG for that time only: SIGKILL when the thread that forked it
    exits, which it cannot do before this returns (it waits for the exec), unless the
    whole process dies. Cleared again before the exec: a worker thread that retires later
    must never take a healthy leader with it (the trap the issue names).
    """
    from ._orphans import libc  # noqa: PLC0415 - (a cycle at import)

    parent, prctl = os.getpid(), libc().prctl  # (looked up here, not in the child)
    set_now = ctypes.c_int()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # we died before it was set: nobody will send it
            os._exit(255)
        user_preexec()
        # Cleared, unless the program's preexec_fn set one of its own (its choice, trap
        # and all: Popen would keep it).
        prctl(PR_GET_PDEATHSIG, ctypes.byref(set_now), 0, 0, 0)
        if set_now.value == signal.SIGKILL:
            prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)

    return preexec


def inherited_environment() -> dict[bytes, bytes]:
    """This process's environment as bytes, for a child that adds to it: `os.environ`'s
    own table copied in one step (a copy of ``os.environ`` decodes every entry, which
    Popen then encodes back: ~0.2 ms a spawn). Variables that C code set behind
    `os.environ`'s back are not in it (a plain Popen child would get them)."""
    data = getattr(os.environ, "_data", None)  # (CPython's bytes table, on POSIX)
    if isinstance(data, dict):
        return cast("dict[bytes, bytes]", data).copy()
    return {os.fsencode(name): os.fsencode(value) for name, value in os.environ.copy().items()}


def resolve_executable(
    program: Any, *, env: Mapping[Any, Any] | None, cwd: Any, remembered: bool = True
) -> Resolved:
    """Find ``program`` the way `subprocess.Popen`'s exec will, raising the error it would.

    As Popen's child does, each candidate in turn until one would exec, passing over
    those the kernel refuses (missing, not executable, an interpreter missing, no format
    it runs); the first error other than "not there" is the one reported. It is raised
    now, but for ENOEXEC, which only the exec can be sure of (`Resolved.refused`).
    """
    name = os.fsdecode(program)
    directory = None if cwd is None else os.fsdecode(cwd)
    if directory is not None:
        _check_working_directory(directory)
    if os.sep in name:
        path = name if directory is None else os.path.join(directory, name)
        found = look_at(path)
        if found == MISSING:
            raise _missing(path, name)
        if isinstance(found, OSError):  # (EACCES: a directory on the way we may not search)
            raise type(found)(found.errno, found.strerror, name)
        if found == NOT_EXECUTABLE:
            raise PermissionError(errno.EACCES, "not an executable file", name)
        if (refused := refusal(path, name, cwd)) is None:
            return Resolved(path)
        if refused.errno == errno.ENOEXEC:
            return Resolved(None, refused=refused)  # (only the exec can be sure of it)
        raise refused
    search = exec_path(env)
    key = (name, tuple(search), directory)
    known = _found_before.get(key) if remembered else None
    if (
        known is not None
        and known.path is not None
        and look_at(known.path) == EXECUTABLE
        and refusal(known.path, name, cwd) is None
    ):
        # Still there: Popen's own search finds it (or one earlier on PATH). One stat and
        # one look at it, not one per PATH entry before it (~0.3 ms a spawn with a long
        # PATH, on this VM). (Kept as remembered: no copy made at each spawn.)
        return known
    candidates: list[str] = []
    for entry in search:
        folder = os.fsdecode(entry) or "."
        if directory is not None:
            folder = os.path.join(directory, folder)
        candidates.append(os.path.join(folder, name))
    resolved = _first_that_runs(candidates, name, cwd)
    if resolved is not None:
        resolved = attrs.evolve(resolved, searched=tuple(search))
    if resolved is None:
        last = _missing(candidates[-1], name) if candidates else None
        if isinstance(last, NotADirectoryError):
            # Popen's exec reports the last place's error where none was worse than "not
            # there": a PATH that ends with a file says ENOTDIR (helper-62).
            raise last
        raise FileNotFoundError(
            errno.ENOENT,
            f"no such executable on PATH ({os.pathsep.join(map(os.fsdecode, search))})",
            name,
        )
    if resolved.path is not None:
        if len(_found_before) >= 256:  # (bounded: commands and PATHs are few)
            _found_before.clear()
        _found_before[key] = attrs.evolve(resolved, remembered=True)
    return resolved


def _missing(path: str, name: str) -> OSError:
    """The error for a program path that names nothing, as Popen raises it: through a
    file (``/etc/passwd/x``), NotADirectoryError; else FileNotFoundError."""
    try:
        os.stat(path)
    except NotADirectoryError:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", name)
    except OSError:
        pass
    return FileNotFoundError(errno.ENOENT, "no such executable", name)


def nothing_came_before(resolved: Resolved) -> bool:
    """Whether a remembered answer still says all: nothing is there now where its search
    found nothing before its file (one stat each; a file appeared there must be looked
    at, and may be one the kernel refuses, which sh's search would stop at)."""
    return all(look_at(place) == MISSING for place in resolved.looked_before)


def _first_that_runs(candidates: list[str], name: str, cwd: Any) -> Resolved | None:
    """The first of ``candidates`` that the kernel would run; else, where the exec
    alone can tell, why none would (`Resolved.refused`). None if none is there to run;
    raises the error Popen would, for a candidate that is there. (One stat each.)"""
    failed: OSError | None = None  # the first error other than "not there"
    missing_interpreter: OSError | None = None
    passed_over = False  # a file there that the kernel refuses
    for candidate in candidates:
        found = look_at(candidate)
        if isinstance(found, OSError):  # (as Popen's exec reports it: EACCES, say)
            failed = failed or found
            continue
        if found == NOT_EXECUTABLE:
            failed = failed or PermissionError(errno.EACCES, "not an executable file", candidate)
            continue
        if found == MISSING:
            continue
        refused = refusal(candidate, name, cwd)
        if refused is None:
            earlier = tuple(candidates[: candidates.index(candidate)])
            return Resolved(candidate, passed_over=passed_over, looked_before=earlier)
        passed_over = True
        if refused.errno == errno.ENOENT:
            missing_interpreter = missing_interpreter or refused
        else:
            failed = failed or refused
    if failed is not None and failed.errno == errno.ENOEXEC:
        return Resolved(None, refused=failed)  # (only the exec can be sure of it)
    if failed is not None:
        raise failed
    if missing_interpreter is not None:
        raise missing_interpreter
    return None


def _check_working_directory(directory: str) -> None:
    """Raise what the child's ``chdir`` would, as `subprocess` does, unless ``directory``
    is one: missing, not a directory (on the way there, too), or not ours to enter."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, "working directory does not exist", directory
        ) from None
    except NotADirectoryError:
        raise NotADirectoryError(errno.ENOTDIR, "not a directory on the way", directory) from None
    except OSError:
        return  # (EACCES on the way, say: the child's chdir says it, as subprocess's does)
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, "working directory is not a directory", directory)


#: Where each command was found on its PATH, checked again (one stat) before it is
#: trusted: a command that existed is looked for from scratch once it is gone.
_found_before: dict[tuple[str, tuple[Any, ...], str | None], Resolved] = {}


_NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1


def boot_ticks() -> int:
    """Now, as ``/proc/PID/stat`` gives a process's start time: clock ticks after boot
    (``CLOCK_BOOTTIME``, which a fork stamps on the child, divided the kernel's way)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // _NS_PER_TICK


def spawn(plan: SpawnPlan) -> Spawned:
    """Start the leader (blocking: run it in a worker thread). Leaks nothing if it fails."""
    ours: dict[str, int] = {}
    child_ends: list[int] = []
    stdio = {"stdin": plan.stdin, "stdout": plan.stdout, "stderr": plan.stderr}
    try:
        if plan.stdin == subprocess.PIPE:
            stdio["stdin"], ours["stdin"] = _pipe(child_ends, child_reads=True)
        if plan.stdout == subprocess.PIPE:
            ours["stdout"], stdio["stdout"] = _pipe(child_ends, child_reads=False)
        if plan.stderr == subprocess.PIPE:
            ours["stderr"], stdio["stderr"] = _pipe(child_ends, child_reads=False)
        elif plan.stderr == subprocess.STDOUT and "stdout" in ours:
            stdio["stderr"] = stdio["stdout"]
        for name, given in stdio.items():
            if name not in ours and (view := _blocking_view(given, child_ends)) is not None:
                stdio[name] = view
        before = boot_ticks()
        pid = _start_in_cgroup(plan, stdio)
        popen = None
        if pid is None:
            _refuse_what_the_wrapper_would_run_anyway(plan)
            popen = _popen(plan, stdio)
            pid = popen.pid
        started_within = (before, boot_ticks())
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in child_ends:
            os.close(fd)
    try:
        pidfd = _pidfd_of_our_child(pid)
    except OSError as exc:
        _give_up(pid, popen, ours.values())
        # Its group is dead; what left the group is its containment's to stop.
        raise StartedUnwatched(exc) from None
    lost = pidfd is None
    if pidfd is None:
        # The tree goes on without its leader, as when other code reaps it later (its group
        # then reached through nothing; its cgroup or its markers still tell its members):
        # in the pidfd's place, a descriptor that reads as exited and names no process.
        try:
            pidfd = os.eventfd(1, os.EFD_CLOEXEC)
        except OSError as exc:
            # (Out of file descriptors, say.) The leader is gone, and its pid may be
            # anyone's: Popen must never wait for that pid (another child of ours may have
            # it), and our pipe ends go. What it started is its containment's to stop.
            if popen is not None:
                popen.returncode = LOST
            for fd in ours.values():
                os.close(fd)
            raise StartedUnwatched(exc) from None
    return Spawned(
        pid,
        popen,
        pidfd,
        ours.get("stdin"),
        ours.get("stdout"),
        ours.get("stderr"),
        started_within,
        threading.get_native_id(),
        lost,
    )


def _give_up(pid: int, popen: subprocess.Popen[bytes] | None, fds: Iterable[int]) -> None:
    """The leader's pidfd could not be opened (out of file descriptors, say): without it
    the tree cannot be watched. Stop it before it runs away (its group id pinned by the
    unreaped leader), and leak nothing. Unless other code has reaped it already: then its
    pid, and group id, may be anyone's, and nothing is signalled or waited for."""
    reaped_elsewhere = not _unreaped_child(pid)
    try:
        if not reaped_elsewhere:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # (reaped elsewhere meanwhile)
                os.waitpid(pid, 0)
    finally:
        if popen is not None:  # reaped: Popen must never wait for that pid
            popen.returncode = LOST if reaped_elsewhere else -signal.SIGKILL
        for fd in fds:
            os.close(fd)


def _unreaped_child(pid: int) -> bool:
    """Whether ``pid`` is a child of ours, not reaped (asked by pid: no pidfd to ask by)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _pidfd_of_our_child(pid: int) -> int | None:
    """A pidfd for the child just started; None if other code has reaped it already.

    The child is ours and unreaped, so its pid cannot have been recycled yet: unless other
    code reaped it in the meantime (a waitpid(-1) in another thread). Then the number may
    be a new process's by now, and a pidfd opened by it names a stranger, whose group
    would get the tree's signals: the pidfd must name a child of ours, not yet reaped.
    """
    if (pidfd := open_pidfd(pid)) is None:
        return None  # reaped already, and the pid not a process's again (yet)
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        os.close(pidfd)
        return None
    except BaseException:  # (EINVAL: a kernel without waitid(P_PIDFD), say)
        os.close(pidfd)
        raise
    return pidfd


def _start_in_cgroup(plan: SpawnPlan, stdio: Mapping[str, Any]) -> int | None:
    """Start the leader directly in its cgroup if the plan asks and it can be done here:
    its pid, or None (then `subprocess.Popen` starts ``plan.command``)."""
    if plan.into_cgroup is None:
        return None
    fds = direct.stdio_fds(stdio["stdin"], stdio["stdout"], stdio["stderr"])
    if fds is None:
        return None
    if plan.into_cgroup.joiner is not None:
        _refuse_what_the_wrapper_would_run_anyway(plan)
    try:
        return direct.start(plan.into_cgroup, plan.options, fds)
    except direct.Refused:
        return None


def _popen(plan: SpawnPlan, stdio: Mapping[str, Any]) -> subprocess.Popen[bytes]:
    """The leader, started by Popen as ``plan`` says (through the joiner or /bin/sh, or
    joining its cgroup in a preexec_fn, where the containment asks)."""
    options = dict(plan.options)
    if plan.command_env is not None:
        options["env"] = plan.command_env
    try:
        with joining_first(plan.joins, options):
            return cast(
                "subprocess.Popen[bytes]", subprocess.Popen(plan.command, **stdio, **options)
            )
    except OSError as exc:
        if (
            plan.joiner is not None
            and exc.errno is not None
            and exc.filename == plan.joiner
            and not joiner_runs(plan.joiner)
        ):
            # The joiner's own exec failed (gone or changed since it was proven).
            raise joiner_lost(exc.errno, plan.joiner) from None
        if plan.through_wrapper and exc.errno == errno.E2BIG:
            # The wrapper's exec (its arguments are the command's, and a few hundred bytes
            # of its own): named so, it blamed "/bin/sh" or the joiner (helper-70).
            raise OSError(exc.errno, exc.strerror, plan.program) from None
        raise


@contextlib.contextmanager
def joining_first(procs: str | None, options: dict[str, Any]) -> Generator[None]:
    """Within, ``options`` have the child write itself into the cgroup whose ``procs``
    file is given, before anything else in its ``preexec_fn`` (and before its exec):
    status 125 and a message if it cannot, as the /bin/sh wrapper's. One ``write`` of a
    descriptor opened here, then the program's own ``preexec_fn``, if any: our part
    imports nothing and takes no lock (Popen runs the fork handlers libraries registered,
    as for any ``preexec_fn``: the reason only a command named apart comes this way)."""
    if procs is None:
        yield
        return
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
    said = f"trio_proctree: cannot join cgroup {os.path.dirname(procs)}\n".encode()
    then: Callable[[], object] | None = options.get("preexec_fn")
    write, exit_now = os.write, os._exit  # (looked up here, not in the child)

    def join() -> None:
        try:
            write(fd, b"0")  # (0: the writer itself)
        except OSError:
            with contextlib.suppress(OSError):
                write(2, said)
            exit_now(125)
        if then is not None:
            then()

    options["preexec_fn"] = join
    try:
        yield
    finally:
        os.close(fd)


def _refuse_what_the_wrapper_would_run_anyway(plan: SpawnPlan) -> None:
    """Raise ENOEXEC, as Popen's exec would, for a program of no format the kernel runs,
    that a wrapper would start all the same (/bin/sh runs it as a script), or report only
    in its exit status (the joiner)."""
    if plan.through_wrapper and plan.resolved is not None and plan.resolved.refused is not None:
        raise plan.resolved.refused


#: Streams whose pipe trio puts in non-blocking mode, for itself (`_blocking_view`):
#: trio's own, and the trio driver's output streams (which it adds).
TRIO_STREAMS: list[type] = []
if hasattr(trio.lowlevel, "FdStream"):  # (not on Windows)
    TRIO_STREAMS.append(trio.lowlevel.FdStream)


def _blocking_view(given: Any, child_ends: list[int]) -> int | None:
    """For a trio stream's pipe given as the command's stdin, stdout or stderr (in a
    pipeline, ``stdin=tree.stdout``), which trio put in non-blocking mode for itself:
    the same pipe opened anew, in blocking mode, for the child (added to ``child_ends``,
    closed once it started). The mode belongs to an open file, shared by every
    descriptor of it: handed on as it was, the command's read of an empty pipe (or write
    to a full one) failed with EAGAIN, "Resource temporarily unavailable", where a
    shell's pipeline waits (trio issue #1707, helper-67). Not a descriptor or a file
    given as such: its mode is the program's choice, and the command gets it as Popen
    gives it (helper-68: a command may poll a non-blocking stdin on purpose). None where
    nothing is to be done, or the pipe cannot be opened anew (a FIFO's write end with no
    reader): the command gets it as given."""
    if not any(isinstance(given, kind) for kind in TRIO_STREAMS):
        return None
    import fcntl  # noqa: PLC0415 - POSIX only, and the package imports on Windows

    try:
        fd = given.fileno()
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if not flags & os.O_NONBLOCK or not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        # Opened without waiting for the other end (/proc's link to a pipe opens it as a
        # FIFO), through this thread's table (/proc/self/fd is gone once the main thread
        # has exited: helper-68); then given the pipe's other flags (O_DIRECT, a pipe of
        # packets, which open() refuses for a pipe: helper-69) in blocking mode. A new
        # open file: its mode is its own.
        access = flags & os.O_ACCMODE
        view = os.open(f"/proc/thread-self/fd/{fd}", access | os.O_NONBLOCK | os.O_CLOEXEC)
        child_ends.append(view)  # (closed once the child started, or the spawn failed)
        fcntl.fcntl(view, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except OSError:
        return None
    return view


def _pipe(child_ends: list[int], *, child_reads: bool) -> tuple[int, int]:
    read_end, write_end = os.pipe()  # both close-on-exec; Popen dups the child's end onto 0/1/2
    child_ends.append(read_end if child_reads else write_end)
    return read_end, write_end
