"""Stable hash of a plan's inputs: the dedup key of stored plans and the plan's provenance."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from planner import PLANNER_VERSION
from planner.specs import PlanRequest


def plan_hash(
    request: PlanRequest, *, calibration_id: str | None = None, config: dict[str, Any] | None = None
) -> str:
    """sha256 over the canonical request, the calibration used and the planner version (and, for a
    plan priced for one fixed configuration instead of searched, that configuration).

    Two requests that plan the same thing hash the same whatever their key order or defaults
    spelled out; a different planner version or calibration gives a different hash.
    """
    document = {
        "request": request.model_dump(mode="json"),
        "calibration_id": calibration_id,
        "planner_version": PLANNER_VERSION,
    }
    if config is not None:
        document["config"] = config
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
