"""The django.tasks tasks the benchmarks run (PgJobsBackend, bench/settings.py TASKS)."""

from django_pgjobs.compat import task


@task
def noop() -> None:
    """Nothing at all: what the tasks framework adds to the queue's own cost."""
