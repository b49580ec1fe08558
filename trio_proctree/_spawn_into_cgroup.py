"""Starting a leader without `subprocess.Popen`, through the C library's ``posix_spawn``:
directly inside its cgroup, with no extra ``exec``, where ``POSIX_SPAWN_SETCGROUP`` is
(glibc 2.41 or newer, Linux 5.7 or newer); elsewhere (glibc 2.34 or newer) the joiner
(`._joiner`), which joins the cgroup and then ``exec``\\ s the command.

``posix_spawn`` creates the child with ``clone3(CLONE_INTO_CGROUP)`` the way `subprocess`
creates one with ``vfork``: the child shares our memory until it calls ``exec`` (no page
tables are copied) and is in its cgroup from its first instruction. The joiner costs one
more ``exec``, of a program with no loader and no C library (a few microseconds).

Only what this module does exactly as `subprocess.Popen` does is taken here; a request
with any other option (``preexec_fn``, ``user=``, ``pass_fds``, ``umask``, ...) is started
by Popen instead (through the joiner, or ``/bin/sh``). `ctypes` is enough: no Python code
runs in the child.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._after_fork import renewed_in_forked_child
from ._exec_check import exec_path
from ._joiner import lost as joiner_lost
from ._joiner import runs as joiner_runs
from ._procfs import read_file

logger = logging.getLogger("trio_proctree")

# <spawn.h>; POSIX_SPAWN_SETCGROUP is new in glibc 2.41.
_SETPGROUP = 0x02
_SETSIGDEF = 0x04
_SETSID = 0x80
_SETCGROUP = 0x100

#: Options taken here, with the values for which `subprocess.Popen` does what this module
#: does (``None``: any value). Anything else goes through Popen.
_SUPPORTED: Mapping[str, tuple[Any, ...] | None] = {
    "cwd": None,
    "env": None,
    "close_fds": (True, False),
    "restore_signals": (True, False),
    "start_new_session": (True, False),
    "process_group": (None, 0),
    "pass_fds": ((),),
    "preexec_fn": (None,),
    "umask": (-1,),
    "pipesize": (-1,),
    "user": (None,),
    "group": (None,),
    "extra_groups": (None,),
    "startupinfo": (None,),
    "creationflags": (0,),
}


@attrs.frozen
class IntoCgroup:
    """A leader to start inside ``cgroup`` (a directory), running ``program`` (found as
    Popen finds it) with ``argv``. ``reused``: the cgroup served a tree before."""

    cgroup: str
    program: Any
    argv: Sequence[Any]
    reused: bool = False
    #: Where Popen's search of PATH settles for a bare ``program``, as the child is to
    #: exec it (the PATH entry joined to the name), checked when the spawn was planned:
    #: tried alone first, then, should its exec fail, the whole search as Popen's.
    settled: bytes | None = None
    #: Where this C library cannot create the leader in its cgroup: the joiner to exec
    #: in its place (`._joiner`), ``argv`` being the joiner's arguments, started as
    #: leaders created in their cgroup are (no `subprocess.Popen`, whose Python in the
    #: spawn's thread cost more than the joiner saves: 100 trees 1.4x the killpg
    #: baseline, against ~1.1x so).
    joiner: str | None = None


class _Glibc:
    """The ``posix_spawn`` functions of the C library, typed for `ctypes` (glibc 2.34 or
    newer: ``posix_spawn_file_actions_addclosefrom_np``)."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int
        self.libc = libc
        #: Whether it can create a child in a cgroup (glibc 2.41 or newer).
        self.sets_cgroup = hasattr(libc, "posix_spawnattr_setcgroup_np")
        for name, argtypes in {
            "posix_spawnattr_init": [p],
            "posix_spawnattr_destroy": [p],
            "posix_spawnattr_setflags": [p, ctypes.c_short],
            "posix_spawnattr_setpgroup": [p, i],
            "posix_spawnattr_setsigdefault": [p, p],
            "posix_spawnattr_setcgroup_np": [p, i],
            "posix_spawn_file_actions_init": [p],
            "posix_spawn_file_actions_destroy": [p],
            "posix_spawn_file_actions_adddup2": [p, i, i],
            "posix_spawn_file_actions_addopen": [p, i, ctypes.c_char_p, i, i],
            "posix_spawn_file_actions_addclosefrom_np": [p, i],
            "posix_spawn_file_actions_addchdir_np": [p, ctypes.c_char_p],
            "posix_spawn": [p, ctypes.c_char_p, p, p, p, p],
            "sigemptyset": [p],
            "sigaddset": [p, i],
        }.items():
            if name == "posix_spawnattr_setcgroup_np" and not self.sets_cgroup:
                continue
            function = getattr(libc, name)
            function.argtypes = argtypes
            function.restype = i
        self.environ = ctypes.c_void_p.in_dll(libc, "environ")


