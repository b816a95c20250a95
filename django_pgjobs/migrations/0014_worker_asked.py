"""Operators can ask a worker, from the console, to go quiet (claim no more jobs) or to
stop after its running jobs: the registry keeps what was asked, by whom and when, and
the worker obeys at its next heartbeat. A permission of its own guards it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0013_worker_claims_from_floors"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="asked",
            field=models.CharField(
                blank=True,
                choices=[
                    ("quiet", "quiet: claim no more jobs, finish the running ones"),
                    ("stop", "stop: claim no more, finish the running jobs, exit"),
                ],
                help_text="What an operator asked of it, obeyed at its next heartbeat (empty: run).",
                max_length=8,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="asked_by",
            field=models.TextField(blank=True, help_text="Who asked it.", null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="asked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterModelOptions(
            name="worker",
            options={
                "permissions": [
                    ("control_worker", "Can ask workers to go quiet, stop, or run again")
                ]
            },
        ),
    ]
