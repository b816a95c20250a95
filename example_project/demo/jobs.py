"""Jobs that misbehave on purpose, so the demo shows retries and dead letters."""

from django_pgjobs import Fail, job
from django_pgjobs.claims import JobHandle


@job(queue="demo", max_attempts=4)
def deliver_webhook(ctx: JobHandle, url: str, fail_times: int = 0) -> str:
    """A remote endpoint that is down for the first `fail_times` attempts."""
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"{url} refused the connection (attempt {ctx.attempt})")
    return f"delivered to {url}"


@job(queue="demo", max_attempts=3)
def charge_card(amount: int) -> str:
    if amount < 0:
        raise Fail(f"card declined: cannot charge {amount}")
    return f"charged {amount}"


@job(queue="demo", max_attempts=2)
def rebuild_search_index(shard: int) -> None:
    raise RuntimeError(f"shard {shard} is corrupt")


@job(queue="demo")
def send_digest(user: str) -> str:
    return f"digest sent to {user}"
