"""Test-side view of processes, written independently of the library's own /proc code.

Every test tree runs with a unique token in its environment; descendants inherit it (even
``setsid`` escapees), so "what survived" is every live process whose environment has it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import AnyStr

TOKEN_VAR = "TRIO_PROCTREE_TEST_TOKEN"


def state(pid: int) -> str | None:
    """The state letter from /proc/PID/stat ('Z' for a zombie), or None once reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2 :].split()[0].decode()


def wait_reading(pid: int, within: float = 5) -> bool:
    """Wait, up to ``within`` seconds, until ``pid`` sleeps in a read of a pipe or FIFO;
    whether it does.

    A test that signals a shell waiting in its ``read`` builtin, and expects a trap to
    run, must wait for this first. dash looks for pending traps before it calls read(2),
    with nothing blocked in between: a signal that lands in that gap (or a SIGSTOP there,
    continued later by the signal's SIGCONT) has its trap run only when the read returns,
    here never. (Shown under gdb, a TERM delivered at read's entry ran the trap when
    stdin closed, 4 s later; seen once under load, as a grace run out.) No event tells
    where a process sleeps: its ``wchan`` is read in short pauses.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/wchan") as f:
                where = f.read()
        except (FileNotFoundError, ProcessLookupError):
            return False  # gone
        if where.endswith("pipe_read"):  # (pipe_read; anon_pipe_read on newer kernels)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


#: Which process each pid a test was told of was: its pid, once it ended, may go to a new
#: process (pids here wrap at 32768, and tests that steer the kernel's next pid reuse
#: recent ones), which is not the one the test asks about. Emptied before each test
#: (conftest).
BORN: dict[int, tuple[int, int]] = {}


def identity(pid: int) -> tuple[int, int]:
    """What tells the process holding ``pid`` from any other that held it: its start time
    (in clock ticks: two born within one tick share it) and its pidfd's inode (unique
    since Linux 6.9; the same for every process before that)."""
    born = starttime(pid)
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno == errno.ENOSYS:  # pragma: no cover - no pidfds: the start time alone
            return born, 0
        if exc.errno in (errno.EINVAL, errno.ENOENT):  # a thread's id now: no process
            return born, -1
        raise  # (reaped meanwhile, out of fds: the caller's to tell)
    try:
        return born, os.fstat(fd).st_ino
    finally:
        os.close(fd)


def remember(pid: int) -> None:
    """Note which process ``pid`` is now, so that `alive` does not take its successor."""
    try:
        BORN[pid] = identity(pid)
    except (FileNotFoundError, ProcessLookupError):
        BORN.pop(pid, None)  # already gone: whatever holds the pid later is not known


def running(pid: int) -> bool:
    """Whatever process holds ``pid`` runs (or is stopped): not a zombie, not reaped.
    ``kill(pid, 0)`` cannot tell. (A process whose main thread exited shows as a zombie
    while other threads run.)"""
    now = state(pid)
    if now in ("Z", "X"):
        try:
            return stat_field(pid, 20) > 1  # num_threads
        except (FileNotFoundError, ProcessLookupError):
            return False
    return now is not None


def alive(pid: int) -> bool:
    """The process the test knows as ``pid`` runs: `running`, and, once `remember`-ed (or
    found alive before in this test), only while that same process holds the pid."""
    known = BORN.get(pid)
    if known is not None:
        try:
            if identity(pid) != known:
                return False
        except (FileNotFoundError, ProcessLookupError):
            return False
    if not running(pid):
        return False
    if known is None:
        remember(pid)
    return True


def reaped(child: int) -> bool:
    """Whether ``child``, a child of this process, has been reaped. Asked of the kernel
    (``waitid``, ``WNOWAIT``: nothing is reaped here), not of /proc: a pid reaped a moment
    ago may already be another process's, which /proc would show as if it were ours."""
    try:
        os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # no child of ours holds that pid
    return False  # running, or a zombie yet to be reaped


