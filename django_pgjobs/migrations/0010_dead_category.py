"""Dead letters keep their category (issue 26): `pgjobs_dead.category`, written by the
statement that dead-letters a job, so that the admin's reason filter finds every
`Fail("...")` under "failed", whatever its message.

Not atomic, so that nothing holds the table for long: the column is added without a
default (no rewrite), the letters already there are filed by their reason in batches of
10,000 by id, each its own transaction (FILE_DEAD_LETTERS; one that says no category
stays empty, as the dependency failures do), then the category's check is added NOT
VALID and validated (no lock against writes while it scans), and the filter's index is
built concurrently. A letter an older worker writes meanwhile stays empty: it reads as
not recorded, or as a dependency failure by its reason.
"""

from typing import Any

from django.contrib.postgres.operations import (
    AddConstraintNotValid,
    AddIndexConcurrently,
    ValidateConstraint,
)
from django.db import migrations, models

from django_pgjobs.db import connection as db
from django_pgjobs.db import sql

BATCH = 10_000


def file_dead_letters(apps: Any, schema_editor: Any) -> None:
    using = schema_editor.connection.alias
    after = 0
    while True:
        ((last,),) = db.fetchall(sql.FILE_DEAD_LETTERS, {"after": after, "limit": BATCH}, using)
        if last is None:
            return
        after = last


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgjobs", "0009_waiting_and_batch_end_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadjob",
            name="category",
            field=models.CharField(
                blank=True,
                choices=[
                    ("failed", "failed"),
                    ("max_attempts", "max attempts exceeded"),
                    ("expired", "expired"),
                    ("cancelled", "cancelled"),
                    ("dependency", "dependency failed"),
                    ("payload", "payload does not fit"),
                    ("unknown_kind", "unknown kind"),
                    ("unstorable", "outcome not storable"),
                ],
                help_text="Why it died, in a word (empty: a dependency failed, or not recorded).",
                max_length=16,
                null=True,
            ),
        ),
        migrations.RunPython(file_dead_letters, migrations.RunPython.noop, elidable=True),
        AddConstraintNotValid(
            model_name="deadjob",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "category__in",
                        [
                            "failed",
                            "max_attempts",
                            "expired",
                            "cancelled",
                            "payload",
                            "unknown_kind",
                            "unstorable",
                        ],
                    ),
                    ("category__isnull", True),
                    _connector="OR",
                ),
                name="pgjobs_dead_category_valid",
            ),
        ),
        ValidateConstraint(model_name="deadjob", name="pgjobs_dead_category_valid"),
        AddIndexConcurrently(
            model_name="deadjob",
            index=models.Index(fields=["category", "died_at"], name="pgjobs_dead_category"),
        ),
    ]
