"""Bodies of the /studies endpoints: what-if studies of one model over many candidate clusters."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
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
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
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


class StudyState(StrEnum):
    """Where a study's job is: `queued` and `running` go on; the other three are final."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


UNFINISHED = (StudyState.queued, StudyState.running)


class StudySummaryOut(BaseModel):
    """A stored study's headline (lists), with its job's state and progress."""

    id: int
    name: str
    model_name: str
    token_budget: int
    deadline_days: float | None
    gpus: list[str]
    state: StudyState
    """queued, running (see `candidates_done`), succeeded (the points are there), failed (see `error`),
    cancelled."""
    num_candidates: int
    candidates_done: int
    """Candidates searched so far, out of `num_candidates`."""
    num_fitting: int
    """Fitting clusters (so far, while the study runs)."""
    error: str | None
    """Why the job failed; null otherwise."""
    planner_version: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    """Times a job started the study: more than 1 when its process stopped (or went silent) and another
    run started it again from its first candidate."""


class StudyDetail(StudySummaryOut):
    """A stored study: its normalized request, every candidate's outcome (once it has succeeded), and the
    clusters to pick."""

    request: dict[str, Any]
    best_so_far: StudyPoint | None
    """While the study runs: the cheapest fitting cluster searched so far (null while none fits)."""
    points: list[StudyPointOut]
    """Every candidate's outcome, in `position` order; empty until the study has succeeded."""
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
