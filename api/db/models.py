"""ORM models: stored plans, calibration profiles, validation runs, API keys and idempotency keys.

The API's pydantic schemas (api/schemas) are separate: these classes describe storage only.
Every change to them needs an Alembic migration in migrations/versions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    bindparam,
    func,
    literal,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from api.db.base import Base, BigId, JsonDocument, UTCDateTime, utcnow
from contract.mesh import MESH_AXES

# SQLite otherwise hands a deleted row's id to the next insert: a stale /plans/{id} link (or a
# remembered Idempotency-Key) would then name another plan. PostgreSQL sequences never reuse ids.
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}


class PlanRow(Base):
    """One plan: its inputs, the whole Plan document, and the columns lists sort and filter on."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    model_name: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[str] = mapped_column(String(64))
    num_nodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int] = mapped_column(Integer)
    tokens_per_s_per_gpu: Mapped[float] = mapped_column(Float)
    mfu: Mapped[float] = mapped_column(Float)
    peak_memory_gib: Mapped[float] = mapped_column(Float)
    step_time_s: Mapped[float] = mapped_column(Float)
    plan_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """sha256 of the canonical request, calibration and planner version: identical inputs, one row."""
    planner_version: Mapped[str] = mapped_column(String(32))
    calibration_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("calibration_profiles.id", ondelete="RESTRICT"), index=True
    )
    # The two documents are large; lists never load them (deferred until a plan is fetched by id).
    request: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The normalized PlanRequest the planner ran on (model resolved to a full spec)."""
    plan: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The whole versioned Plan document."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Provenance of a re-plan (POST /plans/{id}/replan). Plain ids, no foreign keys: the record must
    # survive its source plan being deleted, and SQLite could not drop a referencing column again.
    replanned_from_plan_id: Mapped[int | None] = mapped_column(BigId, index=True)
    """The plan whose out-of-memory run (or configuration) this plan was re-planned to avoid."""
    replanned_from_run_id: Mapped[int | None] = mapped_column(BigId)
    """The OOM validation run whose configuration set the memory ceiling (None: the plan's own)."""
    # The chosen sharding and device mesh, copied out of `plan` so that lists filter on them and show
    # them without loading the documents.
    sharding: Mapped[str] = mapped_column(String(32))
    """config.sharding: full_shard, shard_grad_op, hybrid_shard or no_shard."""
    mesh: Mapped[dict[str, int]] = mapped_column(JsonDocument)
    """config.mesh as `Mesh.as_document()`: every axis's degree, one JSON document (migration 0010 moved
    the per-axis columns of 0003, 0008 and 0009 into it). An axis it lacks has degree 1."""

    __table_args__ = (
        # One index per sortable column, with the id tie-breaker that keyset pagination walks.
        Index("ix_plans_created_at_id", "created_at", "id"),
        Index("ix_plans_tokens_per_s_per_gpu_id", "tokens_per_s_per_gpu", "id"),
        Index("ix_plans_mfu_id", "mfu", "id"),
        Index("ix_plans_peak_memory_gib_id", "peak_memory_gib", "id"),
        Index("ix_plans_world_size_id", "world_size", "id"),
        Index("ix_plans_model_name_id", "model_name", "id"),
        Index("ix_plans_gpu_id", "gpu", "id"),
        Index("ix_plans_num_nodes_id", "num_nodes", "id"),
        NEVER_REUSE_IDS,
    )


def mesh_degree(axis: str) -> ColumnElement[int]:
    """The degree of mesh axis `axis` in a stored plan, as SQL (1 where the document lacks the axis,
    as `Mesh.from_document` reads it): what the list filters compare, and what the `ix_plans_mesh_*`
    indexes hold. The axis and the 1 are written into the SQL, not bound: SQLite and PostgreSQL use an
    expression index only for the very expression it was created on."""
    key = bindparam(None, axis, type_=JSON.JSONIndexType, literal_execute=True)
    # Grouped: PostgreSQL shows the index as `COALESCE((mesh ->> 'tp')::integer, 1)`, and Alembic's
    # check that the models match the migrations compares that text with this expression's.
    return func.coalesce(PlanRow.mesh[key].as_integer().self_group(), literal(1, literal_execute=True))


MESH_INDEXES = tuple(Index(f"ix_plans_mesh_{axis}", mesh_degree(axis)) for axis in MESH_AXES)
"""One expression index per mesh axis: a list filtered on an axis reads only the matching rows. (An
axis added to the registry gets its index from a migration; its plans need none: a missing axis reads 1.)"""


class CalibrationProfileRow(Base):
    """Measurements from profiling runs on one hardware setup, and the cost parameters fitted to them."""

    __tablename__ = "calibration_profiles"
    __table_args__ = (NEVER_REUSE_IDS,)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    """Hardware fingerprint: device name and count, links, library versions."""
    profile: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The uploaded CalibrationProfile document."""
    fitted_parameters: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class ValidationRunRow(Base):
    """A few measured steps of a plan's launcher, beside what the plan predicted; or the record of a run
    that ran out of memory (`outcome == "oom"`: no step measurements, no prediction errors)."""

    __tablename__ = "validation_runs"
    __table_args__ = (NEVER_REUSE_IDS,)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    plan_id: Mapped[int] = mapped_column(BigId, ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    outcome: Mapped[str] = mapped_column(String(16), default="completed", server_default="completed")
    """`completed` or `oom`."""
    measured_step_time_s: Mapped[float | None] = mapped_column(Float)
    measured_tokens_per_s_per_gpu: Mapped[float | None] = mapped_column(Float)
    measured_peak_memory_gib: Mapped[float | None] = mapped_column(Float)
    predicted_step_time_s: Mapped[float] = mapped_column(Float)
    predicted_tokens_per_s_per_gpu: Mapped[float] = mapped_column(Float)
    predicted_peak_memory_gib: Mapped[float] = mapped_column(Float)
    step_time_error_pct: Mapped[float | None] = mapped_column(Float)
    """(predicted - measured) / measured x 100: positive when the plan promised too slow a step."""
    tokens_per_s_error_pct: Mapped[float | None] = mapped_column(Float)
    peak_memory_error_pct: Mapped[float | None] = mapped_column(Float)
    # Out of memory (outcome == "oom"): where it failed and what the allocator said.
    oom_step: Mapped[int | None] = mapped_column(Integer)
    oom_phase: Mapped[str | None] = mapped_column(String(32))
    oom_requested_bytes: Mapped[int | None] = mapped_column(BigInteger)
    oom_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    oom_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    oom_message: Mapped[str | None] = mapped_column(String(2000))
    raw: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The run's full report (per-step times, environment)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKeyRow(Base):
    """An API key: only its sha256 is stored; `prefix` identifies it in listings and narrows the lookup."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    hashed_key: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # A name picks one active key (`keys revoke NAME`); revoked keys keep their names for the record.
        Index(
            "uq_api_keys_name_active", "name", unique=True,
            sqlite_where=text("revoked_at IS NULL"), postgresql_where=text("revoked_at IS NULL"),
        ),
        NEVER_REUSE_IDS,
    )


