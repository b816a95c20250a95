"""The test settings with two queues in databases of their own (PGJOBS["QUEUE_DATABASES"]):
"ingestion" in `jobs_a`, "purge" in `jobs_b`, every other queue in `default`.

DATABASE_URL, JOBS_A_URL and JOBS_B_URL are the three databases.
"""

import os
from typing import Any

from django_pgjobs.testing.localdb import database_settings
from tests.settings import *  # noqa: F403

DATABASES = {
    "default": database_settings(os.environ["DATABASE_URL"]),
    "jobs_a": database_settings(os.environ["JOBS_A_URL"]),
    "jobs_b": database_settings(os.environ["JOBS_B_URL"]),
}
DATABASE_ROUTERS = ["django_pgjobs.routers.JobsRouter"]
PGJOBS: dict[str, Any] = {"QUEUE_DATABASES": {"ingestion": "jobs_a", "purge": "jobs_b"}}
