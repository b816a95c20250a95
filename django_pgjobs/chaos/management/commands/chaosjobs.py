"""`manage.py chaosjobs`: run workers under injected faults, then check the queue's invariants.

    python manage.py chaosjobs                       # 60 s, 3 workers, every fault but restarts
    python manage.py chaosjobs --duration 600 \\
        --allow-db-restart "pg_ctlcluster 15 main restart"

It works on a queue of its own (`chaos.<run id>`) and deletes what it wrote when it ends.
Exit status 0: every invariant held; 1: one failed (the report says which, and where the
workers' logs are).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgjobs.management.commands.runjobs import positive_int, positive_seconds

if TYPE_CHECKING:
    from django_pgjobs.chaos.run import ChaosReport, Progress


class ProgressBar:
    """A bar redrawn in place on a terminal; elsewhere a line every `log_every` seconds."""

    WIDTH = 28

    def __init__(self, stream: TextIO, *, log_every: float = 10.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.log_every = log_every
        self._last_line = float("-inf")
        self._phase = ""

    def __call__(self, progress: Progress) -> None:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(progress.faults.items()))
        if progress.phase == "check":
            text = "checking the invariants ..."
        else:
            label = "faults" if progress.phase == "faults" else "drain "
            share = min(progress.elapsed / progress.total, 1.0) if progress.total else 1.0
            filled = int(share * self.WIDTH)
            text = (
                f"{label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                f"{progress.elapsed:5.0f}/{progress.total:g} s  enqueued {progress.enqueued}  "
                f"finished {progress.finished}  waiting {progress.waiting}  "
                f"faults: {faults or 'none yet'}"
            )
        now = time.monotonic()
        if self.tty:
            # Keep the last bar of a finished phase on its own line.
            ended = "\n" if self._phase and progress.phase != self._phase else ""
            self.stream.write(f"{ended}\r\x1b[K{text}")
            self.stream.flush()
        elif progress.phase != self._phase or now - self._last_line >= self.log_every:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_line = now
        self._phase = progress.phase

    def event(self, message: str) -> None:
        prefix = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{prefix}  ! {message}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Command(BaseCommand):
    help = (
        "Run workers on a scratch queue while injecting faults (kill -9, SIGSTOP past the "
        "lease, dropped connections, rolled-back enqueues, database restarts), then check "
        "that no job was lost, duplicated without cause, or written by a stale claim."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from django_pgjobs.chaos.run import DEFAULT_FAULTS, FAULT_KINDS, ChaosConfig

        defaults = ChaosConfig()
        parser.add_argument(
            "--duration",
            type=positive_seconds,
            default=defaults.duration,
            help=f"Seconds of faults (default {defaults.duration:g}).",
        )
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=defaults.workers,
            help=f"runjobs processes (default {defaults.workers}).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=defaults.concurrency,
            help=f"Handler threads per worker (default {defaults.concurrency}).",
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=defaults.jobs,
            help=f"Jobs enqueued before the first fault (default {defaults.jobs}).",
        )
        parser.add_argument(
            "--rate",
            type=float,
            default=defaults.rate,
            help=f"Jobs enqueued per second during the run (default {defaults.rate:g}).",
        )
        parser.add_argument(
            "--keys",
            type=int,
            default=defaults.keys,
            help=f"Keys re-triggered while their job runs (default {defaults.keys}).",
        )
        parser.add_argument(
            "--limited",
            type=float,
            default=defaults.limited,
            help="Jobs of a concurrency key limited to 2 at once and 10 claims a second, "
            f"enqueued per second (default {defaults.limited:g}; 0: none).",
        )
        parser.add_argument(
            "--workflows",
            type=float,
            default=defaults.workflows,
            help="Chains (jobs after each other) and batches with callbacks written per "
            f"second (default {defaults.workflows:g}; 0: none).",
        )
        parser.add_argument(
            "--lease",
            type=positive_int,
            default=defaults.lease,
            help=f"The jobs' lease in seconds (default {defaults.lease}).",
        )
        parser.add_argument(
            "--faults",
            default=",".join(DEFAULT_FAULTS),
            help=f"Faults to inject, comma-separated, from {', '.join(FAULT_KINDS)} "
            f"(default {','.join(DEFAULT_FAULTS)}; 'restart' needs --allow-db-restart, "
            "'failover' needs --failover).",
        )
        parser.add_argument(
            "--fault-every",
            type=positive_seconds,
            default=defaults.fault_every,
            help=f"Mean seconds between two faults (default {defaults.fault_every:g}).",
        )
        parser.add_argument(
            "--pin-seconds",
            type=positive_seconds,
            default=defaults.pin_s,
            help="How long a 'pin' holds the xmin horizon (an idle transaction or a "
            f"REPEATABLE READ reader; default {defaults.pin_s:g}; longer while a worker "
            "has not yet seen it held).",
        )
        parser.add_argument(
            "--pin-churn",
            type=int,
            default=defaults.pin_churn,
            help="Jobs enqueued as a pin begins, whose rows it keeps dead "
            f"(default {defaults.pin_churn}).",
        )
        parser.add_argument(
            "--allow-db-restart",
            metavar="COMMAND",
            help="Also restart PostgreSQL now and then, with this command "
            "(e.g. 'pg_ctlcluster 15 main restart'); adds 'restart' to the faults.",
        )
        parser.add_argument(
            "--failover",
            metavar="COMMAND",
            help="Also move the primary to its standby now and then, with this command, "
            "which returns once the standby takes writes (e.g. 'pg_autoctl perform "
            "failover --wait 60'); adds 'failover' to the faults. The run reaches the "
            "database through DATABASES, which must find the new primary (a multi-host "
            "URL, a moving address).",
        )
        parser.add_argument(
            "--failover-every",
            type=positive_seconds,
            default=defaults.failover_every,
            help=f"Least seconds between two failovers (default {defaults.failover_every:g}).",
        )
        parser.add_argument(
            "--drain-timeout",
            type=positive_seconds,
            default=defaults.drain_timeout,
            help="Seconds the queue gets to drain after the last fault "
            f"(default {defaults.drain_timeout:g}).",
        )
        parser.add_argument("--seed", type=int, help="Seed of the run's random choices.")
        parser.add_argument(
            "--keep",
            action="store_true",
            help="Keep the run's jobs, ledger and worker logs for inspection.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django_pgjobs.chaos.run import ChaosAborted, ChaosConfig, ChaosRun

        faults = tuple(name.strip() for name in options["faults"].split(",") if name.strip())
        for option, kind in (("allow_db_restart", "restart"), ("failover", "failover")):
            if options[option] and kind not in faults:
                faults += (kind,)
        try:
            config = ChaosConfig(
                duration=options["duration"],
                workers=options["workers"],
                concurrency=options["concurrency"],
                jobs=options["jobs"],
                rate=options["rate"],
                keys=options["keys"],
                limited=options["limited"],
                workflows=options["workflows"],
                lease=options["lease"],
                faults=faults,
                fault_every=options["fault_every"],
                restart_command=options["allow_db_restart"],
                failover_command=options["failover"],
                failover_every=options["failover_every"],
                pin_s=options["pin_seconds"],
                pin_churn=options["pin_churn"],
                drain_timeout=options["drain_timeout"],
                seed=options["seed"],
                keep=options["keep"],
            )
        except ValueError as error:
            raise CommandError(str(error)) from None
        bar = ProgressBar(sys.stderr)
        try:
            run = ChaosRun(config, on_progress=bar, on_event=bar.event)
        except ChaosAborted as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            f"chaos run {run.run_id}: {config.workers} workers x {config.concurrency} "
            f"threads on queue {run.queue} for {config.duration:g} s; "
            f"faults: {', '.join(config.faults) or 'none'}"
        )
        try:
            report = run.run()
        except ChaosAborted as error:
            raise CommandError(
                f"The chaos run stopped: {error}\nworker logs: {run.log_dir}"
            ) from None
        finally:
            bar.close()
        self._print(report)
        if not report.passed:
            broken = [verdict.name for verdict in report.verdicts if not verdict.holds]
            raise CommandError(f"{len(broken)} invariants failed: {', '.join(broken)}")

    def _print(self, report: ChaosReport) -> None:
        write = self.stdout.write
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(report.faults.items())) or "none"
        missed = ", ".join(f"{kind} {n}" for kind, n in sorted(report.missed_faults.items()))
        dead = ", ".join(f"{reason!r} {n}" for reason, n in report.dead.most_common())
        drain = f"{report.drain_s:.1f} s" if report.drain_s is not None else "did not drain"
        write("")
        busy = (
            f"; {report.busy_triggers} given up: their key's job stayed locked by a stopped worker"
            if report.busy_triggers
            else ""
        )
        write(f"jobs committed     {report.jobs} ({report.triggers} keyed triggers{busy})")
        ended = ", ".join(f"{n} {state}" for state, n in sorted(report.batches.items()))
        write(
            f"workflows          {report.chains} chains, {report.batches.total()} batches"
            f"{f' ({ended})' if ended else ''}"
        )
        write(f"rolled back        {report.ghosts} jobs in transactions that rolled back")
        write(f"executions         {report.executions}")
        reruns = report.reruns
        write(
            f"runs again         {reruns.total}: {reruns.deliberate} after a deliberate "
            f"failure, {reruns.cut_short} after a fault cut the run before short, "
            f"{reruns.unexplained} unexplained"
        )
        write(f"faults injected    {faults}" + (f" (missed: {missed})" if missed else ""))
        write(f"dead letters       {dead or 'none'}")
        for pin in report.pins:
            held = (pin.ended - pin.began).total_seconds()
            how = "from their floors" if pin.floors else "from each queue's start"
            unjudged = f"; not judged: {pin.unjudged}" if pin.unjudged else ""
            start = "" if pin.from_start is None else f", {pin.from_start} from the start"
            write(
                f"pin ({pin.how}){' ' * (13 - len(pin.how))}{held:.0f} s: a claim read "
                f"{pin.before} buffers as it began, {pin.after} as it ended{start} (the "
                f"workers' claims {how}; {pin.dead_rows} dead rows){unjudged}"
            )
        write(f"drained after      {drain} after the last fault")
        write(f"took               {report.seconds:.0f} s")
        write("")
        for verdict in report.verdicts:
            mark = self.style.SUCCESS("ok  ") if verdict.holds else self.style.ERROR("FAIL")
            write(f"{mark} {verdict.name}: {verdict.statement}")
            for violation in verdict.violations[:10]:
                write(f"       - {violation}")
            if len(verdict.violations) > 10:
                write(f"       ... and {len(verdict.violations) - 10} more")
        if report.log_dir is not None:
            write(f"\nworker logs: {report.log_dir}")
        if report.config.keep:
            write(f"rows kept: queue {report.queue}, pgjobs_chaos_execution run {report.run_id}")
