from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bench import probes

        probes.install()  # only with $PGJOBS_BENCH_PROBES (the wake-up breakdown)
