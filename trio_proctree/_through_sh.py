"""The /bin/sh wrapper that joins a tree's cgroup and then becomes the command, run so that
the command gets what `subprocess.Popen` would give it: the same file, the same
arguments, the same environment (argv[0] may show the path instead of a bare name given).

Where the C library cannot start a process in a cgroup (glibc before 2.41), the leader
starts as ``/bin/sh``, writes its pid into the cgroup's ``cgroup.procs`` and execs the
command. A shell's exec is not Popen's: it searches its own default PATH where the
environment has none, stops at the first file on PATH it may execute (and runs one the
kernel refuses as a script), and passes on its own variables, not the environment it got:
names that are no shell identifier dropped, and IFS, OPTIND, PPID and PWD set by the shell
itself. Each is dealt with here, at no cost to the common case.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any, cast

#: Joins the cgroup named by $0 (its cgroup.procs), then becomes the command. Exit status
#: 125 (and a message) if the cgroup cannot be joined, as env(1) and timeout(1) use it.
JOIN_AND_EXEC = (
    'echo $$ > "$0" || { echo "trio_proctree: cannot join cgroup ${0%/*}" >&2; exit 125; }; '
    'exec "$@"'
)

#: Joins the cgroup and becomes the command under a name of its own: for a command that
#: names itself apart from the file it runs (``executable=``), which no exec of sh or
#: env(1) here can do. Its arguments: the cgroup's procs file; "1" to give SIGPIPE and
#: SIGXFSZ back their defaults (Popen's ``restore_signals``: Python ignores them at its
#: start, and an ignored signal stays so across an exec); the file; how many environment
#: entries follow; the entries; the command's argv. Exit statuses as sh's.
NAMED_APART_EXEC = """\
import errno, os, signal, sys
procs, restore, file, count, *rest = map(os.fsencode, sys.argv[1:])
try:
    with open(procs, "wb") as f:
        f.write(b"%d" % os.getpid())
except OSError as e:
    cgroup = os.fsdecode(os.path.dirname(procs))
    sys.stderr.write(f"trio_proctree: cannot join cgroup {cgroup}: {e}\\n")
    sys.exit(125)
if restore == b"1":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
env = dict(entry.split(b"=", 1) for entry in rest[: int(count)])
try:
    os.execve(file, rest[int(count) :], env)
except OSError as e:
    sys.stderr.write(f"trio_proctree: cannot exec {os.fsdecode(file)}: {e}\\n")
    sys.exit(127 if e.errno == errno.ENOENT else 126)
"""

#: What passes on the environment exactly as given, where the shell cannot: env(1), told
#: to start from nothing (``-i``) and given every variable as an argument.
ENV = "/usr/bin/env"

_SHELL_NAMES = re.compile(rb"(?:[A-Za-z_][A-Za-z0-9_]*\0)*[A-Za-z_][A-Za-z0-9_]*")
#: Variables a POSIX shell sets for itself at its start, whatever the environment says.
#: (PWD too, which `keep_pwd` restores without env(1); bash would also set SHLVL and _.)
_SET_BY_THE_SHELL = frozenset({b"IFS", b"OPTIND", b"PPID"})


def wrapped(
    procs: str,
    argv: list[Any],
    *,
    env: Mapping[Any, Any] | None,
    found: str | None,
    passed_over: bool,
    named: Any = None,
    restore_signals: bool = True,
) -> tuple[list[Any], dict[str, str] | None]:
    """The command that joins the cgroup whose ``procs`` file is given, then runs ``argv``
    as Popen would, and the environment to start it with where not ``env`` itself.
    ``found``: the absolute path where Popen's search of PATH settles, for a bare program
    name (else None); ``passed_over``: that search went past a file the kernel refuses,
    where sh's own would stop; ``named``: the command's argv[0] where it is not the file
    it runs (``argv[0]``, as ``executable=`` sets it apart)."""
    if env is None:
        from ._spawn import inherited_environment  # noqa: PLC0415 - (a cycle at import)

        env = cast("Mapping[Any, Any]", inherited_environment())
        names: list[bytes] = list(env)  # (bytes already)
    else:
        names = [os.fsencode(name) for name in env]
    file = found or argv[0]
    if named is not None and os.sep in os.fsdecode(file) and (python := _interpreter()):
        # Neither sh's exec nor env(1) can give the command a name of its own: Python's
        # can, at the cost of its start (~10 ms more than sh's), for this option alone.
        entries = _assignments(env, names)
        restore = "1" if restore_signals else "0"
        command = [procs, restore, file, str(len(entries)), *entries, named, *argv[1:]]
        # (It starts with no environment, as env(1) does: see there.)
        return [python, "-I", "-S", "-c", NAMED_APART_EXEC, *command], {}
    if not _pass_through_sh(names):
        # Only env(1) passes these on as given. It is given a path, so that no search of
        # its own runs (argv[0] then shows the path: no exec here can set it apart).
        program = found or os.fsdecode(argv[0])
        if "=" in program:
            raise ValueError(
                f"{program!r}: its environment holds variables /bin/sh cannot pass on, and "
                "env(1), which could, takes a path holding '=' for a variable; use another "
                "containment, or another path"
            )
        command = [ENV, "-i", "--", *_assignments(env, names), program, *argv[1:]]
        # The wrapper itself starts with no environment: env(1) drops what it would pass
        # on anyway, and the environment, carried once in its arguments already, would
        # else count twice against the kernel's bound on both (E2BIG at half Popen's).
        return ["/bin/sh", "-c", JOIN_AND_EXEC, procs, *command], {}
    if found is not None and (passed_over or b"PATH" not in names):
        # sh's search would settle elsewhere: it stops at a file the kernel refuses (dash
        # runs one of no format as a script), and with no PATH at all it searches a
        # default of its own, where Popen searches os.defpath. (argv[0] shows the path.)
        argv = [found, *argv[1:]]
    pwd = next((env[name] for name in ("PWD", b"PWD") if name in env), None)
    return ["/bin/sh", "-c", keep_pwd(pwd) + JOIN_AND_EXEC, procs, *argv], None


def _assignments(env: Mapping[Any, Any], names: list[bytes]) -> list[bytes]:
    """Every variable as NAME=VALUE, for a wrapper that passes them on in its arguments.
    ValueError for a name holding "=", as Popen refuses it: read back, NAME=X=Y would
    set the variable NAME (seen with env(1): helper-25)."""
    if any(b"=" in name for name in names):
        raise ValueError("illegal environment variable name")
    return [os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items()]


def _interpreter() -> str | None:
    """This Python's interpreter, where it can be run (not so in every program that
    embeds Python: then argv[0] shows the file)."""
    python = sys.executable
    return python if python and os.access(python, os.X_OK) else None


def _pass_through_sh(names: list[bytes]) -> bool:
    """Whether a shell passes on variables of these names as it got them: each a shell
    identifier, none one it sets itself. (One match over them all: ~2 us, on every
    spawn through the wrapper.)"""
    return not names or (
        _SET_BY_THE_SHELL.isdisjoint(names)
        and _SHELL_NAMES.fullmatch(b"\0".join(names)) is not None
    )


def keep_pwd(given: str | bytes | None) -> str:
    """What the /bin/sh wrapper must do so that the command gets PWD as ``given`` (None:
    no PWD): sh sets PWD for itself (to the real directory) and exports it, where Popen
    passes the environment as it is."""
    if given is None:
        return "unset PWD; "
    return f"export PWD={shlex.quote(os.fsdecode(given))}; "
