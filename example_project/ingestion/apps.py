from django.apps import AppConfig


class IngestionConfig(AppConfig):
    name = "example_project.ingestion"
    label = "ingestion"
    default_auto_field = "django.db.models.BigAutoField"
