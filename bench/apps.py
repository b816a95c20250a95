import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bench import probes

        probes.install()  # only with $PGJOBS_BENCH_PROBES (the wake-up breakdown)
        if os.environ.get("PGJOBS_BENCH_PLAIN_ACK") == "1":
            use_ack_without_dependencies()


def use_ack_without_dependencies() -> None:
    """Make this process ack with ACK_JOBS as it was before dependencies (S29): the
    workflows benchmark's "without the feature" drain, measured in the same run."""
    from django_pgjobs.db import sql

    sql.ACK_JOBS = ack_without_dependencies()


def ack_without_dependencies() -> str:
    """ACK_JOBS without its dependency step (what it was before S29)."""
    from django_pgjobs.db import sql
    from django_pgjobs.db.sql.fragments import DEPENDENTS_OF_ACKED

    plain = sql.ACK_JOBS.replace(f",\n{DEPENDENTS_OF_ACKED}", "").replace(
        " + (SELECT count(*) FROM dependents)", ""
    )
    plain = plain.replace(",\n           j.has_children, j.has_parents", "")
    if plain == sql.ACK_JOBS or "dependents" in plain or "has_parents" in plain:
        raise RuntimeError("ACK_JOBS changed shape: update bench.apps")
    return plain
