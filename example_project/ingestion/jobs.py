"""Lease mode (S20) with a fenced result (S16).

The remote step (an embedding service, an LLM) is slow and runs outside any transaction,
covered by the job's lease, which the worker heartbeats. The result is written under
`ctx.fenced()`: if this claim lost the job meanwhile (its worker stalled past the lease
and another took over), the write is refused instead of overwriting a newer result.
"""

import hashlib
import time

from django.utils import timezone

from django_pgjobs import job
from django_pgjobs.handles import JobHandle
from example_project.ingestion.models import Document


def summarise(text: str) -> str:
    """Stand in for the remote model: slow, and deterministic."""
    time.sleep(0.2)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    words = len(text.split())
    return f"{words} words, fingerprint {digest}"


@job(queue="ingestion", lease=30, max_attempts=5, key=lambda p: f"document:{p['document_id']}")
def ingest_document(ctx: JobHandle, document_id: int) -> None:
    document = Document.objects.get(pk=document_id)
    summary = summarise(document.text)
    with ctx.fenced():
        Document.objects.filter(pk=document_id).update(
            summary=summary, ingested_at=timezone.now(), ingested_by_claim=ctx.token
        )
        ctx.ack()