@functools.cache
def _glibc() -> _Glibc | None:
    """The C library's ``posix_spawn``, where it does all that Popen's child does."""
    try:
        return _Glibc(ctypes.CDLL(None, use_errno=True))
    except (OSError, AttributeError, ValueError):  # not glibc, or a partial one
        return None


#: Set when leaders cannot be started in their cgroup after all: the kernel refused
#: ``clone3`` (too old, or a seccomp filter says ENOSYS), or the first child started so
#: was killed at birth (see `_first_child_lives`). From then on every leader goes through
#: a wrapper that joins its cgroup (the joiner, or ``/bin/sh``).
_refused = False
#: Whether `_first_child_lives` has answered yes in this process.
_proven = False
_proving = threading.Lock()
renewed_in_forked_child(globals(), "_proving")


def available() -> bool:
    """Whether leaders can be started directly in their cgroup here."""
    glibc = _glibc()
    return not _refused and glibc is not None and glibc.sets_cgroup


def can_start(options: Mapping[str, Any]) -> bool:
    """Whether a request with these `subprocess.Popen` options (stdio aside) is taken here."""
    return available() and _takes(options)


def can_start_joiner(options: Mapping[str, Any]) -> bool:
    """Whether a joiner with these `subprocess.Popen` options (stdio aside) is taken here."""
    return _glibc() is not None and _takes(options)


def _takes(options: Mapping[str, Any]) -> bool:
    for key, value in options.items():
        if key not in _SUPPORTED:
            return False
        allowed = _SUPPORTED[key]
        if allowed is not None and not any(value is ok or value == ok for ok in allowed):
            return False
    return True


class Refused(Exception):
    """Leaders cannot be started in their cgroup here after all (nothing was started):
    the caller starts this one another way, as `can_start` will say for the next."""


class KilledAtBirth(Refused):
    """This leader was killed before it could exec: its cgroup was killed at some point
    (``cgroup.kill``, by a member of the tree it served before). Nothing of the program
    ran, and the child is reaped; start it another way (/bin/sh can still join)."""


#: The real-time signals glibc keeps for itself on Linux (``__SIGRTMIN``, ``+ 1``).
_GLIBC_SIGNALS = (32, 33)

# Buffers larger than glibc's structures on any architecture (336 and 80 bytes on x86-64),
# 8-byte aligned; the init functions fill in what they need.
_Opaque = ctypes.c_uint64 * 64
_SigSet = ctypes.c_uint64 * 16


def start(request: IntoCgroup, options: Mapping[str, Any], stdio: Sequence[int | None]) -> int:
    """Start the leader in its cgroup and return its pid (blocking: run in a thread).

    ``stdio``: the fds to become the child's 0, 1 and 2 (None: inherit ours; -1 for
    ``subprocess.DEVNULL``); `can_start` has accepted ``options``.

    Raises:
        Refused: leaders cannot be started so here (nothing was started).
        OSError: the program could not be started (the error `subprocess.Popen` raises).
    """
    glibc = _glibc()
    assert glibc is not None, "can_start() said yes"
    if request.joiner is not None:
        # (Not created in the cgroup: it joins it as /bin/sh would, and nothing here
        # kills it at birth.)
        return _posix_spawn(glibc, request, options, stdio)
    if not _proven:
        _prove(glibc, request)
    pid = _posix_spawn(glibc, request, options, stdio)
    if request.reused and _died_before_exec(pid):
        raise KilledAtBirth
    return pid


#: Task flags (/proc/PID/stat, field 9): forked and not yet exec'd; exiting.
_PF_FORKNOEXEC = 0x40
_PF_EXITING = 0x4


