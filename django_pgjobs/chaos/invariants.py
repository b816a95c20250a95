"""The invariants a chaos run must keep, judged from its evidence alone (chaos.facts).

Pure functions: no database, no clock. The evidence is what the run saw (the jobs it
committed and rolled back, the faults it injected, stamped with the database's clock) and
what the database holds at the end (the executions' ledger, the live and dead rows).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_pgjobs.chaos.facts import BatchEnd, Evidence, Execution, Fault

#: How an execution ended, as its ledger row says.
COMMITTED = "committed"  # its result and the job's ack committed together, fenced
STARTED = "started"  # it never got further: its worker died, froze or lost its connection
FENCED = "fenced"  # it finished after its claim had lapsed: the fence refused it
RETRIED = "retried"  # a deliberately flaky first attempt
FAILED = "failed"  # a deliberately doomed job
POISON = "poison"  # a hostile handler: it raised or returned what cannot be stored as is
CANCELLED = "cancelled"  # its job was cancelled while it ran, and the handler heard (S32)

#: Outcomes that end an execution on purpose: a run after them needs no fault to explain it.
_DELIBERATE = frozenset({FENCED, RETRIED, FAILED, POISON, CANCELLED})
#: The limits of the run's limited jobs (chaos.jobs.limited): concurrency, and claims per
#: window of RATE_WINDOW.
LIMITED_CONCURRENCY = 2
LIMITED_RATE = 10
RATE_WINDOW = timedelta(seconds=1)

#: A claim at the end of a pin may read this many shared buffers more than twice what it
#: read when the pin began: the dead entries of the last moment before its floor, which
#: the claim still walks (CLAIM_FLOORS keeps a floor 100 ms behind the statement).
PIN_SLACK_BUFFERS = 64
#: Or, while open writers hold the floors back to their start (each a keyed trigger
#: waiting for its key, a fenced run: on a loaded machine, seconds of dead entries), it
#: reads at most this share of what a claim from each queue's start reads then.
PIN_FLOORS_SHARE = 1 / 3


@dataclass(frozen=True, slots=True)
class Verdict:
    """One invariant: what it states and every violation found."""

    name: str
    statement: str
    violations: tuple[str, ...]
    checked: int

    @property
    def holds(self) -> bool:
        return not self.violations


def judge(evidence: Evidence) -> list[Verdict]:
    """Every invariant, in the order the summary prints them."""
    return [
        _no_job_lost(evidence),
        _no_ghost_ran(evidence),
        _fencing(evidence),
        _keys(evidence),
        _duplicates_explained(evidence),
        _attempts(evidence),
        _poison_dead_lettered(evidence),
        _cancellations(evidence),
        _limits(evidence),
        _workflows(evidence),
        _claim_cost_under_pins(evidence),
        _workers_survived(evidence),
    ]


@dataclass(frozen=True, slots=True)
class Reruns:
    """Runs of a job's payload beyond its first, by what came before them."""

    deliberate: int  # the run before failed on purpose (a flaky or doomed job)
    cut_short: int  # the run before was cut short by a fault, or fenced out after one
    unexplained: int

    @property
    def total(self) -> int:
        return self.deliberate + self.cut_short + self.unexplained


def count_reruns(evidence: Evidence) -> Reruns:
    counts = {"deliberate": 0, "cut_short": 0, "unexplained": 0}
    for runs in _by_payload(evidence.executions).values():
        for earlier, later in itertools.pairwise(runs):
            cause = _explanation(earlier, later, evidence.faults)
            if cause is None:
                counts["unexplained"] += 1
            elif cause in (RETRIED, FAILED, POISON):
                counts["deliberate"] += 1
            else:
                counts["cut_short"] += 1
    return Reruns(**counts)


