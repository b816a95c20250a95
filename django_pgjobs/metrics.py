"""Prometheus metrics: `pip install "django-pgjobs[prometheus]"`.

Counters and histograms are kept by each process from the signals (django_pgjobs.signals):

- `pgjobs_jobs_enqueued_total{queue,kind}`: jobs written by this process (merges included);
- `pgjobs_jobs_started_total`, `pgjobs_jobs_succeeded_total`, `pgjobs_jobs_retried_total`,
  `pgjobs_jobs_dead_total`, `pgjobs_jobs_cancelled_total`, `pgjobs_jobs_lost_total`
  `{queue,kind}`: runs in this worker;
- `pgjobs_job_duration_seconds{queue,kind}`: how long handlers ran;
- `pgjobs_job_start_delay_seconds{queue,kind}`: from when a job was due (`run_after`) to
  its claim, both by the database's clock.

Gauges are read from the database at each scrape, along the admin's partial indexes
(counts past 1,000 are the planner's estimates): `pgjobs_jobs{queue,state}` with state
runnable, scheduled, running or dead, and `pgjobs_oldest_runnable_seconds{queue}`.

`runjobs --metrics-port 9108` serves all of them from the worker; in the web process, route
`django_pgjobs.views.metrics` for the gauges (and the process's enqueue counter).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.dispatch import Signal

from django_pgjobs import signals
from django_pgjobs.conf import pgjobs_settings, seconds
from django_pgjobs.models import Job

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        Histogram,
        generate_latest,
    )
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise ImproperlyConfigured(
        "Metrics need prometheus-client: pip install 'django-pgjobs[prometheus]'."
    ) from error

logger = logging.getLogger("django_pgjobs.metrics")

LABELS = ("queue", "kind")
#: Run times and start delays, in seconds: from a no-op to a long remote call.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class JobMetrics:
    """The counters and histograms of one process, fed by the signals once installed."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.enqueued = Counter(
            "pgjobs_jobs_enqueued", "Jobs enqueued by this process.", LABELS, registry=registry
        )
        self.started = Counter("pgjobs_jobs_started", "Runs started.", LABELS, registry=registry)
        self.ended = {
            outcome: Counter(
                f"pgjobs_jobs_{outcome}",
                f"Runs that ended {outcome}.",
                LABELS,
                registry=registry,
            )
            for outcome in (
                signals.SUCCEEDED,
                signals.RETRIED,
                signals.DEAD,
                signals.CANCELLED,
                signals.LOST,
            )
        }
        self.duration = Histogram(
            "pgjobs_job_duration_seconds",
            "How long handlers ran.",
            LABELS,
            buckets=BUCKETS,
            registry=registry,
        )
        self.start_delay = Histogram(
            "pgjobs_job_start_delay_seconds",
            "From run_after to the claim, by the database's clock.",
            LABELS,
            buckets=BUCKETS,
            registry=registry,
        )

    def connect(self) -> None:
        """Count from now on (the receivers are held strongly, once per instance)."""
        for signal, receiver, uid in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=uid)

    def disconnect(self) -> None:
        for signal, _, uid in self._receivers():
            signal.disconnect(dispatch_uid=uid)

    def _receivers(self) -> list[tuple[Signal, Callable[..., None], str]]:
        """Each signal this instance counts, its receiver, and the receiver's uid."""
        return [
            (signal, receiver, f"pgjobs-metrics-{id(self)}-{signal_name}")
            for signal_name, signal, receiver in (
                ("enqueued", signals.job_enqueued, self._on_enqueued),
                ("started", signals.job_started, self._on_started),
                ("finished", signals.job_finished, self._on_finished),
            )
        ]

    def _on_enqueued(self, sender: str, *, queue: str, **kwargs: Any) -> None:
        self.enqueued.labels(queue, sender).inc()

    def _on_started(self, sender: str, *, handle: Any, **kwargs: Any) -> None:
        self.started.labels(handle.queue, sender).inc()
        delay = (handle.claimed_at - handle.run_after).total_seconds()
        self.start_delay.labels(handle.queue, sender).observe(max(delay, 0.0))

    def _on_finished(
        self, sender: str, *, handle: Any, outcome: str, duration: float, **kwargs: Any
    ) -> None:
        self.ended[outcome].labels(handle.queue, sender).inc()
        self.duration.labels(handle.queue, sender).observe(duration)


