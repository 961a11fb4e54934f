"""Alembic migrations of the service's database (a package so that they ship with the wheel)."""
