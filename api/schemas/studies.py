"""Bodies of the /studies endpoints: what-if studies of one model over many candidate clusters."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, Field, model_validator

from api.schemas.plans import MAX_ID, ModelIn, check_json
from planner.study import StudyPoint, StudyRequest

StudyId = Annotated[int, Path(ge=1, le=MAX_ID, description="A study's id")]


class StudyCreate(StudyRequest):
    """What to study: the planner's StudyRequest, with the model given as for a plan and a name.

    Every candidate (GPU type x cluster size) is searched like `POST /plans` with the same model,
    training and search restrictions, and its plan stored as an ordinary plan (with its launchers).
    """

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any) -> Any:
        check_json(data)
        return data

    model: ModelIn  # type: ignore[assignment]  # resolved to a ModelSpec by the service
    """A catalog name, a Hugging Face config.json object, or a model spec / layer graph."""
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]*$")] | None = None
    """A label for listings; default `<model>, <budget> tokens`."""


class StudyPointOut(StudyPoint):
    """One candidate cluster of a stored study."""

    position: int
    """Index in the study's candidate order (GPU types as given, sizes ascending)."""
    cluster: str
    """NODESxGPUSxGPU."""
    plan_id: int | None
    """The stored plan of a fitting cluster (GET /plans/{id}, its launchers under /plans/{id}/launcher);
    null when the cluster does not fit, or the plan was deleted since."""


class StudySummaryOut(BaseModel):
    """A stored study's headline (lists)."""

    id: int
    name: str
    model_name: str
    token_budget: int
    deadline_days: float | None
    gpus: list[str]
    num_candidates: int
    num_fitting: int
    planner_version: str
    created_at: datetime


class StudyDetail(StudySummaryOut):
    """A stored study: its normalized request, every candidate's outcome, and the clusters to pick."""

    request: dict[str, Any]
    points: list[StudyPointOut]
    fastest: int | None
    """`position` of the fitting cluster that trains soonest."""
    cheapest: int | None
    """`position` of the fitting cluster that costs least."""
    cheapest_within_deadline: int | None
    """`position` of the cheapest cluster that trains within `deadline_days` (null: no deadline, or none)."""


class StudyPage(BaseModel):
    items: list[StudySummaryOut]
    next_cursor: str | None
    """Pass as `cursor` to get the next page; null on the last page."""
