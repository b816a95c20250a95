"""The states table, read from `django_pgjobs.states.JobState` and its members' docstrings."""

from __future__ import annotations

import ast
import inspect
import itertools

from pgjobs_reference.markdown import ReferenceDrift, code, table


def state_docs() -> dict[str, str]:
    """Return each JobState member's docstring (the string under its assignment)."""
    from django_pgjobs import states

    tree = ast.parse(inspect.getsource(states.JobState))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for assignment, following in itertools.pairwise(body):
        if (
            isinstance(assignment, ast.Assign)
            and isinstance(assignment.targets[0], ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[assignment.targets[0].id] = " ".join(following.value.value.split())
    return docs


def states_markdown() -> str:
    """Return the table of the live states: what each means and what moves a job in and out."""
    from django_pgjobs.states import JobState

    docs = state_docs()
    rows = []
    for member in JobState:
        if member.name not in docs:
            raise ReferenceDrift(
                f"JobState.{member.name} has no docstring saying what moves a job in and out."
            )
        rows.append((code(member.value), docs[member.name]))
    return table(("State", "What it means, and what moves a job in and out"), rows)
