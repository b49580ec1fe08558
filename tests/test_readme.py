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
}


def example_programs() -> list[str]:
    """The README's Python blocks that are whole programs (they run a ``main``)."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    return [block for block in blocks if "def main" in block]


def test_the_readme_has_a_trio_and_an_asyncio_example() -> None:
    programs = example_programs()
    assert len(programs) == 2
    assert "trio.run(main)" in programs[0]
    assert "asyncio.run(main())" in programs[1]


@pytest.mark.parametrize("program", example_programs(), ids=["trio", "asyncio"])
def test_the_readmes_example_runs_and_leaves_nothing_running(
    tracked: Tracked, tmp_path: Path, program: str
) -> None:
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
