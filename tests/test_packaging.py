"""The package claims exactly the interpreters the test matrix runs, and offers the same
names to trio and asyncio programs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import trio_proctree
import trio_proctree.asyncio

ROOT = Path(__file__).resolve().parent.parent


def nox_pythons() -> list[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PYTHONS":
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError("noxfile.py has no PYTHONS list")


def test_classifiers_and_requires_python_match_the_nox_matrix() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pythons = nox_pythons()
    classified = [
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert classified == pythons
    low, high = pythons[0], pythons[-1]
    minor = int(high.split(".")[1])
    assert project["requires-python"] == f">={low},<3.{minor + 1}"


def test_the_matrix_is_contiguous_from_the_oldest_supported() -> None:
    minors = [int(version.split(".")[1]) for version in nox_pythons()]
    assert minors == list(range(minors[0], minors[-1] + 1))
    assert minors[0] == 10


def test_the_asyncio_module_offers_all_the_package_does() -> None:
    # An asyncio program needs no second import for its policy, its outcome or its except
    # clauses (red before, helper-52: Escalation, Step and the errors were trio_proctree's
    # only). The very objects: an except clause with either catches the same error.
    # (Plus what trio has of its own: the task_status that hands a run's tree back.)
    asyncio_only = {"TaskStatus", "TASK_STATUS_IGNORED"}
    assert set(trio_proctree.asyncio.__all__) == set(trio_proctree.__all__) | asyncio_only
    for name in set(trio_proctree.__all__) - {
        "ProcessTree",
        "open_process_tree",
        "run_process_tree",
    }:
        assert getattr(trio_proctree.asyncio, name) is getattr(trio_proctree, name)
