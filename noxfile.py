"""Test, lint and type-check sessions: ``nox`` runs them all (the README's test command)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import nox

#: Every interpreter ``requires-python`` and the classifiers admit gets a test session.
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
#: Interpreters a machine may lack: their session reports "skipped" (never passes). Any
#: other missing interpreter fails the run, also on CI, where nox would otherwise error
#: on every missing one alike.
OPTIONAL_PYTHONS = {"3.14"}

nox.options.sessions = [
    "interpreters", "tests", "tests_glibc", "joiners", "lint", "typecheck", "docs",
]  # fmt: skip
nox.options.error_on_missing_interpreters = False
nox.options.download_python = "never"  # offline machines: find, never fetch, interpreters
nox.options.reuse_existing_virtualenvs = True
# uv makes the session virtualenvs in seconds where it is installed (the README's test
# command installs it); virtualenv otherwise.
nox.options.default_venv_backend = "uv|virtualenv"

# Tools are pinned: a new release's new rules must not turn CI red on its own.
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
PYRIGHT = "pyright==1.1.414"
#: pytest-xdist workers per test session: three per core of a small CI machine, as the
#: suite waits on real processes more than it computes. On 2 cores (2026-12-07, the
#: packages compiled): 127-130 s with 4, 108-116 s with 6, 118 s with 8 (more CPU spent
#: contending than waiting saved).
WORKERS = 6
TEST_TOOLS = ["pytest", "pytest-trio", "pytest-timeout", "pytest-xdist", "hypothesis", "uvloop"]


def _add_pyenv_interpreters() -> None:
    """Put pyenv's installed versions on PATH ahead of its shims.

    A pyenv shim for a version that is installed but not selected exists and fails when
    run; the version's own bin directory works.
    """
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin")))
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_add_pyenv_interpreters()


@nox.session(python=False)
def interpreters(session: nox.Session) -> None:
    """Fail if a required interpreter is missing; say which optional ones will be skipped."""
    missing = [v for v in PYTHONS if shutil.which(f"python{v}") is None]
    for version in missing:
        if version in OPTIONAL_PYTHONS:
            session.log(f"python{version}: skipped: interpreter not found")
    required = [v for v in missing if v not in OPTIONAL_PYTHONS]
    if required:
        session.error(f"required interpreters not found: {', '.join(required)}")


#: Compiles the session's installed packages, then the directories it is given (~5 s,
#: in this one process: compileall's process pool starts its workers by forkserver,
#: which has its own ways to fail). Only for speed, so never a reason to fail: a file
#: that does not compile is left as it is, and any other error is said and passed over.
_COMPILE = (
    "import compileall, sys, sysconfig\n"
    "for folder in [sysconfig.get_path('purelib'), *sys.argv[1:]]:\n"
    "    try:\n"
    "        compileall.compile_dir(folder, quiet=2)\n"
    "    except Exception as exc:\n"
    "        print(f'not compiled ({exc!r}): {folder}')\n"
)


def _install_for_tests(session: nox.Session) -> None:
    """The package and the test tools, compiled to bytecode.

    The suite starts some 500 Pythons a session that import trio and trio_proctree, and
    workers that import pytest and the rest. Where PYTHONDONTWRITEBYTECODE is set (it
    is on the machine CI runs on here) none of them writes what it compiles, and every one
    compiled it all from source again: ``import trio_proctree`` took 0.33 s instead of
    0.15 s, and the suite took 270 s of CPU instead of 200 s (one run each)."""
    session.install("-e", ".[anyio]", *TEST_TOOLS)
    session.run("python", "-c", _COMPILE, "trio_proctree", "tests")


#: Sessions whose leaders join their cgroup through /bin/sh, not the joiner: where the C
#: library cannot start a process in a cgroup, both ways run (on half the interpreters
#: each, in one run's time), so that the one left where the joiner cannot run stays tested.
THROUGH_SH = {"3.10", "3.12"}
#: Sessions whose Pythons buffer their output to a pipe, as Python does by default; the
#: others run with PYTHONUNBUFFERED=1, as CI machines and containers often do. Either
#: way, whatever the machine running nox sets: a test that needed one passed on the
#: machines that set it (the tool's exit status, a child's unflushed line).
BUFFERED = {"3.10", "3.11"}  # (crossed with THROUGH_SH: all four pairs are run)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite with real processes; pass pytest arguments after ``--``."""
    _install_for_tests(session)
    env = {"TRIO_PROCTREE_NO_JOINER": "1"} if session.python in THROUGH_SH else {}
    # (Python takes an empty value for unset.)
    env["PYTHONUNBUFFERED"] = "" if session.python in BUFFERED else "1"
    session.run("pytest", "-n", str(WORKERS), *session.posargs, env=env)