def _no_job_lost(evidence: Evidence) -> Verdict:
    violations = []
    for job in evidence.final.values():
        if job.state in ("waiting", "pending", "running") and job.id not in evidence.ghosts:
            violations.append(f"job {job.id} is still {job.state} after the drain")
    for job_id in sorted(evidence.committed):
        if job_id not in evidence.final:
            violations.append(f"job {job_id} was committed but is neither done nor dead")
    return Verdict(
        "no job lost",
        "every committed job is done or dead; none is stranded waiting, pending or running",
        tuple(violations),
        len(evidence.committed),
    )


def _no_ghost_ran(evidence: Evidence) -> Verdict:
    violations = [
        f"job {run.job_id} ran (attempt {run.attempt}, worker {run.worker}) though its "
        "enqueue rolled back"
        for run in evidence.executions
        if run.ghost or run.job_id in evidence.ghosts
    ]
    violations += [
        f"job {job_id} exists though its enqueue rolled back"
        for job_id in sorted(evidence.ghosts)
        if job_id in evidence.final and job_id not in evidence.committed
    ]
    return Verdict(
        "no ghost ran",
        "no job enqueued in a rolled-back transaction ever ran or exists",
        tuple(violations),
        len(evidence.ghosts),
    )


def _fencing(evidence: Evidence) -> Verdict:
    violations = []
    runs_of_job = _group(evidence.executions, lambda run: run.job_id)
    for job_id, runs in runs_of_job.items():
        for run in runs:
            if run.outcome != COMMITTED:
                continue
            if run.written_at is None:
                violations.append(f"job {job_id}: a committed run has no write time")
                continue
            for other in runs:
                if other is not run and run.claimed_at < other.claimed_at < run.written_at:
                    violations.append(
                        f"job {job_id}: claim {run.token} (attempt {run.attempt}) committed at "
                        f"{run.written_at:%H:%M:%S.%f} after claim {other.token} (attempt "
                        f"{other.attempt}) began at {other.claimed_at:%H:%M:%S.%f}"
                    )
    for job in evidence.final.values():
        if job.state != "done":
            continue
        token = job.result.get("token") if isinstance(job.result, dict) else None
        committed = [run for run in runs_of_job.get(job.id, []) if run.outcome == COMMITTED]
        if not committed:
            violations.append(f"job {job.id} is done but no run of it committed")
        elif str(committed[-1].token) != token:
            violations.append(
                f"job {job.id}: its result came from claim {token}, not from its last "
                f"committed run ({committed[-1].token})"
            )
    return Verdict(
        "fencing",
        "no result committed by a claim after a newer claim of the same job began",
        tuple(violations),
        sum(run.outcome == COMMITTED for run in evidence.executions),
    )


def _keys(evidence: Evidence) -> Verdict:
    violations = []
    runs_of_key = _group(
        (run for run in evidence.executions if run.key is not None), lambda run: run.key
    )
    for key, runs in runs_of_key.items():
        for run in runs:
            if run.outcome != COMMITTED or run.written_at is None:
                continue
            for other in runs:
                if other is not run and run.claimed_at < other.claimed_at < run.written_at:
                    violations.append(
                        f"key {key}: job {other.job_id} (trigger {other.version}) started "
                        f"while job {run.job_id} (trigger {run.version}) was running and "
                        "then committed"
                    )
    for key, last in sorted(evidence.last_triggers.items()):
        if key in evidence.uncertain_keys:
            continue
        runs = runs_of_key.get(key, [])
        ran = any(run.version == last and run.outcome == COMMITTED for run in runs)
        died = any(
            job.key == key and job.state == "dead" and job.version == last
            for job in evidence.final.values()
        )
        if not ran and not died:
            violations.append(f"key {key}: its last trigger ({last}) never ran to the end")
        newer = sorted({run.version for run in runs if run.version > last})
        if newer:
            violations.append(f"key {key}: triggers {newer} ran but were never committed")
    return Verdict(
        "keys",
        "no two runs of one key overlapped; every key's last trigger ran",
        tuple(violations),
        len(evidence.last_triggers),
    )


