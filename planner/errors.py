"""Errors the planner raises for inputs that are valid in shape but cannot be planned."""

from __future__ import annotations


class PlanningError(ValueError):
    """A request that cannot be planned; `field` names the input a person should change."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class UnknownCatalogEntryError(PlanningError):
    """A model or GPU name that the catalog does not know."""


class UnsupportedArchitectureError(PlanningError):
    """A Hugging Face config whose architecture the planner cannot model."""


class InfeasiblePlanError(PlanningError):
    """No configuration fits in memory on the requested cluster.

    `min_fitting_nodes` is the smallest node count (same GPU and GPUs per node) on which the
    least memory-hungry configuration fits, or None when even the largest cluster tried does not.
    """

    def __init__(
        self,
        message: str,
        *,
        min_fitting_nodes: int | None,
        min_peak_memory_gib: float,
        capacity_gib: float,
    ) -> None:
        super().__init__(message, field="cluster")
        self.min_fitting_nodes = min_fitting_nodes
        self.min_peak_memory_gib = min_peak_memory_gib
        self.capacity_gib = capacity_gib
