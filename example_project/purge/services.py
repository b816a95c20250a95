from datetime import timedelta

from django.db.models.functions import Now

from example_project.purge.jobs import purge_old_events
from example_project.purge.models import Event


def log_events(count: int, *, age_days: int = 0) -> None:
    """Append `count` events, dated `age_days` ago by the database clock."""
    created = Event.objects.bulk_create([Event(name=f"event {i}") for i in range(count)])
    if age_days:
        Event.objects.filter(pk__in=[event.pk for event in created]).update(
            created_at=Now() - timedelta(days=age_days)
        )


def schedule_purge(older_than_days: int = 30, batch: int = 500) -> None:
    purge_old_events.enqueue(older_than_days=older_than_days, batch=batch)
