"""Process tier: tests that start real processes (runjobs workers, chaos runs, PgBouncer,
a second database, the example project), each with hard timeouts and cleanup."""
