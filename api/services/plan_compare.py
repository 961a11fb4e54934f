"""Stored plans side by side: which plans, which fields, what differs and which value is best.

One implementation behind the dashboard's /compare page and GET /api/v1/plans/compare: both read
the ids the same way, load the same rows and compare the same fields on their raw values; the page
only formats them for reading.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.db.models import PlanRow
from api.schemas.plans import MAX_ID
from api.services.plan_documents import read_plan
from api.services.plans import full_plan
from api.typed_numbers import parse_id
from contract.mesh import AXES, Axis, exposed_comm_axes
from planner.cost.memory import MEMORY_TERMS
from planner.formatting import between
from planner.plan import Plan, PredictionInterval

MIN_COMPARED = 2
MAX_COMPARED = 8


def whole_numbers_up_to(limit: int) -> str:
    """A regular expression (Python and JSON Schema alike) for the decimals 1 to `limit`, without
    leading zeros: shorter numbers, then at each digit of `limit` a smaller digit and any rest."""
    digits = str(limit)
    options = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else []
    for i, digit in enumerate(digits):
        lowest = 1 if i == 0 else 0
        if int(digit) > lowest:
            options.append(f"{digits[:i]}[{lowest}-{int(digit) - 1}][0-9]{{{len(digits) - i - 1}}}")
    options.append(digits)
    return "(?:" + "|".join(options) + ")"


_ID = whole_numbers_up_to(MAX_ID)
# What a comparison accepts in one query value: ids (1 to MAX_ID, as everywhere) separated by commas
# (the dashboard also takes repeated `ids=` values and spaces, which a link or a form can produce).
IDS_PATTERN = f"^{_ID}(,{_ID})*$"

Scalar = str | int | float | bool | None
Better = Literal["higher", "lower"] | None


class CompareIdsError(ValueError):
    """Ids that name no comparison; the message says what to send instead."""


def parse_ids(values: Iterable[str]) -> list[int]:
    """Plan ids from `ids` query values (`1,2` or repeated), in order, duplicates dropped."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            plan_id = parse_id(part)
            if plan_id is None:
                raise CompareIdsError(
                    f"{part[:40]!r} is not a plan id: ids are whole numbers from 1 to {MAX_ID}, e.g. ids=3,7"
                )
            if plan_id not in ids:
                ids.append(plan_id)
    return ids


def parse_query_ids(values: Iterable[str]) -> list[int]:
    """The API's reading: each value must match IDS_PATTERN (what its OpenAPI schema says), then the
    ids are parsed and counted as on the dashboard."""
    values = list(values)
    for value in values:
        if re.fullmatch(IDS_PATTERN, value):
            continue
        if re.fullmatch(r"[0-9]+(,[0-9]+)*", value):  # a list, with an id out of range: name it
            bad = next(part for part in value.split(",") if not re.fullmatch(_ID, part))
            raise CompareIdsError(
                f"{bad[:40]!r} is not a plan id: ids are whole numbers from 1 to {MAX_ID} without leading "
                "zeros, e.g. ids=3,7"
            )
        raise CompareIdsError(
            f"{value[:40]!r} is not a list of plan ids: send comma-separated positive whole numbers, "
            "e.g. ids=3,7"
        )
    ids = parse_ids(values)
    check_count(ids)
    return ids


def check_count(ids: Sequence[int]) -> None:
    if not MIN_COMPARED <= len(ids) <= MAX_COMPARED:
        raise CompareIdsError(
            f"name between {MIN_COMPARED} and {MAX_COMPARED} different plans to compare ({len(ids)} given), "
            "e.g. ids=3,7"
        )


class MissingPlansError(LookupError):
    def __init__(self, missing: list[int]) -> None:
        super().__init__(f"plan(s) {', '.join(map(str, missing))} do not exist (they may have been deleted)")
        self.missing = missing


def load_plans(session: Session, ids: Sequence[int]) -> list[tuple[PlanRow, Plan]]:
    """The rows and their read-back Plans, in the order asked; MissingPlansError names absent ids.

    Raises `UnreadablePlanError` for a document this planner version cannot read.
    """
    rows = {row.id: row for row in session.scalars(
        select(PlanRow).where(PlanRow.id.in_(ids)).options(*full_plan())
    )}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise MissingPlansError(missing)
    return [(rows[i], read_plan(rows[i])) for i in ids]


