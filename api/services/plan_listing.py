"""Listing stored plans: filters, sort, and keyset pagination behind an opaque cursor.

The cursor carries the last row's sort value and id, so a page costs an index range scan however deep
it is, and rows inserted meanwhile neither repeat nor get skipped. It also carries the sort and a digest
of the filters it was issued for, so that it is refused when reused with others.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from api.db.models import PlanRow, mesh_degree
from api.problems import FieldError, ProblemError
from api.schemas.plans import MAX_ID, PlanSort, SortOrder
from api.text_check import load_json_text
from contract.mesh import MESH_AXES
from planner.catalog.gpus import resolve_gpu
from planner.errors import UnknownCatalogEntryError

SORT_COLUMNS: dict[PlanSort, InstrumentedAttribute[Any]] = {
    PlanSort.created_at: PlanRow.created_at,
    PlanSort.tokens_per_s_per_gpu: PlanRow.tokens_per_s_per_gpu,
    PlanSort.mfu: PlanRow.mfu,
    PlanSort.peak_memory_gib: PlanRow.peak_memory_gib,
    PlanSort.world_size: PlanRow.world_size,
    PlanSort.model: PlanRow.model_name,
}


@dataclass(frozen=True, init=False)
class PlanFilters:
    model: str | None = None
    gpu: str | None = None
    nodes: int | None = None
    q: str | None = None
    sharding: str | None = None
    mesh: tuple[tuple[str, int], ...] = ()
    """(axis, degree) pairs, in `MESH_AXES` order: plans whose mesh has that degree on each of those
    axes (degree 1: plans without that parallelism)."""

    def __init__(
        self, *, model: str | None = None, gpu: str | None = None, nodes: int | None = None,
        q: str | None = None, sharding: str | None = None, **degrees: int | None,
    ) -> None:
        """`degrees`: a mesh axis's name (`tp=2`, `pp=4`, any of `MESH_AXES`) -> its degree, None: any."""
        unknown = sorted(set(degrees) - set(MESH_AXES))
        if unknown:
            raise TypeError(f"PlanFilters: {', '.join(unknown)} is not a mesh axis ({', '.join(MESH_AXES)})")
        mesh = tuple((axis, degrees[axis]) for axis in MESH_AXES if degrees.get(axis) is not None)
        for name, value in (("model", model), ("gpu", gpu), ("nodes", nodes), ("q", q),
                            ("sharding", sharding), ("mesh", mesh)):
            object.__setattr__(self, name, value)  # frozen: set once, here

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def conditions(self) -> list[ColumnElement[bool]]:
        conditions: list[ColumnElement[bool]] = []
        if self.model is not None:
            conditions.append(func.lower(PlanRow.model_name) == self.model.strip().lower())
        if self.gpu is not None:
            conditions.append(PlanRow.gpu == _canonical_gpu(self.gpu))
        if self.nodes is not None:
            conditions.append(PlanRow.num_nodes == self.nodes)
        if self.sharding is not None:
            conditions.append(PlanRow.sharding == self.sharding)
        # The very expressions the ix_plans_mesh_* indexes were made on, so that the database uses them.
        conditions.extend(mesh_degree(axis) == degree for axis, degree in self.mesh)
        if self.q:
            conditions.append(func.lower(PlanRow.name).contains(self.q.lower(), autoescape=True))
        return conditions


def _canonical_gpu(name: str) -> str:
    # Filtering by an alias (`H100`) finds plans stored under the catalog name (`H100-SXM-80GB`).
    try:
        return resolve_gpu(name).name
    except UnknownCatalogEntryError:
        return name


def list_plans(
    session: Session,
    *,
    filters: PlanFilters,
    sort: PlanSort,
    order: SortOrder,
    limit: int,
    cursor: str | None,
) -> tuple[list[PlanRow], str | None]:
    """One page of plans and the cursor of the next page (None on the last)."""
    column = SORT_COLUMNS[sort]
    query: Select[tuple[PlanRow]] = select(PlanRow).where(*filters.conditions())
    if cursor is not None:
        value, last_id = _decode(cursor, sort, order, filters)
        query = query.where(_after(column, order, value, last_id))
    if order is SortOrder.asc:
        query = query.order_by(column.asc(), PlanRow.id.asc())
    else:
        query = query.order_by(column.desc(), PlanRow.id.desc())
    rows = list(session.scalars(query.limit(limit + 1)))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, _encode(sort, order, filters, getattr(last, column.key), last.id)


def _after(
    column: InstrumentedAttribute[Any], order: SortOrder, value: Any, last_id: int
) -> ColumnElement[bool]:
    if order is SortOrder.asc:
        return or_(column > value, and_(column == value, PlanRow.id > last_id))
    return or_(column < value, and_(column == value, PlanRow.id < last_id))


def _encode(sort: PlanSort, order: SortOrder, filters: PlanFilters, value: Any, last_id: int) -> str:
    if isinstance(value, datetime):
        value = value.isoformat()
    payload = {"s": sort.value, "o": order.value, "f": filters.digest(), "v": value, "i": last_id}
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, sort: PlanSort, order: SortOrder, filters: PlanFilters) -> tuple[Any, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        payload = load_json_text(raw.decode())  # the client's text: bounded like every JSON field
        value, last_id = payload["v"], payload["i"]
        issued_for = (payload["s"], payload["o"], payload["f"])
        if not isinstance(last_id, int) or isinstance(last_id, bool) or not 0 <= last_id <= MAX_ID:
            raise TypeError(last_id)
        if sort is PlanSort.created_at:
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                raise TypeError(value)
        elif sort is PlanSort.model:
            if not isinstance(value, str):
                raise TypeError(value)
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise TypeError(value)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, OverflowError):
        raise _bad_cursor("this cursor is not one the server issued; start again without `cursor`") from None
    if issued_for != (sort.value, order.value, filters.digest()):
        raise _bad_cursor(
            "this cursor belongs to a listing with another sort, order or filters; "
            "keep those the same while paging, or start again without `cursor`"
        )
    return value, last_id


def _bad_cursor(detail: str) -> ProblemError:
    return ProblemError(
        422, detail, slug="invalid-cursor", title="Invalid cursor",
        errors=[FieldError(location="query", field="cursor", message=detail, type="invalid_cursor")],
    )
