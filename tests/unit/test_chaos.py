"""`manage.py chaosjobs`'s invariants catch what they claim to, judged from forged
evidence alone (no database), and its configuration refuses what it cannot run. Real runs
under faults: tests/processes/test_chaos.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_pgjobs.chaos import facts, invariants
from django_pgjobs.chaos.facts import Evidence, Fault, FinalJob
from django_pgjobs.chaos.invariants import judge
from django_pgjobs.chaos.run import ChaosConfig

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Run:
    """An execution as the ledger records it."""

    job_id: int
    attempt: int = 1
    claimed: float = 0.0
    written: float | None = 1.0
    outcome: str = "committed"
    worker: str = "w1"
    key: str | None = None
    version: int = 0
    max_attempts: int = 5
    ghost: bool = False
    token: Any = field(default_factory=uuid.uuid4)

    @property
    def claimed_at(self) -> datetime:
        return at(self.claimed)

    @property
    def started_at(self) -> datetime:
        return at(self.claimed + 0.001)

    @property
    def written_at(self) -> datetime | None:
        return None if self.written is None else at(self.written)


def done(run: Run) -> FinalJob:
    return FinalJob(
        id=run.job_id,
        key=run.key,
        state="done",
        version=run.version,
        result={"token": str(run.token), "v": run.version},
    )


def evidence(*runs: Run, **changes: Any) -> Evidence:
    """A consistent ledger of `runs`: every job committed, and done by its last commit."""
    final: dict[int, FinalJob] = {}
    for run in sorted(runs, key=lambda r: r.claimed):
        if run.outcome == "committed":
            final[run.job_id] = done(run)
    base = Evidence(
        executions=list(runs),
        committed={run.job_id: run.key for run in runs},
        last_triggers={},
        ghosts=set(),
        faults=[],
        final=final,
    )
    return replace(base, **changes)


def broken(found: Evidence) -> dict[str, tuple[str, ...]]:
    return {verdict.name: verdict.violations for verdict in judge(found) if not verdict.holds}


def kill(worker: str, seconds: float) -> Fault:
    return Fault("kill", worker, at(seconds), at(seconds + 0.01))


class TestInvariants:
    def test_a_clean_ledger_keeps_every_invariant(self) -> None:
        first = Run(1, outcome="started", claimed=0, written=None)
        second = Run(1, attempt=2, claimed=5, written=6, worker="w2")
        found = evidence(first, second, Run(2), faults=[kill("w1", 1)])
        assert broken(found) == {}
        assert invariants.count_reruns(found) == invariants.Reruns(0, 1, 0)

    def test_a_committed_job_that_vanished_or_is_stranded_is_lost(self) -> None:
        found = evidence(Run(1), Run(2))
        del found.final[2]
        found.final[3] = FinalJob(3, None, "running")
        found.committed[3] = None
        violations = broken(found)["no job lost"]
        assert any("job 2 was committed" in v for v in violations)
        assert any("job 3 is still running" in v for v in violations)

    def test_a_ghost_that_ran_or_exists_is_caught(self) -> None:
        found = evidence(Run(1), Run(9, ghost=True))
        found.ghosts = {7}
        found.final[7] = FinalJob(7, None, "pending")
        del found.committed[9]
        assert len(broken(found)["no ghost ran"]) == 2

    def test_a_stale_claim_committing_after_a_newer_claim_began_breaks_fencing(self) -> None:
        stale = Run(1, claimed=0, written=9, worker="w1")
        newer = Run(1, attempt=2, claimed=5, written=6, worker="w2")
        found = evidence(stale, newer, faults=[Fault("stop", "w1", at(1), at(8))])
        found.final[1] = done(newer)
        assert "fencing" in broken(found)

    def test_a_result_from_other_than_the_last_committed_claim_breaks_fencing(self) -> None:
        found = evidence(Run(1))
        found.final[1] = replace(found.final[1], result={"token": str(uuid.uuid4())})
        assert any("result came from" in v for v in broken(found)["fencing"])

    def test_overlapping_runs_of_a_key_and_a_lost_last_trigger_are_caught(self) -> None:
        one = Run(1, key="k", version=1, claimed=0, written=4)
        other = Run(2, key="k", version=2, claimed=2, written=5, worker="w2")
        found = evidence(one, other, last_triggers={"k": 3})
        violations = broken(found)["keys"]
        assert any("started while job 1" in v for v in violations)
        assert any("last trigger (3) never ran" in v for v in violations)

    def test_a_last_trigger_that_died_after_its_attempts_is_not_lost(self) -> None:
        runs = [
            Run(1, key="k", version=2, attempt=n, claimed=n * 10, written=None, outcome="started")
            for n in (1, 2)
        ]
        faults = [kill("w1", 11), kill("w1", 21)]
        found = evidence(*runs, last_triggers={"k": 2}, faults=faults)
        found.final[1] = FinalJob(1, "k", "dead", version=2, reason="max attempts exceeded")
        assert broken(found) == {}

    def test_a_rerun_after_a_committed_run_is_an_unexplained_duplicate(self) -> None:
        first = Run(1, claimed=0, written=1)
        again = Run(1, attempt=2, claimed=5, written=6)
        assert "at-least-once within the lease" in broken(evidence(first, again))

    def test_a_rerun_needs_a_fault_on_the_first_runs_worker_while_it_ran(self) -> None:
        first = Run(1, claimed=0, written=None, outcome="started", worker="w1")
        again = Run(1, attempt=2, claimed=5, written=6, worker="w2")
        for faults in ([], [kill("w2", 1)], [kill("w1", -5)], [kill("w1", 6)]):
            found = evidence(first, again, faults=faults)
            assert "at-least-once within the lease" in broken(found), faults
        assert broken(evidence(first, again, faults=[kill("w1", 1)])) == {}
        for kind in ("restart", "failover"):  # faults of every worker at once
            everyone = Fault(kind, None, at(1), at(3))
            assert broken(evidence(first, again, faults=[everyone])) == {}

    def test_deliberate_failures_and_fenced_runs_explain_a_rerun(self) -> None:
        for outcome, reruns in [
            ("retried", invariants.Reruns(1, 0, 0)),
            ("failed", invariants.Reruns(1, 0, 0)),
            ("fenced", invariants.Reruns(0, 1, 0)),
        ]:
            first = Run(1, claimed=0, written=None, outcome=outcome)
            again = Run(1, attempt=2, claimed=5, written=6)
            found = evidence(first, again)
            assert broken(found) == {}, outcome
            assert invariants.count_reruns(found) == reruns

    def test_a_run_that_never_finished_needs_a_fault(self) -> None:
        lone = Run(1, written=None, outcome="started")
        found = evidence(lone)
        found.final[1] = FinalJob(1, None, "dead", reason="max attempts exceeded")
        assert "at-least-once within the lease" in broken(found)
        found.faults = [kill("w1", 0.5)]
        assert broken(found) == {}

    def test_attempts_past_the_limit_repeated_or_shared_tokens_are_caught(self) -> None:
        token = uuid.uuid4()
        runs = [
            Run(1, attempt=7, max_attempts=5, claimed=0, written=None, outcome="retried"),
            Run(1, attempt=7, max_attempts=5, claimed=2, written=3),
            Run(2, token=token),
            Run(3, token=token),
        ]
        violations = broken(evidence(*runs))["attempts"]
        assert any("attempt 7 of 5" in v for v in violations)
        assert any("do not increase" in v for v in violations)
        assert any("ran twice" in v for v in violations)

    def test_s27_a_poison_job_must_end_dead_with_a_readable_reason(self) -> None:
        runs = [Run(1, outcome="poison", written=None), Run(2, outcome="poison", written=None)]
        found = evidence(*runs, Run(3))
        found.final[1] = FinalJob(1, None, "dead", reason="max attempts exceeded", poison=True)
        found.final[2] = FinalJob(2, None, "dead", reason="failed", poison=True)
        assert broken(found) == {}
        found.final[2] = FinalJob(2, None, "dead", reason=" ", poison=True)
        found.final[4] = FinalJob(4, None, "done", poison=True)
        found.committed[4] = None
        violations = broken(found)["poison dead-lettered"]
        assert any("job 2 is dead without a readable reason" in v for v in violations)
        assert any("job 4 ended done" in v for v in violations)

    def test_s27_a_poison_run_explains_the_next_run_but_no_fault_hits_a_worker(self) -> None:
        first = Run(1, claimed=0, written=None, outcome="poison")
        again = Run(1, attempt=2, claimed=5, written=None, outcome="poison")
        found = evidence(first, again)
        found.final[1] = FinalJob(1, None, "dead", reason="max attempts exceeded", poison=True)
        assert broken(found) == {}
        assert invariants.count_reruns(found) == invariants.Reruns(1, 0, 0)
        lone = Run(2, written=None, outcome="started")
        found = evidence(lone, faults=[Fault("poison", None, at(0), at(0.1))])
        found.final[2] = FinalJob(2, None, "dead", reason="max attempts exceeded")
        assert "at-least-once within the lease" in broken(found)

    def test_s32_a_cancelled_job_ends_cancelled_and_never_runs_again(self) -> None:
        heard = Run(1, claimed=0, written=None, outcome="cancelled")
        found = evidence(heard, cancelled={1: at(0.5)})
        found.final[1] = FinalJob(1, None, "dead", reason="cancelled")
        assert broken(found) == {}
        # Its completion inside the fence came first: it stands.
        finished = Run(2, claimed=0, written=0.6)
        assert broken(evidence(finished, cancelled={2: at(0.5)})) == {}
        again = Run(1, attempt=2, claimed=3, written=4, worker="w2")
        found = evidence(heard, again, cancelled={1: at(0.5)})
        found.final[1] = done(again)
        violations = broken(found)["cancellations"]
        assert any("claimed again (attempt 2) after its cancel" in v for v in violations)
        found = evidence(heard, cancelled={1: at(0.5)})
        found.final[1] = FinalJob(1, None, "dead", reason="max attempts exceeded")
        assert "died as 'max attempts exceeded'" in broken(found)["cancellations"][0]
        found.final[1] = FinalJob(1, None, "pending")
        assert any("ended pending" in v for v in broken(found)["cancellations"])

    def test_s34_s35_the_limited_key_over_its_concurrency_or_rate_is_caught(self) -> None:
        runs = [Run(n, claimed=n * 0.2, written=n * 0.2 + 0.3) for n in range(1, 9)]
        assert broken(evidence(*runs, limited={run.job_id for run in runs})) == {}
        crowded = [Run(10 + n, claimed=n * 0.01, written=1.0) for n in range(3)]
        found = evidence(*crowded, limited={run.job_id for run in crowded})
        assert "3 jobs of the limited key ran at once" in broken(found)["limits"][0]
        fast = [Run(20 + n, claimed=n * 0.05, written=n * 0.05 + 0.01) for n in range(11)]
        found = evidence(*fast, limited={run.job_id for run in fast})
        assert "11 claims of the limited key" in broken(found)["limits"][0]

    def test_a_worker_that_exited_by_itself_fails_the_run(self) -> None:
        found = evidence(Run(1), worker_exits=["w1 exited by itself with status 1"])
        assert broken(found) == {"workers survive faults": ("w1 exited by itself with status 1",)}

    @staticmethod
    def pin(
        before: int,
        after: int,
        *,
        unjudged: str | None = None,
        floors: bool = True,
        from_start: int | None = None,
    ) -> Any:
        return facts.PinSample(
            "idle", at(1), at(26), before, after, floors, 4000, unjudged, from_start
        )

    def test_s42_a_claim_that_grew_past_twice_its_cost_under_a_pin_is_caught(self) -> None:
        slack = invariants.PIN_SLACK_BUFFERS
        within = evidence(Run(1), pins=[self.pin(30, 60 + slack), self.pin(20, 20)])
        assert broken(within) == {}
        assert next(v for v in judge(within) if v.name.startswith("claim cost")).checked == 2
        grown = evidence(Run(1), pins=[self.pin(30, 61 + slack, floors=False)])
        [violation] = broken(grown)["claim cost under a held horizon"]
        assert f"read {61 + slack} buffers at its end, 30 at its start" in violation
        assert "from each queue's start" in violation and "4000 dead rows" in violation

    def test_s42_past_twice_its_cost_a_claim_from_floors_must_spare_two_thirds_of_the_walk(
        self,
    ) -> None:
        """Open writers hold the floors back to their start: past the bound, the claim
        from the floors holds while it reads at most a third of the claim from the start."""
        slack = invariants.PIN_SLACK_BUFFERS
        spared = evidence(Run(1), pins=[self.pin(19, 106, from_start=318)])
        assert broken(spared) == {}
        walked = evidence(Run(1), pins=[self.pin(19, 106, from_start=317)])
        [violation] = broken(walked)["claim cost under a held horizon"]
        assert "read 106 buffers at its end (from each queue's start: 317), 19 at its" in violation
        assert f"(at most {2 * 19 + slack})" in violation
        unknown = evidence(Run(1), pins=[self.pin(19, 106, floors=False)])
        assert broken(unknown) != {}  # no claim from the floors: nothing spared it

    def test_s42_a_pin_cut_short_is_not_judged(self) -> None:
        found = evidence(Run(1), pins=[self.pin(30, 5000, unjudged="cut short")])
        assert broken(found) == {}
        assert next(v for v in judge(found) if v.name.startswith("claim cost")).checked == 0

    def test_a_pin_explains_no_rerun(self) -> None:
        first = Run(1, outcome="started", claimed=0, written=None)
        second = Run(1, attempt=2, claimed=5, written=6, worker="w2")
        pinned = Fault("pin", None, at(0), at(4))
        found = evidence(first, second, faults=[pinned])
        assert any(
            "no fault hit that worker" in v for v in broken(found)["at-least-once within the lease"]
        )


class TestConfig:
    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"faults": ("kill", "meteor")}, "unknown faults meteor"),
            ({"faults": ("restart",)}, "--allow-db-restart"),
            ({"faults": ("failover",)}, "--failover CMD"),
            ({"workers": 0}, "at least one worker"),
            ({"duration": 0}, "more than 0"),
            ({"lease": 0}, "at least 1"),
            ({"pin_s": 0}, "a pin must last"),
            ({"pin_churn": -1}, "a pin must last"),
        ],
    )
    def test_bad_settings_are_refused_with_the_reason(
        self, changes: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            ChaosConfig(**changes)


class TestFaultDealing:
    """The faults of a run are dealt in shuffled rounds: a short run meets every kind (a draw
    with replacement left one out in some 2 % of CI's 12 s runs)."""

    def faults(self, kinds: tuple[str, ...], seed: int, failover: str = "true") -> Any:
        from random import Random

        from django_pgjobs.chaos.faults import Faults
        from django_pgjobs.chaos.state import RunState

        # A command is needed for a restart or a failover; it is run only where said.
        config = ChaosConfig(
            faults=kinds,
            restart_command="true" if "restart" in kinds else None,
            failover_command=failover if "failover" in kinds else None,
        )
        state = RunState(config, "r", "chaos.r", "default", Random(seed), lambda _line: None)
        return Faults(state, workers=None, load=None)  # type: ignore[arg-type]

    @pytest.mark.parametrize("seed", range(20))
    def test_every_round_deals_each_kind_once(self, seed: int) -> None:
        kinds = ("kill", "stop", "terminate", "ghost", "poison", "cancel")
        faults = self.faults(kinds, seed)
        dealt = [faults.next_kind() for _ in range(len(kinds) * 4)]
        for start in range(0, len(dealt), len(kinds)):
            assert sorted(dealt[start : start + len(kinds)]) == sorted(kinds)

    def test_the_same_seed_deals_the_same_faults(self) -> None:
        kinds = ("kill", "stop", "ghost", "poison")
        first, second = self.faults(kinds, 7), self.faults(kinds, 7)
        assert [first.next_kind() for _ in range(12)] == [second.next_kind() for _ in range(12)]

    @pytest.mark.django_db(transaction=True)  # the fault closes the run's connection
    def test_a_failover_command_refused_once_is_tried_again_and_the_run_goes_on(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An HA manager may refuse a failover for a moment (pg_auto_failover's monitor met
        a deadlock of its own): tried again; refused every time, the run stops, saying so."""
        from django_pgjobs.chaos import faults as chaos_faults
        from django_pgjobs.chaos.config import ChaosAborted

        monkeypatch.setattr(chaos_faults, "COMMAND_RETRY_S", 0.0)
        flag = tmp_path / "refused-once"
        refused_once = (
            f"sh -c 'test -e {flag} || {{ touch {flag}; echo deadlock detected >&2; exit 6; }}'"
        )
        faults = self.faults(("failover", "ghost"), 1, failover=refused_once)
        faults._database_command("failover")
        assert flag.exists() and "failover" in faults._last_of
        faults = self.faults(("failover", "ghost"), 1, failover="sh -c 'echo refused >&2; exit 6'")
        with pytest.raises(ChaosAborted, match=r"failed 3 times (?s:.*)refused"):
            faults._database_command("failover")

    @pytest.mark.parametrize("kind", ["restart", "failover"])
    def test_a_restart_or_failover_too_soon_gives_way_to_the_next_kind(self, kind: str) -> None:
        faults = self.faults((kind, "ghost"), 1)
        faults._last_of[kind] = float("inf")  # every one is too soon after the last
        assert [faults.next_kind() for _ in range(6)] == ["ghost"] * 6

    def test_failovers_are_dealt_once_their_least_gap_has_passed(self) -> None:
        faults = self.faults(("failover", "ghost"), 3)
        faults._last_of["failover"] = float("-inf")
        dealt = [faults.next_kind() for _ in range(8)]
        assert dealt.count("failover") == 4 and dealt.count("ghost") == 4


class TestWorkflowInvariants:
    """S29-S31 judged from forged evidence: the workflows invariant sees an early child, a
    child of a dead parent that ran, a batch whose tally or callbacks are wrong."""

    def chain(self, child_claimed: float) -> Evidence:
        parent = Run(1, claimed=0, written=2)
        child = Run(2, claimed=child_claimed, written=child_claimed + 1)
        return evidence(parent, child, chains=[(1, 2)])

    def test_a_child_claimed_after_its_parent_committed_is_fine(self) -> None:
        assert broken(self.chain(child_claimed=3)) == {}

    def test_a_child_claimed_before_its_parent_committed_is_caught(self) -> None:
        violations = broken(self.chain(child_claimed=1))["workflows"]
        assert any("before its parent 1's run committed" in v for v in violations)

    def test_a_child_of_a_dead_parent_that_ran_or_lived_is_caught(self) -> None:
        found = self.chain(child_claimed=3)
        found.final[1] = FinalJob(1, None, "dead", reason="chaos: a doomed job")
        violations = broken(found)["workflows"]
        assert any("ran though its parent 1 died" in v for v in violations)
        assert any("ended done" in v for v in violations)

    def batch(self, *, member_failed: bool = False, callback_claimed: float = 5) -> Evidence:
        members = [Run(1, claimed=0, written=1), Run(2, claimed=0, written=3)]
        complete = Run(10, claimed=callback_claimed, written=callback_claimed + 1)
        success = Run(11, claimed=callback_claimed, written=callback_claimed + 1, worker="w2")
        found = evidence(*members, complete, success)
        del found.committed[10], found.committed[11]  # judged by the workflows invariant
        written = facts.BatchWritten(3, (1, 2), {"complete": 10, "success": 11})
        found.batches = [written]
        found.batch_ends = {3: facts.BatchEnd("succeeded", 2, 0)}
        if member_failed:
            found.final[2] = FinalJob(2, None, "dead", reason="chaos: a doomed job")
        return found

    def test_a_batch_that_fired_as_its_members_ended_is_fine(self) -> None:
        assert broken(self.batch()) == {}

    def test_a_batch_whose_tally_disagrees_with_its_members_is_caught(self) -> None:
        violations = broken(self.batch(member_failed=True))["workflows"]
        assert any("ended as BatchEnd(state='succeeded'" in v for v in violations)

    def test_a_callback_claimed_before_the_last_member_ended_is_caught(self) -> None:
        violations = broken(self.batch(callback_claimed=2))["workflows"]
        assert any("before its last member ended" in v for v in violations)

    def test_a_callback_that_ran_twice_or_should_not_exist_is_caught(self) -> None:
        found = self.batch()
        again = Run(10, attempt=2, claimed=8, written=9, worker="w2")
        found.executions = [*found.executions, again]  # type: ignore[list-item]
        found.final[10] = done(again)
        assert broken(found)["workflows"] == (
            "callback 10 (on complete) of batch 3 committed 2 times",
        )
        found.batch_ends = {3: facts.BatchEnd("failed", 1, 1)}
        found.final[2] = FinalJob(2, None, "dead", reason="chaos: a doomed job")
        violations = broken(found)["workflows"]
        assert any("callback 11 (on success) of batch 3 exists or ran" in v for v in violations)

    def test_a_stranded_waiting_job_is_lost(self) -> None:
        found = self.chain(child_claimed=3)
        found.final[2] = FinalJob(2, None, "waiting")
        assert any("still waiting" in v for v in broken(found)["no job lost"])
