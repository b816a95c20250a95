"""What the console's actions leave in Django's admin log (LogEntry): who did what, to
which job, letter, queue or schedule, so that "Recent actions" and each object's history
page say it. One entry per object for a button on its page; one entry per bulk action,
with the count, the ids when few, and the list's filter when it acted on every match."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.http import HttpRequest

from django_pgjobs.admin.common import all_matching
from django_pgjobs.admin.databases import current
from django_pgjobs.conf import pgjobs_settings

#: A bulk action's entry names the ids it acted on up to this many; past them, the count.
LISTED_IDS = 20
#: The list's parameters that are not a filter: its page and its ordering.
_NOT_FILTERS = frozenset({"p", "o", "_changelist_filters"})
#: LogEntry.object_repr's length.
_REPR_MAX = 200


class Acted:
    """The batches of ids an action acts on (`chosen_batches`), passed through, keeping
    the first LISTED_IDS ids for its log entry."""

    def __init__(self, batches: Iterable[list[Any]]) -> None:
        self._batches = batches
        self.ids: list[Any] = []
        #: How many were chosen: the action may have changed fewer (finished jobs).
        self.chosen = 0

    def __iter__(self) -> Iterator[list[Any]]:
        for batch in self._batches:
            self.ids += batch[: LISTED_IDS + 1 - len(self.ids)]
            self.chosen += len(batch)
            yield batch


def log_one(
    request: HttpRequest,
    model: type[Model],
    object_id: Any,
    name: str,
    message: str,
    *,
    flag: int = CHANGE,
) -> None:
    """One entry for what a button did to one object (of `model`, which may be where the
    object is now: a cancelled job is a dead letter)."""
    _log(request, model, str(object_id), name, message, flag)


def log_bulk(
    request: HttpRequest,
    model: type[Model],
    message: str,
    ids: Iterable[Any],
    count: int,
    noun: tuple[str, str],
    *,
    chosen: int | None = None,
    flag: int = CHANGE,
) -> None:
    """One entry for a bulk action: `message` with "{count}" where the count of what it
    changed and `noun` go ("Cancelled {count}"), then the filter the list had (an action
    on every matching row), or the first LISTED_IDS `ids` chosen, said to be the chosen
    ones when the action changed fewer than the `chosen`. An action that changed nothing
    leaves no entry."""
    if count == 0:
        return
    listed: list[str] = []
    for object_id in ids:
        if len(listed) == LISTED_IDS:
            break
        listed.append(f"#{object_id}" if isinstance(object_id, int) else str(object_id))
    words = f"{count:,} {noun[0] if count == 1 else noun[1]}"
    text = message.format(count=words)
    chosen = count if chosen is None else chosen
    if all_matching(request):
        text += f", every one matching the list's filter: {list_filter(request)}"
    elif listed:
        more = ", …" if chosen > len(listed) else ""
        of = ": " if chosen == count else f" of {chosen:,} chosen: "
        text += of + ", ".join(listed) + more
    _log(request, model, None, words, text + ".", flag)


def list_filter(request: HttpRequest) -> str:
    """The list's filter as its query string says it ("state=pending, queue=mail"), or
    "none" (every row)."""
    pairs = [
        f"{name}={value}"
        for name, values in sorted(request.GET.lists())
        if name not in _NOT_FILTERS
        for value in values
    ]
    return ", ".join(pairs) if pairs else "none (every row)"


def database_tag(database: str | None = None) -> str:
    """What an entry's message ends with when it is of a database other than the jobs
    database (PGJOBS["QUEUE_DATABASES"]: ids are each database's own), else nothing."""
    database = database or current()
    return "" if database == pgjobs_settings.DATABASE else f" (database {database})"


def _log(
    request: HttpRequest,
    model: type[Model],
    object_id: str | None,
    name: str,
    message: str,
    flag: int,
) -> None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return  # the admin's views are for staff only; a test's bare request has none
    message += database_tag()
    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(model, for_concrete_model=False),
        object_id=object_id,
        object_repr=name[:_REPR_MAX],
        action_flag=flag,
        change_message=message,
    )
