"""Tests that start real processes: runjobs workers, chaos runs, PgBouncer, a second database, the example project."""
