"""A live job keeps the W3C trace context of its enqueue (OpenTelemetry, the `otel` extra):
its runs' spans link to it. A column without a default: added without a rewrite."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgjobs", "0011_worker_abandoned"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(
                blank=True,
                help_text="The W3C trace context of its enqueue (traceparent, tracestate), when it was enqueued inside a trace with tracing on: its runs link to it.",
                null=True,
            ),
        ),
    ]
