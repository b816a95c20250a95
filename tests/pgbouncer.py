"""A real PgBouncer in transaction mode in front of the test database, for a test's
length (Debian's `pgbouncer`; as root it runs as an unprivileged account, as the
embedded PostgreSQL does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from django_pgjobs.testing.localdb import DEFAULT_RUN_AS, free_port
from tests.helpers import conninfo

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(BINARY).exists()


@contextmanager
def pgbouncer(pool_size: int = 20, max_client_conn: int = 500) -> Iterator[str]:
    """Start PgBouncer (pool_mode = transaction) on a free port; yield the URL of the test
    database through it (a worker process holds several client connections: its loop's,
    its handler threads', its services')."""
    server = conninfo()
    port = free_port()
    target = " ".join(
        f"{key}={server[key]}" for key in ("host", "port", "user", "password") if key in server
    )
    with tempfile.TemporaryDirectory(prefix="pgbouncer-") as directory:
        config = Path(directory) / "pgbouncer.ini"
        config.write_text(
            f"""[databases]
* = {target or "host=127.0.0.1"}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = {max_client_conn}
ignore_startup_parameters = extra_float_digits,options
"""
        )
        kwargs: dict[str, Any] = {}
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            import pwd

            account = pwd.getpwnam(os.environ.get("EMBEDDED_PG_USER", DEFAULT_RUN_AS))
            kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
            os.chmod(directory, 0o755)
            os.chmod(config, 0o644)
        log = Path(directory) / "stderr.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [BINARY, str(config)], stdout=stderr, stderr=subprocess.STDOUT, **kwargs
            )
        url = f"postgresql://{server.get('user', 'postgres')}@127.0.0.1:{port}/{server['dbname']}"
        try:
            _wait_until_it_answers(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_until_it_answers(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PgBouncer did not start:\n{log.read_text()}") from None
            time.sleep(0.1)