@dataclass(frozen=True)
class ComparedField:
    key: str
    """Where the value comes from, as a dotted path (`config.sharding`, `prediction.mfu`)."""
    section: str
    label: str
    value: Callable[[PlanRow, Plan], Scalar]
    better: Better = None
    """For predictions: which direction is better (the best value is marked when values differ)."""


@dataclass(frozen=True)
class Comparison:
    field: ComparedField
    values: list[Scalar]
    differs: bool
    best: list[int]
    """Positions of the best value (fields with a direction only, and only when the values differ)."""


def _memory(key: str, label: str) -> ComparedField:
    return ComparedField(f"prediction.memory_breakdown_gib.{key}", "Memory per GPU", label,
                         lambda _r, p: getattr(p.prediction.memory_breakdown_gib, key), "lower")


def _interval(interval: PredictionInterval | None, *, decimals: int = 0) -> str | None:
    """An interval as its two ends, `7,193–8,737` (None for plans stored before schema 2.2)."""
    return None if interval is None else between(interval.low, interval.high, decimals=decimals)


def _axis_field(entry: Axis) -> ComparedField:
    """The compare table's row for a mesh axis: its degree in each plan."""
    return ComparedField(f"config.mesh.{entry.name}", "Configuration", entry.compare_label,
                         lambda _r, p: p.config.mesh.degree(entry.name))


def _exposed_comm(entry: Axis) -> ComparedField:
    """The compare table's row for an axis's exposed communication (`Axis.exposed_comm`)."""
    return ComparedField(f"prediction.{entry.exposed_comm}", "Prediction", f"of which {entry.spoken}",
                         lambda _r, p: getattr(p.prediction, entry.exposed_comm), "lower")


