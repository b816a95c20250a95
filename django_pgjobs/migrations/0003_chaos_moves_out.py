"""The chaos ledger moves to an app of its own, `django_pgjobs.chaos`.

Only the state moves: a project that installs the chaos app keeps its table (that app's
0001 takes it over); a project that does not loses the table, which is empty outside a
chaos run, so that no chaos table sits in a database that never runs one.
"""

from django.apps import apps as installed
from django.db import migrations

TABLE = "pgjobs_chaos_execution"


def drop_unless_kept(apps, schema_editor):
    if installed.is_installed("django_pgjobs.chaos"):
        return
    if TABLE in schema_editor.connection.introspection.table_names():
        schema_editor.delete_model(apps.get_model("django_pgjobs", "ChaosExecution"))


def restore(apps, schema_editor):
    if TABLE not in schema_editor.connection.introspection.table_names():
        schema_editor.create_model(apps.get_model("django_pgjobs", "ChaosExecution"))


class Migration(migrations.Migration):
    dependencies = [("django_pgjobs", "0002_queue_controls_and_schedules")]

    operations = [
        migrations.RunPython(drop_unless_kept, restore),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ChaosExecution")]
        ),
    ]
