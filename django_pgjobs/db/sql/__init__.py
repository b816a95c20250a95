"""Every statement the queue runs, as named constants, by table. Only `db.connection`
sends them, called by the managers.

Conventions: each statement opens with a `--` line saying what it does; parameters are
named `%(name)s`; time is always the database's `now()` (DESIGN S22), never a timestamp
computed in Python. The rules several statements share (the S10 predicate, the S3 merge
and promotion, the columns a job keeps) are named pieces of `fragments`, spliced whole.
"""

from __future__ import annotations

from django_pgjobs.db.sql.batches import *  # noqa: F403
from django_pgjobs.db.sql.claims import *  # noqa: F403
from django_pgjobs.db.sql.claims import claim_jobs
from django_pgjobs.db.sql.dead import *  # noqa: F403
from django_pgjobs.db.sql.edges import *  # noqa: F403
from django_pgjobs.db.sql.history import *  # noqa: F403
from django_pgjobs.db.sql.jobs import *  # noqa: F403
from django_pgjobs.db.sql.limits import *  # noqa: F403
from django_pgjobs.db.sql.listen import *  # noqa: F403
from django_pgjobs.db.sql.queues import *  # noqa: F403
from django_pgjobs.db.sql.schedules import *  # noqa: F403
from django_pgjobs.db.sql.session import *  # noqa: F403
from django_pgjobs.db.sql.stats import *  # noqa: F403
from django_pgjobs.db.sql.upkeep import *  # noqa: F403
from django_pgjobs.db.sql.workers import *  # noqa: F403
from django_pgjobs.db.sql.workflows import *  # noqa: F403
from django_pgjobs.db.sql.workflows_0006 import *  # noqa: F403

JOB_TABLE = "pgjobs_job"
DEAD_TABLE = "pgjobs_dead"
#: The partition of the dead letters no range partition takes (S44).
DEAD_DEFAULT_PARTITION = "pgjobs_dead_default"

#: Every statement, by name: the managers' whole vocabulary, read from what the modules
#: above export, so that a statement module cannot be imported and left out of it.
STATEMENTS: dict[str, str] = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and value.lstrip().startswith("--")
}

__all__ = ["DEAD_DEFAULT_PARTITION", "DEAD_TABLE", "JOB_TABLE", "STATEMENTS", "claim_jobs"]
