from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shlex
import signal
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from trio_proctree import ContainmentUnavailable, _cgroupfs, _watchdog
from trio_proctree._choose import choose_containment
from trio_proctree._core import open_trees
from trio_proctree._exec_check import binfmt_misc_handlers

from . import procs
from .skip_reasons import pytest_runtest_call  # noqa: F401 - reported with their reasons

#: Every behaviour is pinned under each containment a machine offers.
CONTAINMENTS = ["cgroup", "subreaper", "group"]


class Tracked:
    """Environment for the trees a test starts, and what of them is still alive."""

    def __init__(self) -> None:
        self.token = procs.new_token()
        self.env = {**os.environ, procs.TOKEN_VAR: self.token}

    def survivors(self) -> list[int]:
        return procs.survivors(self.token)

    def mark_this_process(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Put the token in this process's own environment, for a tree given no ``env``.

        The watchdog is started first: started by the test's first tree, it would carry
        the token and count as the test's survivor (red when such a test was the first on
        its xdist worker to open a tree: ``pytest -n 4 tests/test_popen_parity.py``)."""
        _watchdog.ensure_started()
        monkeypatch.setenv(procs.TOKEN_VAR, self.token)


@pytest.fixture(autouse=True)
def _births_are_this_tests() -> None:
    """A pid a test remembered belongs to that test: the next one starts with none."""
    procs.BORN.clear()


@pytest.fixture
def tracked() -> Iterator[Tracked]:
    """Every test that starts processes uses this env; after the test nothing may carry it."""
    tracker = Tracked()
    yield tracker
    leaked = procs.kill_survivors(tracker.token)
    assert not leaked, f"processes outlived the test (killed now): {leaked}"


def lock_path(what: str) -> str:
    """The lock file that makes tests touching ``what`` take turns, across xdist workers."""
    return os.path.join(tempfile.gettempdir(), f"trio_proctree-tests-{what}.lock")


def alone_on_the_machine(what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``what`` for the test's length: the other workers' tests
    that take it wait (a flock, released by the kernel however the worker ends)."""
    with open(lock_path(what), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def memory_to_spare() -> int:
    """Bytes this process may still take: the machine's available memory, or less where a
    memory cgroup of ours or above it (v2, or v1's memory controller) caps it."""
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    spare = int(fields["MemAvailable"].split()[0]) * 1024
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = mountinfo.read()
    v1_memory = [
        line.split(" ")[4]
        for line in mounts.splitlines()
        if line.split(" - ")[-1].startswith("cgroup ") and "memory" in line.split(",")
    ]
    with open("/proc/self/cgroup") as cgroups:
        for line in cgroups:
            _, controllers, path = line.strip().split(":", 2)
            if controllers == "":
                mount = _cgroupfs.find_cgroup2_mount(mounts)
            elif "memory" in controllers.split(",") and v1_memory:
                mount = v1_memory[0]
            else:
                continue
            while mount is not None:
                folder = os.path.join(mount, path.lstrip("/"))
                for limit, usage in (
                    ("memory.max", "memory.current"),
                    ("memory.limit_in_bytes", "memory.usage_in_bytes"),
                ):
                    with contextlib.suppress(OSError, ValueError):  # ("max", or not there)
                        spare = min(spare, int(_read(folder, limit)) - int(_read(folder, usage)))
                if path in ("", "/"):
                    break
                path = os.path.dirname(path)
    return spare


def _read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name)) as file:
        return file.read()


def skip_unless_memory_to_spare(nbytes: int) -> None:
    """Skip a test whose processes take ``nbytes`` (twice that to spare: the runner's own)."""
    spare = memory_to_spare()
    if spare < 2 * nbytes:
        pytest.skip(f"needs {2 * nbytes >> 20} MiB of memory to spare; {spare >> 20} MiB here")


@pytest.fixture
def pid_allocation_alone() -> Iterator[None]:
    """For a test that steers the kernel's next pid (ns_last_pid, machine-wide): another
    worker's steering at the same time would hand the pid elsewhere, and the test give up."""
    yield from alone_on_the_machine("pid-allocation")


@pytest.fixture
def pid_namespaces_alone() -> Iterator[None]:
    """For a test that makes or ends pid namespaces: the kernel reuses an ended
    namespace's inode number for the next one made, so another worker's new namespace can
    make an ended one look alive (seen: an ended namespace's home was not swept)."""
    yield from alone_on_the_machine("pid-namespaces")


#: For a test that steers the kernel's next pid: run while no other test does.
steers_pids = pytest.mark.usefixtures("pid_allocation_alone")
#: For a test that makes pid namespaces (or sees one end), run while no other test does.
makes_pid_namespaces = pytest.mark.usefixtures("pid_namespaces_alone")
#: For a test of a file the kernel refuses to run: a registered binfmt_misc handler may
#: run any file (trio_proctree then leaves it to the exec), so the test cannot say.
kernel_refuses = pytest.mark.skipif(
    bool(binfmt_misc_handlers()), reason="binfmt_misc handlers may run any file: exec decides"
)


#: The parameters through which tests are run once per containment.
CONTAINMENT_PARAMETERS = {"contained", "containment", "strong", "inner"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--only-containments",
        metavar="NAMES",
        help="run the tests that are run once per containment only for these (comma-"
        "separated, e.g. cgroup,auto); every other test runs as usual",
    )


