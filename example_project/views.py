"""One page to trigger every flow of the example, and see where things stand."""

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
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


class SessionForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)


class DocumentForm(forms.Form):
    collection = forms.CharField(max_length=100, required=False)
    title = forms.CharField(max_length=200, required=False)
    text = forms.CharField(max_length=100_000, required=False)


class EntryForm(forms.Form):
    session_id = forms.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    subsystem = forms.CharField(max_length=50, required=False)
    body = forms.CharField(max_length=100_000, required=False)


class PurgeForm(forms.Form):
    # Each old event is a row made inside the request: keep a request a request.
    old_events = forms.IntegerField(min_value=0, max_value=10_000, required=False)
    batch = forms.IntegerField(min_value=1, max_value=10_000, required=False)


def _refused(form: forms.Form) -> HttpResponse:
    """400, saying what is wrong with each field."""
    problems = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
    return HttpResponseBadRequest(f"Bad input: {problems}\n", content_type="text/plain")


@require_POST
def create_session(request: HttpRequest) -> HttpResponse:
    form = SessionForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    session = open_session(form.cleaned_data["name"] or "session")
    messages.success(request, f"Session {session.id} created; its provision job is queued.")
    return redirect("home")


@require_POST
def delete_session(request: HttpRequest, session_id: int) -> HttpResponse:
    if close_session(session_id):
        messages.success(request, f"Session {session_id} is being deleted by a job.")
    return redirect("home")


@require_POST
def create_document(request: HttpRequest) -> HttpResponse:
    form = DocumentForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    document = add_document(
        form.cleaned_data["collection"] or "handbook",
        form.cleaned_data["title"] or "untitled",
        form.cleaned_data["text"],
    )
    messages.success(request, f"Document {document.id} stored; its collection will be ingested.")
    return redirect("home")


@require_POST
def write_entry(request: HttpRequest) -> HttpResponse:
    form = EntryForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    subsystem = form.cleaned_data["subsystem"] or "memory"
    write(form.cleaned_data["session_id"] or 1, subsystem, form.cleaned_data["body"])
    messages.success(request, f"Entry written; the {subsystem} replay is (re)scheduled.")
    return redirect("home")


@require_POST
def purge(request: HttpRequest) -> HttpResponse:
    form = PurgeForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    log_events(form.cleaned_data["old_events"] or 0, age_days=40)
    schedule_purge(batch=form.cleaned_data["batch"] or 100)
    messages.success(request, "Old events logged and a purge queued.")
    return redirect("home")
