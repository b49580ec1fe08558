"""The /bin/sh wrapper that joins a tree's cgroup and then becomes the command, run so that
the command gets what `subprocess.Popen` would give it: the same file, the same
arguments, the same environment (argv[0] may show the path where a bare name was given).

Where the C library cannot start a process in a cgroup (glibc before 2.41), the leader
starts as ``/bin/sh``, writes its pid into the cgroup's ``cgroup.procs`` and execs the
command. A shell's exec is not Popen's: it searches its own default PATH where the
environment has none, stops at the first file on PATH it may execute (and runs one the
kernel refuses as a script), passes on its own variables, not the environment it got
(names that are no shell identifier dropped, and IFS, OPTIND, PPID and PWD set by the shell
itself), and says "getcwd() failed" on stderr when it starts in a directory that has been
removed. Each is dealt with here, at little cost to the common case (one getcwd).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Any, cast

#: Joins the cgroup named by $0 (its cgroup.procs), then becomes the command. Exit status
#: 125 (and a message) if the cgroup cannot be joined, as env(1) and timeout(1) use it.
JOIN_AND_EXEC = (
    'echo $$ > "$0" || { echo "trio_proctree: cannot join cgroup ${0%/*}" >&2; exit 125; }; '
    'exec "$@"'
)

#: What passes on the environment exactly as given, where the shell cannot: env(1), told
#: to start from nothing (``-i``) and given every variable as an argument.
ENV = "/usr/bin/env"

_SHELL_NAMES = re.compile(rb"(?:[A-Za-z_][A-Za-z0-9_]*\0)*[A-Za-z_][A-Za-z0-9_]*")
#: Variables a POSIX shell sets for itself at its start, whatever the environment says.
#: (PWD too, which `keep_pwd` restores without env(1); bash would also set SHLVL and _.)
_SET_BY_THE_SHELL = frozenset({b"IFS", b"OPTIND", b"PPID"})

#: A PWD a shell takes as its directory's name without asking the kernel for one: where it
#: starts (``/proc/self/cwd`` leads there even once the directory is removed).
_HERE = "/proc/self/cwd"


def wrapped(
    procs: str,
    argv: list[Any],
    *,
    env: Mapping[Any, Any] | None,
    found: str | None,
    passed_over: bool,
    cwd: Any,
) -> tuple[list[Any], dict[Any, Any] | None]:
    """The command that joins the cgroup whose ``procs`` file is given, then runs ``argv``
    as Popen would, and the environment to start it with where not ``env`` itself.
    ``found``: the absolute path where Popen's search of PATH settles, for a bare program
    name (else None); ``passed_over``: that search went past a file the kernel refuses,
    where sh's own would stop; ``cwd``: the directory it starts in (None: ours)."""
    # A shell started in a removed directory finds no name for it (getcwd fails) and says
    # so into the command's stderr, where Popen's program runs there with nothing said,
    # unless the PWD it gets leads to where it is. The command gets its own PWD back below.
    removed = _removed(cwd)
    if env is None:
        from ._spawn import inherited_environment  # noqa: PLC0415 - (a cycle at import)

        env = cast("Mapping[Any, Any]", inherited_environment())
        names: list[bytes] = list(env)  # (bytes already)
    else:
        names = [os.fsencode(name) for name in env]
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
        if any(b"=" in name for name in names):
            # As Popen refuses it: env(1) would read NAME=X=Y as the variable NAME (a
            # name holding "=" set another variable, seen: helper-25).
            raise ValueError("illegal environment variable name")
        assignments = [os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items()]
        command = [ENV, "-i", "--", *assignments, program, *argv[1:]]
        # The wrapper itself starts with no environment: env(1) drops what it would pass
        # on anyway, and the environment, carried once in its arguments already, would
        # else count twice against the kernel's bound on both (E2BIG at half Popen's).
        return ["/bin/sh", "-c", JOIN_AND_EXEC, procs, *command], {"PWD": _HERE} if removed else {}
    if found is not None and (passed_over or b"PATH" not in names):
        # sh's search would settle elsewhere: it stops at a file the kernel refuses (dash
        # runs one of no format as a script), and with no PATH at all it searches a
        # default of its own, where Popen searches os.defpath. (argv[0] shows the path.)
        argv = [found, *argv[1:]]
    pwd = next((env[name] for name in ("PWD", b"PWD") if name in env), None)
    command = ["/bin/sh", "-c", keep_pwd(pwd) + JOIN_AND_EXEC, procs, *argv]
    if removed:
        others = {name: value for name, value in env.items() if name not in ("PWD", b"PWD")}
        return command, {**others, "PWD": _HERE}
    return command, None


def _removed(cwd: Any) -> bool:
    """Whether the directory a child starts in (``cwd``; None: ours) has been removed."""
    if cwd is None:
        try:
            os.getcwd()  # (the shell's own question)
        except OSError as exc:
            return isinstance(exc, FileNotFoundError)
        return False
    try:
        return os.stat(cwd).st_nlink == 0
    except (OSError, TypeError, ValueError):
        return False  # (Popen's chdir says what is wrong with it)


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
