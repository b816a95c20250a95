from django.contrib import admin
from django.urls import path

from django_pgjobs.views import metrics

urlpatterns = [path("admin/", admin.site.urls), path("metrics/pgjobs", metrics)]
