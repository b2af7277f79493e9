"""The SQLite receipt store (the embedded default)."""
