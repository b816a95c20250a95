"""The test settings with the jobs in a database of their own (`jobs`), routed there.

DATABASE_URL is the app's database, JOBS_DATABASE_URL the jobs database.
"""

import os
from typing import Any

from django_pgjobs.testing.localdb import database_settings
from tests.settings import *  # noqa: F403

DATABASES = {
    "default": database_settings(os.environ["DATABASE_URL"]),
    "jobs": database_settings(os.environ["JOBS_DATABASE_URL"]),
}
DATABASE_ROUTERS = ["django_pgjobs.routers.JobsRouter"]
PGJOBS: dict[str, Any] = {"DATABASE": "jobs"}
