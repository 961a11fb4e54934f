"""Bodies of the /plans endpoints."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from fastapi import Path
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from api.problems import UNION_TAG_PREFIX
from api.typed_numbers import MAX_ID as MAX_ID
from contract.mesh import Mesh
from contract.training_config import Optimizer, Precision, StateDType

# Re-exported (for the routes and the dashboard) from the planner, whose types the schemas below spell, so
# that the OpenAPI shows the very limits the planner enforces.
from planner.bounds import MAX_GPUS_PER_NODE as MAX_GPUS_PER_NODE
from planner.bounds import MAX_NODES as MAX_NODES
from planner.gpu_spec import GpuSpec
from planner.specs import (
    CLUSTER_FORMAT,
    CLUSTER_SCHEMA_PATTERN,
    DeviceMemoryGib,
    GlobalBatchTokens,
    GpusPerNode,
    LinkOverrideGbps,
    NodeCount,
    PowerLimitW,
    ScaleupDomainGpus,
    SearchSpace,
    SeqLen,
    cluster_fields,
    whole_numbers,
)

PlanId = Annotated[int, Path(ge=1, le=MAX_ID, description="A plan's id")]
MAX_PIPELINE_STAGES = 1024
"""The largest pipeline-parallel degree a filter takes: what `search.pipeline_parallel_degrees` allows."""
# Real inputs (HF configs, layer graphs) nest a few levels; deep nesting only serves to exhaust the stack.
MAX_JSON_DEPTH = 32


class StrictBody(BaseModel):
    """Unknown keys refused and no coercion ("8" is not 8), like the planner's own specs.

    An unknown key that people commonly send for a field (`nodes` for `num_nodes`) is refused with the
    field to use and an example of the whole object, instead of a bare "Extra inputs are not permitted".
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    renamed: ClassVar[Mapping[str, str]] = {}
    """Unknown key -> the field that was meant."""
    example: ClassVar[str] = ""
    """A valid object of this kind, for the advice."""

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        return whole_numbers(cls, data)

    @model_validator(mode="wrap")
    @classmethod
    def _suggest_renamed(cls, data: Any, handler: ModelWrapValidatorHandler[StrictBody]) -> StrictBody:
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            hinted = [_hint_renamed(cls, error) for error in errors]
            if hinted == errors:
                raise
            raise ValidationError.from_exception_data(exc.title, hinted) from None


class ClusterIn(StrictBody):
    """The GPUs to train on."""

    renamed: ClassVar[Mapping[str, str]] = {
        "nodes": "num_nodes", "n_nodes": "num_nodes", "node_count": "num_nodes",
        "gpus": "gpus_per_node", "num_gpus": "gpus_per_node", "n_gpus": "gpus_per_node",
        "gpus_per_nodes": "gpus_per_node", "devices_per_node": "gpus_per_node",
        "gpu_type": "gpu", "device": "gpu",
    }
    example: ClassVar[str] = '{"num_nodes": 1, "gpus_per_node": 8, "gpu": "H100"}, or the string "1x8xH100"'

    num_nodes: NodeCount = 1
    gpus_per_node: GpusPerNode = 8
    gpu: Annotated[str, Field(min_length=1, max_length=64, examples=["H100"])]
    """A GPU catalog name or alias (see GET /api/v1/gpus)."""
    intra_node_bandwidth_gbps: LinkOverrideGbps | None = None
    """Override of the per-GPU intra-node link bandwidth, GB/s."""
    inter_node_bandwidth_gbps: LinkOverrideGbps | None = None
    """Override of the per-GPU network bandwidth, GB/s."""
    scaleup_domain_gpus: ScaleupDomainGpus | None = None
    """GPUs one NVLink or Infinity Fabric domain joins, a whole number of nodes (72 for a GB200 NVL72
    rack of 18 nodes of 4); default: the GPU type's system (`scaleup_domain_gpus` in GET /api/v1/gpus),
    else one node."""
    gpu_memory_gib: DeviceMemoryGib | None = None
    """Memory per GPU usable by the framework, GiB, for cards of another size than the GPU type's
    (scaled from the sold size by the type's usable share); default: the GPU type's."""
    gpu_power_limit_w: PowerLimitW | None = None
    """Board power limit, W, for GPUs capped below their rating (an H100 SXM at 500 W of 700):
    compute-bound kernels slow with the clock the cap leaves; default: the GPU type's own limit
    (`power_limit_w` in GET /api/v1/gpus: 500 W for H100-SXM-96GB), otherwise none."""
    custom_gpu: GpuSpec | None = None
    """A GPU type not in the catalog, by its datasheet (the fields of GET /api/v1/gpus); `gpu` is then its
    name, which must not be a catalog name or alias."""


