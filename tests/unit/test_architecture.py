"""The package's shape (docs/explanation/architecture.md), held by its source: imports that
point one way (no cycle but Django's models <-> managers), SQL sent only from db/, modules
small enough to read, and worker pieces that each keep a little state."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent.parent / "django_pgjobs"
#: The one cycle allowed: Django's convention, a model's manager and its model.
ALLOWED_CYCLE_MODULES = ("django_pgjobs.models", "django_pgjobs.managers")
#: Calls that send SQL (or build it), allowed only in db/ and in migrations.
SQL_CALLS = {"execute", "executemany", "cursor", "raw", "extra", "explain", "RawSQL", "SQL"}
MAX_MODULE_LINES = 600
MAX_WORKER_ATTRIBUTES = 12


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of the package `name` imports, wherever the import stands (at the top,
    in a function, under TYPE_CHECKING): each is an arrow of the architecture."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            candidates = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_only_import_cycle_is_models_and_their_managers() -> None:
    found = cycles(import_graph())
    allowed = [
        cycle
        for cycle in found
        if all(member.startswith(ALLOWED_CYCLE_MODULES) for member in cycle)
    ]
    assert [sorted(cycle) for cycle in found if cycle not in allowed] == []


def test_the_checker_sees_a_cycle_and_an_import_inside_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    graph = import_graph()
    assert "django_pgjobs.models" in graph["django_pgjobs.managers.queues"]  # in a function
    assert "django_pgjobs.db.sql" in graph["django_pgjobs.db.connection"]


def sql_calls_outside_db() -> Iterator[str]:
    for name, path in modules().items():
        if name.startswith("django_pgjobs.db"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else None
            called = called or (function.id if isinstance(function, ast.Name) else "")
            if called in SQL_CALLS or ast.unparse(function) == "psycopg.connect":
                yield f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)[:60]}"


def test_sql_is_sent_only_from_the_db_room() -> None:
    assert list(sql_calls_outside_db()) == []


def test_no_module_is_too_long_to_read() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in modules().values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    return {
        target.attr
        for node in ast.walk(cls)
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign | ast.AugAssign)
            else []
        )
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }


def test_every_piece_of_the_worker_keeps_a_little_state() -> None:
    crowded = {}
    for path in (PACKAGE / "worker").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                attributes = instance_attributes(node)
                if len(attributes) > MAX_WORKER_ATTRIBUTES:
                    crowded[f"{path.name}:{node.name}"] = sorted(attributes)
    assert crowded == {}
    worker = next(
        node
        for node in ast.walk(ast.parse((PACKAGE / "worker" / "loop.py").read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Worker"
    )
    assert 8 <= len(instance_attributes(worker)) <= MAX_WORKER_ATTRIBUTES
