"""docs/tasks.md's table of Django's own tests of django.tasks: every test of Django
6.1.3's tests/tasks/ has a row, every row names a test of this suite that exists, and
every ported test of tests/concurrency/test_upstream_tasks.py has its row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "tasks.md"
PORT = ROOT / "tests" / "concurrency" / "test_upstream_tasks.py"
KINDS = ("ported", "adapted", "left out")
ROW = re.compile(
    r"^\| `(?P<upstream>test_[\w.]+)` \| (?P<kind>[a-z ]+): (?P<here>`[^`]+`|—) \| .+ \|$"
)

#: The test methods of Django 6.1.3's tests/tasks/ (its source distribution), by test case.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "test_tasks.TaskTestCase": (
        "test_using_correct_backend",
        "test_task_decorator",
        "test_enqueue_task",
        "test_enqueue_task_async",
        "test_enqueue_with_invalid_argument",
        "test_aenqueue_with_invalid_argument",
        "test_using_priority",
        "test_using_queue_name",
        "test_using_run_after",
        "test_using_unknown_backend",
        "test_using_missing_backend",
        "test_using_creates_new_instance",
        "test_chained_using",
        "test_refresh_result",
        "test_naive_datetime",
        "test_invalid_priority",
        "test_unknown_queue_name",
        "test_call_task",
        "test_call_task_async",
        "test_call_async_task",
        "test_call_async_task_sync",
        "test_get_result",
        "test_get_result_async",
        "test_get_missing_result",
        "test_get_incorrect_result",
        "test_get_incorrect_result_async",
        "test_invalid_function",
        "test_get_backend",
        "test_name",
        "test_module_path",
        "test_pickle_task",
        "test_unpickle_arbitrary_string",
        "test_unpickle_non_task_object",
        "test_pickle_task_result",
        "test_no_backends",
        "test_task_error_invalid_exception",
        "test_task_error_unknown_module",
        "test_takes_context_without_taking_context",
        "test_run_after_in_decorator",
    ),
    "test_immediate_backend.ImmediateBackendTestCase": (
        "test_using_correct_backend",
        "test_enqueue_task",
        "test_enqueue_task_async",
        "test_catches_exception",
        "test_throws_keyboard_interrupt",
        "test_complex_exception",
        "test_complex_return_value",
        "test_result",
        "test_result_async",
        "test_cannot_get_result",
        "test_cannot_refresh_result",
        "test_cannot_pass_run_after",
        "test_enqueue_logs",
        "test_failed_logs",
        "test_successful_task_no_none_in_logs",
        "test_takes_context",
        "test_context",
        "test_validate_on_enqueue",
        "test_validate_on_aenqueue",
    ),
    "test_immediate_backend.ImmediateBackendTransactionTestCase": (
        "test_doesnt_wait_until_transaction_commit_by_default",
    ),
    "test_dummy_backend.DummyBackendTestCase": (
        "test_using_correct_backend",
        "test_enqueue_task",
        "test_enqueue_task_async",
        "test_get_result",
        "test_get_result_async",
        "test_refresh_result",
        "test_refresh_result_async",
        "test_get_missing_result",
        "test_enqueue_logs",
        "test_errors",
        "test_validate_disallowed_async_task",
        "test_check",
        "test_takes_context",
        "test_clear",
        "test_validate_on_enqueue",
        "test_validate_on_aenqueue",
    ),
    "test_dummy_backend.DummyBackendTransactionTestCase": (
        "test_doesnt_wait_until_transaction_commit_by_default",
    ),
    "test_custom_backend.CustomBackendTestCase": (
        "test_using_correct_backend",
        "test_enqueue_async_task_on_non_async_backend",
        "test_backend_does_not_support_priority",
        "test_options",
        "test_no_enqueue",
    ),
    "test_custom_backend.CustomTaskTestCase": (
        "test_custom_task_default_values",
        "test_custom_task_with_custom_values",
        "test_custom_task_with_standard_and_custom_values",
        "test_custom_task_invalid_kwarg",
    ),
}


def table() -> dict[str, tuple[str, str]]:
    """The page's rows: upstream test -> (kind, the test here or "")."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            here = match["here"].strip("`") if match["here"] != "—" else ""
            rows[match["upstream"]] = (match["kind"], here)
    return rows


def names_in(path: Path) -> set[str]:
    """`Class::test` and `test` names of a test module."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test_"):
                    names.add(f"{node.name}::{item.name}")
    return names


def test_every_upstream_test_has_one_row_with_its_kind() -> None:
    expected = {f"{case}.{name}" for case, names in UPSTREAM.items() for name in names}
    rows = table()
    assert len(expected) == 85
    assert set(rows) == expected
    assert {kind for kind, _ in rows.values()} <= set(KINDS)


def test_the_counts_the_page_gives_are_the_rows() -> None:
    text = PAGE.read_text()
    kinds = [kind for kind, _ in table().values()]
    for kind in KINDS:
        assert f"**{kind}** ({kinds.count(kind)})" in text, kind


def test_every_row_names_a_test_that_exists_and_every_port_has_a_row() -> None:
    ported = names_in(PORT)
    named = set()
    for upstream, (kind, here) in table().items():
        if not here:
            assert kind == "left out", upstream
            continue
        if "::" in here and here.split("::")[0].endswith(".py"):
            module, _, name = here.partition("::")
            assert name in names_in(ROOT / "tests" / "concurrency" / module), here
        else:
            assert here in ported, here
            named.add(here)
    assert ported == named  # no test of the port without its upstream row
