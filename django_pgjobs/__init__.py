"""django_pgjobs: a durable job queue in your own PostgreSQL database.

Importing this package touches neither settings nor models; `Retry`, `Fail` and
`LeaseLost` are resolved on first use, so the package can sit in INSTALLED_APPS.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

try:
    __version__ = metadata.version("django-pgjobs")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = ["Fail", "LeaseLost", "Retry", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Fail", "Retry", "LeaseLost"):
        from django_pgjobs import exceptions

        return getattr(exceptions, name)
    raise AttributeError(f"module 'django_pgjobs' has no attribute {name!r}")
