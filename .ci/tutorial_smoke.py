"""Run the tutorial (docs/tutorial/index.md) against an installed django_pgjobs.

    python .ci/tutorial_smoke.py --venv /tmp/x/venv --project /tmp/x/project docs/tutorial/index.md

The virtual environment must already hold the package (CI installs the wheel it built);
the project directory must be empty or missing, and lie outside the checkout, so that
nothing imports the source tree. The page's blocks are run in order:

- `console` blocks: each `$ command` runs in the project directory with the venv's bin
  first on PATH, except the setup lines that make and fill a venv (this script's caller
  did that with the wheel), and `cd` into the project (this script is there already);
- `{code-block}` blocks captioned with a file path: the file is written, or appended to
  when the caption says "(add at the end)";
- `pycon` blocks: each one is a doctest, run in a fresh process of the project with
  Django set up, so its outputs are checked;
- a `text` block right after a `console` block: every line of it must appear in what the
  console block's last command printed, but for what differs from run to run (a log
  line's time, a worker's id, a `..._at=` time), which is compared masked: the page
  shows real output.

Two commands of a `console` block wait for a person as written; the smoke runs them its
own way. `python manage.py createsuperuser` runs with `--noinput`, as the user `admin`
with a password of the smoke's. `python manage.py runserver` runs without its reloader, on
a free port, until the smoke has logged in as that user and opened every page of
`http://127.0.0.1:8000/...` the page names (each must answer 200, not the login form);
then it is stopped.

Blocks fenced as `bash` or `text` are prose for the reader and never run. The first
failure stops the run with the block's line number and its output. At the end, pass or
fail, the project's private PostgreSQL is stopped and its files removed.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

#: Commands of the page that make the reader's venv and install the package into it.
SETUP_COMMANDS = ("python -m venv", ". .venv/bin/activate", "pip install", "mkdir ")
#: Seconds one command or doctest may take before the run fails.
STEP_TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\S*)\s*(.*)$")
#: What differs in a command's output from one run to the next: a log line's time, a
#: worker's or job's id, a `..._at=` time. Masked on both sides when the page shows output.
_VARYING = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}|(?<=\bid=)\S+|(?<=_at=)\S+", re.M)

#: The commands that wait for a person, run the smoke's way (see the module's docstring).
CREATESUPERUSER = "python manage.py createsuperuser"
RUNSERVER = "python manage.py runserver"
#: The superuser the smoke makes in place of the reader, and logs in as.
SUPERUSER = {
    "DJANGO_SUPERUSER_USERNAME": "admin",
    "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
    "DJANGO_SUPERUSER_PASSWORD": secrets.token_urlsafe(12),
}
#: The address the page tells the reader to open pages of `runserver` at.
_SERVED = re.compile(r"http://127\.0\.0\.1:8000(/[^\s)>`'\"]*)")

DOCTEST_RUNNER = textwrap.dedent(
    """
    import doctest, os, sys
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    import django
    django.setup()
    text = sys.stdin.read()
    test = doctest.DocTestParser().get_doctest(text, {}, "tutorial", "tutorial", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    sys.exit(1 if runner.failures else 0)
    """
)


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced block of the page: its kind (console, pycon, a file), text and line."""

    language: str
    caption: str
    text: str
    line: int


def blocks(page: Path) -> list[Block]:
    """Return the page's fenced blocks in order, with the caption of a {code-block}."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening or not opening.group(1):
            index += 1
            continue
        start = index + 1
        language, argument = opening.group(1), opening.group(2)
        if language == "{code-block}":
            language = argument.strip()
        body: list[str] = []
        caption = ""
        index += 1
        while index < len(lines) and lines[index] != "```":
            option = re.match(r"^:caption: (.+)$", lines[index])
            if option and not body:
                caption = option.group(1)
            elif body or lines[index].strip():
                body.append(lines[index])
            index += 1
        found.append(Block(language, caption, "\n".join(body) + "\n", start))
        index += 1
    return found


def run(
    command: list[str] | str, *, cwd: Path, env: dict[str, str], stdin: str = "", shown: str = ""
) -> str:
    """Run one step, showing it; stop the smoke with its output when it fails.

    Returns:
        What the step printed, stdout then stderr.
    """
    shown = shown or (command if isinstance(command, str) else shlex.join(command))
    print(f"  $ {shown}", flush=True)
    started = time.monotonic()
    result = subprocess.run(
        command,
        shell=isinstance(command, str),
        cwd=cwd,
        env=env,
        input=stdin,
        text=True,
        capture_output=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    if result.returncode:
        print(textwrap.indent(output, "    "))
        raise SystemExit(f"the tutorial's step failed (exit {result.returncode}): {shown}")
    last = output.splitlines()[-1] if output else ""
    print(f"    ok in {time.monotonic() - started:.1f}s {last[:100]}", flush=True)
    return output


def masked(text: str) -> str:
    """Return `text` with what varies from run to run masked (see _VARYING)."""
    return _VARYING.sub("...", text)


def served_paths(page: str) -> list[str]:
    """Return the paths of the `runserver` pages the page names, in order, once each."""
    return list(dict.fromkeys(_SERVED.findall(page)))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def admin_login(base: str) -> urllib.request.OpenerDirector:
    """Log in to the admin at `base` as SUPERUSER; return an opener that holds the session."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    form = opener.open(f"{base}/admin/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    if token is None:
        raise SystemExit("the admin's login page has no CSRF token")
    fields = {
        "csrfmiddlewaretoken": token.group(1),
        "username": SUPERUSER["DJANGO_SUPERUSER_USERNAME"],
        "password": SUPERUSER["DJANGO_SUPERUSER_PASSWORD"],
        "next": "/admin/",
    }
    answer = opener.open(
        urllib.request.Request(
            f"{base}/admin/login/?next=/admin/",
            data=urllib.parse.urlencode(fields).encode(),
            headers={"Referer": f"{base}/admin/login/"},
        ),
        timeout=30,
    )
    if "/admin/login/" in answer.geturl():
        raise SystemExit(
            "could not log in to the admin as the superuser: did the page run "
            f"`{CREATESUPERUSER}` before `{RUNSERVER}`?"
        )
    return opener


def wait_until_serving(base: str, server: subprocess.Popen[str]) -> None:
    """Return once the server answers; stop the smoke if it exits or never answers."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the development server exited ({server.returncode})")
        try:
            urllib.request.urlopen(f"{base}/admin/login/", timeout=5).close()
            return
        except urllib.error.HTTPError as error:
            raise SystemExit(f"the development server answered {error.code}") from None
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the development server never answered") from None
            time.sleep(0.2)


def serve_and_open(command: str, *, cwd: Path, env: dict[str, str], paths: list[str]) -> str:
    """Run the page's `runserver` until the pages it names answer the superuser (see the
    module's docstring).

    Returns:
        What the server printed.
    """
    port = free_port()
    argv = [*shlex.split(command), "--noreload", f"127.0.0.1:{port}"]
    print(f"  $ {shlex.join(argv)} (until the page's URLs answer)", flush=True)
    started = time.monotonic()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        try:
            wait_until_serving(base, server)
            opener = admin_login(base)
            for path in paths:
                try:
                    answer = opener.open(base + path, timeout=30)
                except urllib.error.HTTPError as error:
                    raise SystemExit(f"{path} answered {error.code}") from None
                if "/admin/login/" in answer.geturl():
                    raise SystemExit(f"{path} sent the superuser to the login form")
                print(f"    {path}: {answer.status}", flush=True)
        except SystemExit:
            log.seek(0)
            print(textwrap.indent(log.read().strip(), "    "))
            raise
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(30)
        log.seek(0)
        output = log.read().strip()
    print(f"    ok in {time.monotonic() - started:.1f}s", flush=True)
    return output


def run_command(command: str, *, cwd: Path, env: dict[str, str], paths: list[str]) -> str:
    """Run one `$ command` of a console block, the smoke's way for those that wait for a
    person; return what it printed."""
    if command.startswith(CREATESUPERUSER):
        return run(
            f"{command} --noinput",
            cwd=cwd,
            env={**env, **SUPERUSER},
            shown=f"{command} --noinput (as {SUPERUSER['DJANGO_SUPERUSER_USERNAME']})",
        )
    if command.startswith(RUNSERVER):
        return serve_and_open(command, cwd=cwd, env=env, paths=paths)
    return run(command, cwd=cwd, env=env)


def remove_private_postgres(python: Path, project: Path, env: dict[str, str]) -> None:
    """Stop the tutorial's private PostgreSQL if it runs, and delete its files."""
    script = (
        "import shutil, sys\n"
        "from django_pgjobs.testing.localdb import EmbeddedPostgres\n"
        "server = EmbeddedPostgres(sys.argv[1], durable=True)\n"
        "server.stop()\n"
        "shutil.rmtree(server.base, ignore_errors=True)\n"
    )
    if (project / ".pgdata").exists():
        subprocess.run(
            [str(python), "-c", script, str(project / ".pgdata")],
            cwd=project,
            env=env,
            check=False,
            timeout=STEP_TIMEOUT_S,
        )


def run_page(
    page: list[Block], paths: list[str], bin_dir: Path, project: Path, env: dict[str, str]
) -> None:
    """Run the page's blocks in order (see the module's docstring); `paths` are the pages
    of its development server that it names."""
    last_output = ""
    for block in page:
        if block.language == "console":
            print(f"line {block.line}: console")
            for line in block.text.splitlines():
                command = line[2:] if line.startswith("$ ") else ""
                if command and not command.startswith(SETUP_COMMANDS):
                    last_output = run_command(command, cwd=project, env=env, paths=paths)
        elif block.language == "text" and last_output:
            printed = masked(last_output)
            missing = [want for want in block.text.splitlines() if masked(want) not in printed]
            if missing:
                raise SystemExit(f"line {block.line}: the command did not print {missing}")
            print(f"line {block.line}: the command printed what the page shows")
        elif block.language == "pycon":
            print(f"line {block.line}: doctest")
            run(
                [str(bin_dir / "python"), "-c", DOCTEST_RUNNER],
                cwd=project,
                env=env,
                stdin=block.text,
                shown="python (the block as a doctest)",
            )
        elif block.caption:
            path_text = block.caption.split(" (")[0]
            target = project / path_text
            mode = "a" if "(add at the end)" in block.caption else "w"
            print(f"line {block.line}: {'append to' if mode == 'a' else 'write'} {path_text}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open(mode) as file:
                file.write(("\n" if mode == "a" else "") + block.text)
        if block.language != "console":
            last_output = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--project", type=Path, required=True)
    args = parser.parse_args()
    project: Path = args.project.resolve()
    project.mkdir(parents=True, exist_ok=True)
    if any(project.iterdir()):
        raise SystemExit(f"{project} is not empty: give the smoke a directory of its own.")
    bin_dir = args.venv.resolve() / "bin"
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(bin_dir.parent))
    env.pop("PYTHONPATH", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)

    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import django_pgjobs; print(django_pgjobs.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(bin_dir.parent)):
        raise SystemExit(f"django_pgjobs is imported from {where}, not from the venv.")
    print(f"django_pgjobs imported from {where}")

    try:
        run_page(blocks(args.page), served_paths(args.page.read_text()), bin_dir, project, env)
    finally:
        remove_private_postgres(bin_dir / "python", project, env)
    print("the tutorial ran from start to end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
