"""Database functions the models use."""

from __future__ import annotations

from django.db.models import DateTimeField, Func


class ClockTimestamp(Func):
    """PostgreSQL's clock_timestamp(): the database's time at the moment of the call
    (now() stays at the start of the transaction)."""

    template = "clock_timestamp()"
    output_field = DateTimeField()
