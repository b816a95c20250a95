"""The worker's fast path inside a caller's transaction: its bookkeeping keeps the caller's
commit mode (asynchronous commits of its own: concurrency/test_fast_path.py)."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_pgjobs.models import Job
from tests.helpers import execute, scalar

pytestmark = pytest.mark.django_db


def test_bookkeeping_inside_a_callers_transaction_keeps_its_commit_mode() -> None:
    Job.objects.enqueue("demo.t")
    with transaction.atomic():
        execute("SET LOCAL synchronous_commit = on")
        (handle,) = Job.objects.claim_batch("default", 1, "w")
        assert scalar("SHOW synchronous_commit") == "on"
        assert handle.ack()
        assert scalar("SHOW synchronous_commit") == "on"