class QueueGauges(Collector):
    """Each queue's runnable, scheduled, running and dead jobs, read at scrape time.

    Args:
        close_connection: close the database connection after each scrape (for a thread
            of its own, like the metrics server's; not in a request).
    """

    def __init__(self, *, using: str | None = None, close_connection: bool = False) -> None:
        self.using = using
        self.close_connection = close_connection

    def collect(self) -> Iterator[GaugeMetricFamily]:
        alias = self.using or pgjobs_settings.DATABASE
        jobs = GaugeMetricFamily(
            "pgjobs_jobs",
            "Jobs per queue and state (past 1,000 an estimate).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "pgjobs_oldest_runnable_seconds",
            "Age of the oldest runnable job per queue.",
            labels=["queue"],
        )
        try:
            overview = Job.objects.overview(using=alias)
        except DatabaseError as error:
            logger.warning("queue gauges not read: %s", error)
            connections[alias].close()
            return
        finally:
            if self.close_connection:
                connections[alias].close()
        for queue in overview:
            for state in ("runnable", "scheduled", "running", "dead"):
                jobs.add_metric([queue.queue, state], getattr(queue, state).value)
            oldest.add_metric([queue.queue], queue.oldest_runnable_s or 0.0)
        yield jobs
        yield oldest


_installed: JobMetrics | None = None
_install_lock = threading.Lock()


def install(*, gauges: bool = True, close_connection: bool = False) -> JobMetrics:
    """Count this process's jobs in the default registry (and read the queue gauges at
    each scrape, with `gauges`). Idempotent: later calls return the first's metrics."""
    global _installed
    with _install_lock:
        if _installed is None:
            metrics = JobMetrics()
            metrics.connect()
            if gauges:
                REGISTRY.register(QueueGauges(close_connection=close_connection))
            _installed = metrics
        return _installed


def token_accepted(authorization: str | None) -> bool:
    """Whether an Authorization header carries PGJOBS["METRICS_TOKEN"]: as a bearer token,
    or as the password of basic auth (any user name). Compared in constant time."""
    token = pgjobs_settings.METRICS_TOKEN
    if not token or not authorization:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        given = credentials.strip()
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    else:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


class ScrapeCache:
    """The answer to the last scrape, reused for PGJOBS["METRICS_CACHE"] seconds: a flood
    of scrapes costs the database one overview per interval."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._body = b""
        self._fresh_until = 0.0

    def forget(self) -> None:
        """Make the next scrape read afresh."""
        with self._lock:
            self._fresh_until = 0.0

    def body(self) -> bytes:
        with self._lock:
            now = time.monotonic()
            if now >= self._fresh_until:
                self._body = generate_latest(self.registry)
                self._fresh_until = now + seconds(pgjobs_settings.METRICS_CACHE, "METRICS_CACHE")
            return self._body


#: The scrapes of this process.
scrapes = ScrapeCache()

#: Addresses that only this host reaches.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def is_loopback(addr: str) -> bool:
    return addr in LOOPBACK or addr.startswith("127.")


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Install the metrics and serve them over HTTP on `addr:port`, in a daemon thread.

    With PGJOBS["METRICS_TOKEN"] every scrape must carry it. Without one, a loopback
    address is its own access control; another address needs METRICS_PUBLIC.

    Raises:
        ImproperlyConfigured: a non-loopback address with neither a token nor
            METRICS_PUBLIC.
        OSError: the port cannot be bound.
    """
    token = pgjobs_settings.METRICS_TOKEN
    public = pgjobs_settings.METRICS_PUBLIC
    if not token and not public and not is_loopback(addr):
        raise ImproperlyConfigured(
            f"Serving the metrics on {addr} would show them to anyone who reaches it: set "
            "PGJOBS['METRICS_TOKEN'] (and the same token in Prometheus' scrape config), "
            "bind 127.0.0.1, or set PGJOBS['METRICS_PUBLIC'] = True to mean it."
        )
    install(close_connection=True)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if token and not token_accepted(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="pgjobs"')],
            )
            return [b"The metrics need PGJOBS['METRICS_TOKEN'] as a bearer token.\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [scrapes.body()]

    server = make_server(addr, port, app, _ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="pgjobs-metrics", daemon=True).start()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        return
