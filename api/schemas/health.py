"""Bodies of the health endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    database: str
    """The database backend, e.g. `sqlite` or `postgresql`."""
    schema_revision: str
