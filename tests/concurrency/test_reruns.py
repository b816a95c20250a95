"""S3: the rerun a trigger leaves on a running job wakes the listening workers when the
ack commits. Reruns whichever way a run ends: unit/test_reruns.py."""

from __future__ import annotations

import pytest

from django_pgjobs.claims import JobHandle
from django_pgjobs.models import Job

pytestmark = pytest.mark.django_db


def running_with_trigger(**enqueue_options: object) -> JobHandle:
    Job.objects.enqueue("demo.sync", {"v": 1}, key="acct:1", **enqueue_options)
    handle = Job.objects.claim_one("default", "w1")
    assert handle is not None
    merged = Job.objects.enqueue("demo.sync", {"v": 2}, key="acct:1")
    assert merged == (handle.id, False)
    return handle


@pytest.mark.django_db(transaction=True)
def test_s3_rerun_after_ack_wakes_the_workers() -> None:
    from tests.helpers import other_connection

    handle = running_with_trigger()
    with other_connection() as listener:
        listener.execute("LISTEN pgjobs")
        assert handle.ack()
        assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["default"]
