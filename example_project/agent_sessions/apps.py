from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    name = "example_project.agent_sessions"
    label = "agent_sessions"
    verbose_name = "Sessions"
    default_auto_field = "django.db.models.BigAutoField"
