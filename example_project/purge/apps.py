from django.apps import AppConfig


class PurgeConfig(AppConfig):
    name = "example_project.purge"
    label = "purge"
    default_auto_field = "django.db.models.BigAutoField"
