"""The claim and the completion statements' plans on the table users have straight after a
burst (issue 17): `EXPLAIN (ANALYZE, BUFFERS)` of CLAIM_JOBS (a claim of 100) and of
ACK_JOBS (100 claimed jobs) on a fresh table, after ANALYZE, and after VACUUM, each in a
transaction rolled back; whether the plan's shape changes with the statistics."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from bench.harness import Database, Figure

if TYPE_CHECKING:
    from bench.suite import Sizes

CLAIM_SIZE = 100
#: The table states, in order, and what is done to the table to reach each.
STATES = (
    ("fresh table", None),
    ("after ANALYZE", "ANALYZE pgjobs_job"),
    ("after VACUUM ANALYZE", "VACUUM ANALYZE pgjobs_job"),
)


def plan_shape(plan: str) -> list[str]:
    """The plan's nodes without their estimates and timings: what the planner chose."""
    shape = []
    for line in plan.splitlines():
        node = re.split(r"\s+\(cost=|\s+\(actual", line)[0].rstrip()
        if "->" in node or (node and not node.startswith(" ") and "Time:" not in node):
            shape.append(node.replace("->", "").strip() if "->" in node else node.strip())
    return shape


def plan_numbers(plan: str) -> dict[str, Any]:
    """Planning and execution time (ms) and the top node's shared buffers of a plan."""
    numbers: dict[str, Any] = {}
    for key, pattern in (
        ("planning_ms", r"Planning Time: ([\d.]+) ms"),
        ("execution_ms", r"Execution Time: ([\d.]+) ms"),
    ):
        match = re.search(pattern, plan)
        numbers[key] = float(match.group(1)) if match else None
    buffers = re.search(r"Buffers: (shared [^\n]*)", plan)
    numbers["buffers"] = buffers.group(1).strip() if buffers else ""
    return numbers


def _explain(database: Database, statement: str, params: dict[str, Any]) -> str:
    with database.connect() as conn, conn.transaction(force_rollback=True):
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def plans(database: Database, sizes: Sizes) -> list[Figure]:
    from bench.suite import fill_as_users_do
    from django_pgjobs.db import connection as db
    from django_pgjobs.db import sql
    from django_pgjobs.models import Job

    n = sizes.drain
    database.reset_jobs()
    fill_as_users_do(database, n, vacuum=False)  # no statistics: a table never analyzed
    claim = sql.claim_jobs(CLAIM_SIZE)
    claim_params = {
        "queues": ["default"],
        "floors": [None],
        "tops": [None],
        "lease_floor": None,
        "worker_id": "bench-explain",
        "synchronous_commit": None,
        "due": True,
        "only_kinds": None,
        "not_kinds": None,
    }
    figures = []
    first: dict[str, list[str]] = {}
    for state, command in STATES:
        if command:
            with database.connect() as conn:
                conn.execute(command)
        handles = Job.objects.claim_batch("default", CLAIM_SIZE, "bench-explain")
        ack_params = {
            **db.array_of_claims(handles),
            "results": db.array_of_nulls(len(handles)),
            **db.wake_params(),
            "synchronous_commit": None,
        }
        for name, statement, params in (
            ("CLAIM_JOBS (limit 100)", claim, claim_params),
            (f"ACK_JOBS ({len(handles)} jobs)", sql.ACK_JOBS, ack_params),
        ):
            plan = _explain(database, statement, params)
            shape = plan_shape(plan)
            first.setdefault(name, shape)
            numbers = plan_numbers(plan)
            figures.append(
                Figure(
                    "plans",
                    f"{name}, {state}: execution",
                    numbers["execution_ms"] or 0.0,
                    "ms",
                    details={
                        **numbers,
                        "rows in the table": n,
                        "same plan as on the fresh table": shape == first[name],
                        "plan": plan,
                    },
                )
            )
        Job.objects.ack_batch(handles)
    database.reset_jobs()
    return figures
