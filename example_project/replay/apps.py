from django.apps import AppConfig


class ReplayConfig(AppConfig):
    name = "example_project.replay"
    label = "replay"
    default_auto_field = "django.db.models.BigAutoField"
