"""Run the benchmarks: `python -m bench [--smoke] [--only drain,wake | --skip console]
[--repeat 3] [--peers]`.

Uses the PostgreSQL server of DATABASE_URL (a scratch database `pgjobs_bench`, or
$PGJOBS_BENCH_DATABASE, is created on it and dropped afterwards), or a private embedded
one when DATABASE_URL is unset.
With --peers, PgQueuer (pinned) is installed into a venv of its own under bench/.peers/,
and graphile-worker (pinned) from npm beside it (needs Node), and each is measured in the
same run on a scratch database of its own; our drain and wake figures are then printed as
ratios to PgQueuer's, and our wake-up to graphile-worker's.
Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.harness import (
    ROOT,
    Database,
    Figure,
    machine_facts,
    measured,
    render_table,
    write_json,
)
from bench.suite import BENCHMARKS, SMOKE, Sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes: seconds, for CI.")
    parser.add_argument(
        "--only", help=f"Comma-separated benchmarks to run, of {', '.join(BENCHMARKS)}."
    )
    parser.add_argument(
        "--skip", help="Comma-separated benchmarks to leave out (the rest run, in order)."
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="Run each benchmark N times; report medians."
    )
    parser.add_argument("--json", type=Path, help="Write the JSON here too.")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="Also run PgQueuer and graphile-worker (downloaded once into bench/.peers/) and "
        "print ratios to them.",
    )
    args = parser.parse_args(argv)
    if args.only and args.skip:
        parser.error("give --only or --skip, not both")
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    skipped = args.skip.split(",") if args.skip else []
    names = [name for name in names if name not in skipped]
    if args.peers:  # the figures the peers are compared on
        names += [name for name in ("enqueue", "drain", "wake") if name not in names]
    unknown = [name for name in [*names, *skipped] if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    sizes = SMOKE if args.smoke else Sizes()

    server, embedded = _server()
    database = Database(server)
    database.recreate()
    os.environ["DATABASE_URL"] = database.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", run_syncdb=True, verbosity=0)
    facts = {
        **machine_facts(),
        **database.server_facts(),
        "embedded": embedded,
        "smoke": args.smoke,
        "repeat": args.repeat,
        "sizes": sizes.__dict__,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    figures: list[Figure] = []
    try:

        def run(name: str, benchmark: Callable[[Database, Sizes], list[Figure]]) -> list[Figure]:
            """`benchmark` run --repeat times, each figure the median run's, with its load."""
            started = time.monotonic()
            print(f"-- {name} ...", file=sys.stderr, flush=True)
            runs = [
                measured(functools.partial(benchmark, database, sizes)) for _ in range(args.repeat)
            ]
            print(f"   {name} took {time.monotonic() - started:.0f} s", file=sys.stderr)
            return _medians(runs)

        for name in names:
            figures.extend(run(name, BENCHMARKS[name]))
        if args.peers:
            from bench.peers import GRAPHILE, PEER, compare, compare_wake, graphile, pgqueuer

            theirs = run(PEER, pgqueuer)
            graphiles = run(GRAPHILE, graphile)
            figures.extend(
                [
                    *theirs,
                    *graphiles,
                    *compare(figures, theirs),
                    *compare_wake(figures, graphiles, GRAPHILE),
                ]
            )
            facts["peers"] = {"pgqueuer": PEER, "graphile": GRAPHILE}
    finally:
        from django.db import connections

        connections.close_all()
        database.drop()
        if embedded is not None:
            embedded.stop()
    print(render_table(figures))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    outputs = [ROOT / "bench" / "results" / f"{stamp}.json"]
    if args.json:
        outputs.append(args.json)
    for path in outputs:
        write_json(path, figures, facts)
    print(f"\nJSON: {', '.join(str(p) for p in outputs)}", file=sys.stderr)
    return 0


def _server() -> tuple[str, object | None]:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url, None
    from django_pgjobs.testing.localdb import EmbeddedPostgres

    print("no DATABASE_URL: using an embedded PostgreSQL (fsync off)", file=sys.stderr)
    server = EmbeddedPostgres().start()
    return server.url, server


def _medians(runs: list[list[Figure]]) -> list[Figure]:
    """Per figure, the run whose value is the median (its ceiling travels with it)."""
    if len(runs) == 1:
        return runs[0]
    merged = []
    for index in range(len(runs[0])):
        candidates = sorted((run[index] for run in runs), key=lambda f: f.value)
        chosen = candidates[len(candidates) // 2]
        chosen.details = {
            **chosen.details,
            "runs": [round(f.value, 3) for f in (run[index] for run in runs)],
            "median_of": len(runs),
        }
        if chosen.ceiling is not None:
            chosen.details["ceilings"] = [round(run[index].ceiling or 0, 3) for run in runs]
        merged.append(chosen)
    return merged


if __name__ == "__main__":
    sys.exit(main())
