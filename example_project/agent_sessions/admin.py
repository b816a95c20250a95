from django.contrib import admin

from example_project.agent_sessions.models import AgentSession


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "status", "created_at", "provisioned_at")
