"""Concurrency tier: `@pytest.mark.django_db(transaction=True)` tests that commit for real
and use other connections, threads or an in-process Worker: visibility after commit, SKIP
LOCKED races, fencing, workers in threads."""
