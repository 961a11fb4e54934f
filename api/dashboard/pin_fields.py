"""The dashboard forms' mesh-axis pins (the plan form and the study form): one number field per axis of
contract/mesh.py's registry that has a search field, named after it (`tensor_parallel_degree`), with
its label, help and bound from the table, read back into the search space's pin fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from api.typed_numbers import parse_whole
from contract.mesh import Axis, searched_axes
from planner.bounds import max_degree

PINNED_AXES: tuple[Axis, ...] = tuple(entry for entry in searched_axes() if entry.form_field)
"""The axes a form pins, innermost first (the search space's order)."""
PIN_FIELDS: tuple[str, ...] = tuple(entry.form_field for entry in PINNED_AXES if entry.form_field)
"""The forms' pin fields (`tensor_parallel_degree`, ...)."""
PIN_PATHS: tuple[tuple[str, str], ...] = tuple(
    (f"search.{entry.search_field}", entry.form_field) for entry in PINNED_AXES if entry.form_field
)
"""API field path -> form field, for putting the API's errors beside the pin they concern."""


@dataclass(frozen=True)
class PinField:
    """One mesh axis's pin field as a page shows it."""

    name: str
    axis: str
    label: str
    help: str
    value: str


def pin_fields(pins: Mapping[str, str]) -> list[PinField]:
    """The fields a form shows, with the values typed in them (`pins`: form field -> text)."""
    return [
        PinField(
            name=entry.form_field,
            axis=entry.name,
            label=f"{entry.what.capitalize()} degree",
            help=entry.form_help,
            value=pins.get(entry.form_field, ""),
        )
        for entry in PINNED_AXES
        if entry.form_field
    ]


def pinned_search(pins: Mapping[str, str], add_error: Callable[[str, str], None]) -> dict[str, list[int]]:
    """The search space's pin fields for what was typed (`{"tensor_parallel_degrees": [8]}`); a value
    that is not a degree adds an error beside its field (the bound is the API's: `max_degree`)."""
    search: dict[str, list[int]] = {}
    for entry in PINNED_AXES:
        if not (entry.search_field and entry.form_field):
            continue
        raw = pins.get(entry.form_field, "").strip()
        high = max_degree(entry)
        degree = parse_whole(raw, low=1, high=high) if raw else None
        if raw and degree is None:
            add_error(
                entry.form_field,
                f"enter a whole number from 1 to {high} (1: none), or leave it empty to search every degree",
            )
        elif degree is not None:
            search[entry.search_field] = [degree]
    return search
