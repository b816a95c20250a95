"""The system checks reference, read from the package's source.

Every `checks.Error(...)`, `checks.Warning(...)` ... with an `id="pgjobs.…"` is found by
walking the syntax tree of each module, so a new check appears here as soon as it is
written, with its message, its hint and whether it runs only with `check --deploy`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from pgjobs_reference.markdown import code, table

LEVELS = {"Debug", "Info", "Warning", "Error", "Critical"}


@dataclass(frozen=True, slots=True)
class CheckEntry:
    """One message a system check can give."""

    id: str
    level: str
    summary: str
    message: str
    hint: str
    deploy: bool
    source: str


def package_root() -> Path:
    """Return the directory of the django_pgjobs package."""
    import django_pgjobs

    return Path(django_pgjobs.__file__).resolve().parent


def _text(node: ast.expr | None, function: ast.AST | None = None) -> str:
    """A message as the reader sees it, with each value left to run time as <name>.

    A message held in a variable of the check function reads as each text assigned to it.
    """
    if node is None:
        return ""
    if isinstance(node, ast.Name) and function is not None:
        assigned = [
            _text(assignment.value)
            for assignment in ast.walk(function)
            if isinstance(assignment, ast.Assign)
            and any(
                isinstance(target, ast.Name) and target.id == node.id
                for target in assignment.targets
            )
        ]
        if assigned:
            return " Or: ".join(assigned)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        pieces = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                pieces.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                pieces.append(_placeholder(value.value))
        return "".join(pieces)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        return _placeholder(node.args[0]) if node.args else ""
    return _placeholder(node)


def _placeholder(expression: ast.expr) -> str:
    """A value filled in at run time, shown as code: `<alias>`."""
    return code(f"<{ast.unparse(expression)}>")


def _is_deploy(function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> bool:
    if function is None:
        return False
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "deploy" and isinstance(keyword.value, ast.Constant):
                    return bool(keyword.value.value)
    return False


def _level(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name if name in LEVELS else None


def check_entries(root: Path | None = None) -> list[CheckEntry]:
    """Return every check message of the package under `root`, ordered by id."""
    root = root or package_root()
    entries = []
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in [None, *ast.walk(tree)]:
            if function is not None and not isinstance(
                function, ast.FunctionDef | ast.AsyncFunctionDef
            ):
                continue
            body = tree if function is None else function
            for node in ast.walk(body):
                if not isinstance(node, ast.Call) or (level := _level(node)) is None:
                    continue
                keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                check_id = keywords.get("id")
                if not (isinstance(check_id, ast.Constant) and isinstance(check_id.value, str)):
                    continue
                if not check_id.value.startswith("pgjobs."):
                    continue
                owner = _owner(tree, node)
                if function is not (owner or None):
                    continue
                entries.append(
                    CheckEntry(
                        id=check_id.value,
                        level=level,
                        summary=_summary(owner, check_id.value),
                        message=_text(node.args[0] if node.args else keywords.get("msg"), owner),
                        hint=_text(keywords.get("hint"), owner),
                        deploy=_is_deploy(owner),
                        source=f"{path.relative_to(root.parent).with_suffix('')}".replace("/", "."),
                    )
                )
    return sorted(entries, key=lambda entry: (entry.id, entry.message))


def _summary(function: ast.FunctionDef | ast.AsyncFunctionDef | None, check_id: str) -> str:
    """What the check function's docstring says `check_id` checks ("pgjobs.E001: ...")."""
    docstring = (ast.get_docstring(function) or "") if function is not None else ""
    flat = " ".join(docstring.split())
    if f"{check_id}:" not in flat:
        return ""
    said = flat.split(f"{check_id}:", 1)[1]
    said = re.split(r";?\s*(?:and )?pgjobs\.[A-Z]\d+:", said, maxsplit=1)[0]
    return said.strip().rstrip(".;") + "."


def _owner(tree: ast.Module, target: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function whose body holds `target`."""
    owner: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        holds_target = any(child is target for child in ast.walk(node))
        if holds_target and (owner is None or any(child is node for child in ast.walk(owner))):
            owner = node
    return owner


def checks_markdown() -> str:
    """Return a section per system check id: its level, what it checks, its messages and
    what to do."""
    entries = check_entries()
    parts: list[str] = []
    for check_id in dict.fromkeys(entry.id for entry in entries):
        messages = [entry for entry in entries if entry.id == check_id]
        first = messages[0]
        summary = first.summary[:1].upper() + first.summary[1:]
        deploy = " Runs with `check --deploy`." if first.deploy else ""
        lines = [f"## {check_id}\n", f"**{first.level}** from {code(first.source)}.{deploy}"]
        if summary:
            lines.append(f" {summary}")
        lines.append("\n")
        rows = [(entry.message, entry.hint or "—") for entry in messages]
        lines.append(table(("Message", "What to do"), rows))
        parts.append("\n".join(lines))
    return "\n".join(parts)