class TrainingIn(StrictBody):
    """What one optimizer step processes."""

    renamed: ClassVar[Mapping[str, str]] = {
        "seq_length": "seq_len", "sequence_length": "seq_len", "max_seq_len": "seq_len",
        "batch_size": "global_batch_tokens", "global_batch_size": "global_batch_tokens",
        "global_batch": "global_batch_tokens", "batch_tokens": "global_batch_tokens",
    }
    example: ClassVar[str] = (
        '{"seq_len": 4096, "global_batch_tokens": 1048576} (tokens per step over the whole cluster, a '
        "multiple of seq_len)"
    )

    seq_len: Annotated[SeqLen, Field(examples=[4096])]
    global_batch_tokens: Annotated[GlobalBatchTokens, Field(examples=[1048576])]
    """Tokens per optimizer step over the whole cluster; a multiple of seq_len."""
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    state_dtype: StateDType = "float32"
    """What the optimizer updates: `float32` parameters, gradients and AdamW states beside the bf16
    compute copies (mixed precision), or `bfloat16` for pure bf16 training (no fp32 master: half their
    memory and optimizer traffic; needs precision `bf16`). The search never picks it: a request does."""


def _json_kind(value: Any) -> str | None:
    # Picks the union branch by JSON type, so errors speak about one branch instead of all of them.
    if isinstance(value, str):
        return f"{UNION_TAG_PREFIX}string"
    if isinstance(value, dict | BaseModel):
        return f"{UNION_TAG_PREFIX}object"
    return None


ModelIn = Annotated[
    Annotated[Annotated[str, Field(min_length=1, max_length=200)], Tag(f"{UNION_TAG_PREFIX}string")]
    | Annotated[dict[str, Any], Tag(f"{UNION_TAG_PREFIX}object")],
    Discriminator(
        _json_kind,
        custom_error_type="model_input_type",
        custom_error_message="give a catalog model name (GET /api/v1/models), a Hugging Face config.json "
        "object, or a model spec / layer graph object",
    ),
    Field(examples=["llama3-8b"]),
]

def _cluster_text_spelt_out(value: Any) -> Any:
    """A cluster string read into the object's fields (planner.specs.cluster_fields), so that both
    spellings meet one validation, error for error: ClusterIn's bounds, then the planner's. Text that
    spells no cluster stays text, refused with the format to use by the planner's parser (build_request)."""
    if not isinstance(value, str):
        return value
    try:
        return cluster_fields(value)
    except ValidationError:
        return value


ClusterInput = Annotated[
    Annotated[
        Annotated[str, Field(
            min_length=3, max_length=80, json_schema_extra={"pattern": CLUSTER_SCHEMA_PATTERN},
            description=f"A cluster as {CLUSTER_FORMAT}.",
        )],
        Tag(f"{UNION_TAG_PREFIX}string"),
    ]
    | Annotated[ClusterIn, Tag(f"{UNION_TAG_PREFIX}object")],
    Discriminator(
        _json_kind,
        custom_error_type="cluster_input_type",
        custom_error_message="give a cluster as NODESxGPUSxGPU (e.g. 1x8xH100) or an object "
        "{num_nodes, gpus_per_node, gpu}",
    ),
    BeforeValidator(_cluster_text_spelt_out),
    Field(examples=["1x8xH100"]),
]


class PlanCreate(StrictBody):
    """What to plan. Identical inputs (name aside) return the plan already stored."""

    renamed: ClassVar[Mapping[str, str]] = {
        # A field of a section sent at the top level (`seq_len` beside `training`) is pointed to it.
        **{name: f"search.{name}" for name in SearchSpace.model_fields},
        **{name: f"cluster.{name}" for name in ClusterIn.model_fields},
        **{name: f"training.{name}" for name in TrainingIn.model_fields},
    }
    example: ClassVar[str] = (
        '{"model": "llama3-8b", "cluster": "1x8xH100", "training": {"seq_len": 4096, '
        '"global_batch_tokens": 1048576}}'
    )

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any) -> Any:
        check_json(data)
        return data

    model: ModelIn
    """A catalog name, a Hugging Face config.json object, or a model spec / layer graph."""
    cluster: ClusterInput
    training: TrainingIn
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """A label for listings; default `<model> on <cluster>`."""
    calibration_id: Annotated[int, Field(ge=1, le=MAX_ID)] | None = None
    """A stored calibration profile to plan with."""
    search: SearchSpace | None = None
    """Restrictions on the configurations searched."""
    top_k: Annotated[int, Field(ge=1, le=50)] = 5
    """How many ranked alternatives to keep beside the best plan."""


