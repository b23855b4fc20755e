"""
Sphinx configuration: MyST Markdown, furo, autodoc with Napoleon, doctest.

Built with ``nox -s docs`` as ``sphinx-build -W -n``: every warning fails the
build and every cross-reference must resolve.
"""

from __future__ import annotations

import doctest
import importlib.metadata
import os


project = "resilient"
author = "The resilient developers"
copyright = "2026, The resilient developers"
release = importlib.metadata.version("resilient")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
]

source_suffix = {".md": "markdown"}
master_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Single backticks in docstrings are cross-references.
default_role = "py:obj"
nitpicky = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Intersphinx needs the network, which the build machines do not have; an
# unreachable inventory is a warning, and warnings fail the build. Set
# RESILIENT_DOCS_INTERSPHINX=1 to link to these projects' docs.
intersphinx_mapping: dict[str, tuple[str, None]] = {}
if os.environ.get("RESILIENT_DOCS_INTERSPHINX"):
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "anyio": ("https://anyio.readthedocs.io/en/stable", None),
        "attrs": ("https://www.attrs.org/en/stable", None),
    }

# References that must resolve are ours. Without intersphinx, names from the
# standard library and from other projects (anyio, attrs, OpenTelemetry,
# httpx, requests) have nothing to link to; with it, the ones it knows link
# and these patterns only catch the rest.
nitpick_ignore_regex = [
    # Not ours: the standard library and third-party projects, and literal
    # text in single backticks (`date -s`).
    (r"py:.*", r"(?!resilient\b).*"),
    # Type variables and ParamSpecs in signatures have no pages.
    (r"py:.*", r"~?_?[PT]|resilient\..*\._?[PT]"),
]
nitpick_ignore = [
    # The keyword arguments of Policy.evolve(), typed: the fields of Policy.
    ("py:class", "resilient._policy._policy.PolicyChanges"),
    # The same for the evolve() of the bulkhead and retry-budget configs.
    ("py:class", "resilient._core._config_bulkhead.BulkheadKnobs"),
    ("py:class", "resilient._core._config_retry_budget.RetryBudgetKnobs"),
    # What RetryMachine decides; private until users drive machines.
    ("py:class", "resilient._core._decisions.Retry"),
    ("py:class", "resilient._core._decisions.GiveUp"),
    # The context manager the testing switches return; only entered.
    ("py:class", "resilient.testing._Restore"),
]

doctest_global_setup = """
import resilient
import resilient.testing

# Examples run in virtual time: waits advance a fake clock.
_docs_clock = resilient.testing.FakeClock()
_docs_restore = resilient.testing.use_clock(_docs_clock)
"""
doctest_global_cleanup = """
_docs_restore.__exit__(None, None, None)
"""

html_theme = "furo"
html_title = f"resilient {release}"
html_static_path: list[str] = []

# Check exception messages too, not only their types.
doctest_default_flags = doctest.ELLIPSIS | doctest.DONT_ACCEPT_TRUE_FOR_1
