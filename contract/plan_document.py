"""The Plan document as the runtime reads it (stdlib dataclasses), its schema version and its one
upgrader.

The planner's pydantic `planner.plan.Plan` writes the document (its `schema_version` is
`SCHEMA_VERSION`) holding the contract's own `ParallelConfig` and (as the fields of its model spec)
`ModelConfig`; the runtime reads the subset the trainer needs with `parse_plan`. Unknown keys are
ignored so that plans from newer planners still load, but a plan of another *major* schema version
is refused: its fields may mean something else. tests/executor/test_plan_contract.py keeps the two
readings in step.

Every older schema is read through `upgrade_document` alone (the planner, the CLI and the runtime
all call it): schema 2 describes the parallelism as a device mesh `config.mesh = {dp_replicate,
dp_shard, tp}` (contract.mesh); schema 1 plans (data parallelism only) named the two data-parallel
degrees `shard_group_size` and `replicate_group_size`, and schema 1.0 named two memory terms
differently. Schema 2.2 added the 80% intervals beside the predicted throughput and peak memory
(optional: a 2.1 plan reads as one without them); 2.3 a mixture-of-experts plan's peak split into
experts, dispatch buffers and dense parts (`prediction.expert_memory_gib`, optional: a 2.2 plan reads
as one without it); 2.4 the expert-parallel all-to-alls' time apart from the tensor-parallel
collectives' (`prediction.exposed_expert_parallel_s`, optional: a 2.3 plan reads as one that counted
them with tensor parallelism).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract.fields import FieldError
from contract.mesh import Mesh, MeshError, mesh_problems
from contract.model_config import ModelConfig
from contract.parallel_config import ParallelConfig, PipelineError
from contract.training_config import TrainingConfig

SCHEMA_VERSION = "2.4"
"""The version the planner writes. Bump the minor for a new field, the major when a field changes
meaning (and teach `upgrade_document` the old one)."""
SUPPORTED_SCHEMA_MAJORS = (1, 2)
"""Plans whose `schema_version` starts with one of these major numbers can be read."""

class PlanError(ValueError):
    """A plan document the runtime cannot use; the message names the field and what to do."""


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """The accelerator's catalog entry (only what the runtime reports against)."""

    name: str = "unknown"
    """Catalog name."""
    peak_bf16_tflops: float = 0.0
    """Dense bf16 peak, TFLOP/s: the MFU denominator (0: MFU not reported)."""
    memory_gib: float = 0.0
    """Usable device memory, GiB."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Where the plan was made for."""

    gpu: str
    """GPU type (catalog name), e.g. `H100-SXM-80GB` or `cpu`."""
    num_nodes: int = 1
    """Machines."""
    gpus_per_node: int = 8
    """Ranks per machine."""
    world_size: int = 0
    """Total ranks (num_nodes x gpus_per_node when 0)."""
    gpu_spec: GpuConfig = field(default_factory=GpuConfig)
    """The GPU's catalog entry."""
    scaleup_domain_gpus: int | None = None
    """GPUs one NVLink (or Infinity Fabric) domain joins where it spans nodes (72 on a GB200 NVL72
    rack of nodes of 4); None: the node."""

    @property
    def ranks(self) -> int:
        return self.world_size or self.num_nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """The GPUs a tensor-parallel group may span (contract/topology.py): the scale-up domain, at
        most the plan's ranks (part of a rack is one domain of its GPUs, as the planner reads it)."""
        return min(self.scaleup_domain_gpus or self.gpus_per_node, self.ranks)


@dataclass(frozen=True, slots=True)
class PredictionConfig:
    """What the cost model expects (reported beside the measurement)."""

    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    """The whole plan as the runtime needs it."""

    schema_version: str
    """`MAJOR.MINOR`; the majors in SUPPORTED_SCHEMA_MAJORS are readable."""
    model: ModelConfig
    cluster: ClusterConfig
    training: TrainingConfig
    config: ParallelConfig
    plan_hash: str = ""
    """The planner's input hash (provenance, logged and stored with checkpoints)."""
    prediction: PredictionConfig = field(default_factory=PredictionConfig)

    @property
    def world_size(self) -> int:
        return self.cluster.ranks


