"""A fault-injection run users can point at their own PostgreSQL: `manage.py chaosjobs`.

`jobs` holds the kinds the run's workers execute (imported by them with
`runjobs --import django_pgjobs.chaos.jobs`, nowhere else); `run` starts the workers,
enqueues, injects faults and collects the evidence; `invariants` judges the evidence.
"""