def wait_main_thread_gone(pid: int, within: float = 5) -> bool:
    """Wait up to ``within`` seconds until ``pid`` shows as a zombie: its main thread has
    exited (asynchronously, after the call that ends it), other threads may run on. No
    event says so: this looks again every ms. Whether it did."""
    deadline = time.monotonic() + within
    while state(pid) != "Z":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def wait_unreaped(child: int, *, within: float) -> bool:
    """Wait up to ``within`` seconds for ``child`` (a child of this process) to exit, and
    leave it unreaped: whether it is still there to be reaped (False if other code reaped
    it). Its pidfd turns readable on its exit: an event, not a poll."""
    try:
        fd = os.pidfd_open(child)
    except ProcessLookupError:
        return False  # reaped already
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(within * 1000), f"pid {child} still runs after {within} s"
    finally:
        os.close(fd)
    return not reaped(child)


def untouched_child(pid: int) -> bool:
    """Whether our child ``pid`` runs with no fatal signal on its way to it.

    A SIGKILL sent an instant ago may not have landed yet: its target can still show as
    running, and a test that only looks passes by luck. But Linux drops every signal sent
    to a process that a fatal one already reached, so a SIGSTOP sent now stops only a
    process that none reached. Wait (``waitid``: an event) for it to stop or to exit, and
    let it go on.
    """
    os.kill(pid, signal.SIGSTOP)
    event = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    assert event is not None
    if event.si_code != os.CLD_STOPPED:
        return False
    os.kill(pid, signal.SIGCONT)
    return True


def stat_field(pid: int, index: int) -> int:
    """Field ``index`` (1-based, as in proc(5)) of /proc/PID/stat, for fields after comm."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2 :].split()[index - 3])


def arguments(pid: int, within: float = 5) -> bytes | None:
    """The process's raw argument block (/proc/PID/cmdline) once its image has one; None
    once it is gone.

    A parent that a vfork-style start (posix_spawn) wakes is woken when the new image's
    memory replaces the old, before that image's arguments are in place: for a moment
    the block reads as empty (``arg_end``, field 49 of /proc/PID/stat, still 0): here in
    up to 1 read in 20 right after a start, with two runs side by side. No event says
    when they are in place: this looks again in short pauses, up to ``within`` seconds.
    """
    deadline = time.monotonic() + within
    try:
        while stat_field(pid, 49) == 0 and time.monotonic() < deadline:
            time.sleep(0.0005)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def pgid_of(pid: int) -> int:
    return stat_field(pid, 5)


def starttime(pid: int) -> int:
    return stat_field(pid, 22)


def with_token(pid: int, token: str, *, patient: bool = False) -> bool:
    """Whether the process carries ``token``. ``patient``: a process in the middle of
    execve shows no environment for a moment, so look again a while (a process known to
    have carried it: kernel threads show none for good, and would cost the wait each)."""
    environment = read_environ(pid)
    deadline = time.monotonic() + _EXEC_WITHIN
    for tries in itertools.count() if patient else ():
        if environment != b"" or not running(pid):
            break
        # A while for any process; as long as it takes for one whose environment is not
        # empty for good: one in the middle of its exec (under load, seen past the while:
        # the test said no process survived, and its teardown then found one).
        if tries >= 200 and (_no_environment(pid) or time.monotonic() > deadline):
            break
        time.sleep(0.0005)
        environment = read_environ(pid)
    return environment is not None and _carries(environment, token)


def _carries(environment: bytes, token: str) -> bool:
    return f"{TOKEN_VAR}={token}".encode() in environment.split(b"\0")


#: Seconds a process whose environment shows empty for now (in the middle of its exec) is
#: given to show it, at most.
_EXEC_WITHIN = 10.0


def _no_environment(pid: int) -> bool:
    """Whether the process has an empty environment for good (``env -i``): its image's
    environment is in place and empty (``env_start`` == ``env_end``, fields 50 and 51 of
    /proc/PID/stat, not 0). In the middle of an exec, an environment reads as empty while
    the old image goes or the new one is not set up yet (``env_end`` 0), for a while."""
    try:
        start, end = stat_field(pid, 50), stat_field(pid, 51)
    except (OSError, IndexError, ValueError):
        return True  # (gone, or not ours to see: nothing to wait for)
    return start == end != 0


def command_name(pid: int) -> str | None:
    """The process's command name (``comm``), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None


