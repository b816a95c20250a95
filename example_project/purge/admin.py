from django.contrib import admin

from example_project.purge.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "created_at")
