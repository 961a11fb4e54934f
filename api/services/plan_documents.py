"""A stored plan's document read back through the planner's own `Plan` model.

Every field is then typed, and a document this version cannot read (stored by another planner
version) is caught in one place for the dashboard and the API alike.
"""

from __future__ import annotations

from pydantic import ValidationError

from api.db.models import PlanRow
from planner.plan import Plan


class UnreadablePlanError(ValueError):
    """A stored document that this version's Plan model rejects (stored by another planner version)."""


def read_plan(row: PlanRow) -> Plan:
    try:
        return Plan.model_validate(row.plan)
    except ValidationError as exc:
        raise UnreadablePlanError(
            f"plan {row.id} was stored by planner {row.planner_version} in a format this version cannot "
            f"show ({exc.error_count()} problem(s)); its raw JSON is still at /api/v1/plans/{row.id}"
        ) from None
