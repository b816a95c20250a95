"""What the console's pages share: how values read (times, JSON, errors, progress), the
capped paginator, and the refusals (a bad query, an action this user may not run)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import display, helpers
from django.contrib.admin.filters import FieldListFilter, ListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ERROR_FLAG, IGNORED_PARAMS, PAGE_VAR
from django.core.paginator import Paginator
from django.db.models import DateTimeField, Max, Model, QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.utils import formats, timezone
from django.utils.dateparse import parse_datetime
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs import labels
from django_pgjobs.admin.databases import PARAMETER as DATABASE_PARAMETER
from django_pgjobs.admin.databases import ConsoleChangeList
from django_pgjobs.admin.rows import results_table
from django_pgjobs.models import Job
from django_pgjobs.records import COUNT_CAP


def pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


#: How the console writes an exact time: to the second, with its time zone. (The
#: project's DATETIME_FORMAT, Django's default for its pages, reads "Dec. 1, 2026, 10 p.m.":
#: two attempts 5 s apart read the same.)
EXACT_FORMAT = "Y-m-d H:i:s T"


def exact_time(value: Any) -> str:
    """A stored time (a datetime or the ISO text of an error entry) as the console writes
    every exact time: in the current time zone, to the second, "2026-12-01 22:00:05 UTC"."""
    moment = parse_datetime(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        return str(value or "-")
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return formats.date_format(moment, EXACT_FORMAT)


def relative_time(moment: datetime | None, delta: timedelta | None) -> SafeString:
    """A time in a list: how far it is from now ("3 min ago", "in 5 s"; `delta` is
    `moment` less now, on the database's clock), with the exact time on hover."""
    if moment is None:
        return mark_safe("-")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        moment.isoformat(),
        exact_time(moment),
        labels.ago(delta) if delta is not None else exact_time(moment),
    )


class ExactTimes:
    """For a ModelAdmin whose object page is read-only: every date-time field on it reads
    exactly (`exact_time`), each shown through a `<name>_exact` of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model: type[Model] = self.model  # type: ignore[attr-defined]
        fields = [field for field in model._meta.fields if isinstance(field, DateTimeField)]
        self._exact = {field.name: f"{field.name}_exact" for field in fields}
        for field in fields:
            setattr(self, self._exact[field.name], _exact_field(field.name, field.verbose_name))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        return [
            (name, {**options, "fields": [self._exact.get(f, f) for f in options["fields"]]})
            for name, options in fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        return [*readonly, *self._exact.values()]


def _exact_field(name: str, label: Any) -> Any:
    @display(description=label)
    def shown(obj: Any) -> str:
        return exact_time(getattr(obj, name))

    return shown


def error_history(errors: list[dict[str, Any]] | None) -> SafeString:
    """Every failed attempt, newest first, each traceback folded under its error."""
    if not errors:
        return mark_safe("<p>No failed attempt.</p>")
    rows = format_html_join(
        "",
        '<tr><td>{}</td><td class="nowrap">{}</td><td>{}</td><td><strong>{}</strong>'
        '<details><summary>traceback</summary><pre class="pgjobs-traceback">{}</pre>'
        "</details></td></tr>",
        (
            (
                entry.get("attempt"),
                exact_time(entry.get("at")),
                entry.get("worker_id") or "",
                entry.get("error"),
                entry.get("traceback") or "(none recorded)",
            )
            for entry in reversed(errors)
        ),
    )
    return format_html(
        '<table class="pgjobs-errors"><thead><tr><th>attempt</th><th>at</th><th>worker</th>'
        "<th>error</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


def latest_traceback(errors: list[dict[str, Any]] | None) -> SafeString:
    """The last failed attempt's traceback, in full and wrapping."""
    for entry in reversed(errors or []):
        if entry.get("traceback"):
            return format_html('<pre class="pgjobs-traceback">{}</pre>', entry["traceback"])
    return mark_safe("-")


def progress_bar(progress: dict[str, Any] | None, *, wide: bool = False) -> SafeString:
    """A running job's last progress report as a bar: its fraction (or data's done of
    total), its message, and (wide) when it came."""
    if not isinstance(progress, dict):
        return mark_safe("")
    fraction, text = _progress_parts(progress)
    if wide and progress.get("at"):
        text = " · ".join(part for part in (text, f"reported {exact_time(progress['at'])}") if part)
    text = text or "working"
    if fraction is None:
        return format_html('<span class="pgjobs-progress-text">{}</span>', text)
    percent = round(fraction * 100)
    return format_html(
        '<span class="pgjobs-progress{}" title="{}"><span class="pgjobs-progress-bar">'
        '<span style="width:{}%"></span></span> {}%{}</span>',
        " pgjobs-progress-wide" if wide else "",
        text,
        percent,
        percent,
        format_html(" · {}", text) if wide else "",
    )


