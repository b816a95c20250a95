"""The documentation's reference generators (docs/_ext/pgjobs_reference), for the tests.

They import no Sphinx, so the suite can check what the pages will say without building
the site.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from tests.spawn import ROOT

DOCS_EXTENSIONS = ROOT / "docs" / "_ext"


def docs_reference(name: str) -> ModuleType:
    """Import one generator module of the docs' reference: "settings", "checks" ..."""
    if str(DOCS_EXTENSIONS) not in sys.path:
        sys.path.append(str(DOCS_EXTENSIONS))
    return importlib.import_module(f"pgjobs_reference.{name}")
