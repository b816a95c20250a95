"""`batch()`: member jobs whose callbacks fire once, when the last member ends (S31).

    from django_pgjobs.batches import Callback, batch

    with batch(on_complete=Callback(build_index, collection=7)) as b:
        for document in documents:
            b.add(embed, document=document.id)
    # written when the block ends, in one transaction; b.id is the batch's id

A callback is a job written with the batch, waiting for every member. When the last
member ends (done, dead or cancelled), the statement that records that end releases the
callbacks that match: `on_complete` always, `on_success` if every member is done,
`on_failure` if any died; the other is deleted unseen. Exactly once, whatever the
concurrency and whatever crashes: it is the same transaction. A callback reads the
batch with `ctx.batch()` (tally, callbacks) and its members' results with
`ctx.parent_results()`.

An open batch (`batch(..., open=True)`) does not end until it is sealed: add members to
it over time (`add_to_batch(b.id, ...)`, a running member included: dynamic fan-out),
then `seal_batch(b.id)`. A sealed batch still takes members from a member that runs.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from django_pgjobs.exceptions import InvalidBatch
from django_pgjobs.managers.batches import FIRES_ON, database_of_batch
from django_pgjobs.managers.enqueue import database_of_jobs
from django_pgjobs.options import ResolvedJob
from django_pgjobs.records import BatchRecord, EnqueueResult
from django_pgjobs.workflows import kind_and_options, resolve_step

#: The options a member or a callback cannot take: a job with dependencies has no key,
#: and a batch is written to its own database (batch(using=...)).
REFUSED_OPTIONS = ("key", "on_conflict", "using", "after")


class Callback:
    """A batch's callback: `Callback(build_index, collection=7)`, the target a @job
    function, its `.using(...)`, or a kind's name; keyword arguments its payload."""

    def __init__(self, target: Any, /, **payload: Any) -> None:
        self.job = _resolve(target, payload, "a batch's callback")

    def __repr__(self) -> str:
        return f"<Callback {self.job.kind}>"


class Batch:
    """The members and callbacks of one `with batch():` block, written when it ends."""

    def __init__(
        self,
        *,
        on_success: Callback | None = None,
        on_failure: Callback | None = None,
        on_complete: Callback | None = None,
        open: bool = False,
        using: str | None = None,
    ) -> None:
        given = {"on_success": on_success, "on_failure": on_failure, "on_complete": on_complete}
        self.callbacks: list[tuple[str, ResolvedJob]] = []
        for name, callback in given.items():
            if callback is None:
                continue
            if not isinstance(callback, Callback):
                raise InvalidBatch(
                    f"{name}= takes a Callback(target, **payload), not {callback!r}."
                )
            self.callbacks.append((FIRES_ON[name], callback.job))
        if not self.callbacks:
            raise InvalidBatch(
                "A batch needs a callback: on_success=, on_failure= or on_complete= "
                "(Callback(target, **payload)). Use enqueue_many for jobs without one."
            )
        self.open = bool(open)
        self.using = using
        self.id: int | None = None
        self.members: list[EnqueueResult] = []
        #: The callbacks' jobs as written, in the order on_success, on_failure,
        #: on_complete (those given); which of them the end released is
        #: `get_batch(b.id).fired`.
        self.callback_jobs: list[EnqueueResult] = []
        #: The on_success callback's job once written (None: not given), a parent for
        #: `after=[b.on_success]`; on_failure and on_complete alike.
        self.on_success: EnqueueResult | None = None
        #: The on_failure callback's job once written (None: not given).
        self.on_failure: EnqueueResult | None = None
        #: The on_complete callback's job once written (None: not given).
        self.on_complete: EnqueueResult | None = None
        self._pending: list[ResolvedJob] = []

    def add(self, target: Any, /, **payload: Any) -> EnqueueResult | None:
        """Add a member: `target` a @job function (or its `.using(...)`) or a kind's
        name, `payload` its keyword arguments. Inside the block it is written with the
        batch (None is returned); after the block, to an open batch, at once.

        Raises:
            InvalidJobOption: a subclass naming what is wrong; nothing is written.
            BatchEnded: the batch has ended.
        """
        job = _resolve(target, payload, "a batch's member")
        if self.id is None:
            self._pending.append(job)
            return None
        from django_pgjobs.models import Batch as BatchModel

        (result,) = BatchModel.objects.add(self.id, [job], using=self.using)
        self.members.append(result)
        return result

    def seal(self) -> bool:
        """Seal the batch (see `seal_batch`); inside the block, it is written sealed."""
        if self.id is None:
            self.open = False
            return True
        return seal_batch(self.id, using=self.using)

    def write(self) -> None:
        """Write the batch, its members and callbacks: one transaction (a savepoint in
        the caller's). Called when the `with` block ends."""
        from django_pgjobs.models import Batch as BatchModel

        if self.id is not None:
            return
        everything = [*self._pending, *(job for _, job in self.callbacks)]
        self.using = self.using or database_of_jobs(everything, "a batch")
        self.id, self.members, self.callback_jobs = BatchModel.objects.write(
            self._pending, self.callbacks, seal=not self.open, using=self.using
        )
        for (fires_on, _), written in zip(self.callbacks, self.callback_jobs, strict=True):
            setattr(self, f"on_{fires_on}", written)
        self._pending = []

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.write()
        else:
            self._pending = []  # an exception in the block: nothing is written


