"""The command line's mesh-axis pins (`--tp`, `--cp`, `--pp`, ...): one option per axis of the registry
(contract/mesh.py `AXES`) that has a search field, generated from it with its help text, and read back
into the search space's pin fields. A command that takes them declares one parameter,
`axis_pins: AxisPins = None`, where its options belong, and is decorated with `with_axis_pins`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer

from api.cli.common import fail
from api.typed_numbers import parse_whole
from contract.mesh import Axis, searched_axes
from planner.bounds import degree_range, max_degree

AxisPins = Mapping[str, list[str] | None] | None
"""What the command receives: each pinned axis's name -> its option's values as typed (None: not given)."""
PIN_METAVAR = "N[,N...]"
PARAMETER = "axis_pins"
"""The parameter a command declares where the generated options go."""
Command = TypeVar("Command", bound=Callable[..., Any])


def pin_parameters(
    axes: tuple[Axis, ...] | None = None,
    *,
    help_suffix: str = "",
    kind: inspect._ParameterKind = inspect.Parameter.KEYWORD_ONLY,
) -> list[inspect.Parameter]:
    """A parameter per searched axis (of the registry, or `axes`), annotated as typer reads options:
    `--tp N[,N...]`."""
    return [
        inspect.Parameter(
            entry.name,
            kind,
            default=None,
            annotation=Annotated[
                list[str] | None,
                typer.Option(entry.option, metavar=PIN_METAVAR, help=entry.cli_help + help_suffix),
            ],
        )
        for entry in (axes if axes is not None else searched_axes())
        if entry.option
    ]


def with_axis_pins(*, help_suffix: str = "") -> Callable[[Command], Command]:
    """Decorate a typer command: its `axis_pins` parameter becomes one option per searched axis in
    its signature (what typer reads), and the command receives their values as one mapping."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        where = signature.parameters[PARAMETER]
        generated = pin_parameters(help_suffix=help_suffix, kind=where.kind)
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            parameters.extend(generated if parameter is where else [parameter])

        @functools.wraps(command)
        def wrapper(**options: Any) -> Any:
            pins = {parameter.name: options.pop(parameter.name, None) for parameter in generated}
            return command(**options, **{PARAMETER: pins})

        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper  # type: ignore[return-value]

    return decorate


def choices(values: list[str] | None) -> list[str]:
    """`--opt a --opt b,c` -> [a, b, c] (blank parts ignored)."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def pinned_degrees(axis_pins: AxisPins) -> dict[str, list[int]]:
    """The search space's pin fields for the given options (`{"tensor_parallel_degrees": [8]}`); a
    value that is not a degree exits with one line naming the option."""
    pins: dict[str, list[int]] = {}
    for entry in searched_axes():
        values = (axis_pins or {}).get(entry.name)
        if not values or not entry.search_field:
            continue
        option = entry.option
        # ASCII digits only: str.isdigit() is true for '²' (int() then fails) and '٣' (int() reads 3).
        degrees = [(d, parse_whole(d, low=1, high=max_degree(entry))) for d in choices(values)]
        bad = [d for d, degree in degrees if degree is None]
        if bad or not degrees:
            article = "an" if entry.what[0] in "aeiou" else "a"
            raise fail(
                f"{option}: {bad[0] if bad else '(empty)'!r} is not {article} {entry.what} degree; give "
                f"{degree_range(entry)}, e.g. {option} 8 or {option} 2,4 (leave "
                f"{option} out to search every degree)"
            )
        pins[entry.search_field] = sorted({degree for _, degree in degrees if degree is not None})
    return pins
