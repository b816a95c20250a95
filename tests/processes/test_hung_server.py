"""S43 with a real worker: `runjobs` whose server hangs (behind a freezing TCP proxy,
tests/proxy.py) reconnects to the next host of its URL and drains there."""

from __future__ import annotations

import pytest

from django_pgjobs.models import Job
from tests.helpers import count, execute
from tests.proxy import FreezableProxy
from tests.spawn import Workers, database_url_for_workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_s43_a_worker_whose_server_hangs_reconnects_to_the_next_host_and_drains(
    proxy: FreezableProxy,
) -> None:
    """The worker's URL lists the proxy first, then the server itself (a multi-host URL,
    as after a failover: the old primary first). Frozen mid-drain, the worker gives up on
    it, skips it when it reconnects (connect_timeout) and drains on the other."""
    direct = database_url_for_workers()
    scheme, _, rest = direct.partition("://")
    auth, _, location = rest.rpartition("@")
    hosts, _, name = location.partition("/")
    url = f"{scheme}://{auth}@127.0.0.1:{proxy.port},{hosts}/{name}?target_session_attrs=read-write"
    # A claim whose answer the proxy held back has committed all the same on the server
    # (the one behind the proxy is the one after it): its jobs wait out their lease, 3 s.
    job = {"kind": "tests.record", "payload": {"sleep": 0.05}, "lease": 3}
    Job.objects.enqueue_many([job] * 40)
    workers = Workers()
    try:
        # A 2 s guard (its connect_timeout too) takes the same path as the default 5 s,
        # sooner; a run cut with its connection retries after 0.5-1 s, not 5-10.
        worker = workers.start(
            "--concurrency",
            "2",
            extra_env={
                "DATABASE_URL": url,
                "PGJOBS_HUNG_SERVER_TIMEOUT": "2",
                "PGJOBS_BACKOFF_BASE": "1",
            },
        )
        wait_for(lambda: count("tests_note") >= 5, timeout=60, what="jobs run through the proxy")
        proxy.freeze()
        Job.objects.enqueue_many([{**job, "payload": {}}] * 20)
        wait_for(
            lambda: count() == 0,
            timeout=90,
            interval=0.2,
            what="every job run, the last ones on the server itself",
        )
        assert "taking it for hung" in worker.output()
        proxy.thaw()
        worker.signal(15)
        assert worker.wait(60) == 0, worker.output()
    finally:
        workers.close()
    noted = execute("SELECT count(DISTINCT job_id) FROM tests_note")[0][0]
    assert noted == 60
    assert count() == 0, execute("SELECT id, state, attempts FROM pgjobs_job")
