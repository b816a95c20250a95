"""The dashboard's queue wait and run time per queue as well as per kind, and over a day
and a week: the per-minute histograms gain their queue (minutes written before say ""),
and the sweeper sums ended hours into two tables kept for eight days. The dashboard reads
the sums per queue, per kind and over all that the workers now keep beside each pair
(queue or kind "*"): its percentiles start from the upgrade."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0014_worker_asked"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStatsHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField()),
                ("queue", models.CharField(max_length=100)),
                ("succeeded", models.IntegerField()),
                ("retried", models.IntegerField()),
                ("dead", models.IntegerField()),
                ("cancelled", models.IntegerField()),
            ],
            options={
                "verbose_name_plural": "job stats per hour",
                "db_table": "pgjobs_stats_hour",
            },
        ),
        migrations.CreateModel(
            name="KindStatsHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField()),
                ("queue", models.CharField(max_length=100)),
                ("kind", models.CharField(max_length=200)),
                ("runs", models.IntegerField()),
                (
                    "wait_hist",
                    models.JSONField(help_text="Runs per queue-wait bucket (a list of counts)."),
                ),
                (
                    "run_hist",
                    models.JSONField(help_text="Runs per run-time bucket (a list of counts)."),
                ),
            ],
            options={
                "verbose_name_plural": "kind stats per hour",
                "db_table": "pgjobs_kind_stats_hour",
            },
        ),
        migrations.RemoveConstraint(
            model_name="kindstats",
            name="pgjobs_kind_stats_minute_kind",
        ),
        migrations.AddField(
            model_name="kindstats",
            name="queue",
            field=models.CharField(
                db_default="",
                help_text="Empty in minutes written before the counts were kept per queue.",
                max_length=100,
            ),
        ),
        migrations.AddConstraint(
            model_name="kindstats",
            constraint=models.UniqueConstraint(
                fields=("minute", "queue", "kind"), name="pgjobs_kind_stats_minute_queue_kind"
            ),
        ),
        migrations.AddConstraint(
            model_name="jobstatshour",
            constraint=models.UniqueConstraint(
                fields=("hour", "queue"), name="pgjobs_stats_hour_queue"
            ),
        ),
        migrations.AddConstraint(
            model_name="kindstatshour",
            constraint=models.UniqueConstraint(
                fields=("hour", "queue", "kind"), name="pgjobs_kind_stats_hour_queue_kind"
            ),
        ),
    ]
