"""Prometheus metrics for the web process: route `metrics` in your urls.py.

    from django_pgjobs.views import metrics

    urlpatterns = [..., path("metrics/pgjobs", metrics)]

It serves the queue gauges (read from the database, at most once per METRICS_CACHE
seconds) and this process's counters (jobs it enqueued), to a scraper that sends
PGJOBS["METRICS_TOKEN"] (a bearer token, or basic auth with the token as password) and
to staff users of the admin who may view jobs. PGJOBS["METRICS_PUBLIC"] = True serves it to anyone.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from django_pgjobs.conf import pgjobs_settings

logger = logging.getLogger("django_pgjobs.metrics")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    from prometheus_client import CONTENT_TYPE_LATEST

    from django_pgjobs import metrics as pgjobs_metrics

    if not may_read_metrics(request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return HttpResponse(
                "The metrics need the permission to view jobs (django_pgjobs.view_job) "
                "and a staff login, or PGJOBS['METRICS_TOKEN'].\n",
                status=403,
                content_type="text/plain",
            )
        response = HttpResponse(
            "The metrics need PGJOBS['METRICS_TOKEN'] (as a bearer token, or the basic-auth "
            "password) or a staff login that may view jobs.\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="pgjobs"'
        return response
    pgjobs_metrics.install()
    return HttpResponse(pgjobs_metrics.scrapes.body(), content_type=CONTENT_TYPE_LATEST)


def may_read_metrics(request: HttpRequest) -> bool:
    """A scraper with the token, the session of staff who may view jobs (as the
    dashboard asks), or anyone with METRICS_PUBLIC."""
    from django_pgjobs.metrics import token_accepted

    if pgjobs_settings.METRICS_PUBLIC:
        return True
    user = getattr(request, "user", None)
    if (
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("django_pgjobs.view_job")
    ):
        return True
    return token_accepted(request.headers.get("Authorization"))
