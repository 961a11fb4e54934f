"""Pydantic request and response bodies of the API, kept apart from the ORM models in api/db."""
