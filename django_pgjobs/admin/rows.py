"""The rows of the job lists, written in one pass: the markup of Django's own rows, at a
fraction of their cost.

Django's `items_for_result` works each cell out anew (which kind of column it is, its
empty value, the change URL reversed and the list's filters parsed again for every
row, a form widget rendered for every checkbox): 50 rows of 9 columns cost more than
all of the page's queries. Here each column is worked out once per page and each row is
a few string joins. A list with editable fields, a popup, a `to_field`, or a column
that is neither a plain field nor a method (a relation, a property) gets Django's rows.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from django.contrib.admin.templatetags import admin_list
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import display_for_field, display_for_value, quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.template.loader import select_template
from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeString, mark_safe

#: Stands for a row's id in the change page's URL, made once per page (letters only:
#: the admin's quote() leaves them as they are).
_PK = "PGJOBSROWID"


class Unsupported(Exception):
    """A column this module does not write as Django would."""


class Column:
    """One column of a list: its tag and classes, whether it holds the row's link, and
    how a value reads, decided once as Django's `items_for_result` decides per cell."""

    def __init__(self, cl: ChangeList, index: int, name: Any, *, link: bool, first: bool):
        self.link = link
        self.tag = "th" if link and first else "td"
        self.classes = f"field-{_class_name(name, index)}"
        self.empty = cl.model_admin.get_empty_value_display()
        self.field: models.Field[Any, Any] | None = None
        self.attname = ""
        self.method: Callable[[Any], Any] | None = None
        self.boolean = False
        try:
            field = cl.opts.get_field(name) if isinstance(name, str) else None
        except FieldDoesNotExist:
            field = None
        if field is not None:
            if not isinstance(field, models.Field) or field.is_relation:
                raise Unsupported(name)
            self.attname = field.attname
            if not field.auto_created:  # an implicit id reads as a value, like a method's
                self.field = field
                if isinstance(field, models.DateField | models.TimeField):
                    self.classes += " nowrap"
            return
        if name == "action_checkbox":
            self.classes = "action-checkbox"
            self.method = cl.model_admin.action_checkbox
        elif callable(name):
            self.method = name
        elif isinstance(name, str) and name != "__str__" and hasattr(cl.model_admin, name):
            self.method = getattr(cl.model_admin, name)
        else:
            raise Unsupported(name)
        self.boolean = getattr(self.method, "boolean", False)
        self.empty = getattr(self.method, "empty_value_display", self.empty)

    def cell(self, obj: Any) -> tuple[Any, str]:
        """What the cell of `obj` shows, and its classes."""
        if self.field is not None:
            value = _blank_as_empty(getattr(obj, self.attname))
            return display_for_field(value, self.field, self.empty, self.link), self.classes
        value = self.method(obj) if self.method is not None else getattr(obj, self.attname)
        value = _blank_as_empty(value)
        shown = display_for_value(value, self.empty, self.boolean)
        if isinstance(value, datetime.date | datetime.time):
            return shown, f"{self.classes} nowrap"
        return shown, self.classes


def result_rows(cl: ChangeList) -> list[admin_list.ResultList] | None:
    """The rows of `cl`'s page, each one string of its cells; None where Django's own
    rows are needed."""
    if cl.formset or cl.is_popup or cl.to_field or cl.list_display_links is None:
        return None
    links = cl.list_display_links
    columns = []
    first = True
    try:
        for index, name in enumerate(cl.list_display):
            link = (first and not links) or name in links
            columns.append(Column(cl, index, name, link=link, first=first))
            first = first and not link
    except Unsupported:
        return None
    before, after = _change_url(cl)
    rows = []
    for obj in cl.result_list:
        cells = []
        for column in columns:
            shown, classes = column.cell(obj)
            text: str = conditional_escape(shown)
            if column.link:
                pk = escape(quote(getattr(obj, cl.pk_attname)))
                text = f'<a href="{before}{pk}{after}">{text}</a>'
            cells.append(f'<{column.tag} class="{classes}">{text}</{column.tag}>')
        rows.append(admin_list.ResultList(None, [mark_safe("".join(cells))]))
    return rows


def results_table(cl: ChangeList) -> SafeString:
    """The list's table, as Django's `result_list` tag renders it: its headers and its
    template (overridable per app and model as there), these rows."""
    rows = result_rows(cl)
    if rows is None:
        context = admin_list.result_list(cl)
    else:
        headers = list(admin_list.result_headers(cl))
        context = {
            "cl": cl,
            "result_hidden_fields": [],
            "result_headers": headers,
            "num_sorted_fields": sum(1 for h in headers if h["sortable"] and h["sorted"]),
            "results": rows,
        }
    opts = cl.opts
    template = select_template(
        [
            f"admin/{opts.app_label}/{opts.model_name}/change_list_results.html",
            f"admin/{opts.app_label}/change_list_results.html",
            "admin/change_list_results.html",
        ]
    )
    table: str = template.render(context)
    return mark_safe(table)


def _change_url(cl: ChangeList) -> tuple[str, str]:
    """A row's change URL with the list's filters, escaped, split around its id."""
    placeholder = cl.model()
    setattr(placeholder, cl.pk_attname, _PK)
    url = add_preserved_filters(
        {"preserved_filters": cl.preserved_filters, "opts": cl.opts},
        cl.url_for_result(placeholder),
    )
    before, _, after = str(escape(url)).partition(_PK)
    return before, after


def _blank_as_empty(value: Any) -> Any:
    """Blank text as no text, which shows as the empty value (Django 5.2 does this in its
    rows, 6.1 where it displays a value; either way the cell reads the same)."""
    if isinstance(value, str) and not value.strip():
        return ""
    return value


def _class_name(name: Any, index: int) -> str:
    """A column's name in its cells' class, as Django's rows write it."""
    if not callable(name):
        return str(name)
    if name.__name__ == "<lambda>":
        return f"lambda{index}"
    return str(name.__name__)