def read_environ(pid: int) -> bytes | None:
    """The process's raw environment block, or None once it is gone (or not ours to read).

    A process whose main thread has exited shows none at /proc/PID/environ; a live
    thread's task entry shows it (so such a survivor is still found by its token).
    """
    try:
        found = _read_environ_file(f"/proc/{pid}/environ")
    except PermissionError:
        return None  # (nor are its threads' entries ours: the same check, the same memory)
    if found:
        return found
    tasks: list[str] = []
    with contextlib.suppress(OSError):
        tasks = os.listdir(f"/proc/{pid}/task")
    for tid in tasks:
        with contextlib.suppress(PermissionError):
            read = _read_environ_file(f"/proc/{pid}/task/{tid}/environ")
            found = found if read is None else read
        if found:
            break
    return found


def _read_environ_file(path: str) -> bytes | None:
    """The bytes of an environ file of /proc, or None once its process (or thread) is
    gone: its main thread's ended (ESRCH), or it is reaped."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def survivors(token: str) -> list[int]:
    """Live processes carrying ``token`` in their environment.

    A process in the middle of execve shows no environment for a moment: one that shows
    none is looked at again a while (kernel threads, which never show one, are not).
    """
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            pid = int(entry)
            # Read once where the main thread shows it (most processes: this scan runs a
            # few times a test, and once read everything twice: ~6% of the suite's CPU).
            try:
                environment = _read_environ_file(f"/proc/{pid}/environ")
            except PermissionError:
                continue  # (not ours to read: as read_environ says, nor are its threads')
            if environment:
                carries = _carries(environment, token)
            elif kernel_thread(pid):
                continue
            else:
                # Empty or unreadable: gone, in the middle of an exec, or its main thread
                # ended (ESRCH; its threads' entries show the environment).
                carries = with_token(pid, token, patient=True)
            # (Not `alive`: a leaked process in a pid that the test remembered for another
            # would go unseen. The token says whose it is.)
            if carries and running(pid):
                found.append(pid)
    return sorted(found)


_PF_KTHREAD = 0x00200000


def kernel_thread(pid: int) -> bool:
    try:
        return bool(stat_field(pid, 9) & _PF_KTHREAD)
    except (FileNotFoundError, ProcessLookupError):
        return False


def kill_survivors(token: str) -> list[int]:
    """SIGKILL what carries ``token`` and wait until it is dead.

    Through pidfds: a recycled pid is never hit, and the wait is on the exit itself.
    """
    killed: dict[int, int] = {}
    for pid in survivors(token):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        if with_token(pid, token, patient=True):  # (it did a moment ago)
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            killed[pid] = fd
        else:
            os.close(fd)
    poller = select.poll()
    for fd in killed.values():
        poller.register(fd, select.POLLIN)
    pending = set(killed.values())
    deadline = time.monotonic() + 5
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            pending.discard(fd)
            poller.unregister(fd)
    for fd in killed.values():
        os.close(fd)
    return sorted(killed)


def kill_ours(pid: int, token: str) -> None:
    """SIGKILL ``pid`` if it carries ``token``, through a pidfd opened before that look:
    a pid that went to another process since the test saw it is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if running(pid) and with_token(pid, token, patient=True):
            with contextlib.suppress(ProcessLookupError):  # (exited meanwhile)
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def wait_exited(pid: int, within: float = 5, *, kill: bool = False) -> bool:
    """Wait on ``pid``'s pidfd, up to ``within`` seconds, until it has exited; whether it
    has (a process gone already has). ``kill``: SIGKILL it first, through that pidfd (a
    recycled pid is never hit; a SIGKILL just sent may not have landed yet: the wait
    is for the exit itself)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        if kill:
            with contextlib.suppress(ProcessLookupError):  # (exited meanwhile)
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        return bool(select.select([fd], [], [], within)[0])
    finally:
        os.close(fd)


def new_token() -> str:
    return uuid.uuid4().hex


def children_of_self() -> set[int]:
    return children_of(os.getpid())


def zombie_children_of_self() -> set[int]:
    return {pid for pid in children_of_self() if state(pid) == "Z"}


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        except FileNotFoundError:
            continue
    return found


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def python() -> list[str]:
    """How to start a Python like this one: through the same dynamic loader and C library
    when this one was started through an explicit loader (``nox -s tests_glibc``)."""
    if not os.path.basename(os.readlink("/proc/self/exe")).startswith("ld-"):
        return [sys.executable]
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    if argv[1] != b"--library-path":
        return [sys.executable]
    return [os.fsdecode(arg) for arg in argv[:3]] + [sys.executable]


def populated(cgroup: str) -> bool:
    """Whether anything still runs in the cgroup at this directory."""
    with open(os.path.join(cgroup, "cgroup.events"), "rb") as f:
        return b"populated 1" in f.read()


#: How every cgroup a test makes inside ours begins: then whose it is (pid, start time),
#: so that one left by a run cut short (a timeout's, a mutant's: no teardown ran) can be
#: told from a running test's, and removed by a later run.
_TEST_CGROUP = "tests-"


def cgroup_path_for_a_test(label: str) -> str:
    """The path for a cgroup a test makes inside this process's own (cgroup v2), named
    after this process and ``label``. First, the emptied cgroups of test processes that
    have gone are removed (one still populated is left: its processes are not ours)."""
    from trio_proctree._cgroupfs import find_cgroup2_mount, own_cgroup  # noqa: PLC0415

    with open("/proc/self/mountinfo") as f:
        mount = find_cgroup2_mount(f.read())
    with open("/proc/self/cgroup") as f:
        own = own_cgroup(f.read())
    assert mount is not None and own is not None
    parent = os.path.join(mount, own.lstrip("/"))
    for name in os.listdir(parent):
        owner = name[len(_TEST_CGROUP) :].split("-", 2)
        if not name.startswith(_TEST_CGROUP) or not all(part.isdigit() for part in owner[:2]):
            continue
        try:
            gone = starttime(int(owner[0])) != int(owner[1])
        except (FileNotFoundError, ProcessLookupError):
            gone = True
        if gone:
            remove_emptied(os.path.join(parent, name))
    me = os.getpid()
    return os.path.join(parent, f"{_TEST_CGROUP}{me}-{starttime(me)}-{label}")


def remove_emptied(cgroup: str) -> None:
    """Remove ``cgroup`` and the cgroups inside it, deepest first, those that are empty."""
    for inner, _, _ in os.walk(cgroup, topdown=False):
        with contextlib.suppress(OSError):  # (a test that failed may leave a member)
            os.rmdir(inner)


def until_emptied(cgroup: str, within: float = 5.0) -> bool:
    """Wait, at most ``within`` seconds, until the kernel counts nothing in ``cgroup``
    (``populated 0``); whether it did. That count lags /proc: a process already gone from
    cgroup.procs, shown as a zombie or reaped, can keep its cgroup populated, and an rmdir
    of it refused with EBUSY, for tens of ms on a loaded machine (CI failed so once: the
    test had seen nothing left running, and the cgroup read "populated 1" with no member
    listed, then "populated 0" 28 ms later)."""
    events = os.open(os.path.join(cgroup, "cgroup.events"), os.O_RDONLY)
    try:
        poller = select.poll()
        poller.register(events, select.POLLPRI)  # a change of "populated"
        deadline = time.monotonic() + within

        def still_populated() -> bool:
            # Read through the descriptor polled: that read clears its flag. (Read through
            # another, the flag stayed up, and the poll returned at once: the wait spun,
            # ~30,000 passes a second, helper-109.)
            return b"populated 1" in os.pread(events, 64, 0)

        while (still := still_populated()) and (left := deadline - time.monotonic()) > 0:
            poller.poll(min(left, 0.1) * 1000)  # (the kernel tells of a change per 10 ms)
        return not still
    finally:
        os.close(events)


@contextlib.contextmanager
def cgroup_in_ours(
    name: str, settings: Mapping[str, str] | None = None, *, emptied_within: float = 5.0
) -> Iterator[str]:
    """A cgroup made inside this process's own (cgroup v2), with ``settings`` (file: value)
    written to it, for a child Python to move into. Removed after, with the cgroups made
    inside it, once its last member (that child's watchdog, say) has gone: an rmdir that
    fails then fails a test that passed (it left something behind). What a failed test
    left in it is killed first (all of it the test's), and an error of that cleanup does
    not replace the test's own."""
    made = cgroup_path_for_a_test(name)
    os.mkdir(made)
    clean = False
    try:
        for setting, value in (settings or {}).items():
            with open(os.path.join(made, setting), "w") as f:
                f.write(value)
        yield made
        clean = True
    finally:
        # A test that passed, but left something running in it, fails naming what it left
        # (a bare EBUSY from the rmdir said nothing of it), which is killed all the same.
        left = [] if not clean or until_emptied(made, emptied_within) else members_named(made)
        if left or not clean:
            with contextlib.suppress(OSError):
                with open(os.path.join(made, "cgroup.kill"), "w") as f:
                    f.write("1")
                until_emptied(made)
        for inner in sorted((d for d, _, _ in os.walk(made)), key=len, reverse=True):
            try:
                os.rmdir(inner)
            except OSError:
                if clean and not left:
                    raise
        if left:
            raise AssertionError(
                f"{made}: still populated {emptied_within:g} s after its test: {left}"
            )


@contextlib.contextmanager
def pipe_whose_reader_left() -> Iterator[int]:
    """The write end of a pipe whose read end is closed already (a ``| head -1`` that
    exited): every write to it fails with EPIPE. Closed after the block."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)


def members_named(cgroup: str) -> list[str]:
    """Every process in ``cgroup`` and the cgroups inside it, as "PID: command line"
    (or "nobody listed", if the kernel counts a member it no longer lists)."""
    named = []
    for folder, _, _ in os.walk(cgroup):
        try:
            with open(os.path.join(folder, "cgroup.procs")) as f:
                pids = [int(pid) for pid in f.read().split()]
        except OSError:  # (removed meanwhile)
            continue
        for pid in pids:  # (one that is gone or cannot be read does not hide the rest)
            try:
                said = (arguments(pid, within=0) or b"").replace(b"\0", b" ")
            except OSError as exc:
                said = f"({exc.strerror})".encode()
            named.append(f"{pid}: {said.decode(errors='replace').strip()}")
    return named or ["nobody listed"]


def run_python(
    code: str, *args: str, env: Mapping[str, str] | None = None, before: Sequence[str] = ()
) -> str:
    """Run ``code`` in a Python like this one (see `python`), behind the command ``before``
    if any; its output, once it has exited 0 (else its stderr fails the test)."""
    child = subprocess.run(
        [*before, *python(), "-c", code, *args],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr.decode()
    return child.stdout.decode()


#: A command prefix (``setpriv``): what it runs as root may signal only its own user's
#: processes, as any user without CAP_KILL.
WITHOUT_CAP_KILL = ("setpriv", "--inh-caps=-kill", "--bounding-set=-kill")


#: The end of a test program whose signal handlers do its work: it waits for ever, and
#: each signal's handler runs as it comes. Not ``while True: signal.pause()`` (nor
#: ``time.sleep(60)``): a signal that lands after the interpreter last looked for one and
#: before pause() has its handler noted but not run, and pause() sleeps on until another
#: signal comes (the sleep, to its end). The handler noted also writes to the wakeup
#: descriptor, which the read here is waiting on.
WAIT_FOR_SIGNALS = textwrap.dedent(
    """
    import os as _os, signal as _signal
    _woken, _wake = _os.pipe()
    _os.set_blocking(_wake, False)
    _signal.set_wakeup_fd(_wake)
    while True:
        _os.read(_woken, 1)
    """
)


#: For scripts run by `run_python` that report on processes before they exit: the same
#: test as `alive` (a zombie is not alive), with nothing to import.
ALIVE_IN_A_CHILD = textwrap.dedent(
    """
    import os

    def stat(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    def identity(pid):
        # Start time (clock ticks) and pidfd inode (unique since Linux 6.9), as procs does.
        started = stat(pid)[19]
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # (out of fds, say: the start time alone)
            return started, None
        try:
            return started, os.fstat(fd).st_ino
        finally:
            os.close(fd)

    BORN = {}

    def remember(pid):
        try:
            BORN[pid] = identity(pid)
        except OSError:
            pass
        return pid

    class Pids(list):
        # The pids a script was told of, each remembered as it is added: a pid that went
        # to another process once the script's one ended is not alive.
        def append(self, pid):
            super().append(remember(pid))

        def extend(self, pids):
            for pid in pids:
                self.append(pid)

    def alive(pid):
        try:
            if pid in BORN:
                (started, inode), (now, held) = BORN[pid], identity(pid)
                if started != now or None not in (inode, held) and inode != held:
                    return False
            return stat(pid)[0] not in "ZX"
        except OSError:
            return False
    """
)


def group_signals_through_pidfds() -> bool:
    """Whether a pidfd can signal the group its process leads (Linux 6.9+)."""
    probe = subprocess.Popen(["sleep", "60"], start_new_session=True)
    fd = os.pidfd_open(probe.pid)
    try:
        signal.pidfd_send_signal(fd, 0, None, 4)  # PIDFD_SIGNAL_PROCESS_GROUP
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.kill()
        probe.wait()
    return True


def set_behind_os_environs_back() -> dict[str, str]:
    """Variables in the C library's environment (what a child started with env=None
    gets) that `os.environ` does not show: set by C code since Python started."""
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    found: dict[str, str] = {}
    index = 0
    while (entry := environ[index]) is not None:
        name, _, value = os.fsdecode(entry).partition("=")
        if os.environ.get(name) != value:
            found[name] = value
        index += 1
    return found


@contextlib.contextmanager
def killed_on_failure(process: subprocess.Popen[AnyStr]) -> Iterator[subprocess.Popen[AnyStr]]:
    """``process`` as its own context, except that a test failing inside it SIGKILLs it
    (our own child, by pid) before the wait on it: Popen's own would wait for ever for a
    tool the test had just failed to stop (seen: a run hung for good)."""
    with process:
        try:
            yield process
        except BaseException:
            process.kill()
            raise


def signal_state(pid: int) -> str:
    """What a process's /proc status says of its state and signals, for a failure message
    (a process that did not act on a signal: blocked, ignored, pending, never sent?)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = [line.strip() for line in status if line.startswith(_SIGNAL_FIELDS)]
        lines.append(f"pgid {stat_field(pid, 5)}")
    except OSError as exc:
        return f"no status ({exc})"
    return "; ".join(lines)


_SIGNAL_FIELDS = ("State:", "SigQ:", "SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:", "SigCgt:")


def blocked_signals(pid: int, task: int) -> set[int]:
    """The signals thread ``task`` of process ``pid`` blocks (its ``SigBlk``)."""
    with open(f"/proc/{pid}/task/{task}/status") as status:
        [mask] = [line.split()[1] for line in status if line.startswith("SigBlk:")]
    return {number for number in range(1, 65) if int(mask, 16) >> (number - 1) & 1}