def only_containments(config: pytest.Config) -> set[str] | None:
    """The containments ``--only-containments`` names (None: every one): a name that is
    no containment is a usage error."""
    option = config.getoption("only_containments")
    if option is None:
        return None
    wanted = {name.strip() for name in option.split(",") if name.strip()}
    unknown = wanted - {*CONTAINMENTS, "auto"}
    if unknown or not wanted:
        raise pytest.UsageError(
            f"--only-containments {option!r}: names no containment of {[*CONTAINMENTS, 'auto']}"
        )
    return wanted


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--only-containments``: deselect the runs of the other containments (the suite
    under another C library changes only how a leader enters its cgroup)."""
    wanted = only_containments(config)
    if wanted is None:
        return
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        chosen = {
            value
            for name, value in (callspec.params.items() if callspec else ())
            if name in CONTAINMENT_PARAMETERS
        }
        (deselected if chosen - wanted else kept).append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    """Give the tests the Ctrl-C, SIGQUIT and SIGHUP a shell gives a command it runs in the
    foreground, whatever this run inherited: a command a script starts in the background
    (``cmd &``) has SIGINT and SIGQUIT ignored, one started by ``nohup`` SIGHUP, which its
    children inherit (and the run tool keeps ignored, by design). The tests of what such a
    signal does to the tool then failed (10; 2 under nohup, helper-48), some by hanging."""
    only_containments(config)  # (checked before collection: a usage error, said once)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for ignored_by_the_caller in (signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(ignored_by_the_caller) == signal.SIG_IGN:
            signal.signal(ignored_by_the_caller, signal.SIG_DFL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """After each test, reap the zombies that became our children while it ran.

    The worker is a child subreaper once a subreaper test ran in it (the setting is
    process-wide), so other processes' orphans re-parent to it: the watchdog of each tool
    a test ran, the escapees of a child killed with its trees. No code of ours reaps them
    (that is the documented limit of a subreaper), and they piled up: 1,400 in one worker,
    which each later scan of /proc met, and the suite took 60% longer. A test that pins
    reaping asserts it while it runs.

    Not the leaders of trees still open (a test that made a cleanup fail leaves its tree
    to the net at interpreter exit): reaped here, the net found each one reaped by someone
    else, and said so, six times at the end of every full run."""
    before = procs.zombie_children_of_self()
    yield
    left_to_the_net = {core.leader.pid for core in open_trees()}
    for pid in procs.zombie_children_of_self() - before - left_to_the_net:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child, a zombie: reaping it signals no one


@pytest.fixture
def aside_from_other_homes() -> Iterator[str]:
    """A cgroup beside nobody's home, for a home a test must see swept (or not) by its
    own call alone: every process of ours sweeps the stale homes beside the one it makes,
    and the other workers' tools and children, whose homes are made beside ours, took a
    home a test had just seen its namespace leave (seen: 1 run in 8), or killed a stale
    member before the test had done with it. Removed after, with the homes left in it."""
    try:
        choose_containment("cgroup")
    except ContainmentUnavailable as exc:  # pragma: no cover - on machines without cgroups
        pytest.skip(str(exc))
    aside = procs.cgroup_path_for_a_test(f"aside-{os.urandom(4).hex()}")
    os.mkdir(aside)
    try:
        yield aside
    finally:
        procs.remove_emptied(aside)


@pytest.fixture(params=["buffered", "unbuffered"])
def cli_env(request: pytest.FixtureRequest, tracked: Tracked) -> dict[str, str]:
    """The tracked environment, with a Python program's output buffered (the default, to a
    pipe or file) or not (``PYTHONUNBUFFERED=1``, as CI and many containers set): a tool's
    write to a reader that left fails at once in one, at its exit's flush in the other."""
    return {**tracked.env, "PYTHONUNBUFFERED": "1" if request.param == "unbuffered" else ""}


@pytest.fixture(params=CONTAINMENTS)
def contained(request: pytest.FixtureRequest, tracked: Tracked) -> dict[str, Any]:
    """Keyword arguments for a tree: the tracked environment and one containment."""
    try:
        choose_containment(request.param)
    except ContainmentUnavailable as exc:  # pragma: no cover - on machines without cgroups
        pytest.skip(str(exc))
    return {"env": tracked.env, "containment": request.param}


@pytest.fixture(params=["asyncio.run", "anyio.run", "uvloop.run"])
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Run an asyncio test body under plain asyncio, under anyio's asyncio backend, and
    on uvloop's event loop (libuv's, which many asyncio programs run on)."""
    if request.param == "asyncio.run":
        return lambda main, *args: asyncio.run(main(*args))
    if request.param == "uvloop.run":
        uvloop = pytest.importorskip("uvloop")
        return lambda main, *args: uvloop.run(main(*args))
    anyio = pytest.importorskip("anyio")
    return lambda main, *args: anyio.run(main, *args, backend="asyncio")


def seq(last: int) -> bytes:
    """What ``seq 1 LAST`` prints: the numbers 1 to ``last``, one per line."""
    return b"".join(b"%d\n" % n for n in range(1, last + 1))


async def read_pids(stream: trio.abc.ReceiveStream, count: int) -> list[int]:
    """Read ``count`` pids, one per line, that a test shell echoes as it starts members."""
    buffer = b""
    while buffer.count(b"\n") < count:
        chunk = await stream.receive_some()
        assert chunk, f"stream ended after {buffer!r}"
        buffer += chunk
    pids = [int(line) for line in buffer.split(b"\n")[:count]]
    for pid in pids:
        procs.remember(pid)
    return pids


def slow_to_die() -> list[str]:
    """A tree whose member takes milliseconds to die even of SIGKILL (it frees the 256 MB
    it wrote; ~6 ms here, where a ``sleep`` takes microseconds), and says its pid once
    they are written: a cleanup that begins right after the tree was killed finds it
    still running."""
    member = (
        "import os, time; b = b'x' * (256 << 20); print(os.getpid(), flush=True); time.sleep(60)"
    )
    return ["sh", "-c", f"{shlex.join([*procs.python(), '-c', member])} & exec sleep 61"]
