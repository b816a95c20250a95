"""The worker registry counts the handlers abandoned at their timeout that still run (S39)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0010_dead_category"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="abandoned",
            field=models.IntegerField(
                db_default=0,
                help_text="Handlers abandoned at their timeout whose threads still run (S39): at its concurrency, it claims no more jobs for its threads.",
            ),
        ),
    ]
