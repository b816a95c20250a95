"""Which database the console shows, with PGJOBS["QUEUE_DATABASES"]: each database has
queues, jobs, dead letters, workers and batches of its own (and ids of its own: job 5 of
one is not job 5 of another). A page's URL names its database (`?db=jobs_a`; none: the
jobs database, PGJOBS["DATABASE"]), its links carry it on, and its view reads and acts
on that database alone. With one database, nothing of this shows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any
from urllib.parse import parse_qs, urlencode

from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern, reverse

from django_pgjobs.conf import pgjobs_settings
from django_pgjobs.db import connection as db

#: The query parameter that names the console's database.
PARAMETER = "db"
#: What a link to the same page in another database leaves behind: the database, the
#: page, and what names jobs by id (a filter of edges, the search).
NOT_CARRIED = frozenset({PARAMETER, "p", "parents_of", "children_of", "q", "after"})


def chosen_database(request: HttpRequest) -> str | HttpResponse | None:
    """The database a request's URL names (None: the jobs database), from `?db=` or,
    on an object's page reached from a list, from the list's preserved filters; a 400
    that lists the databases for any other name."""
    value = request.GET.get(PARAMETER)
    if value is None and "_changelist_filters" in request.GET:
        preserved = parse_qs(request.GET["_changelist_filters"]).get(PARAMETER)
        value = preserved[0] if preserved else None
    if value is None or value == pgjobs_settings.DATABASE:
        return None
    databases = pgjobs_settings.databases()
    if value not in databases:
        return HttpResponseBadRequest(
            f"db is one of the databases that hold jobs: {', '.join(databases)}.",
            content_type="text/plain",
        )
    return value


def in_chosen_database(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """`view` run in the database its request's URL names, its page rendered there too
    (a list's columns and an object page's fields are worked out as the template renders,
    after the view returns)."""

    @wraps(view)
    def run(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is None or not (user.is_active and user.is_staff):
            return view(request, *args, **kwargs)  # the admin's login: no database named
        database = chosen_database(request)
        if isinstance(database, HttpResponse):
            return database
        with db.console_database(database):
            response = view(request, *args, **kwargs)
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
            return response

    return run


def current() -> str:
    """The database the console's current view shows."""
    return db.default_alias()


def several() -> bool:
    return len(pgjobs_settings.databases()) > 1


def console_url(
    viewname: str, args: tuple[Any, ...] | list[Any] = (), query: Mapping[str, Any] | None = None
) -> str:
    """A console page's URL in the current view's database (`?db=` when it is not the
    jobs database), with `query`."""
    parameters = dict(query or {})
    if current() != pgjobs_settings.DATABASE:
        parameters[PARAMETER] = current()
    url = reverse(viewname, args=list(args))
    return f"{url}?{urlencode(parameters)}" if parameters else url


def database_context(request: HttpRequest, *, switch: bool = True) -> dict[str, Any]:
    """What a page says of its database, with several: which it shows and (`switch`: a
    list's page, not an object's, whose id means another object in another database) a
    link to the same page in each; and the query its links to other pages carry."""
    if not several():
        return {"pgjobs_databases": [], "pgjobs_db_query": ""}
    shown = current()
    query = "" if shown == pgjobs_settings.DATABASE else f"?{urlencode({PARAMETER: shown})}"
    # Ids are each database's own: a filter or search that names one stays behind.
    kept = {k: v for k, v in request.GET.items() if k not in NOT_CARRIED}
    choices = []
    for alias in pgjobs_settings.databases():
        parameters = dict(kept)
        if alias != pgjobs_settings.DATABASE:
            parameters[PARAMETER] = alias
        url = f"{request.path}?{urlencode(parameters)}" if parameters else request.path
        if switch or alias == shown:
            choices.append({"alias": alias, "url": url, "current": alias == shown})
    return {"pgjobs_databases": choices, "pgjobs_database": shown, "pgjobs_db_query": query}


class ConsoleChangeList(ChangeList):
    """A list that reads `db` as its database, not as a filter."""

    def get_filters_params(self, params: Any = None) -> Any:
        lookup = super().get_filters_params(params)
        lookup.pop(PARAMETER, None)
        return lookup


class InChosenDatabase:
    """A ModelAdmin whose every view (lists, object pages, actions, its own URLs) reads
    and acts on the database its URL names."""

    @property
    def urls(self) -> list[URLPattern]:
        """Every URL of the ModelAdmin, its own views' too (a subclass's get_urls adds
        them), each run in the database its request names."""
        patterns: list[URLPattern] = self.get_urls()  # type: ignore[attr-defined]
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = in_chosen_database(pattern.callback)
        return patterns

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return queryset.using(current())

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ConsoleChangeList

    def get_preserved_filters(self, request: HttpRequest) -> str:
        """The list's filters an object page's links keep (breadcrumbs, history, the
        redirect after a save), with the page's database when it was named by `?db=`."""
        preserved: str = super().get_preserved_filters(request)  # type: ignore[misc]
        if current() == pgjobs_settings.DATABASE or f"{PARAMETER}%3D" in preserved:
            return preserved
        if preserved:
            inner = parse_qs(preserved)["_changelist_filters"][0]
            return urlencode({"_changelist_filters": f"{inner}&{PARAMETER}={current()}"})
        return urlencode({"_changelist_filters": f"{PARAMETER}={current()}"})

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**database_context(request), **(extra_context or {})}
        return super().changelist_view(request, context)  # type: ignore[misc,no-any-return]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {**database_context(request, switch=False), **(extra_context or {})}
        if context["pgjobs_databases"]:  # Django's breadcrumbs lead to the list of none
            opts = self.model._meta  # type: ignore[attr-defined]
            list_url = console_url(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            context["pgjobs_list_url"] = list_url
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc,no-any-return]