#: Debian 13 ships glibc 2.41, the first C library that starts a process in a cgroup.
GLIBC_SOURCE = "http://deb.debian.org/debian trixie main"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
GLIBC_CACHE = Path(".nox", "_glibc").resolve()


@nox.session(python="3.11")
def tests_glibc(session: nox.Session) -> None:
    """The test suite once more under Debian 13's C library (glibc 2.41), where leaders
    start directly in their cgroup: the machine's own C library may be older. Skipped,
    and said so, where that library cannot be fetched (no apt, not Debian, offline).

    The tests run once per containment run here for cgroup (and auto, which picks it)
    only: how a leader enters its cgroup is all that library changes, and the process
    group's and subreaper's runs took ~45% of the session's tests for nothing new."""
    loader, library = _debian_glibc(session)
    _install_for_tests(session)
    # The workers run under that C library (their children under the machine's own).
    # (Not in session.create_tmp(): that makes it TMPDIR, inside this project, and pytest
    # would give the test files that tests write this project's pytest configuration.)
    python = GLIBC_CACHE / "python"
    venv_python = Path(session.bin) / "python"
    python.write_text(
        f'#!/bin/sh\nexec "{loader}" --library-path "{library}" "{venv_python}" "$@"\n'
    )
    python.chmod(0o755)
    session.run(
        "pytest", "-d", "--tx", f"{WORKERS}*popen//python={python}",
        "--only-containments", "cgroup,auto", *session.posargs,
        env={"TRIO_PROCTREE_EXPECT_DIRECT": "1"},
    )  # fmt: skip


def _debian_glibc(session: nox.Session) -> tuple[Path, Path]:
    """Debian 13's dynamic loader and C library directory, fetched with apt on first use."""
    root = GLIBC_CACHE / "root"
    if not list(root.glob("usr/lib/*/libc.so.6")):
        _fetch_debian(session, GLIBC_CACHE, GLIBC_SOURCE, ["libc6"], what="Debian 13's libc6")
    library = next(root.glob("usr/lib/*/libc.so.6")).parent
    loader = next(root.glob("usr/lib*/ld-linux*.so.*"))
    return loader, library


#: Where the joiners session fetches its tools: Debian 12, whose ``qemu-user-static``
#: holds the emulators themselves (Debian 13's is a link to another package's).
BOOKWORM_SOURCE = "http://deb.debian.org/debian bookworm main"
#: Debian's cross binutils that build a joiner, by the machine it is for; with the
#: libraries they need that a slim system may lack (the rest are Debian's required ones).
CROSS_BINUTILS = {"x86_64": "binutils-x86-64-linux-gnu", "aarch64": "binutils-aarch64-linux-gnu"}
BINUTILS_LIBRARIES = ["libbinutils", "libjansson4"]
JOINERS_CACHE = Path(".nox", "_joiners").resolve()


