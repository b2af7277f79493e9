"""The Postgres receipt store, for many workers on many hosts."""
