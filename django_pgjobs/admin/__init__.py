"""The operators' console in the Django admin: jobs and dead letters with counts at a
glance, search, filters and per-job buttons; queues (pause, resume, limit), schedules
(enable, disable, run now), the worker registry, batches and their callbacks, and the
live dashboard.

Nothing here runs queue SQL: actions call the models' managers. Jobs are never added or
edited by hand; viewers see everything, actions need the model's change (or delete)
permission, and every action says what it did.
"""

from __future__ import annotations

from django_pgjobs.admin import batches, dashboard, jobs, letters, queues, workers

__all__ = ["batches", "dashboard", "jobs", "letters", "queues", "workers"]
