"""A watermark job per (session, subsystem), re-triggered on every write and debounced:
a burst of writes makes one replay (on_conflict="replace" keeps pushing it back), and a
write that lands while it runs makes exactly one more run after it (S3)."""

from django.db.models import Max
from django.db.models.functions import Now

from django_pgjobs import job
from example_project.replay.models import Entry, Watermark


@job(
    queue="replay",
    key=lambda p: f"replay:{p['session_id']}:{p['subsystem']}",
    on_conflict="replace",
)
def replay(session_id: int, subsystem: str) -> int:
    newest = Entry.objects.filter(session_id=session_id, subsystem=subsystem).aggregate(
        newest=Max("id")
    )["newest"]
    mark, _ = Watermark.objects.get_or_create(session_id=session_id, subsystem=subsystem)
    if newest and newest > mark.replayed_to:
        # ... feed entries (mark.replayed_to, newest] to the subsystem ...
        Watermark.objects.filter(pk=mark.pk).update(
            replayed_to=newest, replays=mark.replays + 1, replayed_at=Now()
        )
    return int(newest or 0)
