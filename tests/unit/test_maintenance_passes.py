"""The worker's maintenance thread runs its passes (sweep, table care, the floors'
lowering) each whatever the others do."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from django_pgjobs.worker.services import MaintenanceService


def test_s42_a_pass_that_fails_holds_back_none_of_the_passes_after_it() -> None:
    """A VACUUM cut by a statement timeout, at every try while the horizon holds: the
    lowering of the floors after it still runs when due, and the VACUUM stays due, to be
    tried again after the service's backoff, not after its whole interval."""
    service = MaintenanceService(using="default", sweep_interval=0, care_interval=5.0)
    ran: list[str] = []

    def care() -> None:
        ran.append("care")
        raise OperationalError("canceling statement due to statement timeout")

    service.passes = {"care": (care, 5.0), "floors": (lambda: ran.append("floors"), 10.0)}
    service.first_wait()
    service._due = dict.fromkeys(service.passes, 0.0)

    with pytest.raises(OperationalError):
        service.run_once()
    assert ran == ["care", "floors"]

    with pytest.raises(OperationalError):
        service.run_once()
    assert ran == ["care", "floors", "care"]  # the floors' next is 10 s away
    assert service._due["floors"] > service._due["care"]
