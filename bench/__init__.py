"""django_pgjobs benchmarks: `python -m bench` (see README's Performance section)."""
