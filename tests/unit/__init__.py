"""Unit tier: tests inside one rolled-back transaction (`@pytest.mark.django_db`), or with
no database at all."""
