"""The exceptions reference: the tree of `django_pgjobs.exceptions`, read from its classes."""

from __future__ import annotations

import inspect

from pgjobs_reference.markdown import code


def _exception_classes() -> list[type[BaseException]]:
    from django_pgjobs import exceptions

    return [
        value
        for value in vars(exceptions).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == exceptions.__name__
    ]


def _summary(cls: type[BaseException]) -> str:
    return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())


def _article(name: str) -> str:
    return "an" if name[0] in "AEIOU" else "a"


def _branch(cls: type[BaseException], ours: list[type[BaseException]], depth: int) -> list[str]:
    """The list lines of `cls` and, indented under it, of the classes derived from it."""
    inherited = [base.__name__ for base in cls.__bases__ if base not in ours]
    also = "".join(f" (also {_article(name)} {code(name)})" for name in inherited if depth)
    if not depth:
        also = "".join(f" ({_article(name)} {code(name)})" for name in inherited)
    lines = [f"{'  ' * depth}- {code(cls.__name__)}{also}: {_summary(cls)}"]
    for child in ours:
        if child.__bases__[0] is cls:
            lines.extend(_branch(child, ours, depth + 1))
    return lines


def exceptions_markdown() -> str:
    """Return the exception classes as a nested list, each with its first docstring line."""
    ours = _exception_classes()
    lines: list[str] = []
    for root in (cls for cls in ours if cls.__bases__[0] not in ours):
        lines.extend(_branch(root, ours, 0))
    return "\n".join(lines) + "\n"
