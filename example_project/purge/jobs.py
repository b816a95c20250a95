"""Transaction mode (S21): database-only work that must happen exactly once.

The handler runs inside one transaction that holds the job row; the batch deletion and
the job's completion commit together. When rows remain, the next batch is enqueued in
the same transaction, under the same key, so at most one purge runs at a time.
"""

from datetime import timedelta

from django.db.models.functions import Now

from django_pgjobs import job
from example_project.purge.models import Event


@job(queue="maintenance", atomic=True, key=lambda p: "purge-events")
def purge_old_events(older_than_days: int = 30, batch: int = 500) -> int:
    cutoff = Now() - timedelta(days=older_than_days)
    ids = list(
        Event.objects.filter(created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("id", flat=True)[:batch]
    )
    deleted, _ = Event.objects.filter(id__in=ids).delete()
    if len(ids) == batch:
        purge_old_events.enqueue(older_than_days=older_than_days, batch=batch)
    return deleted
