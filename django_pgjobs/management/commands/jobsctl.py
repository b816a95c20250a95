"""`manage.py jobsctl`: queues, jobs, dead letters and schedules at a glance, and their
controls: what the admin's actions do, from a terminal.

python manage.py jobsctl status               # a table per queue, then the workers
python manage.py jobsctl status --json        # the same as one JSON document
python manage.py jobsctl pause emails         # no worker claims its jobs
python manage.py jobsctl pause --create later # a queue nothing names yet (else refused)
python manage.py jobsctl resume emails        # and wake the workers at once
python manage.py jobsctl limit emails 5       # at most 5 running, across every worker
python manage.py jobsctl limit emails none    # no limit
python manage.py jobsctl rate emails 100/m    # at most 100 claims a minute, across every worker
python manage.py jobsctl rate emails none     # no rate
python manage.py jobsctl running              # the running jobs: worker, for how long, progress
python manage.py jobsctl running --json
python manage.py jobsctl cancel 12 13         # dead-letter them as cancelled; handlers told
python manage.py jobsctl cancel --database jobs_a 12   # job 12 of that database
python manage.py jobsctl dead                 # the newest dead letters: kind, queue, reason
python manage.py jobsctl dead --kind billing. --queue emails --reason failed --limit 20
python manage.py jobsctl dead --json
python manage.py jobsctl requeue 12 13        # dead letters back to pending, fresh attempts
python manage.py jobsctl requeue --all --queue emails --reason max_attempts
python manage.py jobsctl schedules            # every schedule, its next and last run
python manage.py jobsctl schedules enable nightly    # from its next tick on
python manage.py jobsctl schedules disable nightly
python manage.py jobsctl schedules run nightly       # one job now; the next tick stays
python manage.py jobsctl worker quiet web-1:812:ab12 # claim no more jobs (at its heartbeat)
python manage.py jobsctl worker stop --host web-1    # every worker on a host: stop after its jobs
python manage.py jobsctl worker run web-1:812:ab12   # claim again
python manage.py jobsctl worker pause web-1:812:ab12 emails   # on that worker alone
python manage.py jobsctl worker resume web-1:812:ab12 emails

With PGJOBS["QUEUE_DATABASES"], each command acts on the database of the queue it names
and says which; `cancel` and `requeue` find each id's database, and refuse ids that name
jobs in several (say which with --database); `running`, `dead` and `requeue --all` read
every database, or the queue's. Schedules live in PGJOBS["DATABASE"].

A command that matches nothing it was asked to change (no such id, no such schedule, no
dead letter for `requeue --all`) fails with a CommandError that says what it looked for.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.management.jobsctl import dead, jobs, queues, schedules, workers
from django_pgjobs.management.jobsctl.output import Output
from django_pgjobs.managers.dead import CATEGORY_FILTERS
from django_pgjobs.records import COUNT_CAP

#: The largest id a job can have (bigint).
JOB_ID_MAX = 2**63 - 1
#: The most rows a listing shows (`--limit`).
LISTING_MAX = 100_000

JSON_HELP = (
    "print one JSON document instead of tables (its keys: 'jobsctl for scripts' in the "
    "how-to 'Running django_pgjobs in production')"
)


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a limit: give a whole number >= 1, or none.") from None
    return value


def _job_id(text: str) -> int:
    """A job id as typed: a whole number from 1 to JOB_ID_MAX, in ASCII digits."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= JOB_ID_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a job id: give whole numbers from 1 to {JOB_ID_MAX}."
        )
    return int(text)


def _listing_limit(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= LISTING_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of rows: give a whole number from 1 to {LISTING_MAX:,}."
        )
    return int(text)


def _add_filters(parser: CommandParser) -> None:
    """The dead-letter filters of the admin's list: kind, queue, reason category."""
    parser.add_argument("--kind", metavar="PREFIX", help="only kinds that begin with PREFIX")
    parser.add_argument("--queue", metavar="QUEUE", help="only this queue")
    parser.add_argument(
        "--reason",
        metavar="CATEGORY",
        help=f"only this category of reason: {', '.join(CATEGORY_FILTERS)} (other: none recorded)",
    )


def _subcommand(
    actions: Any, name: str, summary: str, description: str | None = None
) -> CommandParser:
    """A subcommand whose `--help` says what it does (`summary` in the list of
    subcommands, `description` on its own page)."""
    parser: CommandParser = actions.add_parser(
        name, help=summary, description=description or summary
    )
    return parser