class PlanSummary(BaseModel):
    """A stored plan's headline numbers (lists)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    model_name: str
    gpu: str
    num_nodes: int
    gpus_per_node: int
    world_size: int
    sharding: str = Field(examples=["full_shard"])
    """The chosen sharding: full_shard, shard_grad_op, hybrid_shard or no_shard."""
    mesh: Mesh
    """The device mesh: pp x dp_replicate x dp_shard x cp x tp = world_size."""
    tokens_per_s_per_gpu: float
    mfu: float
    peak_memory_gib: float
    step_time_s: float
    plan_hash: str
    planner_version: str
    calibration_id: int | None
    created_at: datetime

    @model_validator(mode="before")
    @classmethod
    def _mesh_from_row(cls, data: Any) -> Any:
        # A row's mesh is read as the contract reads one (a missing axis is 1, an unknown one at 1 is
        # accepted), not field by field: a row stored before an axis existed lacks it.
        if not isinstance(data, dict) and hasattr(data, "mesh"):
            values = {name: getattr(data, name) for name in cls.model_fields if name != "mesh"}
            return {**values, "mesh": stored_mesh(data)}
        return data


def stored_mesh(row: Any) -> Mesh:
    """The mesh of a stored plan row (api.db.models.PlanRow), from its `mesh` document alone."""
    return Mesh.from_document(row.mesh)


class PlanDetail(PlanSummary):
    """A stored plan with its inputs and the whole Plan document."""

    replanned_from_plan_id: int | None = None
    """Set on a re-plan: the plan whose configuration (or OOM run) it avoids."""
    replanned_from_run_id: int | None = None
    """Set on a re-plan after an out-of-memory run: that run's id."""

    request: dict[str, Any]
    """The normalized request the planner ran on (the model resolved to a full spec)."""
    plan: dict[str, Any]
    """The versioned Plan document: config, prediction, alternatives, Pareto front, rejected families."""


class ReplanCreate(StrictBody):
    """Which failure to re-plan around (every field optional)."""

    run_id: Annotated[int, Field(ge=1, le=MAX_ID)] | None = None
    """An out-of-memory run of this plan; default: its newest OOM run, or else the plan's own
    configuration."""
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """A label for the new plan; default `<plan name> (re-planned)`."""


class PlanPage(BaseModel):
    items: list[PlanSummary]
    next_cursor: str | None
    """Pass as `cursor` to get the next page; null on the last page."""


class PlanSort(StrEnum):
    created_at = "created_at"
    tokens_per_s_per_gpu = "tokens_per_s_per_gpu"
    mfu = "mfu"
    peak_memory_gib = "peak_memory_gib"
    world_size = "world_size"
    model = "model"


class SortOrder(StrEnum):
    asc = "asc"
    desc = "desc"




def _hint_renamed(model: type[StrictBody], error: ErrorDetails) -> Any:
    """`error` with the field that was meant, when it refuses a key of `model.renamed`."""
    loc = error["loc"]
    if error["type"] != "extra_forbidden" or len(loc) != 1 or loc[0] not in model.renamed:
        return error
    return InitErrorDetails(
        type=PydanticCustomError(
            "renamed_field", 'unknown field "{given}": did you mean "{meant}"? e.g. {example}',
            {"given": loc[0], "meant": model.renamed[str(loc[0])], "example": model.example},
        ),
        loc=loc,
        input=error["input"],
    )


def check_json(data: Any) -> None:
    """Refuse absurd nesting anywhere in a body, without recursion. (NUL characters and lone surrogates
    are refused for every request before it gets here: api/text_check.py.)"""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                stack.append((key, child, depth + 1))
                stack.append((item, child, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{index}", depth + 1) for index, item in enumerate(value))


class ComparedPlan(BaseModel):
    """One compared plan: who it is and the parts of its Plan document that differ between plans."""

    id: int
    name: str
    created_at: datetime
    training: dict[str, Any]
    """The training setup (sequence length, global batch, precision, optimizer)."""
    config: dict[str, Any]
    """The chosen parallel configuration (sharding, wrap units, buckets, checkpointing, batching)."""
    prediction: dict[str, Any]
    """Step time, throughput, MFU, peak memory with its breakdown, exposed communication."""


class ComparisonRow(BaseModel):
    """One row of the comparison: a field's value in every plan, in the order of `plans`."""

    field: str = Field(examples=["config.sharding"])
    """Where the value comes from, as a dotted path into the plan (or the stored row: name, created_at)."""
    section: str = Field(examples=["Configuration"])
    label: str = Field(examples=["Sharding"])
    values: list[str | int | float | bool | None]
    differs: bool
    best: list[int]
    """Positions (in `plans`) of the best value of a prediction, when the values differ; else empty."""


class PlanComparison(BaseModel):
    """Plans side by side, as on the dashboard's compare page."""

    ids: list[int]
    plans: list[ComparedPlan]
    fields: list[ComparisonRow]
    """Every compared field, in the dashboard's order (inputs, configuration, prediction, memory)."""
    differences: list[str]
    """The `field` of every row whose values differ."""
