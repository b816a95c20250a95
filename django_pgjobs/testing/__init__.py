"""What tests and development need: a PostgreSQL of their own (`localdb`)."""
