"""A fault-injection run users can point at their own PostgreSQL: `manage.py chaosjobs`.

`jobs` holds the kinds the run's workers execute (imported by them with
`runjobs --import django_pgjobs.chaos.jobs`, nowhere else); `run` orchestrates a run:
`processes` starts the workers, `load` enqueues, `faults` injects the faults and `evidence`
collects what the database holds, which `invariants` judges.
"""
