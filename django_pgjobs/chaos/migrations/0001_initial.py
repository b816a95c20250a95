"""The chaos ledger, moved here from django_pgjobs (its 0003 hands the table over).

A database migrated before the move keeps its table (the state is created here, the table
is made only where it is missing); a new one gets the table only with this app.
"""

import django.db.models.functions.datetime  # noqa: F401
from django.db import migrations, models

import django_pgjobs.functions

TABLE = "pgjobs_chaos_execution"


def create_if_missing(apps, schema_editor):
    if TABLE not in schema_editor.connection.introspection.table_names():
        schema_editor.create_model(apps.get_model("pgjobs_chaos", "ChaosExecution"))


def drop(apps, schema_editor):
    schema_editor.delete_model(apps.get_model("pgjobs_chaos", "ChaosExecution"))


class Migration(migrations.Migration):
    initial = True

    dependencies = [("django_pgjobs", "0003_chaos_moves_out")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ChaosExecution",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("run_id", models.CharField(max_length=40)),
                        ("job_id", models.BigIntegerField()),
                        ("token", models.UUIDField()),
                        ("attempt", models.IntegerField()),
                        ("max_attempts", models.IntegerField()),
                        ("worker", models.TextField()),
                        ("key", models.TextField(blank=True, null=True)),
                        ("version", models.IntegerField()),
                        (
                            "ghost",
                            models.BooleanField(
                                db_default=False,
                                help_text="Enqueued in a rolled-back transaction.",
                            ),
                        ),
                        ("claimed_at", models.DateTimeField()),
                        (
                            "started_at",
                            models.DateTimeField(
                                db_default=django_pgjobs.functions.ClockTimestamp()
                            ),
                        ),
                        ("written_at", models.DateTimeField(blank=True, null=True)),
                        ("outcome", models.CharField(db_default="started", max_length=16)),
                    ],
                    options={
                        "db_table": TABLE,
                        "indexes": [
                            models.Index(fields=["run_id", "job_id"], name="pgjobs_chaos_run_job"),
                            models.Index(fields=["token"], name="pgjobs_chaos_token"),
                        ],
                    },
                )
            ]
        ),
        migrations.RunPython(create_if_missing, drop),
    ]
