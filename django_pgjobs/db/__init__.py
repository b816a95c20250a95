"""The database room: the only code that sends SQL (`connection`, `listener`), and every
statement it sends (`sql`, by table)."""
