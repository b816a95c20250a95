"""Cancel requests (S38): a cancel of a running job whose row a transaction holds is
recorded at once, without waiting for the row, and binds that claim."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0007_batches"),
    ]

    operations = [
        migrations.CreateModel(
            name="CancelRequest",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("claimed_by", models.UUIDField()),
                ("reason", models.TextField()),
                (
                    "requested_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "pgjobs_cancel_request",
            },
        ),
    ]