def _duplicates_explained(evidence: Evidence) -> Verdict:
    violations = []
    for (job_id, version), runs in _by_payload(evidence.executions).items():
        for earlier, later in itertools.pairwise(runs):
            if earlier.outcome == COMMITTED:
                violations.append(
                    f"job {job_id} (trigger {version}) ran again (attempt {later.attempt}) "
                    f"after attempt {earlier.attempt} had committed"
                )
            elif _explanation(earlier, later, evidence.faults) is None:
                violations.append(
                    f"job {job_id} (trigger {version}) ran again (attempt {later.attempt}); "
                    f"attempt {earlier.attempt} on {earlier.worker} never finished and no "
                    "fault hit that worker"
                )
    for job_id, runs in _group(evidence.executions, lambda run: run.job_id).items():
        last = runs[-1]
        if last.outcome == STARTED and not any(
            fault.may_explain(last, None) for fault in evidence.faults
        ):
            violations.append(
                f"job {job_id}: attempt {last.attempt} on {last.worker} never finished and "
                "no fault hit that worker"
            )
    return Verdict(
        "at-least-once within the lease",
        "every run beyond the first follows a run that a fault or its own failure cut short",
        tuple(violations),
        len(evidence.executions),
    )


def _attempts(evidence: Evidence) -> Verdict:
    violations = [
        f"job {run.job_id} ran as attempt {run.attempt} of {run.max_attempts}"
        for run in evidence.executions
        if not 1 <= run.attempt <= run.max_attempts
    ]
    for (job_id, version), runs in _by_payload(evidence.executions).items():
        attempts = [run.attempt for run in runs]
        if any(b <= a for a, b in itertools.pairwise(attempts)):
            violations.append(
                f"job {job_id} (trigger {version}): attempts {attempts} do not increase "
                "from claim to claim"
            )
    seen: dict[str, int] = {}
    for run in evidence.executions:
        token = str(run.token)
        if token in seen:
            violations.append(f"claim {token} ran twice (jobs {seen[token]} and {run.job_id})")
        seen[token] = run.job_id
    return Verdict(
        "attempts",
        "no job ran more times than its max attempts; every claim has its own token",
        tuple(violations),
        len(evidence.executions),
    )


def _poison_dead_lettered(evidence: Evidence) -> Verdict:
    poisoned = [job for job in evidence.final.values() if job.poison]
    violations = [
        f"poison job {job.id} ended {job.state}, not dead"
        for job in poisoned
        if job.state != "dead" and job.id not in evidence.ghosts
    ]
    violations += [
        f"poison job {job.id} is dead without a readable reason ({job.reason!r})"
        for job in poisoned
        if job.state == "dead" and not (job.reason or "").strip()
    ]
    return Verdict(
        "poison dead-lettered",
        "every job of a hostile handler ended dead with a readable reason (S27)",
        tuple(violations),
        len(poisoned),
    )


def _cancellations(evidence: Evidence) -> Verdict:
    violations = []
    runs_of_job = _group(evidence.executions, lambda run: run.job_id)
    for job_id, cancelled_at in sorted(evidence.cancelled.items()):
        job = evidence.final.get(job_id)
        runs = runs_of_job.get(job_id, [])
        later = [run for run in runs if run.claimed_at > cancelled_at]
        if later:
            violations.append(
                f"job {job_id} was claimed again (attempt {later[0].attempt}) after its cancel"
            )
        if job is None or job.state not in ("dead", "done"):
            state = job.state if job else "gone"
            violations.append(f"job {job_id} was cancelled but ended {state}")
        elif job.state == "dead" and job.reason != "cancelled":
            violations.append(f"job {job_id} was cancelled but died as {job.reason!r}")
        elif job.state == "dead" and any(run.outcome == COMMITTED for run in runs):
            violations.append(f"job {job_id} is a cancelled dead letter but a run committed")
    return Verdict(
        "cancellations",
        "a job cancelled while it ran never runs again and ends cancelled (or done, when "
        "it completed inside its fence first) (S32)",
        tuple(violations),
        len(evidence.cancelled),
    )