class IdempotencyKeyRow(Base):
    """The response an `Idempotency-Key` produced, so that a retried POST replays it."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (NEVER_REUSE_IDS,)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    """sha256 of the canonical JSON body: the same key with another body is refused."""
    plan_id: Mapped[int] = mapped_column(BigId, ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    status_code: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class JobColumns:
    """What makes a row a job (api/services/job_rows.py runs any table with these columns): its state,
    its runs, and the Idempotency-Key it was created with."""

    state: Mapped[str] = mapped_column(String(16), index=True)
    """queued, running, succeeded, failed (or cancelled, for studies): the table's schema names them."""
    error: Mapped[str | None] = mapped_column(Text)
    """Why the job failed (a person can act on it), or None."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer)
    """Times a job has claimed the row; each write of a job names its attempt, so a job whose row was
    queued again (its process presumed dead) can no longer write."""
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """When the process running the job last said it is alive (a running job whose heartbeat is older
    than `Settings.study_stale_after_s` is queued again)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    """The `Idempotency-Key` the job was created with (unique while set; cleared when it expires)."""
    request_fingerprint: Mapped[str | None] = mapped_column(String(64))
    """sha256 of the canonical request, beside its key: the same key with another request is refused."""


class StudyRow(JobColumns, Base):
    """A what-if study: one model and token budget planned on many candidate clusters (planner/study.py)."""

    __tablename__ = "studies"
    # A unique index, not a constraint: SQLite adds one without rebuilding the table (migration 0005).
    __table_args__ = (
        Index("ix_studies_idempotency_key", "idempotency_key", unique=True),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    model_name: Mapped[str] = mapped_column(String(200))
    token_budget: Mapped[int] = mapped_column(BigInteger)
    deadline_days: Mapped[float | None] = mapped_column(Float)
    gpus: Mapped[str] = mapped_column(String(1000))
    """The candidate GPU types, comma-separated (lists show them without loading the request)."""
    num_candidates: Mapped[int] = mapped_column(Integer)
    num_fitting: Mapped[int] = mapped_column(Integer)
    planner_version: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The normalized StudyRequest (model resolved to a full spec)."""
    summary: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    """StudySummary without its points (they are rows of study_points): fastest, cheapest, deadline pick;
    empty until the study's job has succeeded."""
    # The study is a job (JobColumns): its state and progress live on its row, so that any web process
    # answers GET with them and a restarted one finds the queued jobs again (api.schemas.studies.StudyState).
    candidates_done: Mapped[int] = mapped_column(Integer)
    """Candidates searched so far (num_candidates when the job has succeeded)."""
    best_so_far: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    """The StudyPoint of the cheapest fitting cluster searched so far (None while none fits)."""


class StudyPointRow(Base):
    """One candidate cluster of a study: its outcome and, when it fits, the ordinary plan stored for it."""

    __tablename__ = "study_points"
    __table_args__ = (NEVER_REUSE_IDS,)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    study_id: Mapped[int] = mapped_column(BigId, ForeignKey("studies.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    """Index in the study's candidate order (GPU type, then size); the summary's indices refer to it."""
    plan_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("plans.id", ondelete="SET NULL"), index=True
    )
    """The plan (shared with any identical request); None when the cluster does not fit, or the plan was
    deleted since (the point keeps its numbers)."""
    point: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    """The StudyPoint document."""


class PlanJobRow(JobColumns, Base):
    """A plan search run as a job (api/services/plan_jobs.py): a re-plan, or a `POST /plans` whose layer
    graph is beyond `Settings.job_threshold_units`. The same job columns as a study (state, attempts,
    heartbeat), so the same engines run both; on success `plan_id` names the ordinary plan it stored (or
    found stored)."""

    __tablename__ = "plan_jobs"
    __table_args__ = (
        Index("ix_plan_jobs_idempotency_key", "idempotency_key", unique=True),
        NEVER_REUSE_IDS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    """`plan` (a large POST /plans) or `replan` (POST /plans/{id}/replan)."""
    name: Mapped[str] = mapped_column(String(200))
    """What the job plans, for people (the plan's name, or the re-planned plan's)."""
    units: Mapped[int] = mapped_column(Integer)
    """The model's layer-graph units (or layers): what made a plan request a job."""
    body: Mapped[dict[str, Any]] = mapped_column(JsonDocument, deferred=True)
    """The request body as received (PlanCreate, or ReplanCreate), checked before it was queued."""
    source_plan_id: Mapped[int | None] = mapped_column(BigId, index=True)
    """The plan a re-plan starts from (a plain id: the job's record outlives that plan)."""
    plan_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("plans.id", ondelete="SET NULL"), index=True
    )
    """The plan the job stored or found stored (None until it succeeds, or once that plan is deleted)."""
    status_code: Mapped[int | None] = mapped_column(Integer)
    """What the request would have answered synchronously: 201 (stored now) or 200 (stored before)."""
    problem: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument)
    """The RFC 9457 problem the synchronous request would have answered with, when the job failed."""
