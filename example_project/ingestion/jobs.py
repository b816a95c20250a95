"""Semantic ingestion: one job per dirty set, in lease mode (S20) with fenced results (S16).

The remote step (an embedding service, an LLM) is slow and runs outside any transaction;
the lease covers it, and the handler heartbeats between documents. The results are written
under `ctx.fenced()`: if this claim lost the job meanwhile (its worker stalled past the
lease and another took over), the write is refused instead of overwriting a newer result.
"""

import hashlib
import time

from django.db.models.functions import Now

from django_pgjobs import job
from django_pgjobs.claims import JobHandle
from example_project.ingestion.models import Document


def summarise(text: str) -> str:
    """Stand in for the remote model: slow, and deterministic."""
    time.sleep(0.05)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{len(text.split())} words, fingerprint {digest}"


@job(queue="ingestion", lease=30, max_attempts=5, key=lambda p: f"collection:{p['collection_id']}")
def ingest_collection(ctx: JobHandle, collection_id: int) -> int:
    dirty = list(Document.objects.filter(collection_id=collection_id, dirty=True))
    summaries = {}
    for document in dirty:
        summaries[document.pk] = (summarise(document.text), document.text)
        ctx.heartbeat()
    with ctx.fenced():
        for pk, (summary, text) in summaries.items():
            # Only if the text is still what was summarised: a newer edit re-triggers us.
            Document.objects.filter(pk=pk, text=text).update(
                summary=summary, dirty=False, ingested_at=Now(), ingested_by_claim=ctx.token
            )
        ctx.ack(len(summaries))
    return len(summaries)
