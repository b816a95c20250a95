"""The worker's event loop: async lease-mode handlers run as tasks on one asyncio loop in
a thread of its own, up to `size` at once beside the handler threads.

A job cancelled while it runs (S32) has its task cancelled: `CancelledError` at its next
await. A job past its timeout (S33) too, and its attempt is recorded as timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from asgiref.sync import sync_to_async

from django_pgjobs.claims import Failure, Outcome, Verdict
from django_pgjobs.db import connection as db
from django_pgjobs.worker.executor import Executor
from django_pgjobs.worker.leases import Running

logger = logging.getLogger("django_pgjobs.worker")


class EventLoopRunner:
    """Runs async jobs on one event loop thread; each outcome goes to `deliver`."""

    def __init__(
        self,
        size: int,
        deliver: Callable[[Outcome], object],
        lapsed: Callable[[Running], Outcome],
    ) -> None:
        self.size = size
        self._deliver = deliver
        self._lapsed = lapsed
        self._executor = Executor()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Jobs handed over that wait for one of the `size` places (under the lock).
        self._waiting: deque[Running] = deque()
        self._active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_loop, name="pgjobs-async", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run_loop(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def submit(self, running: Running) -> None:
        """Run `running`'s job as soon as a place is free (from any thread)."""
        with self._lock:
            self._waiting.append(running)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fill)

    def take_waiting(self) -> list[Running]:
        """The jobs no place was free for yet, taken back (to be handed back, S25)."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        return waiting

    def _fill(self) -> None:
        """Start waiting jobs while places are free (on the loop)."""
        loop = self._loop
        assert loop is not None
        while True:
            with self._lock:
                if self._active >= self.size or not self._waiting:
                    return
                running = self._waiting.popleft()
                self._active += 1
            running.started = True
            running.started_at = time.monotonic()
            task = loop.create_task(self._run(running))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

            def cancel(task: asyncio.Task[None] = task) -> None:
                loop.call_soon_threadsafe(task.cancel)

            running.handle.control.on_cancel(cancel)

    async def _run(self, running: Running) -> None:
        handle = running.handle
        try:
            if time.monotonic() < running.lease_ends:
                outcome = await self._executor.run_async(handle)
            else:
                outcome = self._lapsed(running)
        except BaseException as error:  # the executor's own bug: never the loop's end
            logger.error("job id=%s kind=%s: the executor raised %r", handle.id, handle.kind, error)
            outcome = Outcome(
                handle=handle, verdict=Verdict.RETRY, duration=0.0, failure=Failure.of(error)
            )
            task = asyncio.current_task()
            if task is not None:
                while task.uncancel():
                    pass
        finally:
            with self._lock:
                self._active -= 1
        self._deliver(outcome)
        self._fill()

    def stop(self, timeout: float) -> None:
        """Cancel the tasks still running and stop the loop, waiting up to `timeout`."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def shut_down() -> None:
            loop.create_task(self._shut_down(timeout))

        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(shut_down)
        if self._thread is not None:
            self._thread.join(timeout=timeout + 2)

    async def _shut_down(self, timeout: float) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=min(timeout, 0.5))
        # The async ORM's calls ran on Django's thread for sync code: close its connections.
        with contextlib.suppress(Exception):
            await sync_to_async(db.close_all)()
        asyncio.get_running_loop().stop()
