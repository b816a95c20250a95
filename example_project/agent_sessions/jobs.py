"""Provision and delete jobs, one live job per (session, kind) thanks to their keys."""

import time

from django.db.models.functions import Now

from django_pgjobs import job
from example_project.agent_sessions.models import AgentSession


@job(queue="sessions", key=lambda p: f"session:{p['session_id']}:provision")
def provision_session(session_id: int) -> str:
    time.sleep(0.05)  # the remote side: a container, a sandbox, a model context
    updated = AgentSession.objects.filter(
        pk=session_id, status=AgentSession.Status.PROVISIONING
    ).update(status=AgentSession.Status.READY, provisioned_at=Now())
    return "ready" if updated else "gone"


@job(queue="sessions", key=lambda p: f"session:{p['session_id']}:delete")
def delete_session(session_id: int) -> str:
    time.sleep(0.02)
    deleted, _ = AgentSession.objects.filter(
        pk=session_id, status=AgentSession.Status.DELETING
    ).delete()
    return "deleted" if deleted else "gone"
