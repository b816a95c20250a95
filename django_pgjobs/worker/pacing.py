"""When a worker claims, and how many: the poll and the next scheduled job, and prefetch.

While jobs are short, the worker claims some ahead of its free threads (prefetch), so
that the threads find the next job waiting while the loop claims: the database
statements then cost the threads nothing. It claims only as many as the threads
start within PREFETCH_WAIT_S at the recent run time, so slow jobs are never held back
from other workers.
"""

from __future__ import annotations

from django_pgjobs.managers.claiming import few_sizes

#: The longest a job claimed ahead (prefetched) should wait for a free thread, judged by
#: the recent run time of this worker's jobs.
PREFETCH_WAIT_S = 0.05
#: While the threads' claims bring jobs, a claim for the event loop's places that found
#: none waits this long before the next one, doubled each time up to LOOP_BACKOFF_MAX_S:
#: a worker with async kinds registered but sync jobs to run claims once per turn, not
#: twice. A poll, or a claim for the threads that found none, makes it due at once.
LOOP_BACKOFF_MIN_S = 0.05
LOOP_BACKOFF_MAX_S = 1.0
#: Weight of the latest run in the worker's mean run time.
RUN_TIME_WEIGHT = 0.2


class Pacing:
    """Whether a claim may find work now, and the size of the next claim."""

    def __init__(
        self,
        *,
        concurrency: int,
        prefetch: int,
        poll_interval: float,
        queues: tuple[str, ...] = (),
    ) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.poll_interval = poll_interval
        #: A claim may find work: a notification, a completion, a poll, a due job.
        self.maybe_more = True
        #: Claims nothing: asked to go quiet from the console (`asked_quiet`, as the
        #: registry's heartbeat says), or every queue paused on this worker alone.
        self.quiet = False
        self.asked_quiet = False
        #: The queues it claims from: its queues but those paused on it alone.
        self.claiming = queues
        self.next_poll = 0.0
        #: When the next scheduled job (or lapsing lease) is due, on the monotonic clock.
        self.next_due: float | None = None
        #: Mean run time of this worker's jobs (None: none ran yet), for prefetching.
        self.mean_run_s: float | None = None
        #: When a claim for the event loop's places is next due, and its backoff.
        self._loop_due_at = 0.0
        self._loop_backoff_s = 0.0

    def look_again(self) -> None:
        """Claim as soon as the loop may (after a failure, a notification, a completion)."""
        self.maybe_more = True

    def tick(self, now: float) -> None:
        """Look for work when the poll interval or the next due job says so."""
        if now >= self.next_poll:
            self.maybe_more = True
            self.next_poll = now + self.poll_interval
            self._loop_due_at = 0.0
        if self.next_due is not None and now >= self.next_due:
            self.maybe_more = True
            self.next_due = None

    def dry(self, due_in: float | None, now: float) -> None:
        """The queues ran dry: look again when the next job is due (`due_in` seconds)."""
        self.maybe_more = False
        self.next_due = None if due_in is None else now + due_in

    def loop_places(self, free: int, capacity: int, now: float) -> int:
        """How many of the event loop's `free` places (of its `capacity`) the next claim
        asks for: none while the last such claim found none and its backoff runs; all
        when every place is free; else the largest power of two of them. A claim for the
        threads and the loop is one statement per pair of sizes (sql.claim_jobs), so the
        places come in a few sizes, as the threads' do (claim_size)."""
        if now < self._loop_due_at:
            return 0
        return few_sizes(free, capacity)

    def claimed(self, threads: tuple[int, int], places: tuple[int, int], now: float) -> None:
        """A claim asked for and took (threads asked, taken) and (places asked, taken)."""
        (asked, taken), (places_asked, places_taken) = threads, places
        if (asked and not taken) or places_taken:
            self._loop_due_at, self._loop_backoff_s = 0.0, 0.0
        elif places_asked:
            self._loop_backoff_s = min(
                LOOP_BACKOFF_MAX_S, max(LOOP_BACKOFF_MIN_S, self._loop_backoff_s * 2)
            )
            self._loop_due_at = now + self._loop_backoff_s

    def ran(self, duration: float) -> None:
        """A job ran for `duration` seconds."""
        mean = self.mean_run_s
        self.mean_run_s = duration if mean is None else mean + RUN_TIME_WEIGHT * (duration - mean)

    def slots(self, held: int) -> int:
        """Claims this worker may make now, holding `held`: its threads, and the prefetch."""
        return max(self.concurrency + self.prefetch_now() - held, 0)

    def prefetch_now(self) -> int:
        """How many jobs to hold beyond the threads: as many as they start within
        PREFETCH_WAIT_S at the mean run time, at most `prefetch` (none before a job ran)."""
        mean = self.mean_run_s
        if not self.prefetch or mean is None:
            return 0
        if mean * self.prefetch <= PREFETCH_WAIT_S * self.concurrency:
            return self.prefetch
        return int(PREFETCH_WAIT_S * self.concurrency / mean)

    def claim_size(self, free: int) -> int:
        """How many of `free` slots to claim: all of them up to the threads' count, or
        when every slot is free; between, the threads plus a power of two. Each size is a
        statement of its own, prepared once per connection (sql.claim_jobs), so a worker
        uses a few of them rather than every size from 1 to concurrency + prefetch."""
        ahead = free - self.concurrency
        if ahead <= 0 or free == self.concurrency + self.prefetch:
            return free
        return self.concurrency + (1 << (ahead.bit_length() - 1))