FIELDS: tuple[ComparedField, ...] = (
    ComparedField("name", "Inputs", "Name", lambda r, _p: r.name),
    ComparedField("model.name", "Inputs", "Model", lambda _r, p: p.model.name),
    ComparedField("model.num_params", "Inputs", "Parameters", lambda _r, p: p.model.num_params),
    ComparedField("cluster", "Inputs", "Cluster",
                  lambda _r, p: f"{p.cluster.num_nodes}x{p.cluster.gpus_per_node}x{p.cluster.gpu}"),
    ComparedField("cluster.world_size", "Inputs", "GPUs", lambda _r, p: p.cluster.world_size),
    ComparedField("training.seq_len", "Inputs", "Sequence length", lambda _r, p: p.training.seq_len),
    ComparedField("training.global_batch_tokens", "Inputs", "Global batch (tokens)",
                  lambda _r, p: p.training.global_batch_tokens),
    ComparedField("training.precision", "Inputs", "Precision", lambda _r, p: p.training.precision),
    ComparedField("training.optimizer", "Inputs", "Optimizer", lambda _r, p: p.training.optimizer),
    ComparedField("calibration_id", "Inputs", "Calibration", lambda r, _p: r.calibration_id),
    # None for plans stored before schema 2.2 (not applicable, as for a missing interval below).
    ComparedField("network_assumed", "Inputs", "Network between nodes", lambda _r, p: p.network_assumed),
    ComparedField("config.sharding", "Configuration", "Sharding", lambda _r, p: p.config.sharding),
    # A row per mesh axis, outermost first (contract/mesh.py's registry).
    *(_axis_field(entry) for entry in AXES),
    # Null without a pipeline: not applicable, as every_k is outside selective checkpointing.
    ComparedField("config.pipeline", "Configuration", "Pipeline schedule",
                  lambda _r, p: p.config.pipeline.label() if p.config.pipeline is not None else None),
    ComparedField("config.blocks_per_unit", "Configuration", "Blocks per unit",
                  lambda _r, p: p.config.blocks_per_unit),
    ComparedField("config.all_gather_bucket_mb", "Configuration", "All-gather bucket (MB)",
                  lambda _r, p: p.config.all_gather_bucket_mb),
    ComparedField("config.reduce_scatter_bucket_mb", "Configuration", "Reduce-scatter bucket (MB)",
                  lambda _r, p: p.config.reduce_scatter_bucket_mb),
    ComparedField("config.reshard_after_forward", "Configuration", "Reshard after forward",
                  lambda _r, p: p.config.reshard_after_forward),
    ComparedField("config.prefetch_depth", "Configuration", "Prefetch depth",
                  lambda _r, p: p.config.prefetch_depth),
    ComparedField("config.checkpointing.mode", "Configuration", "Activation checkpointing",
                  lambda _r, p: p.config.checkpointing.mode),
    # Only selective checkpointing reads every_k; elsewhere it is not applicable (null), not "1".
    ComparedField("config.checkpointing.every_k", "Configuration", "Checkpoint every k-th block",
                  lambda _r, p: p.config.checkpointing.every_k if p.config.checkpointing.mode == "selective"
                  else None),
    # And only mode `blocks` reads its count.
    ComparedField("config.checkpointing.blocks", "Configuration", "Checkpointed first blocks",
                  lambda _r, p: p.config.checkpointing.blocks if p.config.checkpointing.mode == "blocks"
                  else None),
    ComparedField("config.micro_batch_size", "Configuration", "Micro-batch (sequences)",
                  lambda _r, p: p.config.micro_batch_size),
    ComparedField("config.grad_accum_steps", "Configuration", "Accumulation steps",
                  lambda _r, p: p.config.grad_accum_steps),
    ComparedField("config.param_dtype", "Configuration", "Param dtype", lambda _r, p: p.config.param_dtype),
    ComparedField("config.reduce_dtype", "Configuration", "Reduce dtype",
                  lambda _r, p: p.config.reduce_dtype),
    ComparedField("config.float8", "Configuration", "Float8 training", lambda _r, p: p.config.float8),
    ComparedField("config.async_tp", "Configuration", "Async TP", lambda _r, p: p.config.async_tp),
    ComparedField("config.compile", "Configuration", "torch.compile", lambda _r, p: p.config.compile),
    ComparedField("prediction.step_time_s", "Prediction", "Step time",
                  lambda _r, p: p.prediction.step_time_s, "lower"),
    ComparedField("prediction.tokens_per_s_per_gpu", "Prediction", "Tokens/s per GPU",
                  lambda _r, p: p.prediction.tokens_per_s_per_gpu, "higher"),
    ComparedField("prediction.tokens_per_s_per_gpu_interval", "Prediction", "Tokens/s per GPU, 80% interval",
                  lambda _r, p: _interval(p.prediction.tokens_per_s_per_gpu_interval)),
    ComparedField("prediction.tokens_per_s", "Prediction", "Tokens/s (cluster)",
                  lambda _r, p: p.prediction.tokens_per_s, "higher"),
    ComparedField("prediction.mfu", "Prediction", "MFU", lambda _r, p: p.prediction.mfu, "higher"),
    ComparedField("prediction.peak_memory_gib", "Prediction", "Peak memory",
                  lambda _r, p: p.prediction.peak_memory_gib, "lower"),
    ComparedField("prediction.peak_memory_gib_interval", "Prediction", "Peak memory, 80% interval",
                  lambda _r, p: _interval(p.prediction.peak_memory_gib_interval, decimals=1)),
    ComparedField("prediction.exposed_comm_s", "Prediction", "Exposed communication",
                  lambda _r, p: p.prediction.exposed_comm_s, "lower"),
    *(_exposed_comm(entry) for entry in exposed_comm_axes()),
    *(_memory(key, term.label) for key, term in MEMORY_TERMS.items()),
    ComparedField("planner_version", "Provenance", "Planner version", lambda r, _p: r.planner_version),
    ComparedField("created_at", "Provenance", "Created",
                  lambda r, _p: r.created_at.isoformat(timespec="seconds")),
)


def compare(plans: Sequence[tuple[PlanRow, Plan]]) -> list[Comparison]:
    """Every field of FIELDS across the plans, in order, with whether it differs and the best."""
    result = []
    for f in FIELDS:
        values = [f.value(row, plan) for row, plan in plans]
        differs = len(set(values)) > 1
        best: list[int] = []
        if differs and f.better is not None:
            numbers = [v for v in values if isinstance(v, int | float)]
            target = max(numbers) if f.better == "higher" else min(numbers)
            best = [i for i, v in enumerate(values) if v == target]
        result.append(Comparison(f, values, differs, best))
    return result