def batch(
    *,
    on_success: Callback | None = None,
    on_failure: Callback | None = None,
    on_complete: Callback | None = None,
    open: bool = False,
    using: str | None = None,
) -> Batch:
    """Start a batch: `with batch(on_complete=Callback(...)) as b: b.add(...)`; see the
    module."""
    return Batch(
        on_success=on_success,
        on_failure=on_failure,
        on_complete=on_complete,
        open=open,
        using=using,
    )


def add_to_batch(
    batch_id: int, target: Any, /, *, using: str | None = None, **payload: Any
) -> EnqueueResult:
    """Add one member to a batch that has not ended (open, or sealed with a member still
    running, which may call this to fan out).

    Raises:
        BatchEnded: its callbacks were released; nothing is written.
        InvalidBatch: no such batch.
    """
    from django_pgjobs.models import Batch as BatchModel

    job = _resolve(target, payload, "a batch's member")
    using = using or database_of_jobs([job], "a batch")  # a batch lives in one database
    (result,) = BatchModel.objects.add(batch_id, [job], using=using)
    return result


def seal_batch(batch_id: int, *, using: str | None = None) -> bool:
    """Seal an open batch: it ends with its last member, now if none is left. Returns
    False if it was sealed already or has ended. `using`: the batch's database, needed
    when PGJOBS["QUEUE_DATABASES"] keeps queues in several (`b.using`, `ctx.using`).

    Raises:
        InvalidBatch: no such batch, or no `using` under several databases.
    """
    from django_pgjobs.models import Batch as BatchModel

    using = database_of_batch(batch_id, using, "seal_batch")
    return BatchModel.objects.seal(batch_id, using=using)


def get_batch(batch_id: int, *, using: str | None = None) -> BatchRecord | None:
    """The batch as stored (state, tally so far, callbacks), or None. `using` as for
    `seal_batch`.

    Raises:
        InvalidBatch: no batch id, or no `using` under several databases.
    """
    from django_pgjobs.models import Batch as BatchModel

    using = database_of_batch(batch_id, using, "get_batch")
    return BatchModel.objects.get_batch(batch_id, using=using)


def _resolve(target: Any, payload: dict[str, Any], what: str) -> ResolvedJob:
    kind, given = kind_and_options(target, what)
    refused = [name for name in REFUSED_OPTIONS if name in given]
    if refused:
        raise InvalidBatch(
            f"{what[0].upper()}{what[1:]} cannot take {refused}: a job with dependencies "
            "has no key or parents of its own, and a batch is written to its own "
            "database (batch(using=...))."
        )
    return resolve_step(kind, given, payload)
