"""Sphinx configuration for trio_proctree's documentation (``nox -s docs``)."""

from __future__ import annotations

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
# The build is offline (no intersphinx): references to trio and the standard library
# stay plain text instead of failing the warnings-as-errors build.
nitpicky = False

html_theme = "alabaster"
html_theme_options = {"description": "Tie a whole subprocess tree to a trio scope"}
html_static_path: list[str] = []
exclude_patterns = ["_build"]
