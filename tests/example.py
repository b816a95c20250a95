"""Run the example project in a database of its own, in subprocesses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers import conninfo, other_connection
from tests.spawn import manage_py


def database_url(name: str) -> str:
    params = {**conninfo(), "dbname": name}
    user = params.get("user", "")
    password = f":{params['password']}" if "password" in params else ""
    port = f":{params['port']}" if "port" in params else ""
    return f"postgresql://{user}{password}@{params.get('host', '127.0.0.1')}{port}/{name}"


@contextmanager
def scratch_database() -> Iterator[str]:
    """A fresh database on the test server, dropped afterwards; yields its URL."""
    name = f"pgjobs_example_{uuid.uuid4().hex[:8]}"
    with other_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        with other_connection() as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def manage(url: str, *args: str, timeout: float = 180) -> str:
    return manage_py(example_env(url), *args, timeout=timeout)


def example_env(url: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "DJANGO_DEBUG": "0"}
