"""The database: typed SQLAlchemy models, engine and sessions, and Alembic migrations at start-up."""
