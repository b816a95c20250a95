"""One page to trigger every flow of the example, and see where things stand."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_pgjobs.models import Job
from example_project.agent_sessions.models import AgentSession
from example_project.agent_sessions.services import close_session, open_session
from example_project.ingestion.models import Document
from example_project.ingestion.services import add_document
from example_project.purge.models import Event
from example_project.purge.services import log_events, schedule_purge
from example_project.replay.models import Watermark
from example_project.replay.services import write


def home(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "example/home.html",
        {
            "sessions": AgentSession.objects.order_by("-id")[:10],
            "documents": Document.objects.select_related("collection").order_by("-id")[:10],
            "watermarks": Watermark.objects.order_by("session_id", "subsystem")[:10],
            "events": Event.objects.count(),
            "overview": Job.objects.overview(),
        },
    )


@require_POST
def create_session(request: HttpRequest) -> HttpResponse:
    session = open_session(request.POST.get("name") or "session")
    messages.success(request, f"Session {session.id} created; its provision job is queued.")
    return redirect("home")


@require_POST
def delete_session(request: HttpRequest, session_id: int) -> HttpResponse:
    if close_session(session_id):
        messages.success(request, f"Session {session_id} is being deleted by a job.")
    return redirect("home")


@require_POST
def create_document(request: HttpRequest) -> HttpResponse:
    document = add_document(
        request.POST.get("collection") or "handbook",
        request.POST.get("title") or "untitled",
        request.POST.get("text") or "",
    )
    messages.success(request, f"Document {document.id} stored; its collection will be ingested.")
    return redirect("home")


@require_POST
def write_entry(request: HttpRequest) -> HttpResponse:
    session_id = int(request.POST.get("session_id") or 1)
    subsystem = request.POST.get("subsystem") or "memory"
    write(session_id, subsystem, request.POST.get("body") or "")
    messages.success(request, f"Entry written; the {subsystem} replay is (re)scheduled.")
    return redirect("home")


@require_POST
def purge(request: HttpRequest) -> HttpResponse:
    log_events(int(request.POST.get("old_events") or 0), age_days=40)
    schedule_purge(batch=int(request.POST.get("batch") or 100))
    messages.success(request, "Old events logged and a purge queued.")
    return redirect("home")
