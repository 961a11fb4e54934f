"""What the contract's dataclasses share: a bound on a field, and the check every instance passes.

Both readers honour them: the runtime's (contract.plan_document) and pydantic's (the planner and the
API, through the duck-typed hooks below: no pydantic import here).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

DOCUMENT_CONFIG: dict[str, Any] = {"extra": "forbid", "use_attribute_docstrings": True}
"""pydantic's reading of the contract's dataclasses (`__pydantic_config__`): unknown keys refused, the
field docstrings become the JSON Schema's descriptions. The runtime's reader ignores unknown keys."""


class FieldError(ValueError):
    """A field value out of its bounds: the message names the field."""


@dataclass(frozen=True, slots=True)
class AtLeast:
    """A field's lower bound (`Annotated[int, AtLeast(1)]`)."""

    bound: float

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        schema = handler(source)
        schema["ge"] = self.bound  # int and float core schemas both take `ge`
        return schema


@functools.cache
def _bounded_fields(cls: type) -> tuple[tuple[str, type, tuple[AtLeast, ...]], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    described = []
    for f in dataclasses.fields(cls):
        hint = _without_none(hints[f.name])
        bounds: tuple[AtLeast, ...] = ()
        if typing.get_origin(hint) is typing.Annotated:
            bounds = tuple(m for m in hint.__metadata__ if isinstance(m, AtLeast))
            hint = typing.get_args(hint)[0]
        described.append((f.name, hint, bounds))
    return tuple(described)


def _without_none(hint: Any) -> Any:
    """`X` for an optional `X | None`; other hints as they are."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return hint


def check_fields(instance: Any) -> None:
    """Enforce the `AtLeast` bounds of a dataclass instance and store whole numbers given for `float`
    fields as floats (so a document, and its hash, read the same however it was built). Call from
    `__post_init__`."""
    for name, hint, bounds in _bounded_fields(type(instance)):
        value = getattr(instance, name)
        if value is None:
            continue
        if dataclasses.is_dataclass(hint) and not isinstance(value, hint):
            # A document's part given as a plain dict (or anything else) would pass unchecked.
            raise FieldError(f"{name}: expected a {hint.__name__}, got {type(value).__name__}")
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            object.__setattr__(instance, name, value)  # frozen: the one write, at construction
        for bound in bounds:
            if isinstance(value, int | float) and value < bound.bound:
                raise FieldError(f"{name}: must be at least {bound.bound:g}, got {value!r}")
