"""django_pgjobs benchmarks: `python -m bench` (see docs/explanation/performance.md)."""
