"""Prometheus metrics: `pip install "django-pgjobs[prometheus]"`.

Counters and histograms are kept by each process from the signals (django_pgjobs.signals):

- `pgjobs_jobs_enqueued_total{queue,kind}`: jobs written by this process (merges included);
- `pgjobs_jobs_started_total`, `pgjobs_jobs_succeeded_total`, `pgjobs_jobs_retried_total`,
  `pgjobs_jobs_dead_total`, `pgjobs_jobs_lost_total` `{queue,kind}`: runs in this worker;
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

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.dispatch import Signal

from django_pgjobs import signals
from django_pgjobs.conf import pgjobs_settings

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
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
            for outcome in (signals.SUCCEEDED, signals.RETRIED, signals.DEAD, signals.LOST)
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
        from django_pgjobs.models import Job

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


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Install the metrics and serve them over HTTP on `addr:port`, in a daemon thread."""
    from prometheus_client import start_http_server

    install(close_connection=True)
    start_http_server(port, addr)