def load_plan(path: str | Path) -> RuntimePlan:
    """Read and check a plan JSON file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"cannot read plan file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return parse_plan(document)


def parse_plan(document: Any) -> RuntimePlan:
    """Build a RuntimePlan from a decoded JSON document (accepts an API wrapper `{"plan": {...}}`)."""
    plan = _build(RuntimePlan, upgrade_document(unwrap(document)), "plan")
    check_plan(plan)
    return plan


def unwrap(document: Any) -> Any:
    """The plan inside an API response `{"id": ..., "plan": {...}}`; anything else as it is."""
    wrapped = isinstance(document, dict) and "schema_version" not in document
    if wrapped and isinstance(document.get("plan"), dict):
        return document["plan"]
    return document


def schema_major(document: Any) -> int:
    """The major schema version of a plan document, refused (PlanError) unless this version reads it."""
    if not isinstance(document, dict):
        raise PlanError("plan: expected a JSON object")
    version = document.get("schema_version")
    if not isinstance(version, str) or not version.split(".")[0].isdigit():
        raise PlanError(
            f"plan.schema_version: expected a version such as '{SCHEMA_VERSION}', got {version!r}"
        )
    major = int(version.split(".")[0])
    if major not in SUPPORTED_SCHEMA_MAJORS:
        readable = " and ".join(f"{m}.x" for m in SUPPORTED_SCHEMA_MAJORS)
        raise PlanError(
            f"plan.schema_version: this version reads schema {readable} plans, the plan is {version}; "
            "use a launcher bundle or client made by the same service version as the plan"
        )
    return major


def upgrade_document(document: Any) -> dict[str, Any]:
    """A plan document of any readable schema as the current one (a new dict; the input is untouched).

    Schema 1.x had no tensor parallelism: each configuration (the chosen one, the alternatives,
    the Pareto front) named its data-parallel degrees `shard_group_size` and `replicate_group_size`,
    read here as the mesh they are (tp 1; a missing replica count is what the world size leaves).
    Schema 1.0 named two memory terms `unsharded_buffers` and `fragmentation` and had no
    gradient-buffer term."""
    major = schema_major(document)
    if major == 2:
        return dict(document)
    cluster = document.get("cluster")
    world = _world_size(cluster) if isinstance(cluster, dict) else None
    upgraded = _upgrade_schema_1(document, world)
    return {**upgraded, "schema_version": SCHEMA_VERSION}


def _world_size(cluster: dict[str, Any]) -> int | None:
    world = cluster.get("world_size")
    if isinstance(world, int) and world > 0:
        return world
    nodes, per_node = cluster.get("num_nodes"), cluster.get("gpus_per_node")
    return nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None


def _upgrade_schema_1(value: Any, world: int | None) -> Any:
    if isinstance(value, list):
        return [_upgrade_schema_1(item, world) for item in value]
    if not isinstance(value, dict):
        return value
    upgraded = {key: _upgrade_schema_1(item, world) for key, item in value.items()}
    if "shard_group_size" in upgraded and "mesh" not in upgraded:
        shard = upgraded.pop("shard_group_size")
        replicas = upgraded.pop("replicate_group_size", None)
        if replicas is None:
            if not isinstance(shard, int) or shard < 1 or world is None:
                raise PlanError(
                    "plan.config.replicate_group_size: missing, and the cluster does not say the world size"
                )
            replicas = max(1, world // shard)
        upgraded["mesh"] = {"dp_replicate": replicas, "dp_shard": shard, "tp": 1}
    if "unsharded_buffers" in upgraded:
        upgraded["unsharded_params"] = upgraded.pop("unsharded_buffers")
        upgraded["allocator_reserve"] = upgraded.pop("fragmentation", 0.0)
        upgraded.setdefault("grad_buffers", 0.0)
    return upgraded


def check_plan(plan: RuntimePlan) -> None:
    """Consistency checks that types alone do not catch."""
    cfg, world, mesh = plan.config, plan.world_size, plan.config.mesh
    if mesh.world_size != world:
        raise PlanError(f"plan.config.mesh: {mesh.describe().split(' = ')[0]} = {mesh.world_size} ranks, "
                        f"but the cluster has {world}")
    if cfg.sharding in ("full_shard", "shard_grad_op") and mesh.dp_replicate != 1:
        raise PlanError(
            f"plan.config.mesh.dp_replicate: must be 1 for {cfg.sharding} (it shards over every "
            f"data-parallel rank: dp_shard {mesh.dp}); replicas across groups are hybrid_shard"
        )
    if cfg.sharding == "no_shard" and mesh.dp_shard != 1:
        raise PlanError("plan.config.mesh.dp_shard: must be 1 for no_shard (every replica holds everything)")
    if cfg.sharding == "hybrid_shard" and (mesh.fsdp_shards < 2 or mesh.dp_replicate < 2):
        raise PlanError(
            f"plan.config.mesh: hybrid_shard needs a shard group (dp_shard x cp) and dp_replicate of at "
            f"least 2, got {mesh.fsdp_shards} and {mesh.dp_replicate} (with one of them 1 it is full_shard "
            "or no_shard)"
        )
    if cfg.engine != "fsdp-planner" or cfg.loss != "sliced":
        raise PlanError(
            f"plan.config.engine: this plan prices another trainer ({cfg.engine}, loss {cfg.loss}) to "
            "compare with runs measured there; this runtime trains only engine fsdp-planner with the "
            "sliced loss: plan the model again without pinning the engine"
        )
    expected = cfg.micro_batch_size * cfg.grad_accum_steps * mesh.dp
    if expected != plan.training.sequences:
        raise PlanError(
            f"plan.config: micro_batch_size {cfg.micro_batch_size} x grad_accum_steps "
            f"{cfg.grad_accum_steps} x {mesh.dp} data-parallel ranks = {expected} sequences, but the "
            f"global batch is {plan.training.sequences}"
        )
    model = plan.model
    if model.architecture != "layer_graph" and (
        model.hidden_size % model.num_heads or model.num_heads % model.kv_heads
    ):
        raise PlanError("plan.model: num_heads must divide hidden_size and num_kv_heads num_heads")
    cluster = plan.cluster
    problems = mesh_problems(
        mesh, model, plan.training, gpus_per_node=cluster.domain_gpus, node_gpus=cluster.gpus_per_node
    )
    if problems:
        raise PlanError(f"plan.{problems[0]}")
    if cfg.pipeline is not None:
        _check_pipeline(plan)


def _check_pipeline(plan: RuntimePlan) -> None:
    """Pipeline stages are runs of the model's blocks, every block placed once."""
    pipeline, model = plan.config.pipeline, plan.model
    assert pipeline is not None
    try:
        pipeline.check(pp=plan.config.mesh.pp, grad_accum_steps=plan.config.grad_accum_steps,
                       num_layers=model.num_layers)
    except PipelineError as exc:
        raise PlanError(f"plan.config.{exc}") from None


def _build(cls: type, data: Any, path: str) -> Any:
    """Instantiate dataclass `cls` from a dict, checking each field's type; unknown keys ignored."""
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls, include_extras=True)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}"
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PlanError(f"{where}: missing")
            continue
        values[f.name] = _coerce(hints[f.name], data[f.name], where)
    try:
        return cls(**values)
    except (FieldError, PipelineError) as exc:
        raise PlanError(f"{path}.{exc}") from None


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _coerce(typing.get_args(tp)[0], value, path)  # the bounds: the dataclass's own check
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(option, value, path)
            except PlanError as exc:
                errors.append(str(exc))
        raise PlanError(errors[0] if errors else f"{path}: invalid value {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise PlanError(f"{path}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise PlanError(f"{path}: expected a list, got {value!r}")
        (item,) = (a for a in typing.get_args(tp) if a is not Ellipsis)
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is Mesh:
        try:
            return Mesh.from_document(value, where=path)
        except MeshError as exc:
            raise PlanError(str(exc)) from None
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise PlanError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise PlanError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug here, not in the plan
