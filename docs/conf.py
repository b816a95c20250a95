"""Sphinx configuration of django_pgjobs' documentation (MyST Markdown, the furo theme).

Build it with warnings as errors, as CI does:

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
os.environ["DJANGO_SETTINGS_MODULE"] = "docs_settings"
django.setup()

from django_pgjobs import __version__  # noqa: E402  (after django.setup)

project = "django_pgjobs"
author = "django_pgjobs maintainers"
copyright = "2026, django_pgjobs maintainers"
release = __version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "pgjobs_reference.directives",
    "pgjobs_rule_links",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: ::: fences for admonitions, definition lists, and anchors for ## and ### headings
# so that [a link](page.md#a-heading) works here as it does on a forge's file view.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference: signatures with their type hints, Google-style docstrings.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": False}
# A signature longer than a line shows one parameter per line.
python_maximum_signature_line_length = 88
# `@job` is overloaded for type checkers (bare, or with options): show its one signature.
pgjobs_implementation_signatures = ["django_pgjobs.decorators.job"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Docstrings write names as `name`: show them as code, as the Markdown pages do.
default_role = "literal"

# Settings' descriptions hold Python literals ({"LEASE": 120}): keep their quotes straight.
smartquotes = False

html_theme = "furo"
html_title = f"django_pgjobs {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
