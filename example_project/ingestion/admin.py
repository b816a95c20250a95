from django.contrib import admin

from example_project.ingestion.models import Document


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "summary", "ingested_at")
