"""Queue controls: pause and resume, and a limit on a queue's running jobs across every
replica, enforced at claim time by the database; `manage.py jobsctl`. Real runjobs
processes under pauses and limits: processes/test_queue_controls.py."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_pgjobs.exceptions import InvalidJobOption
from django_pgjobs.models import Job, QueueControl
from tests.helpers import count, execute, run_threads

pytestmark = pytest.mark.django_db(transaction=True)

RUNNING = "SELECT count(*) FROM pgjobs_job WHERE queue = %s AND state = 'running'"
# A running job whose lease lapsed holds no slot (its worker is presumed dead).
HOLDING = RUNNING + " AND claimed_until > now()"


def claim(queues: list[str], n: int = 10, worker_id: str = "w") -> list[int]:
    return [handle.id for handle in Job.objects.claim_batch(queues, n, worker_id)]


class TestPause:
    def test_a_paused_queue_is_claimed_by_no_replica_and_still_takes_enqueues(self) -> None:
        assert QueueControl.objects.pause("mail") == ["mail"]
        mail = [Job.objects.enqueue("demo.mail", queue="mail").id for _ in range(8)]
        other = Job.objects.enqueue("demo.other", queue="other").id
        claimed = run_threads(4, lambda i: claim(["mail", "other"], worker_id=f"replica-{i}"))
        assert sorted(id_ for ids in claimed for id_ in ids) == [other]
        assert count(where="queue = 'mail' AND state = 'pending'") == 8
        assert QueueControl.objects.resume("mail") == ["mail"]
        claimed = run_threads(4, lambda i: claim(["mail"], 2, worker_id=f"replica-{i}"))
        assert sorted(id_ for ids in claimed for id_ in ids) == mail

    def test_pause_and_resume_say_what_they_changed(self) -> None:
        assert QueueControl.objects.pause(["a", "b"]) == ["a", "b"]
        first = QueueControl.objects.get(name="a").paused_at
        QueueControl.objects.pause("a")  # pausing again keeps the first pause's time
        assert QueueControl.objects.get(name="a").paused_at == first
        assert QueueControl.objects.resume(["a", "never-paused"]) == ["a"]
        assert QueueControl.objects.resume("a") == []
        assert [s.queue for s in QueueControl.objects.status() if s.paused] == ["b"]

    def test_bad_queue_names_are_refused_and_nothing_is_written(self) -> None:
        with pytest.raises(InvalidJobOption):
            QueueControl.objects.pause(["ok", ""])
        with pytest.raises(InvalidJobOption):
            QueueControl.objects.set_limit("x" * 500, 2)
        assert QueueControl.objects.count() == 0


class TestLimit:
    def test_claims_stop_at_the_limit_across_replicas(self) -> None:
        QueueControl.objects.set_limit("capped", 3)
        for _ in range(20):
            Job.objects.enqueue("demo.t", queue="capped")
        claimed = run_threads(4, lambda i: claim(["capped"], 8, worker_id=f"replica-{i}"))
        assert sum(len(ids) for ids in claimed) == 3
        assert execute(RUNNING, ["capped"])[0][0] == 3

    def test_a_limited_queue_does_not_hold_back_the_other_queues_of_a_claim(self) -> None:
        QueueControl.objects.set_limit("capped", 1)
        for queue in ("capped", "capped", "free", "free"):
            Job.objects.enqueue("demo.t", queue=queue)
        handles = Job.objects.claim_batch(["capped", "free"], 10, "w")
        assert sorted(handle.queue for handle in handles) == ["capped", "free", "free"]

    def test_finished_jobs_give_their_slots_back(self) -> None:
        QueueControl.objects.set_limit("capped", 2)
        ids = [Job.objects.enqueue("demo.t", queue="capped").id for _ in range(5)]
        first = Job.objects.claim_batch(["capped"], 5, "w")
        assert [h.id for h in first] == ids[:2]
        assert claim(["capped"]) == []
        first[0].ack()
        assert claim(["capped"]) == [ids[2]]

    def test_a_lapsed_lease_frees_its_slot(self) -> None:
        QueueControl.objects.set_limit("capped", 1)
        ids = [Job.objects.enqueue("demo.t", queue="capped", lease=1).id for _ in range(2)]
        held = Job.objects.claim_one("capped", "dead-worker")
        assert claim(["capped"]) == []
        execute(
            "UPDATE pgjobs_job SET claimed_until = now() - interval '1 second' WHERE id = %s",
            [held.id],
        )
        # The lapsed claim is rescued (attempt counted) and one job runs again: one slot.
        again = claim(["capped"])
        assert len(again) == 1 and set(again) <= set(ids)
        assert execute(HOLDING, ["capped"])[0][0] == 1

    def test_lifting_and_changing_a_limit_takes_effect_at_the_next_claim(self) -> None:
        QueueControl.objects.set_limit("capped", 1)
        for _ in range(4):
            Job.objects.enqueue("demo.t", queue="capped")
        assert len(claim(["capped"])) == 1
        assert QueueControl.objects.set_limit("capped", 2) is True
        assert QueueControl.objects.set_limit("capped", 2) is False
        assert len(claim(["capped"])) == 1
        QueueControl.objects.set_limit("capped", None)
        assert len(claim(["capped"])) == 2

    def test_a_limit_lifted_behind_the_processs_back_is_claimed_normally(self) -> None:
        QueueControl.objects.set_limit("capped", 1)
        for _ in range(3):
            Job.objects.enqueue("demo.t", queue="capped")
        assert len(claim(["capped"])) == 1  # the process learnt that "capped" has a limit
        execute("UPDATE pgjobs_queue SET max_running = NULL")  # behind the manager's back
        assert len(claim(["capped"])) == 2

    def test_a_limit_set_behind_the_processs_back_binds_the_claim_that_finds_it(
        self,
    ) -> None:
        for _ in range(4):
            Job.objects.enqueue("demo.t", queue="capped")
        assert len(claim(["capped", "other"], 1)) == 1  # "capped" has no limit, it learns
        execute(
            "INSERT INTO pgjobs_queue (name, paused, max_running, limit_from_settings)"
            " VALUES ('capped', false, 2, false)"
        )
        # The fast claim skips the queue, and says why; the same claim then takes it by
        # the limited queues' own way, within the limit.
        assert len(claim(["capped", "other"])) == 1
        assert claim(["capped", "other"]) == []  # 2 running of 2
        execute("UPDATE pgjobs_queue SET max_running = NULL")  # lifted behind its back
        assert len(claim(["capped", "other"])) == 2

    def test_a_paused_limited_queue_is_not_read_again_at_every_claim(
        self, django_assert_num_queries
    ) -> None:
        QueueControl.objects.set_limit("capped", 1)
        QueueControl.objects.pause("capped")
        Job.objects.enqueue("demo.t", queue="capped")
        other = Job.objects.enqueue("demo.t", queue="other").id
        assert claim(["capped", "other"]) == [other]
        Job.objects.enqueue("demo.t", queue="other")
        # Its turn (the queue lock, which skips it paused) and the fast claim: no list.
        with django_assert_num_queries(4):  # the transaction's two statements and its end
            assert len(claim(["capped", "other"])) == 1

    def test_limits_are_validated(self) -> None:
        for bad in (0, -1, 2.5, True, "3", 2**31):
            with pytest.raises(InvalidJobOption):
                QueueControl.objects.set_limit("capped", bad)
        assert QueueControl.objects.count() == 0

    def test_a_limit_from_settings_is_applied_by_workers_and_refused_by_set_limit(self) -> None:
        with override_settings(PGJOBS={"QUEUES": {"capped": {"MAX_RUNNING": 2}}}):
            QueueControl.objects.sync_settings()
            control = QueueControl.objects.get(name="capped")
            assert (control.max_running, control.limit_from_settings) == (2, True)
            with pytest.raises(ValueError, match="MAX_RUNNING"):
                QueueControl.objects.set_limit("capped", 5)
        QueueControl.objects.set_limit("manual", 4)
        QueueControl.objects.sync_settings()  # the setting is gone: its limit is lifted
        assert QueueControl.objects.get(name="capped").max_running is None
        assert QueueControl.objects.get(name="manual").max_running == 4


class TestJobsctl:
    def run(self, *args: str) -> str:
        out = StringIO()
        call_command("jobsctl", *args, stdout=out)
        return out.getvalue()

    def test_status_is_a_table_per_queue(self) -> None:
        with override_settings(PGJOBS={}):  # configured queues are listed even when empty
            assert "No queues yet" in self.run("status")
        Job.objects.enqueue("demo.t", queue="mail")
        Job.objects.enqueue("demo.t", queue="mail", delay=600)
        Job.objects.enqueue("demo.t", queue="reports")
        Job.objects.claim_one("reports", "w")
        self.run("pause", "mail")
        self.run("limit", "reports", "4")
        self.run("rate", "mail", "100/m")
        lines = self.run("status").splitlines()
        assert lines[0].split() == [
            "queue",
            "runnable",
            "scheduled",
            "retrying",
            "running",
            "done",
            "rate",
            "paused",
            "dead",
            "oldest",
            "runnable",
        ]
        mail = next(line for line in lines if line.startswith("mail"))
        reports = next(line for line in lines if line.startswith("reports"))
        assert mail.split()[:8] == ["mail", "1", "1", "0", "0", "0", "100/m", "yes"]
        assert reports.split()[:7] == ["reports", "0", "0", "0", "1", "of", "4"]

    def test_pause_resume_and_limit_report_what_they_did(self) -> None:
        assert "Paused mail" in self.run("pause", "--create", "mail")  # a new queue
        assert QueueControl.objects.get(name="mail").paused
        assert "Resumed mail" in self.run("resume", "mail")
        assert "Not paused" in self.run("resume", "mail")
        assert "at most 5 running." in self.run("limit", "mail", "5")
        assert "(already so)" in self.run("limit", "mail", "5")
        assert "no limit" in self.run("limit", "mail", "none")
        assert QueueControl.objects.get(name="mail").max_running is None
        assert "at most 10/s claims." in self.run("rate", "mail", "10/s")
        assert "(already so)" in self.run("rate", "mail", "10/s")
        assert QueueControl.objects.get(name="mail").rate_limit == 10
        assert "no rate." in self.run("rate", "mail", "none")
        assert QueueControl.objects.get(name="mail").rate_limit is None

    def test_bad_arguments_are_specific_errors(self) -> None:
        with pytest.raises(CommandError, match="not a limit"):
            self.run("limit", "mail", "lots")
        with pytest.raises(CommandError, match=">= 1"):
            self.run("limit", "mail", "-2")
        with (
            override_settings(PGJOBS={"QUEUES": {"mail": {"MAX_RUNNING": 2}}}),
            pytest.raises(CommandError, match="change it there"),
        ):
            self.run("limit", "mail", "3")
        with pytest.raises(CommandError, match="rate must look like '100/m'"):
            self.run("rate", "mail", "fast")
        with pytest.raises(CommandError, match="the count must be 1"):
            self.run("rate", "mail", "0/s")
        assert QueueControl.objects.count() == 0