def progress_words(progress: dict[str, Any] | None) -> str:
    """A progress report in words ("60 % · 6 of 10 · resizing"), or "" for none."""
    if not isinstance(progress, dict):
        return ""
    fraction, text = _progress_parts(progress)
    percent = f"{round(fraction * 100)} %" if fraction is not None else ""
    return " · ".join(part for part in (percent, text) if part)


def _progress_parts(progress: dict[str, Any]) -> tuple[float | None, str]:
    """A progress report's fraction (its own, or data's done of total) and its words (done
    of total, message)."""
    data = progress.get("data")
    counts: dict[str, Any] = data if isinstance(data, dict) else progress
    done, total = _number(counts.get("done")), _number(counts.get("total"))
    fraction = _number(progress.get("fraction"))
    if fraction is None and done is not None and total:
        fraction = min(max(done / total, 0.0), 1.0)
    parts = []
    if done is not None and total is not None:
        parts.append(f"{done:,g} of {total:,g}")
    if progress.get("message"):
        parts.append(str(progress["message"]))
    return fraction, " · ".join(parts)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


#: The largest job id (bigint): a search for a larger number finds no id.
JOB_ID_MAX = 2**63 - 1


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator that never counts millions of rows: past a cap, it estimates."""

    @cached_property
    def count(self) -> int:
        return Job.objects.capped_count(self.object_list)  # type: ignore[arg-type]


class JobChangeList(ConsoleChangeList):
    """A list of jobs as a page of 50 needs it: without the JSON columns a job may fill
    with megabytes (payload, result, errors, rerun payload), its rows written in one
    pass (`rows`)."""

    #: The columns no list shows.
    deferred = ("payload", "result", "errors", "rerun_payload")

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        return super().get_queryset(request, exclude_parameters).defer(*self.deferred)

    def results_table(self) -> SafeString:
        return results_table(self)


def refuse_bad_params(request: HttpRequest) -> HttpResponse | None:
    """A 400 for a query no column can hold (NUL) or too long to be a search."""
    for values in request.GET.lists():
        for value in values[1]:
            if "\x00" in value or len(value) > 1000:
                return HttpResponseBadRequest(
                    "A filter or search value holds a NUL character or is too long.",
                    content_type="text/plain",
                )
    return None


#: What every list takes besides its filters: Django's own search, order, page, "show
#: all", popup and facets parameters, and its error flag.
LIST_PARAMETERS = frozenset({*IGNORED_PARAMS, PAGE_VAR, ERROR_FLAG, DATABASE_PARAMETER})


def offered_parameters(model_admin: admin.ModelAdmin, request: HttpRequest) -> frozenset[str]:  # type: ignore[type-arg]
    """The query parameters a list offers: its filters' (as each filter names them) and
    Django's own (LIST_PARAMETERS); nothing else reaches a query."""
    names = set(LIST_PARAMETERS)
    for item in model_admin.get_list_filter(request):
        if isinstance(item, type) and issubclass(item, ListFilter):
            names.add(item.parameter_name)  # type: ignore[attr-defined]
            continue
        path, make = item if isinstance(item, list | tuple) else (item, FieldListFilter.create)
        field = get_fields_from_path(model_admin.model, str(path))[-1]
        # A field's filter names its parameters as it is made; made with no parameters,
        # it reads nothing (the choices are read only when the sidebar is drawn).
        spec = make(field, request, {}, model_admin.model, model_admin, field_path=str(path))  # type: ignore[operator]
        names.update(name for name in spec.expected_parameters() if name)
    return frozenset(names)


