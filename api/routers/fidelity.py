"""/fidelity: how close the planner's predictions are to training runs measured on GPUs (the corpus)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import ReadAccess
from api.problems import FieldError, ProblemError
from api.routers.responses import problems
from api.services.fidelity import KNOWN_GPUS, KNOWN_SOURCES, UnknownFilterError, filtered_report
from planner.fidelity.report import FidelityReport

router = APIRouter(tags=["fidelity"], dependencies=[ReadAccess])


@router.get(
    "/fidelity", response_model=FidelityReport, responses=problems(401, 422),
    summary="Every measured corpus run priced at its exact configuration: errors per GPU type, source "
    "and quantity, leave-one-source-out, and the targets",
)
def get_fidelity(
    gpu: Annotated[str | None, Query(
        description="Only the runs on this GPU type (a catalog name, e.g. H100-SXM-80GB)",
        # Documented for clients; checked below so that a bad value gets a message listing the known ones.
        json_schema_extra={"enum": list(KNOWN_GPUS)},
    )] = None,
    source: Annotated[str | None, Query(
        description="Only the runs of this corpus source (its id, the corpus file's name)",
        json_schema_extra={"enum": list(KNOWN_SOURCES)},
    )] = None,
) -> FidelityReport:
    """The report `fsdp-planner fidelity --write` stored with this release (the service does not price
    the corpus itself: that takes a minute). The filters narrow `runs`; the summaries and targets are
    always the whole corpus'."""
    try:
        return filtered_report(gpu=gpu, source=source)
    except UnknownFilterError as exc:
        error = FieldError(location="query", field=exc.parameter, message=str(exc), type="value_error")
        raise ProblemError(422, f"{exc.parameter}: {exc}", slug="invalid-request", title="Invalid request",
                           errors=[error]) from None