@nox.session(python="3.11")
def joiners(session: nox.Session) -> None:
    """The joiners built for other machines than this one (tests/test_joiner.py), run
    under qemu's user-mode emulator and checked against their source with the cross
    binutils, both fetched from Debian 12 on first use (unpacked here, not installed).
    Skipped, and said so, where they cannot be fetched (no apt, not Debian, offline)."""
    machine = os.uname().machine
    others = [m for m in CROSS_BINUTILS if m != machine]
    root = JOINERS_CACHE / "root"
    needed = [
        f"usr/bin/{tool}"
        for m in others
        for tool in (f"qemu-{m}-static", *(f"{m}-linux-gnu-{t}" for t in ("as", "ld", "strip")))
    ]
    if not all((root / path).resolve().is_file() for path in needed):
        packages = ["qemu-user-static", *(CROSS_BINUTILS[m] for m in others)]
        # Of the emulators' package (some 400 MB unpacked), only those needed here.
        only = {"qemu-user-static": [f"./usr/bin/qemu-{m}-static" for m in others]}
        _fetch_debian(
            session, JOINERS_CACHE, BOOKWORM_SOURCE, [*packages, *BINUTILS_LIBRARIES],
            what="qemu's user-mode emulator and cross binutils", only=only,
        )  # fmt: skip
        if missing := [path for path in needed if not (root / path).resolve().is_file()]:
            session.error(f"fetched, but not there: {', '.join(missing)}")
    _install_for_tests(session)
    libraries = [str(folder) for folder in root.glob("usr/lib/*-linux-gnu") if folder.is_dir()]
    env = {
        "PATH": os.pathsep.join([str(root / "usr" / "bin"), os.environ.get("PATH", "")]),
        "LD_LIBRARY_PATH": os.pathsep.join(
            [*libraries, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        ),
        "TRIO_PROCTREE_EXPECT_EMULATED_JOINERS": "1",
    }
    session.run("pytest", "-n", "2", "tests/test_joiner.py", *session.posargs, env=env)


def _fetch_debian(
    session: nox.Session,
    cache: Path,
    source: str,
    packages: list[str],
    *,
    what: str,
    only: dict[str, list[str]] | None = None,
) -> None:
    """Fetch ``packages`` from the Debian ``source`` given (an apt line: its mirror, suite
    and components) and unpack them into ``cache / "root"``, replacing what was there
    (``only``: the paths to take of a package, by its name; else all of it). Skips the
    session, saying why, where they cannot be fetched."""
    if not (
        shutil.which("apt-get") and shutil.which("dpkg-deb") and os.path.exists(DEBIAN_KEYRING)
    ):
        session.skip(f"skipped: fetching {what} needs apt-get, dpkg-deb and Debian's keyring")
    (cache / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    sources = cache / "sources.list"
    sources.write_text(f"deb [signed-by={DEBIAN_KEYRING}] {source}\n")
    # APT::Sandbox::User=root: as root, apt verifies signatures as the _apt user, in a
    # temporary file in /tmp, which fails where /tmp is not world-writable (seen).
    apt = [
        "apt-get", "-q", "-o", "APT::Sandbox::User=root",
        "-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=-",
        "-o", f"Dir::State::Lists={cache / 'lists'}", "-o", f"Dir::Cache={cache / 'apt'}",
    ]  # fmt: skip
    debs = cache / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir()
    try:
        subprocess.run([*apt, "update"], check=True, capture_output=True)
        subprocess.run([*apt, "download", *packages], check=True, capture_output=True, cwd=debs)
    except subprocess.CalledProcessError as exc:
        session.skip(f"skipped: cannot fetch {what}: {exc} {(exc.stderr or b'')[-300:]!r}")
    # Unpacked beside, then put in place whole: an unpacking cut short leaves no half.
    unpacking = cache / "unpacking"
    shutil.rmtree(unpacking, ignore_errors=True)
    unpacking.mkdir()
    for deb in sorted(debs.glob("*.deb")):
        paths = (only or {}).get(deb.name.split("_")[0], [])
        tar = 'dpkg-deb --fsys-tarfile "$0" | tar -x -C "$1" "${@:2}"'
        unpacked = subprocess.run(
            ["bash", "-o", "pipefail", "-c", tar, deb, unpacking, *paths],
            capture_output=True, check=False,
        )  # fmt: skip
        if unpacked.returncode != 0:
            session.error(f"cannot unpack {deb.name}: {unpacked.stderr[-300:]!r}")
    shutil.rmtree(cache / "root", ignore_errors=True)
    unpacking.rename(cache / "root")
    shutil.rmtree(debs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """For the oldest supported Python: mypy --strict on the package, the tests and the
    benchmarks; pyright strict on the package and on tests/typed_usage.py."""
    # exceptiongroup: trio's own backport, imported on 3.10, which both checkers target;
    # the test tools: the tests are checked too (and the package ships a pytest plugin).
    session.install("-e", ".[anyio]", MYPY, PYRIGHT, "exceptiongroup", *TEST_TOOLS)
    session.run("mypy", "--strict")
    session.run("pyright")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the HTML documentation; any Sphinx warning fails the build."""
    session.install("-e", ".", "sphinx", "sphinxcontrib-trio")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks, as ratios against a hand-rolled killpg baseline in the same run."""
    session.install("-e", ".")
    session.run("python", "bench/bench_teardown.py", *session.posargs)
    session.run("python", "bench/bench_scale.py", *session.posargs)
    session.run("python", "bench/bench_zombies.py", *session.posargs)


@nox.session(python="3.11", default=False)
def bench_glibc(session: nox.Session) -> None:
    """The benchmarks under Debian 13's C library (glibc 2.41): leaders start directly
    in their cgroup, without the exec of /bin/sh that older C libraries need."""
    loader, library = _debian_glibc(session)
    session.install("-e", ".")
    python = [str(loader), "--library-path", str(library), str(Path(session.bin) / "python")]
    session.run(*python, "bench/bench_teardown.py", *session.posargs, external=True)
    session.run(*python, "bench/bench_scale.py", *session.posargs, external=True)


@nox.session(python="3.11", default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing: mutmut on the policy and the escalation machine (configured in
    pyproject.toml), then the named mutants of the containment and close-path code."""
    session.install("-e", ".[anyio]", "pytest", "pytest-trio", "pytest-timeout", "hypothesis")
    session.install("mutmut==3.8.1")
    session.run("mutmut", "run")
    session.run("mutmut", "results")  # lists the survivors, if any
    session.run("python", "tests/mutation/named_mutants.py")
