"""The commands reference, read from each management command's argparse parser."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from pgjobs_reference.markdown import code, table
from pgjobs_reference.settings import default_literal

#: The commands django_pgjobs ships, with the app that holds each.
COMMANDS = (
    ("runjobs", "django_pgjobs"),
    ("sweepjobs", "django_pgjobs"),
    ("jobsctl", "django_pgjobs"),
    ("chaosjobs", "django_pgjobs.chaos"),
)


def _django_options() -> set[str]:
    """The destinations of the options every Django command has (-v, --settings ...)."""
    from django.core.management.base import BaseCommand

    parser = BaseCommand().create_parser("manage.py", "command")
    return {action.dest for action in parser._actions}


def _option_names(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) if action.option_strings else action.dest
    if action.nargs != 0 and action.option_strings:
        metavar = action.metavar or action.dest.upper()
        names += f" {metavar}"
    elif not action.option_strings:
        names = str(action.metavar or action.dest)
    return names


def _setting_of(action: argparse.Action) -> str | None:
    """The PGJOBS setting an option without a default of its own falls back to: the one
    named like it (--shutdown-grace: SHUTDOWN_GRACE), else the one its help names."""
    from django_pgjobs.conf import Settings

    settings = {name for name in vars(Settings) if name.isupper()}
    if action.dest.upper() in settings:
        return action.dest.upper()
    named = re.search(r"PGJOBS\['([A-Z_]+)'\]", action.help or "")
    return named.group(1) if named and named.group(1) in settings else None


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off" if action.default is False else "on"
    if action.default in (None, argparse.SUPPRESS) or action.default == []:
        if not action.option_strings:
            return "—" if action.nargs in ("*", "?") else "required"
        setting = _setting_of(action)
        if setting is None:
            return "—"
        from django_pgjobs.conf import Settings

        return f"{code(setting)} ({code(default_literal(getattr(Settings, setting)))})"
    return code(repr(action.default))


def _rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[tuple[str, str, str]]:
    return [
        (code(_option_names(action)), _default(action), action.help or "")
        for action in parser._actions
        if action.dest not in skip and not isinstance(action, argparse._SubParsersAction)
    ]


def _subcommands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each subcommand, its subcommands after it: (its name after the command's, what it
    does, its parser). What it does is its description, else its summary."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                named = f"{prefix}{name}"
                yield named, subparser.description or summaries.get(name, ""), subparser
                yield from _subcommands(subparser, f"{named} ")


def command_markdown(name: str, app: str) -> str:
    """Return the reference of one command: what it does, its usage and every option."""
    from django.core.management import load_command_class

    command = load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    django_options = _django_options()
    parts = [f"## {name}\n", f"{command.help}\n"]
    parts.append(f"```text\n{parser.format_usage().strip()}\n```\n")
    rows = _rows(parser, django_options)
    if rows:
        parts.append(table(("Option", "Default", "What it does"), rows))
    for action_name, summary, subparser in _subcommands(parser, ""):
        parts.append(f"### {name} {action_name}\n")
        parts.append(f"{summary}\n")
        usage = subparser.format_usage().strip().replace("usage: ", "usage: ", 1)
        parts.append(f"```text\n{usage}\n```\n")
        sub_rows = _rows(subparser, {"help"})
        if sub_rows:
            parts.append(table(("Argument", "Default", "What it is"), sub_rows))
    parts.append(
        f"Every Django command's options apply too (`-v`, `--settings`, `--traceback` ...): "
        f"`python manage.py help {name}` lists them.\n"
    )
    return "\n".join(parts)


def commands_markdown() -> str:
    """Return the reference of every command django_pgjobs ships."""
    return "\n".join(command_markdown(name, app) for name, app in COMMANDS)
