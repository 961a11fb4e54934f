"""procrastinate's schema as migration 0006 applies it (a frozen copy of the pinned version's schema.sql)."""
