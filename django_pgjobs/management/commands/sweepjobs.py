"""`manage.py sweepjobs`: run the sweeper once (or in a loop) and say what it did."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_pgjobs.maintenance import Sweeper
from django_pgjobs.management.commands.runjobs import positive_int, positive_seconds


class Command(BaseCommand):
    help = (
        "Dead-letter expired jobs, take back claims whose lease lapsed (or dead-letter them "
        "when no attempt is left), and prune done jobs and dead letters past their "
        "retention (DESIGN S24). Safe from many hosts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="Sweep again every --interval.")
        parser.add_argument(
            "--interval", type=positive_seconds, default=60.0, help="Seconds between sweeps."
        )
        parser.add_argument(
            "--batch-size", type=positive_int, help="Rows per statement (PGJOBS['SWEEP_BATCH'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sweeper = Sweeper(batch_size=options["batch_size"])
        stop = threading.Event()
        if options["loop"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        while True:
            try:
                result = sweeper.run_once()
            except DatabaseError as error:
                if not options["loop"]:
                    raise CommandError(
                        f"The sweep failed: {str(error).strip().splitlines()[0]}. "
                        "Is the database up and migrated (python manage.py migrate)?"
                    ) from None
                self.stderr.write(
                    f"sweep failed ({error}); trying again in {options['interval']:g}s"
                )
            else:
                if options["verbosity"] > 0:
                    self.stdout.write(
                        f"expired {result.expired}, lapsed claims requeued "
                        f"{result.lapsed_requeued} and dead-lettered {result.lapsed_dead}, "
                        f"promoted triggers {result.triggers_promoted}, "
                        f"pruned done {result.done_pruned}, pruned dead {result.dead_pruned}, "
                        f"cancelled back in line {result.cancelled_in_line}, "
                        f"dead-letter partitions made {result.partitions_made} and dropped "
                        f"{result.partitions_dropped}"
                    )
            if not options["loop"] or stop.wait(options["interval"]):
                return
