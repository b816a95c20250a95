"""Semantic ingestion: one job per dirty set, in lease mode (S20) with fenced results (S16);
and a reindex: one job per document in a batch, then one index build (S31).

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
from example_project.ingestion.models import Collection, Document


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


@job(queue="ingestion", lease=30, max_attempts=3)
def summarise_document(ctx: JobHandle, document_id: int) -> str:
    """One member of a reindex: summarise one document, the result written under the fence."""
    document = Document.objects.filter(pk=document_id).first()
    if document is None:
        return "gone"  # deleted since the reindex began: nothing to summarise
    summary = summarise(document.text)
    with ctx.fenced():
        Document.objects.filter(pk=document.pk, text=document.text).update(
            summary=summary, dirty=False, ingested_at=Now(), ingested_by_claim=ctx.token
        )
        ctx.ack(summary)
    return summary


@job(queue="ingestion")
def build_collection_index(ctx: JobHandle, collection_id: int) -> int:
    """A reindex's callback (on_complete): runs once, after every document's summary ended,
    and builds the collection's index from what its batch says."""
    batch = ctx.batch()
    assert batch is not None, "build_collection_index runs as a batch's callback"
    Collection.objects.filter(pk=collection_id).update(
        indexed_at=Now(), indexed_documents=batch.done, index_failures=batch.failed
    )
    return batch.done
