"""Oban's per-node pause: an operator pauses a queue on one worker alone (its jobs stay
for the others), from the console or jobsctl; the worker obeys at its next heartbeat."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0015_latency_per_queue_and_hour"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="paused_queues",
            field=models.JSONField(
                blank=True,
                help_text='The queues an operator paused on this worker only, each with who paused it and when ({"mail": {"by": "alice", "at": "…"}}); obeyed at its next heartbeat.',
                null=True,
            ),
        ),
    ]
