"""The faults `manage.py chaosjobs` deals reach its own database's clients only: a run on a
server that other databases share drops none of their connections."""

from __future__ import annotations

import psycopg
import pytest

from django_pgjobs.chaos.models import ChaosExecution
from tests.helpers import conninfo

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "pgjobs-test-chaos-target"


def test_dropped_connections_are_of_this_database_only() -> None:
    elsewhere = {**conninfo(), "dbname": "postgres"}
    with (
        psycopg.connect(**conninfo(), application_name=NAME, autocommit=True) as here,
        psycopg.connect(**elsewhere, application_name=NAME, autocommit=True) as there,
    ):
        assert ChaosExecution.objects.terminate_connections(NAME, limit=5) == 1
        with pytest.raises(psycopg.OperationalError):
            here.execute("SELECT 1")
        assert there.execute("SELECT 1").fetchone() == (1,)
