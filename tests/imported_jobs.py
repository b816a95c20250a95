"""A job module no app autodiscovers: workers know its kinds only with `runjobs --import`."""

from __future__ import annotations

from django_pgjobs import job
from django_pgjobs.claims import JobHandle
from tests.models import Note


@job(name="tests.imported")
def imported(ctx: JobHandle, text: str) -> None:
    Note.objects.create(
        text=text, job_id=ctx.id, token=ctx.token, attempt=ctx.attempt, worker=ctx.worker_id
    )
