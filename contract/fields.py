"""What the contract's dataclasses share: a bound on a field, and the check every instance passes.

Both readers honour them: the runtime's (contract.plan_document) and pydantic's (the planner and the
API, through the duck-typed hooks below: no pydantic import here).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any


@functools.cache
def _classes_of(module_name: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module's source, by name: the module parsed once."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    except (OSError, TypeError):  # no source shipped (a zipped or compiled-only install): no descriptions
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right below its annotated line), by field name, as pydantic's
    `use_attribute_docstrings` reads them. That option re-parsed the class's whole module each time a
    pydantic model holding the class was built (0.2 s of every command's start, issue 42); this reads
    each module once, and only when a JSON Schema or a field description is asked for."""
    node = _classes_of(cls.__module__).get(cls.__qualname__)
    if node is None:
        return {}
    docs: dict[str, str] = {}
    for previous, statement in zip(node.body, node.body[1:], strict=False):
        if (isinstance(previous, ast.AnnAssign) and isinstance(previous.target, ast.Name)
                and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)):
            docs[previous.target.id] = inspect.cleandoc(statement.value.value)
    return docs


def field_descriptions(cls: type) -> dict[str, str]:
    """The descriptions a JSON Schema gives `cls`'s fields: their docstrings, except (as pydantic does) a
    field typed by a class whose own docstring reads the same (the class's schema already says it)."""
    hints = typing.get_type_hints(cls)
    return {name: doc for name, doc in field_docstrings(cls).items()
            if inspect.cleandoc(getattr(hints.get(name), "__doc__", None) or "") != doc}


def describe_fields(schema: dict[str, Any], cls: type) -> None:
    """pydantic's `json_schema_extra` hook: the field docstrings as the properties' descriptions."""
    properties = schema.get("properties", {})
    for name, doc in field_descriptions(cls).items():
        if name in properties:
            properties[name].setdefault("description", doc)


DOCUMENT_CONFIG: dict[str, Any] = {"extra": "forbid", "json_schema_extra": describe_fields}
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