def _limits(evidence: Evidence) -> Verdict:
    """S34 and S35 on the run's limited key: committed runs held a current claim from
    their start to their write, so at most LIMITED_CONCURRENCY of them overlap; and a run
    is a claim, so no window of RATE_WINDOW holds more than LIMITED_RATE claims."""
    violations = []
    runs = [run for run in evidence.executions if run.job_id in evidence.limited]
    spans = [
        (run.started_at, run.written_at)
        for run in runs
        if run.outcome == COMMITTED and run.written_at is not None
    ]
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    if most > LIMITED_CONCURRENCY:
        violations.append(
            f"{most} jobs of the limited key ran at once (limit {LIMITED_CONCURRENCY})"
        )
    claims = sorted({(run.claimed_at, str(run.token)) for run in runs})
    start = 0
    for end in range(len(claims)):
        while claims[end][0] - claims[start][0] >= RATE_WINDOW:
            start += 1
        if end - start + 1 > LIMITED_RATE:
            violations.append(
                f"{end - start + 1} claims of the limited key within {RATE_WINDOW} "
                f"from {claims[start][0]:%H:%M:%S.%f} (rate {LIMITED_RATE})"
            )
            break
    return Verdict(
        "limits",
        f"the limited key never ran more than {LIMITED_CONCURRENCY} at once nor was "
        f"claimed more than {LIMITED_RATE} times a second (S34, S35)",
        tuple(violations),
        len(runs),
    )


def _workflows(evidence: Evidence) -> Verdict:
    """S29-S31: no job of a chain was claimed before its parent's run committed, and none
    ran after its parent died (it died with it); every batch ended as its members did,
    its matching callbacks committed once, after its last member's end, and the others
    never existed for anyone."""
    violations: list[str] = []
    runs_of_job = _group(evidence.executions, lambda run: run.job_id)

    def ended_by(job_id: int) -> datetime | None:
        """A time the job's end came after: its committed write, else its last start."""
        runs = runs_of_job.get(job_id, [])
        writes = [r.written_at for r in runs if r.outcome == COMMITTED and r.written_at]
        return max(writes) if writes else max((r.started_at for r in runs), default=None)

    for chain in evidence.chains:
        if evidence.uncertain.intersection(chain):
            continue
        for parent, child in itertools.pairwise(chain):
            before, after = evidence.final.get(parent), evidence.final.get(child)
            if before is None or after is None:
                continue  # "no job lost" says so
            child_runs = runs_of_job.get(child, [])
            done_at = ended_by(parent)
            if before.state == "done" and done_at is not None:
                violations += [
                    f"job {child} was claimed at {run.claimed_at:%H:%M:%S.%f}, before its "
                    f"parent {parent}'s run committed at {done_at:%H:%M:%S.%f}"
                    for run in child_runs
                    if run.claimed_at <= done_at
                ]
            elif before.state == "dead":
                if child_runs:
                    violations.append(f"job {child} ran though its parent {parent} died")
                if not (after.state == "dead" and (after.reason or "").startswith("dependency")):
                    violations.append(
                        f"job {child} ended {after.state} ({after.reason!r}) though its "
                        f"parent {parent} died"
                    )
    for written in evidence.batches:
        members = [evidence.final.get(member) for member in written.members]
        if evidence.uncertain.intersection(written.members) or any(
            m is None or m.state not in ("done", "dead") for m in members
        ):
            continue  # "no job lost" says so
        done = sum(m is not None and m.state == "done" for m in members)
        failed = len(members) - done
        outcome = "failed" if failed else "succeeded"
        end = evidence.batch_ends.get(written.id)
        if end != BatchEnd(outcome, done, failed):
            violations.append(
                f"batch {written.id} ended as {end}, but its members ended {done} done and "
                f"{failed} failed"
            )
        last_end = max((t for m in written.members if (t := ended_by(m))), default=None)
        matching = {"complete", "success" if outcome == "succeeded" else "failure"}
        for fires_on, job_id in sorted(written.callbacks.items()):
            runs = runs_of_job.get(job_id, [])
            final = evidence.final.get(job_id)
            name = f"callback {job_id} (on {fires_on}) of batch {written.id}"
            if fires_on not in matching:
                if runs or final is not None:
                    violations.append(f"{name} exists or ran though the batch {outcome}")
                continue
            committed = sum(run.outcome == COMMITTED for run in runs)
            if final is None or final.state not in ("done", "dead"):
                violations.append(f"{name} ended {final.state if final else 'gone'}")
            elif final.state == "done" and committed != 1:
                violations.append(f"{name} committed {committed} times")
            elif final.state == "dead" and (final.reason or "").startswith("dependency"):
                violations.append(f"{name} died as {final.reason!r}")
            if last_end is not None:
                violations += [
                    f"{name} was claimed at {run.claimed_at:%H:%M:%S.%f}, before its last "
                    f"member ended at {last_end:%H:%M:%S.%f}"
                    for run in runs
                    if run.claimed_at <= last_end
                ]
    return Verdict(
        "workflows",
        "no job of a chain ran before its parent was done or after it died; each batch "
        "ended as its members did and fired its matching callbacks once, after its last "
        "member (S29-S31)",
        tuple(violations),
        len(evidence.chains) + len(evidence.batches),
    )


