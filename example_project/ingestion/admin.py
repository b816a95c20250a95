from django.contrib import admin

from example_project.ingestion.models import Collection, Document


@admin.register(Collection)
class CollectionAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "indexed_at", "indexed_documents", "index_failures")


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("id", "collection", "title", "dirty", "summary", "ingested_at")
    list_filter = ("dirty",)
