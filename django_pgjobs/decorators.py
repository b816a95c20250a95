"""`@job`: register a function as a job kind with its defaults.

from django_pgjobs import job

@job(queue="emails", max_attempts=5)
def send_welcome(ctx, user_id):
    ...

send_welcome.enqueue(user_id=7)                        # payload {"user_id": 7}
send_welcome.using(delay=60, priority=5).enqueue(user_id=7)
send_welcome(ctx, user_id=7)                           # still a plain function
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, TypeVar, overload

from django_pgjobs import options
from django_pgjobs.exceptions import InvalidCron, InvalidPayload
from django_pgjobs.limits import Limits, Rate
from django_pgjobs.options import UNSET
from django_pgjobs.registry import JobDefinition, register
from django_pgjobs.retry import Backoff
from django_pgjobs.schedules import Cron

P = ParamSpec("P")
R = TypeVar("R")

#: First parameter names that ask for the claim's context.
CONTEXT_PARAMETERS = ("ctx", "context")


class JobFunction(Generic[P, R]):
    """A registered job: still callable as the plain function, and enqueueable."""

    def __init__(
        self, definition: JobDefinition, enqueue_options: Mapping[str, Any] | None = None
    ) -> None:
        self.definition = definition
        self.enqueue_options: Mapping[str, Any] = dict(enqueue_options or {})
        functools.update_wrapper(self, definition.func)

    def __repr__(self) -> str:
        return f"<job {self.definition.kind}>"

    @property
    def kind(self) -> str:
        return self.definition.kind

    @property
    def func(self) -> Callable[P, R]:
        return self.definition.func

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        function: Callable[P, R] = self.definition.func
        return function(*args, **kwargs)

    def _call_example(self) -> str:
        """How a call of enqueue reads for this handler: name(first=..., second=...)."""
        parameters = list(inspect.signature(self.definition.func).parameters.values())
        if self.definition.takes_context:
            parameters = parameters[1:]
        named = [
            f"{parameter.name}=..."
            for parameter in parameters
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        return f"{self.definition.func.__name__}.enqueue({', '.join(named)})"

    def using(
        self,
        *,
        queue: str = UNSET,
        key: str | None = UNSET,
        on_conflict: str = UNSET,
        priority: int = UNSET,
        run_after: datetime | None = UNSET,
        delay: float | timedelta | None = UNSET,
        max_attempts: int = UNSET,
        lease: float | timedelta = UNSET,
        expires: float | timedelta | None = UNSET,
        result_retention: float | timedelta | None = UNSET,
        timeout: float | timedelta | None = UNSET,
        after: Any = UNSET,
        using: str | None = UNSET,
    ) -> JobFunction[P, R]:
        """Return this job with enqueue options set (the payload stays for `enqueue`).

        `after` names the jobs this one waits for (S29; see Job.objects.enqueue).
        """
        given = {
            name: value
            for name, value in {
                "queue": queue,
                "key": key,
                "on_conflict": on_conflict,
                "priority": priority,
                "run_after": run_after,
                "delay": delay,
                "max_attempts": max_attempts,
                "lease": lease,
                "expires": expires,
                "result_retention": result_retention,
                "timeout": timeout,
                "after": after,
                "using": using,
            }.items()
            if value is not UNSET
        }
        return JobFunction(self.definition, {**self.enqueue_options, **given})

    def enqueue(self, *positional: Any, **payload: Any) -> Any:
        """Enqueue this job with `payload` as its keyword arguments (S1: in the caller's
        transaction). Options come from `using(...)`, then the decorator, then settings.

        Returns:
            EnqueueResult(id, inserted).

        Raises:
            InvalidPayload: positional arguments (a payload is named: it is stored as a
                JSON object), or a payload that does not fit the handler (S28).
        """
        from django_pgjobs.models import Job

        if positional:
            raise InvalidPayload(
                f"{self.definition.kind}.enqueue() takes the payload as keyword arguments, "
                f"not {len(positional)} positional: {self._call_example()}. Nothing was "
                "written."
            )

        enqueue_options = dict(self.enqueue_options)
        if "key" not in enqueue_options and self.definition.key is not None:
            enqueue_options["key"] = self.definition.key(payload)
        if "on_conflict" not in enqueue_options and self.definition.on_conflict is not None:
            enqueue_options["on_conflict"] = self.definition.on_conflict
        return Job.objects.enqueue(self.definition.kind, payload, **enqueue_options)


@overload
def job(func: Callable[P, R], /) -> JobFunction[P, R]: ...


@overload
def job(
    *,
    name: str | None = None,
    queue: str = UNSET,
    priority: int = UNSET,
    max_attempts: int = UNSET,
    lease: float | timedelta = UNSET,
    expires: float | timedelta | None = UNSET,
    result_retention: float | timedelta | None = UNSET,
    backoff: Backoff | tuple[int, int] | None = None,
    key: Callable[[dict[str, Any]], str | None] | None = None,
    on_conflict: str | None = None,
    atomic: bool = False,
    takes_context: bool | None = None,
    schedule: str | Cron | None = None,
    timeout: float | timedelta | None = UNSET,
    concurrency_key: Callable[[dict[str, Any]], Any] | str | None = None,
    concurrency: int | None = None,
    rate: str | Rate | None = None,
) -> Callable[[Callable[P, R]], JobFunction[P, R]]: ...


def job(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = UNSET,
    priority: int = UNSET,
    max_attempts: int = UNSET,
    lease: float | timedelta = UNSET,
    expires: float | timedelta | None = UNSET,
    result_retention: float | timedelta | None = UNSET,
    backoff: Backoff | tuple[int, int] | None = None,
    key: Callable[[dict[str, Any]], str | None] | None = None,
    on_conflict: str | None = None,
    atomic: bool = False,
    takes_context: bool | None = None,
    schedule: str | Cron | None = None,
    timeout: float | timedelta | None = UNSET,
    concurrency_key: Callable[[dict[str, Any]], Any] | str | None = None,
    concurrency: int | None = None,
    rate: str | Rate | None = None,
) -> JobFunction[P, R] | Callable[[Callable[P, R]], JobFunction[P, R]]:
    """Register a function as a job kind.

    Args:
        func: the function, when the decorator is used bare (`@job`); called with
            options instead (`@job(queue="emails")`), `job` returns the decorator.
        name: the kind; default the function's dotted path (`module.function`).
        queue, priority, max_attempts, lease, expires, result_retention: this kind's
            default (S2: an option given at enqueue wins; UNSET: the queue's setting,
            then the app's default).
        backoff: `Backoff(base_s, cap_s)` or `(base_s, cap_s)`; default the queue's.
        key: a function of the payload returning the job's key (None: no key).
        on_conflict: the default `on_conflict` of this kind's enqueues.
        atomic: transaction mode (S21): the handler runs inside one transaction that
            holds the job row and deletes it on success.
        takes_context: pass the claim as the first argument; default: when the first
            parameter is named `ctx` or `context`.
        schedule: also run it periodically: a cron expression (`"*/5 * * * *"`), or a
            `Cron(...)` for a timezone, a payload and options. The schedule is named
            after the kind.
        timeout: the longest an attempt may run (S33); past it the attempt is recorded
            as "timed out after N s" and retried. Distinct from the lease, which is how
            long a claim holds without a heartbeat.
        concurrency_key: a function of the payload returning the value its job is
            counted under (a string or whole number; None: not limited), or a fixed
            value (S34).
        concurrency: at most this many jobs of one key value run at once, across every
            worker.
        rate: at most this many claims per period per key value ("100/m"; S35); without
            a concurrency_key, for the kind as a whole.

    Raises:
        InvalidJobOption: a default or the schedule is invalid (checked at decoration,
            not at enqueue).
        ValueError: the kind is already registered to another function.
    """

    def decorate(function: Callable[P, R]) -> JobFunction[P, R]:
        kind = options.validate_kind(name or f"{function.__module__}.{function.__qualname__}")
        if "<locals>" in function.__qualname__ and name is None:
            raise ValueError(
                f"{function.__qualname__} is defined inside a function; jobs must be "
                "module-level functions, or be given a name=."
            )
        defaults = _validated_defaults(
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            lease=lease,
            expires=expires,
            result_retention=result_retention,
            timeout=timeout,
        )
        limits = Limits.of(key=concurrency_key, concurrency=concurrency, rate=rate)
        if on_conflict is not None:
            options.validate_conflict_mode(on_conflict)
        if schedule is not None and not isinstance(schedule, str | Cron):
            raise InvalidCron(
                f"schedule must be a cron expression or a Cron(...), not {schedule!r}."
            )
        definition = JobDefinition(
            kind=kind,
            func=function,
            defaults=defaults,
            backoff=_backoff(backoff),
            key=key,
            on_conflict=on_conflict,
            atomic=atomic,
            takes_context=_takes_context(function) if takes_context is None else takes_context,
            schedule=Cron(schedule) if isinstance(schedule, str) else schedule,
            limits=limits,
        )
        register(definition)
        return JobFunction[P, R](definition)

    if func is not None:
        return decorate(func)
    return decorate


def _validated_defaults(**given: Any) -> dict[str, Any]:
    defaults = {name: value for name, value in given.items() if value is not UNSET}
    validators: dict[str, Callable[[Any], Any]] = {
        "queue": options.validate_queue_name,
        "priority": options.validate_priority,
        "max_attempts": options.validate_max_attempts,
        "lease": options.validate_lease,
        "expires": options.validate_expires,
        "result_retention": options.validate_result_retention,
        "timeout": options.validate_timeout,
    }
    for option, value in defaults.items():
        validators[option](value)
    return defaults


def _backoff(backoff: Backoff | tuple[int, int] | None) -> Backoff | None:
    if backoff is None or isinstance(backoff, Backoff):
        return backoff
    base, cap = backoff
    return Backoff(base_s=base, cap_s=cap)


def _takes_context(function: Callable[..., Any]) -> bool:
    parameters = list(inspect.signature(function).parameters.values())
    return bool(parameters) and parameters[0].name in CONTEXT_PARAMETERS
