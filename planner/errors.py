"""Errors the planner raises for inputs that are valid in shape but cannot be planned."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import ValidationError


class PlanningError(ValueError):
    """A request that cannot be planned; `field` names the input a person should change."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __reduce__(self) -> tuple:
        # Keyword-only arguments are not in `args`, so the default pickling cannot rebuild a
        # subclass; the service's search pool sends these errors between processes.
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[PlanningError], args: tuple, state: dict) -> PlanningError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class UnknownCatalogEntryError(PlanningError):
    """A model or GPU name that the catalog does not know."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'llama3-8b'?)` for a name one slip away from a known one (a letter missed,
    doubled or swapped, case and spaces aside), else empty: the refusal leads with the fix."""
    by_lower = {entry.lower(): entry for entry in known}
    close = difflib.get_close_matches(name.strip().lower(), by_lower, n=1, cutoff=0.8)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


class UnsupportedArchitectureError(PlanningError):
    """A Hugging Face config whose architecture the planner cannot model."""


class SearchSpaceError(PlanningError):
    """A request whose search space holds more configurations than one request may price
    (planner/enumeration.py `check_space`): refused before anything is priced."""

    def __init__(self, message: str, *, configurations: int, limit: int) -> None:
        super().__init__(message, field="search")
        self.configurations = configurations
        """How many configurations were counted before counting stopped (past `limit`)."""
        self.limit = limit


class InfeasiblePlanError(PlanningError):
    """No configuration fits in memory on the requested cluster.

    The advice is what the planner accepts (planner/infeasibility.py `advise`): `min_fitting_nodes` is
    the smallest node count (same GPU and GPUs per node) on which the request plans, with the global
    batch `suggested_global_batch_tokens` (the requested one when it plans there, else the nearest that
    splits over the data-parallel ranks of a searched tensor-parallel degree and plans; the node count
    may be the requested one, with another batch), or None when even the largest cluster tried does
    not; `min_fitting_nodes_same_batch` the smallest that plans the requested batch unchanged.
    `dominant_memory_term` names what holds most of the lightest configuration's peak on the
    requested cluster; `needs_model_parallelism` says that data parallelism alone cannot fit it, or
    fits it only where activations dominate.
    """

    def __init__(
        self,
        message: str,
        *,
        min_fitting_nodes: int | None,
        min_peak_memory_gib: float,
        capacity_gib: float,
        suggested_global_batch_tokens: int | None = None,
        min_fitting_nodes_same_batch: int | None = None,
        dominant_memory_term: str | None = None,
        dominant_memory_gib: float | None = None,
        needs_model_parallelism: bool = False,
        advice: str = "",
    ) -> None:
        super().__init__(message, field="cluster")
        self.min_fitting_nodes = min_fitting_nodes
        self.min_peak_memory_gib = min_peak_memory_gib
        self.capacity_gib = capacity_gib
        self.suggested_global_batch_tokens = suggested_global_batch_tokens
        self.min_fitting_nodes_same_batch = min_fitting_nodes_same_batch
        self.dominant_memory_term = dominant_memory_term
        self.dominant_memory_gib = dominant_memory_gib
        self.needs_model_parallelism = needs_model_parallelism
        self.advice = advice
        """The message's remedy alone (what would fit), for callers that explain the refusal their way."""

    def problem_fields(self) -> dict[str, object]:
        """The advice as JSON members (the API's infeasible-plan problem)."""
        return {
            "min_fitting_nodes": self.min_fitting_nodes,
            "suggested_global_batch_tokens": self.suggested_global_batch_tokens,
            "min_fitting_nodes_same_batch": self.min_fitting_nodes_same_batch,
            "min_peak_memory_gib": self.min_peak_memory_gib,
            "capacity_gib": self.capacity_gib,
            "dominant_memory_term": self.dominant_memory_term,
            "dominant_memory_gib": self.dominant_memory_gib,
            "needs_model_parallelism": self.needs_model_parallelism,
        }


class SearchDeadlineError(PlanningError):
    """The search ran past the time the caller allowed it (a server's limit per request)."""

    def __init__(self, message: str, *, time_limit_s: float, candidates_priced: int) -> None:
        super().__init__(message, field="search")
        self.time_limit_s = time_limit_s
        self.candidates_priced = candidates_priced


def describe_validation_error(exc: ValidationError, *, prefix: str = "") -> list[str]:
    """One line per problem, `field.path: what is wrong and how to fix it`.

    Our validators already lead with the field they concern; pydantic's own messages get the
    location in front.
    """
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        where = ".".join(filter(None, [prefix, *(str(p) for p in error["loc"])]))
        if where and not message.startswith(where.split(".")[-1] + ":"):
            message = f"{where}: {message}"
        lines.append(message)
    return lines