def _died_before_exec(pid: int) -> bool:
    """Whether the child just started is dying without having exec'd (then: reaped).

    A cgroup reused after a member wrote its ``cgroup.kill`` kills the next leader created
    in it at birth; nothing tells such a cgroup apart beforehand. ``posix_spawn`` reports
    success for a child killed before its exec, so the child's flags say it: by the time
    ``posix_spawn`` returns, a healthy child has (nearly) exec'd, and a child that has
    not is exiting, never to run a line of the program. Read only for reused cgroups.
    """
    try:
        data = read_file(f"/proc/{pid}/stat", made_whole=True)
    except OSError:  # pragma: no cover - an unreaped child of ours has a /proc entry
        return False
    flags = int(data[data.rindex(b")") + 2 :].split()[6])
    if flags & _PF_FORKNOEXEC and flags & _PF_EXITING:
        with contextlib.suppress(ChildProcessError):  # (reaped by the program meanwhile)
            os.waitpid(pid, 0)  # it is exiting: this returns at once
        logger.debug("pid %d was killed before its exec (its cgroup had been killed)", pid)
        return True
    return False


def _prove(glibc: _Glibc, request: IntoCgroup) -> None:
    """Start one throwaway child in a new cgroup the way leaders will be, once per
    process: if it is killed at birth, leaders go through ``/bin/sh`` instead.

    Linux kernels with the ``kill_seq`` fix for ``cgroup.kill`` (6.14, and stable kernels
    it was backported to) compare a new child's target cgroup with its *parent's* cgroup:
    a child created in a cgroup whose ``cgroup.kill`` count differs from ours gets SIGKILL
    before it runs (measured on Linux 6.18). `CgroupHome` does not reuse a cgroup it
    killed, and a leader killed at birth in one a member killed is started again through
    /bin/sh (`_died_before_exec`); in a new cgroup it only happens if our own cgroup was
    killed before this process entered it. Unknowable from user space, hence the
    throwaway child, in the leader's own cgroup if it is new, else in one made for it
    (not in a reused one, which a member may have killed: that says nothing about ours).
    """
    global _proven, _refused  # noqa: PLW0603 - one answer for the whole process
    with _proving:
        if _proven or _refused:
            if _refused:
                raise Refused
            return
        proving = request.cgroup
        if request.reused:
            proving = os.path.join(os.path.dirname(request.cgroup), "proving")
            try:
                os.mkdir(proving)
            except FileExistsError:  # (left by this process's former image)
                pass
            except OSError:
                # Out of cgroups (cgroup.max.descendants), say: this leader goes through
                # /bin/sh, and a later one with a new cgroup proves direct starts.
                raise Refused from None
        try:
            throwaway = IntoCgroup(proving, "/bin/sh", ["sh", "-c", "exit 0"])
            pid = _posix_spawn(glibc, throwaway, {}, [])  # its errors are this spawn's
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                # Reaped by someone else (a waitpid(-1) in the program): no answer yet.
                # This leader goes through /bin/sh; the next spawn asks again.
                raise Refused from None
        finally:
            if proving != request.cgroup:
                with contextlib.suppress(OSError):
                    os.rmdir(proving)
        outcome = os.waitstatus_to_exitcode(status)
        if outcome == 0:
            _proven = True
            return
        _refused = True
    logger.debug(
        "a child started in its cgroup did not live (exit status %s); leaders will join "
        "their cgroup through /bin/sh",
        outcome,
    )
    raise Refused


