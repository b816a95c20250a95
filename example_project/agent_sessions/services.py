"""What the views call: each write and its job in one transaction (S1)."""

from django.db import transaction

from example_project.agent_sessions.jobs import delete_session, provision_session
from example_project.agent_sessions.models import AgentSession


def open_session(name: str) -> AgentSession:
    with transaction.atomic():
        session = AgentSession.objects.create(name=name)
        provision_session.enqueue(session_id=session.id)
    return session


def close_session(session_id: int) -> bool:
    with transaction.atomic():
        marked = AgentSession.objects.filter(pk=session_id).update(
            status=AgentSession.Status.DELETING
        )
        if marked:
            delete_session.enqueue(session_id=session_id)
    return bool(marked)
