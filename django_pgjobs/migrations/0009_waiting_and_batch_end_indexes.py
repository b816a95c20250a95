"""Two partial indexes, built without locking out writes (CREATE INDEX CONCURRENTLY, so
the migration is not atomic): the waiting jobs by id, for the admin's "waiting" filter
(a few rows among millions, newest first), and the ended batches by their end, for the
sweeper's PRUNE_BATCHES. Issue 26."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgjobs", "0008_cancel_requests"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "waiting")),
                fields=["id"],
                name="pgjobs_job_waiting",
            ),
        ),
        AddIndexConcurrently(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("ended_at__isnull", False)),
                fields=["ended_at"],
                name="pgjobs_batch_ended",
            ),
        ),
    ]
