"""The parts of `manage.py jobsctl`, a module per family of subcommands: queues (status,
pause, resume, limit, rate), jobs (running, cancel), dead letters (dead, requeue) and
schedules. The command (management/commands/jobsctl.py) parses and dispatches; each part
reads and acts through the managers and writes what it did through `output`."""
