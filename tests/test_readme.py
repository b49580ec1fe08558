"""The README's example programs run as written: the programs they name that are the
reader's own (``make``, ``some-cli``, ``gunicorn``) are small stand-ins on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import procs
from .conftest import Tracked

README = Path(__file__).resolve().parents[1] / "README.md"

#: Stand-ins for the programs the examples run: make finds nothing to do, the CLI reads
#: its stdin to its end (the example's first step closes it), the server runs until told.
STAND_INS = {
    "make": "exit 0",
    "some-cli": "exec cat",
    "gunicorn": "exec sleep 60",
    "my-server": "exec sleep 60",
}


def example_programs() -> list[str]:
    """The README's Python blocks that are whole programs (they run a ``main``)."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    return [block for block in blocks if "def main" in block]


def test_the_readme_has_a_trio_an_asyncio_and_an_anyio_example() -> None:
    programs = example_programs()
    assert len(programs) == 3
    assert "trio.run(main)" in programs[0]
    assert "asyncio.run(main())" in programs[1]
    assert "anyio.run(main)" in programs[2]


@pytest.mark.parametrize("program", example_programs(), ids=["trio", "asyncio", "anyio"])
def test_the_readmes_example_runs_and_leaves_nothing_running(
    tracked: Tracked, tmp_path: Path, program: str
) -> None:
    if "import anyio" in program:
        pytest.importorskip("anyio")
    if "asyncio.timeout" in program and sys.version_info < (3, 11):
        pytest.skip("the asyncio example uses asyncio.timeout (Python 3.11+), as it says")
    for name, body in STAND_INS.items():
        stand_in = tmp_path / name
        stand_in.write_text(f"#!/bin/sh\n{body}\n")
        stand_in.chmod(0o755)
    env = {**tracked.env, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [*procs.python(), "-c", program],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert b"Traceback" not in result.stderr, result.stderr.decode()
    assert tracked.survivors() == []


def anyio_recipe() -> str:
    """The README's anyio block: a ``tree_runner`` for ``tg.start()`` on either backend,
    up to its example of use."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    [block] = [block for block in blocks if "def tree_runner" in block]
    return str(block).partition("\n\nasync def main")[0]


# Appended to the README's anyio block: starts a tree through it, under the backend named
# as the argument, then cancels the task group; prints what cleanup did.
STARTS_AND_CANCELS = """
import sys


async def main():
    async with anyio.create_task_group() as tg:
        tree = await tg.start(tree_runner(["sh", "-c", "sleep 60 & sleep 61 & wait"], grace=0.5))
        print(tree.containment != "", tree.returncode, flush=True)
        tg.cancel_scope.cancel()
    print(tree.outcome.signals[:1] == (15,), tree.outcome.emptied)


anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_readmes_anyio_recipe_hands_the_tree_back_on_either_backend(
    tracked: Tracked, backend: str
) -> None:
    pytest.importorskip("anyio")
    program = anyio_recipe() + STARTS_AND_CANCELS
    output = procs.run_python(program, backend, env=tracked.env)
    assert output == "True None\nTrue True\n"
    assert tracked.survivors() == []
