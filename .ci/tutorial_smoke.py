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
  console block's last command printed.

Blocks fenced as `bash` or `text` are prose for the reader and never run. The first
failure stops the run with the block's line number and its output. At the end, pass or
fail, the project's private PostgreSQL is stopped and its files removed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

#: Commands of the page that make the reader's venv and install the package into it.
SETUP_COMMANDS = ("python -m venv", ". .venv/bin/activate", "pip install", "mkdir ")
#: Seconds one command or doctest may take before the run fails.
STEP_TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\S*)\s*(.*)$")

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


def run_page(page: list[Block], bin_dir: Path, project: Path, env: dict[str, str]) -> None:
    """Run the page's blocks in order (see the module's docstring)."""
    last_output = ""
    for block in page:
        if block.language == "console":
            print(f"line {block.line}: console")
            for line in block.text.splitlines():
                command = line[2:] if line.startswith("$ ") else ""
                if command and not command.startswith(SETUP_COMMANDS):
                    last_output = run(command, cwd=project, env=env)
        elif block.language == "text" and last_output:
            missing = [want for want in block.text.splitlines() if want not in last_output]
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
        run_page(blocks(args.page), bin_dir, project, env)
    finally:
        remove_private_postgres(bin_dir / "python", project, env)
    print("the tutorial ran from start to end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
