"""Sphinx configuration for trio_proctree's documentation (``nox -s docs``)."""

from __future__ import annotations

from typing import Any

import trio_proctree

project = "trio_proctree"
author = "trio_proctree maintainers"
copyright = "2026, trio_proctree maintainers"
release = version = trio_proctree.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' "Args:" / "Raises:" sections
    "sphinxcontrib_trio",  # async signatures: "await", "async with"
]
default_role = "py:obj"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Every reference to this project's own names must resolve (a renamed name fails the
# warnings-as-errors build). The build is offline (no intersphinx): references to trio
# and the standard library stay plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(trio|subprocess|asyncio|collections|ctypes)(\..*)?"),
]

html_theme = "alabaster"
html_theme_options = {"description": "Tie a whole subprocess tree to a trio scope"}
html_static_path: list[str] = []
exclude_patterns = ["_build"]

#: Made by the library, never by the user: no constructor parameters in their pages.
_MADE_BY_THE_LIBRARY = {
    "trio_proctree.ProcessTree",
    "trio_proctree.asyncio.ProcessTree",
    "trio_proctree.CleanupOutcome",
}


def _no_constructor_types(app: Any, what: str, name: str, *args: Any) -> None:
    """Forget the constructor's type hints that autodoc just recorded for such a class
    (it would list them as the class's parameters)."""
    if what == "class" and name in _MADE_BY_THE_LIBRARY:
        app.env.temp_data.get("annotations", {}).pop(name, None)


def setup(app: Any) -> None:
    # After sphinx.ext.autodoc.typehints records them (priority 500).
    app.connect("autodoc-process-signature", _no_constructor_types, priority=600)