class OfferedFiltersOnly:
    """A list that filters only as its sidebar offers (`offered_parameters`): Django's
    default admits any lookup on any local field from the URL (`?payload__icontains=`),
    a scan of every row for whoever may view the list."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in offered_parameters(self, request)  # type: ignore[arg-type]


def refuse_unoffered_filters(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
) -> HttpResponse | None:
    """A 400 for a query parameter the list does not offer, before anything is read."""
    offered = offered_parameters(model_admin, request)
    unknown = sorted(name for name in request.GET if name not in offered)
    if not unknown:
        return None
    filters = sorted(offered - LIST_PARAMETERS)
    return HttpResponseBadRequest(
        f"{str(unknown[0])[:100]!r} is not one of this list's filters, which are: "
        f"{', '.join(filters) or 'none'} (and the search box). Nothing was read.",
        content_type="text/plain",
    )


def refuse_action(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse | None:  # type: ignore[type-arg]
    """A POSTed action this user may not run: refused with a message, nothing changed."""
    name = request.POST.get("action") if request.method == "POST" else None
    if not name or name in model_admin.get_actions(request):
        return None
    model_admin.message_user(
        request,
        f"Refused: you may not run “{name}” on {model_admin.model._meta.verbose_name_plural}; "
        "nothing was changed.",
        messages.ERROR,
    )
    return HttpResponseRedirect(request.get_full_path())


def job_id_of(object_id: str) -> int:
    if not (object_id.isascii() and object_id.isdigit()) or int(object_id) > JOB_ID_MAX:
        return 0
    return int(object_id)


def jobs_word(count: int) -> str:
    return "job" if count == 1 else "jobs"


#: Jobs per statement when an action applies to more than a page of jobs.
ACTION_BATCH = 1000

#: The field of a filter-wide confirmation that bounds what the confirmed action acts
#: on: the largest id matching the filter when the count was shown.
UPTO_FIELD = "pgjobs_upto"


def all_matching(request: HttpRequest) -> bool:
    """Whether the action is for every row matching the list's filter ("select all"),
    read as Django's action form reads it (any value but "", "0" or "false")."""
    value = request.POST.get("select_across")
    return bool(forms.BooleanField(required=False).to_python(value))


def confirmation(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    action: str,
    question: str,
    title: str,
    explanation: str,
    button: str,
) -> TemplateResponse:
    """The page that states how many jobs an action is about to change, and asks:
    `question` with "{jobs}" where the count goes ("Cancel {jobs}").

    For the page's ticked rows, it carries their ids. For every row matching the filter,
    it counts them (past COUNT_CAP, the planner's estimate) and carries the largest id
    among them: the confirmed action acts on the matching jobs up to that id only
    (`chosen_batches`), never on jobs that came after the count was shown.
    """
    across = all_matching(request)
    ids: list[Any] = []
    upto = None
    if across:
        total = Job.objects.capped_count(queryset)
        upto = queryset.order_by().aggregate(upto=Max("id"))["upto"] or 0
        ids = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)  # says "there was one"
    else:
        ids = list(queryset.order_by("id").values_list("id", flat=True))
        total = len(ids)
    estimated = total > COUNT_CAP
    return TemplateResponse(
        request,
        "admin/django_pgjobs/action_confirmation.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": title,
            "opts": model_admin.model._meta,
            "action": action,
            "explanation": explanation,
            "button": button,
            "jobs": queryset.order_by("id")[:20],
            "count": total,
            "question": question.format(
                jobs=f"{'about ' if estimated else ''}{total:,} {jobs_word(total)}"
            ),
            "more_label": f"about {total - 20:,}" if estimated else f"{total - 20:,}",
            "batch": f"{ACTION_BATCH:,}",
            "select_across": across,
            "ids": ids,
            "upto_field": UPTO_FIELD,
            "upto": upto,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        },
    )


def confirmed(request: HttpRequest) -> bool:
    """Whether the POST is the answer of the confirmation page."""
    return request.POST.get("confirmed") == "yes"


def confirmed_bound(request: HttpRequest) -> int | None:
    """The largest id a filter-wide confirmation showed, or None if the POST has no
    valid one (a forged or stale form: the action is then refused)."""
    value = request.POST.get(UPTO_FIELD, "")
    if not (value.isascii() and value.isdigit()) or int(value) > JOB_ID_MAX:
        return None
    return int(value)


def chosen_batches(
    model_admin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    queryset: QuerySet[Any],
) -> Iterator[list[int]] | None:
    """The ids a confirmed action acts on, ACTION_BATCH at a time, so that no statement
    holds a million locks: the page's ticked rows, or (filter-wide) the rows matching
    the filter up to the largest id its confirmation showed, read a batch at a time in
    id order. None, with a message saying the action was refused, for a filter-wide
    POST without a valid bound (a stale or altered form)."""
    ordered = queryset.order_by("id").values_list("id", flat=True)
    if not all_matching(request):
        ids = list(ordered)
        return iter(
            [ids[start : start + ACTION_BATCH] for start in range(0, len(ids), ACTION_BATCH)]
        )
    upto = confirmed_bound(request)
    if upto is None:
        model_admin.message_user(
            request,
            "Refused: this confirmation does not say up to which job it counted (a stale "
            "or altered form); nothing was changed. Run the action again.",
            messages.ERROR,
        )
        return None
    return _walk(ordered, upto)


def _walk(ordered: QuerySet[Any], upto: int) -> Iterator[list[int]]:
    last = 0
    while last < upto:
        batch = list(ordered.filter(id__gt=last, id__lte=upto)[:ACTION_BATCH])
        if not batch:
            return
        yield batch
        last = batch[-1]
