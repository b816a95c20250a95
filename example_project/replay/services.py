from django.db import transaction

from example_project.replay.jobs import replay
from example_project.replay.models import Entry


def write(session_id: int, subsystem: str, body: str, *, debounce_s: float = 1.0) -> Entry:
    """Append an entry and (re)schedule its subsystem's replay, in one transaction."""
    with transaction.atomic():
        entry = Entry.objects.create(session_id=session_id, subsystem=subsystem, body=body)
        replay.using(delay=debounce_s).enqueue(session_id=session_id, subsystem=subsystem)
    return entry
