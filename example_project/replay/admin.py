from django.contrib import admin

from example_project.replay.models import Entry, Watermark


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    list_display = ("id", "session_id", "subsystem", "body", "created_at")


@admin.register(Watermark)
class WatermarkAdmin(admin.ModelAdmin):
    list_display = ("session_id", "subsystem", "replayed_to", "replays", "replayed_at")
