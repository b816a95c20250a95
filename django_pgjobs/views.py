"""Prometheus metrics for the web process: route `metrics` in your urls.py.

    from django_pgjobs.views import metrics

    urlpatterns = [..., path("metrics/pgjobs", metrics)]

It serves the queue gauges (read from the database at each scrape) and this process's
counters (jobs it enqueued). It asks for no login, as Prometheus cannot give one: expose
it only where your scrapers reach, or wrap it in your own access check.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    from django_pgjobs import metrics as pgjobs_metrics

    pgjobs_metrics.install()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