def _posix_spawn(
    glibc: _Glibc, request: IntoCgroup, options: Mapping[str, Any], stdio: Sequence[int | None]
) -> int:
    global _refused  # noqa: PLW0603 - one switch for the whole process
    libc = glibc.libc
    argv = [os.fsencode(arg) for arg in request.argv]
    c_argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    env = options.get("env")
    cwd = options.get("cwd")
    c_env: Any = glibc.environ.value if env is None else _environment(env)
    attr, actions, defaults = _Opaque(), _Opaque(), _SigSet()
    cgroup = (
        os.open(request.cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if request.joiner is None
        else None  # (the joiner joins it itself)
    )
    try:
        _check(libc.posix_spawnattr_init(attr))
    except BaseException:
        _close(cgroup)
        raise
    try:
        _check(libc.posix_spawn_file_actions_init(actions))
        try:
            _set_attributes(libc, attr, defaults, options, cgroup)
            _set_actions(libc, actions, stdio, options)
            pid = ctypes.c_int()

            def search(candidates: list[bytes]) -> tuple[int, int]:
                # As Popen's child does: each candidate in turn, until one execs; the first
                # error other than "not there" is the one to report.
                saved_error, last_error = 0, errno.ENOENT
                for path in candidates:
                    last_error = libc.posix_spawn(
                        ctypes.byref(pid), path, actions, attr, c_argv, c_env
                    )
                    if last_error in (0, errno.ENOSYS):
                        break
                    if last_error not in (errno.ENOENT, errno.ENOTDIR) and not saved_error:
                        saved_error = last_error
                return last_error, saved_error

            last_error, saved_error = errno.ENOENT, 0
            if request.joiner is not None:
                # (Its own search, of the paths it is given, is Popen's.) Should the joiner
                # not exec (gone or changed since it was proven), nothing else is started
                # here: the program, started in its place, would run in no cgroup of ours
                # (helper-107).
                last_error, saved_error = search([os.fsencode(request.joiner)])
                if last_error and not joiner_runs(request.joiner):
                    raise joiner_lost(last_error, request.joiner)
            elif request.settled is not None:
                # Where the planned search settled: PATH is not searched again (one stat
                # per entry, ~10 a spawn). Popen would run the same file, the entries
                # before it having been looked at by then.
                last_error, saved_error = search([request.settled])
            if request.joiner is None and last_error not in (0, errno.ENOSYS):
                # Gone since, say: the whole search, from the first entry, as Popen's.
                last_error, saved_error = search(_candidates(request.program, env, cwd))
        finally:
            libc.posix_spawn_file_actions_destroy(actions)
    finally:
        libc.posix_spawnattr_destroy(attr)
        _close(cgroup)
    if last_error == errno.ENOSYS and cgroup is not None:
        _refused = True
        logger.debug("clone3 is refused here; leaders will join their cgroup through /bin/sh")
        raise Refused
    if last_error:
        raise _spawn_error(saved_error or last_error, request.program, cwd)
    return pid.value


@functools.cache
def _glibc_signals_not_ignored() -> tuple[int, ...]:
    """glibc's own signals that this process does not ignore. Read once, from the kernel
    (Python's `signal.getsignal` cannot tell: glibc refuses it these): no Python code can
    change them, and a fork keeps them."""
    try:
        status = read_file("/proc/thread-self/status")
    except OSError:  # pragma: no cover - (/proc is there, or nothing here would work)
        return _GLIBC_SIGNALS
    for line in status.splitlines():
        if line.startswith(b"SigIgn:"):
            ignored = int(line.split()[1], 16)
            return tuple(n for n in _GLIBC_SIGNALS if not ignored >> (n - 1) & 1)
    return _GLIBC_SIGNALS  # pragma: no cover - (every Linux says it)


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _set_attributes(
    libc: ctypes.CDLL, attr: Any, defaults: Any, options: Mapping[str, Any], cgroup: int | None
) -> None:
    """The spawn attributes: cgroup (unless None), session or group, and signals Popen
    restores."""
    flags = 0 if cgroup is None else _SETCGROUP
    if options.get("start_new_session", False):
        flags |= _SETSID
    elif options.get("process_group") == 0:
        flags |= _SETPGROUP
        _check(libc.posix_spawnattr_setpgroup(attr, 0))
    flags |= _SETSIGDEF
    _check(libc.sigemptyset(defaults))
    if options.get("restore_signals", True):
        # As Popen does: what Python ignores for itself, the program gets back.
        for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
            if hasattr(signal, name):
                _check(libc.sigaddset(defaults, getattr(signal, name)))
    # glibc's own signals (SIGCANCEL, SIGSETXID), which it handles itself: where
    # posix_spawn cannot have the kernel reset the child's handlers (a clone without
    # clone3's CLONE_CLEAR_SIGHAND, glibc before 2.41 here), it sets those it handles to
    # "ignore", and the program would keep that through its exec, where Popen's vfork
    # child gets the default (or ours, if we ignore them: a process started by Python
    # 3.13's own posix_spawn does). Set bit by bit: sigaddset refuses them.
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    words = ctypes.cast(defaults, ctypes.POINTER(ctypes.c_ulong))
    for number in _glibc_signals_not_ignored():
        words[(number - 1) // bits] |= 1 << ((number - 1) % bits)
    _check(libc.posix_spawnattr_setsigdefault(attr, defaults))
    _check(libc.posix_spawnattr_setflags(attr, flags))
    if cgroup is not None:
        _check(libc.posix_spawnattr_setcgroup_np(attr, cgroup))


def _set_actions(
    libc: ctypes.CDLL, actions: Any, stdio: Sequence[int | None], options: Mapping[str, Any]
) -> None:
    """What the child does before its exec: stdio, closing the rest, entering ``cwd``."""
    _add_stdio(libc, actions, stdio)
    if options.get("close_fds", True):
        _check(libc.posix_spawn_file_actions_addclosefrom_np(actions, 3))
    cwd = options.get("cwd")
    if cwd is not None:
        _check(libc.posix_spawn_file_actions_addchdir_np(actions, os.fsencode(cwd)))


def _candidates(program: Any, env: Mapping[Any, Any] | None, cwd: Any) -> list[bytes]:
    """The paths Popen's child would try to exec, in order, less those that are not there.

    The name as given if it has a slash (relative to ``cwd``, which the child enters
    first: never made absolute here, as ``..`` after a symlink would then mean another
    file); else joined to each PATH entry (``env``'s PATH, as Popen takes it).
    """
    name = os.fsencode(program)
    if os.path.dirname(name):
        return [name]
    paths = [os.path.join(os.fsencode(entry), name) for entry in exec_path(env)]
    # Spawning for a path that is not there costs a clone and a failed exec each: look
    # first, as the kernel will resolve it (from cwd for a relative one).
    base = None if cwd is None else os.fsencode(cwd)
    present: list[bytes] = []
    for path in paths:
        try:
            os.stat(path if base is None else os.path.join(base, path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            pass  # (not ours to judge: the exec will say)
        present.append(path)
    return present


def _spawn_error(error: int, program: Any, cwd: Any) -> OSError:
    """The error Popen raises for a child that could not start: naming the directory if
    entering it failed, the program if its exec did."""
    if cwd is not None and not (os.path.isdir(cwd) and os.access(cwd, os.X_OK)):
        culprit: Any = os.fsdecode(cwd)
    elif error in _EXEC_ERRORS:
        culprit = program
    else:
        culprit = None  # a descriptor to duplicate, say: no file to name
    return OSError(error, os.strerror(error), culprit)


#: What a failed exec of the program reports (Popen then names the program).
_EXEC_ERRORS = frozenset(
    {
        errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.ELOOP,
        errno.ENAMETOOLONG, errno.ETXTBSY, errno.E2BIG, errno.EISDIR, errno.ELIBBAD,
    }
)  # fmt: skip


def _add_stdio(libc: ctypes.CDLL, actions: Any, stdio: Sequence[int | None]) -> None:
    for target, source in enumerate(stdio):
        if source is None:
            continue
        if source == -1:
            _check(
                libc.posix_spawn_file_actions_addopen(
                    actions, target, os.fsencode(os.devnull), os.O_RDWR, 0
                )
            )
        else:
            # Same fd: glibc clears its close-on-exec flag, as Popen does.
            _check(libc.posix_spawn_file_actions_adddup2(actions, source, target))


def stdio_fds(stdin: Any, stdout: Any, stderr: Any) -> list[int | None] | None:
    """The child's 0, 1 and 2 as `start` takes them, or None if one is beyond it (then the
    leader goes through ``/bin/sh`` and `subprocess.Popen`).

    Each of ``stdin``/``stdout``/``stderr`` is None, ``subprocess.DEVNULL``, an fd or a file
    (``stderr`` may be ``subprocess.STDOUT``). Duplicating a low fd onto another low fd is
    left to Popen, which orders such moves so that none overwrites the next one's source.
    """
    fds: list[int | None] = []
    for target, given in enumerate((stdin, stdout, stderr)):
        if given is None:
            fds.append(None)
        elif given == subprocess.DEVNULL:
            fds.append(-1)
        elif target == 2 and given == subprocess.STDOUT:
            fds.append(1)  # dup2(1, 2) after stdout is in place
        else:
            fd = given if isinstance(given, int) else getattr(given, "fileno", lambda: None)()
            if not isinstance(fd, int) or fd < 0 or (fd < 3 and fd != target):
                return None
            fds.append(fd)
    return fds


def _environment(env: Mapping[Any, Any]) -> Any:
    """``env`` as a C ``envp``, checked as `subprocess.Popen` checks it."""
    entries: list[bytes] = []
    for key, value in env.items():
        name, text = os.fsencode(key), os.fsencode(value)
        if b"=" in name:
            raise ValueError("illegal environment variable name")
        if b"\0" in name or b"\0" in text:
            raise ValueError("embedded null byte")
        entries.append(name + b"=" + text)
    return (ctypes.c_char_p * (len(entries) + 1))(*entries, None)


def _check(result: int) -> None:
    if result != 0:
        raise OSError(result, os.strerror(result))