def _claim_cost_under_pins(evidence: Evidence) -> Verdict:
    violations = []
    judged = [pin for pin in evidence.pins if pin.unjudged is None]
    for pin in judged:
        bound = 2 * pin.before + PIN_SLACK_BUFFERS
        spared = pin.from_start is not None and pin.after <= pin.from_start * PIN_FLOORS_SHARE
        if pin.after > bound and not spared:
            read = "from their queues' floors" if pin.floors else "from each queue's start"
            start = (
                "" if pin.from_start is None else f" (from each queue's start: {pin.from_start})"
            )
            violations.append(
                f"a pin ({pin.how}) from {pin.began:%H:%M:%S.%f} to {pin.ended:%H:%M:%S.%f}: "
                f"the claim read {pin.after} buffers at its end{start}, {pin.before} at its "
                f"start (at most {bound}); the workers' claims read {read}, "
                f"{pin.dead_rows} dead rows in the job table"
            )
    return Verdict(
        "claim cost under a held horizon",
        "while a transaction or a reader held the xmin horizon, the claim read at most "
        f"twice the buffers it read when the hold began and {PIN_SLACK_BUFFERS} more, or "
        f"(writers holding the floors back) a {round(1 / PIN_FLOORS_SHARE)}rd of a claim "
        "from each queue's start (S42)",
        tuple(violations),
        len(judged),
    )


def _workers_survived(evidence: Evidence) -> Verdict:
    return Verdict(
        "workers survive faults",
        "no worker exited unless the run stopped or killed it",
        tuple(evidence.worker_exits),
        len(evidence.faults),
    )


def _explanation(earlier: Execution, later: Execution, faults: Iterable[Fault]) -> str | None:
    """Why `earlier` was followed by another run of the same payload, if anything says."""
    if earlier.outcome in _DELIBERATE:
        return earlier.outcome
    for fault in faults:
        if fault.may_explain(earlier, later):
            return fault.kind
    return None


def _by_payload(executions: Iterable[Execution]) -> dict[tuple[int, int], list[Execution]]:
    """Runs grouped by (job, trigger number), in claim order."""
    return _group(executions, lambda run: (run.job_id, run.version))


def _group(executions: Iterable[Execution], by: Any) -> dict[Any, list[Execution]]:
    groups: dict[Any, list[Execution]] = defaultdict(list)
    for run in executions:
        groups[by(run)].append(run)
    for runs in groups.values():
        runs.sort(key=lambda run: run.claimed_at)
    return dict(groups)
