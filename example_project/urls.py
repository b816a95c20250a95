from django.contrib import admin
from django.urls import path

from example_project import views

urlpatterns = [
    path("", views.home, name="home"),
    path("sessions/", views.create_session, name="create-session"),
    path("sessions/<int:session_id>/delete/", views.delete_session, name="delete-session"),
    path("documents/", views.create_document, name="create-document"),
    path("replay/", views.write_entry, name="write-entry"),
    path("purge/", views.purge, name="purge"),
    path("admin/", admin.site.urls),
]
