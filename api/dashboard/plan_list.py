"""The plans page's state: sort, filters and page from the query string, and the links that change them.

The rows themselves come from `api.services.plan_listing` (the API's listing: same filters, same sorts,
same keyset cursor). Unlike the API, a page never answers a bad query parameter with an error: it falls
back to the default and says so, because the parameter usually came from an old bookmark.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from starlette.datastructures import QueryParams

from api.schemas.plans import MAX_ID, MAX_NODES, PlanSort, SortOrder
from api.services.plan_listing import PlanFilters
from api.typed_numbers import parse_whole
from contract.mesh import Axis, searched_axes
from contract.parallel_config import ShardingStrategy
from planner.bounds import max_degree

DEFAULT_PAGE_SIZE = 25
MAX_PAGE_SIZE = 200
MAX_FILTER_LENGTH = 200
SHARDINGS: tuple[str, ...] = typing.get_args(ShardingStrategy)
FILTER_AXES: tuple[Axis, ...] = searched_axes()
"""The mesh axes the plan list filters by (`?tp=2`): each with a search field, innermost first."""


@dataclass(frozen=True)
class Column:
    """A column of the plans table; `sort` is None for columns the listing cannot sort on."""

    label: str
    sort: PlanSort | None = None
    numeric: bool = False


COLUMNS = (
    Column("Name"),
    Column("Model", PlanSort.model),
    Column("Cluster"),
    Column("GPUs", PlanSort.world_size, numeric=True),
    Column("Mesh"),
    Column("Tokens/s/GPU", PlanSort.tokens_per_s_per_gpu, numeric=True),
    Column("MFU", PlanSort.mfu, numeric=True),
    Column("Peak memory", PlanSort.peak_memory_gib, numeric=True),
    Column("Step time", numeric=True),
    Column("Created", PlanSort.created_at),
)
# Clicking a column first sorts it the way people look at it: best/newest first, names A to Z.
FIRST_ORDER = {PlanSort.model: SortOrder.asc, PlanSort.peak_memory_gib: SortOrder.asc}


@dataclass(frozen=True)
class SortLink:
    href: str
    active: bool
    aria_sort: str
    """`ascending`, `descending` or `none` (for screen readers)."""
    arrow: str


def _words(entry: Axis) -> str:
    """`Tensor parallel`: how the list names an axis's filter."""
    return entry.what.replace("-", " ").capitalize()


@dataclass(frozen=True)
class AxisFilter:
    """One mesh axis's filter as the page shows it."""

    axis: str
    label: str
    options: list[int]
    chosen: int | None