class Command(BaseCommand):
    help = (
        "Show queues, running jobs, dead letters and schedules; pause, resume, limit or "
        "rate-limit queues; cancel jobs, requeue dead letters, steer schedules and workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        status = _subcommand(
            actions,
            "status",
            "Each queue (runnable, scheduled, retrying, running, done, dead ...), each worker.",
            "Each queue of each database: its runnable, scheduled, retrying (pending, tried "
            "before), running, done (retained) and dead jobs, its controls and the age of its "
            "oldest runnable job; then the workers, and the queues with runnable jobs no live "
            f"worker serves. Counts past {COUNT_CAP:,} are the planner's estimates.",
        )
        status.add_argument("--json", action="store_true", help=JSON_HELP)

        for name, summary, what in (
            ("pause", "Stop every worker claiming these queues.", "No worker claims"),
            ("resume", "Let workers claim these queues again.", "Workers claim"),
        ):
            control = _subcommand(
                actions,
                name,
                summary,
                f"{summary} {what} their jobs from the moment this commits, in the database of "
                "each queue. A queue nothing names (no registered job or task, no setting, "
                "no job, dead letter or control) is refused as a likely typo unless --create.",
            )
            control.add_argument("queues", nargs="+", metavar="QUEUE", help="queue names")
            control.add_argument(
                "--create",
                action="store_true",
                help="act on queues nothing names yet (e.g. one a coming deploy brings)",
            )

        limit = _subcommand(
            actions, "limit", "Cap a queue's running jobs across every worker (none: no cap)."
        )
        limit.add_argument("queue", metavar="QUEUE")
        limit.add_argument("max_running", metavar="N|none")
        rate = _subcommand(
            actions, "rate", "Cap a queue's claims per period across every worker (none: no cap)."
        )
        rate.add_argument("queue", metavar="QUEUE")
        rate.add_argument("rate", metavar="N/PERIOD|none", help="100/m, 5/s, 1000/h, 3/10s")

        running = _subcommand(
            actions,
            "running",
            "The running jobs, longest first: worker, time, progress.",
            "The running jobs of every database (or of the queues named), the longest "
            "running first: worker, attempt, time running, the handler's latest progress.",
        )
        running.add_argument("queues", nargs="*", metavar="QUEUE", help="only these queues")
        running.add_argument(
            "--limit", type=_listing_limit, default=50, metavar="N", help="show at most N (50)"
        )
        running.add_argument("--json", action="store_true", help=JSON_HELP)

        cancel = _subcommand(
            actions,
            "cancel",
            "Cancel jobs by id: dead-lettered (requeueable), running handlers told.",
            "Cancel waiting, pending or running jobs by id: each becomes a dead letter with "
            "the reason 'cancelled' (jobsctl requeue brings it back), and the handler of a "
            "running one is told to stop. Fails when none of the ids could be cancelled.",
        )
        cancel.add_argument("ids", nargs="+", type=_job_id, metavar="ID", help="jobs to cancel")
        cancel.add_argument(
            "--database",
            metavar="ALIAS",
            help="the database of the jobs (PGJOBS['QUEUE_DATABASES']); default: the one "
            "holding each id",
        )

        dead_letters = _subcommand(
            actions,
            "dead",
            "The dead letters, newest first: id, kind, queue, reason, when they died.",
            "The dead letters of every database (or of the queue's), the newest first, "
            "filtered as the admin's list is: by the start of their kind, their queue, the "
            "category of their reason. An empty listing is an answer, not an error.",
        )
        _add_filters(dead_letters)
        dead_letters.add_argument(
            "--limit", type=_listing_limit, default=50, metavar="N", help="show at most N (50)"
        )
        dead_letters.add_argument("--json", action="store_true", help=JSON_HELP)

        requeue = _subcommand(
            actions,
            "requeue",
            "Dead letters back to pending with fresh attempts: by id, or --all matching filters.",
            "Move dead letters back to pending with fresh attempts and no expiry, as the "
            "admin's Requeue does: those named by id, or with --all every one that matches "
            "the filters (none: every dead letter) and had died when the command began, a "
            "thousand per transaction. A letter whose key has a live job is merged into that "
            "job. Fails when nothing matched.",
        )
        requeue.add_argument(
            "ids", nargs="*", type=_job_id, metavar="ID", help="dead letters (jobsctl dead)"
        )
        requeue.add_argument(
            "--all", action="store_true", help="every dead letter matching the filters"
        )
        _add_filters(requeue)
        requeue.add_argument(
            "--database",
            metavar="ALIAS",
            help="the database of the letters (PGJOBS['QUEUE_DATABASES']); default: the one "
            "holding each id, or for --all every one (the queue's with --queue)",
        )

        steer = _subcommand(
            actions,
            "schedules",
            "Every schedule: next run, last run, last job; enable, disable, run one now.",
            "Without an action, every schedule: its kind, cron, state, next and last run. "
            "With one, steer schedules as the admin's Schedules page does.",
        )
        verbs = steer.add_subparsers(dest="schedule_action", metavar="[ACTION]")
        for name, summary, description in (
            (
                "enable",
                "Enable schedules from their next tick (missed ticks are not run).",
                "Enable disabled schedules from their next tick after now; the ticks missed "
                "while disabled are not run. A retired schedule (no longer declared) is "
                "refused: declare it again.",
            ),
            (
                "disable",
                "Disable schedules: no tick enqueues a job until enabled.",
                None,
            ),
            (
                "run",
                "Enqueue one job of each schedule now; the next tick stays.",
                "Enqueue one job of each schedule now, with its payload and options, as the "
                "admin's Run now does (enabled or not); the next tick stays as it was.",
            ),
        ):
            schedule = _subcommand(verbs, name, summary, description)
            schedule.add_argument(
                "names", nargs="+", metavar="NAME", help="schedules (jobsctl schedules lists them)"
            )

        worker = _subcommand(
            actions,
            "worker",
            "Ask workers to go quiet, stop or run again; pause a queue on one worker alone.",
            "What the console's Workers page does: each worker obeys at its next heartbeat, "
            "and the registry keeps who asked (jobsctl status shows it).",
        )
        steps = worker.add_subparsers(dest="worker_action", required=True, metavar="ACTION")
        for name, summary in (
            ("quiet", "Claim no more jobs; the running ones finish."),
            ("stop", "Claim no more jobs, finish the running ones, exit (not taken back)."),
            ("run", "Claim jobs again (after quiet)."),
        ):
            step = _subcommand(steps, name, summary)
            step.add_argument("ids", nargs="*", metavar="WORKER", help="worker ids")
            step.add_argument("--host", help="every running worker on this host")
        for name, summary in (
            ("pause", "Pause a queue on this worker alone: the others still claim its jobs."),
            ("resume", "Resume a queue paused on this worker alone."),
        ):
            step = _subcommand(steps, name, summary)
            step.add_argument("worker_id", metavar="WORKER", help="the worker's id")
            step.add_argument("queue", metavar="QUEUE", help="one of the worker's queues")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._act(Output(self), options)
        except (InvalidJobOption, ValueError) as error:
            raise CommandError(str(error)) from None
        except DatabaseError as error:
            raise CommandError(
                f"The jobs database '{pgjobs_settings.DATABASE}' refused: "
                f"{str(error).strip().splitlines()[0]}. "
                "Is it running, and migrated (python manage.py migrate django_pgjobs)?"
            ) from None

    def _act(self, out: Output, options: dict[str, Any]) -> None:
        action = options["action"]
        if action == "status":
            queues.status(out, as_json=options["json"])
        elif action == "pause":
            queues.pause(out, options["queues"], create=options["create"])
        elif action == "resume":
            queues.resume(out, options["queues"], create=options["create"])
        elif action == "limit":
            queues.set_limit(out, options["queue"], _limit(options["max_running"]))
        elif action == "rate":
            queues.set_rate(out, options["queue"], options["rate"])
        elif action == "running":
            jobs.running(out, options["queues"], limit=options["limit"], as_json=options["json"])
        elif action == "cancel":
            jobs.cancel(out, options["ids"], options["database"])
        elif action == "dead":
            filters = dead.Filters(options["kind"], options["queue"], options["reason"])
            dead.dead(out, filters, limit=options["limit"], as_json=options["json"])
        elif action == "requeue":
            self._requeue(out, options)
        elif action == "worker":
            step = options["worker_action"]
            if step in workers.ASKS:
                workers.ask(out, step, options["ids"], options["host"])
            else:
                paused = step == "pause"
                workers.pause_here(out, options["worker_id"], options["queue"], paused=paused)
        else:
            self._schedules(out, options.get("schedule_action"), options.get("names") or [])

    def _requeue(self, out: Output, options: dict[str, Any]) -> None:
        filters = dead.Filters(options["kind"], options["queue"], options["reason"])
        if options["all"] and options["ids"]:
            raise CommandError("Give ids or --all, not both: nothing was requeued.")
        if options["all"]:
            dead.requeue_matching(out, filters, options["database"])
        elif not options["ids"]:
            raise CommandError(
                "Which dead letters? Give their ids (jobsctl dead lists them), or --all "
                "with filters (--kind, --queue, --reason) for every one that matches."
            )
        elif filters.any():
            raise CommandError(
                "--kind, --queue and --reason choose the letters of --all; with ids, give "
                "the ids alone. Nothing was requeued."
            )
        else:
            dead.requeue_ids(out, options["ids"], options["database"])

    def _schedules(self, out: Output, action: str | None, names: list[str]) -> None:
        if action is None:
            schedules.listing(out)
        elif action == "enable":
            schedules.enable(out, names)
        elif action == "disable":
            schedules.disable(out, names)
        else:
            schedules.run_now(out, names)
