"""The worker registry says whose claims read from their queues' floors: the xmin horizon
is held (S42)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0012_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="claims_from_floors",
            field=models.BooleanField(
                db_default=False,
                help_text="Its claims read from their queues' floors: something has held the database's xmin horizon (a transaction left open, a long report) through two of its looks (S42).",
            ),
        ),
    ]
