from django.db import transaction

from example_project.ingestion.jobs import ingest_collection
from example_project.ingestion.models import Collection, Document


def add_document(collection_name: str, title: str, text: str) -> Document:
    """Store a document and schedule its collection's ingestion, in one transaction."""
    with transaction.atomic():
        collection, _ = Collection.objects.get_or_create(name=collection_name)
        document = Document.objects.create(collection=collection, title=title, text=text)
        ingest_collection.enqueue(collection_id=collection.id)
    return document
