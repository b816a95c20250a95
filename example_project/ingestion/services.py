from django.db import transaction

from django_pgjobs.batches import Callback, batch
from example_project.ingestion.jobs import (
    build_collection_index,
    ingest_collection,
    summarise_document,
)
from example_project.ingestion.models import Collection, Document


def add_document(collection_name: str, title: str, text: str) -> Document:
    """Store a document and schedule its collection's ingestion, in one transaction."""
    with transaction.atomic():
        collection, _ = Collection.objects.get_or_create(name=collection_name)
        document = Document.objects.create(collection=collection, title=title, text=text)
        ingest_collection.enqueue(collection_id=collection.id)
    return document


def reindex_collection(collection_name: str) -> int:
    """Summarise every document of a collection again, one job each, then build its index
    once they have all ended: a batch (S31). Returns the batch's id."""
    with transaction.atomic():
        collection = Collection.objects.get(name=collection_name)
        index = Callback(build_collection_index, collection_id=collection.id)
        with batch(on_complete=index) as reindex:
            for document_id in collection.documents.values_list("id", flat=True):
                reindex.add(summarise_document, document_id=document_id)
    assert reindex.id is not None
    return reindex.id