@dataclass(frozen=True)
class ListingState:
    sort: PlanSort = PlanSort.created_at
    order: SortOrder = SortOrder.desc
    model: str = ""
    gpu: str = ""
    q: str = ""
    nodes: int | None = None
    sharding: str = ""
    degrees: tuple[tuple[str, int], ...] = ()
    """The mesh-axis filters set, (axis, degree) in `FILTER_AXES` order (`?tp=2&pp=4`)."""
    limit: int = DEFAULT_PAGE_SIZE
    cursor: str | None = None
    notices: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, params: QueryParams) -> ListingState:
        notices = []

        def text(name: str) -> str:
            value = params.get(name, "").strip()
            if len(value) > MAX_FILTER_LENGTH:
                notices.append(f"The {name} filter was too long and was ignored.")
                return ""
            return value

        sort, order = PlanSort.created_at, SortOrder.desc
        if "sort" in params:
            try:
                sort = PlanSort(params["sort"])
                order = FIRST_ORDER.get(sort, SortOrder.desc)
            except ValueError:
                notices.append(f"Unknown sort {params['sort'][:40]!r}; showing the newest plans first.")
        if "order" in params:
            try:
                order = SortOrder(params["order"])
            except ValueError:
                notices.append(f"Unknown order {params['order'][:10]!r}; use asc or desc.")
        raw_nodes = text("nodes")
        nodes = parse_whole(raw_nodes, low=1, high=MAX_NODES) if raw_nodes else None
        if raw_nodes and nodes is None:
            notices.append(f"Nodes must be a whole number from 1 to {MAX_NODES}; that filter was ignored.")
        sharding = text("sharding")
        if sharding and sharding not in SHARDINGS:
            notices.append(f"Unknown sharding {sharding[:40]!r} (use one of {', '.join(SHARDINGS)}); "
                           "that filter was ignored.")
            sharding = ""
        degrees = []
        for entry in FILTER_AXES:  # a filter per mesh axis with a search field (contract/mesh.py)
            raw = text(entry.name)
            high = max_degree(entry)
            degree = parse_whole(raw, low=1, high=high) if raw else None
            if raw and degree is None:
                notices.append(f"{_words(entry)} must be a whole number from 1 to {high}; that filter was "
                               "ignored.")
            if degree is not None:
                degrees.append((entry.name, degree))
        limit = DEFAULT_PAGE_SIZE
        if "limit" in params:
            asked = parse_whole(params["limit"], low=0, high=MAX_ID)
            if asked is None:
                notices.append(f"The page size must be a whole number from 1 to {MAX_PAGE_SIZE}; "
                               f"showing {DEFAULT_PAGE_SIZE} plans a page.")
            else:
                limit = min(max(asked, 1), MAX_PAGE_SIZE)
        cursor = params.get("cursor") or None
        return cls(sort=sort, order=order, model=text("model"), gpu=text("gpu"), q=text("q"), nodes=nodes,
                   sharding=sharding, degrees=tuple(degrees), limit=limit, cursor=cursor,
                   notices=tuple(notices))

    def filters(self) -> PlanFilters:
        return PlanFilters(model=self.model or None, gpu=self.gpu or None, nodes=self.nodes, q=self.q or None,
                           sharding=self.sharding or None, **dict(self.degrees))

    @property
    def filtered(self) -> bool:
        return bool(self.model or self.gpu or self.q or self.nodes is not None or self.sharding
                    or self.degrees)

    def degree(self, axis: str) -> int | None:
        """The filter's degree on `axis` (None: any)."""
        return dict(self.degrees).get(axis)

    def axis_filters(self, stored: dict[str, list[int]]) -> list[AxisFilter]:
        """A select per filtered axis: the degrees stored plans have on it (`stored`), and the one
        asked for even where no plan has it."""
        filters = []
        for entry in FILTER_AXES:
            chosen = self.degree(entry.name)
            options = list(stored.get(entry.name, []))
            if chosen is not None and chosen not in options:
                options.append(chosen)
            filters.append(AxisFilter(axis=entry.name, label=_words(entry), options=options, chosen=chosen))
        return filters

    def cleared(self) -> str:
        """The link that drops every filter (keeps the sort)."""
        return self.href(model="", gpu="", q="", nodes=None, sharding="", degrees=(), cursor=None)

    def href(self, **changes: object) -> str:
        """`/?...` for this state with `changes` applied; defaults are left out to keep links short."""
        state = replace(self, **changes)  # type: ignore[arg-type]
        query = {
            "sort": state.sort.value if state.sort is not PlanSort.created_at else None,
            "order": state.order.value if state.order is not FIRST_ORDER.get(state.sort, SortOrder.desc)
            else None,
            "model": state.model, "gpu": state.gpu, "q": state.q, "nodes": state.nodes,
            "sharding": state.sharding, **dict(state.degrees),
            "limit": state.limit if state.limit != DEFAULT_PAGE_SIZE else None,
            "cursor": state.cursor,
        }
        encoded = urlencode({k: v for k, v in query.items() if v})
        return f"/?{encoded}" if encoded else "/"

    def sort_link(self, sort: PlanSort) -> SortLink:
        active = sort is self.sort
        if active:
            order = SortOrder.asc if self.order is SortOrder.desc else SortOrder.desc
        else:
            order = FIRST_ORDER.get(sort, SortOrder.desc)
        aria = ("ascending" if self.order is SortOrder.asc else "descending") if active else "none"
        arrow = ("▲" if self.order is SortOrder.asc else "▼") if active else ""
        return SortLink(self.href(sort=sort, order=order, cursor=None), active, aria, arrow)
