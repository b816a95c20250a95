"""Which tests pin each rule of the guarantees (S1, S2 ...), read from the test suite.

A test pins a rule by naming it: `test_s9_lapsed_exhausted_job_dead_letters`, or `S9` in
its docstring. The table is made from the tests of the checkout the docs are built from.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from pgjobs_reference.markdown import code, table

_NAMED = re.compile(r"^test_s(\d+)_")
_DOCSTRING = re.compile(r"\bS(\d+)\b")
#: Tests shown by name per rule; the rest are counted.
SHOWN = 3


def tests_root() -> Path:
    """Return the checkout's tests/ folder (beside docs/)."""
    return Path(__file__).resolve().parents[3] / "tests"


def pinning_tests(root: Path | None = None) -> dict[int, list[str]]:
    """Return, per rule number, the tests that name it (`tier/file.py::test_name`)."""
    root = root or tests_root()
    pinned: dict[int, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            rules = {int(number) for number in _NAMED.findall(node.name)}
            rules |= {int(number) for number in _DOCSTRING.findall(ast.get_docstring(node) or "")}
            for rule in rules:
                pinned[rule].append(f"{path.relative_to(root).as_posix()}::{node.name}")
    return dict(pinned)


def stated_rules(page: Path | None = None) -> list[int]:
    """Return the rules the guarantees page states (its `**S<n>**` items), in order."""
    page = page or Path(__file__).resolve().parents[2] / "explanation" / "guarantees.md"
    return [int(number) for number in re.findall(r"^- \*\*S(\d+)\*\*", page.read_text(), re.M)]


def rules_markdown() -> str:
    """Return the table of the rules the guarantees page states, and the tests that pin
    each."""
    pinned = pinning_tests()
    rows = []
    for rule in sorted(stated_rules()):
        tests = pinned.get(rule, [])
        shown = ", ".join(code(test.split("::")[1]) for test in tests[:SHOWN])
        more = f" and {len(tests) - SHOWN} more" if len(tests) > SHOWN else ""
        rows.append((f"S{rule}", str(len(tests)), (shown + more) or "—"))
    return table(("Rule", "Tests", "For example"), rows)
