"""Input specifications: the model, the cluster, the training setup, and a whole plan request.

Every spec is a strict pydantic model (unknown fields are refused, numbers are not coerced from
strings) whose validation errors name the field and say how to fix it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from contract.fields import field_descriptions
from contract.mesh import searched_axes
from contract.model_config import DERIVED_COUNTS, ModelConfig, ModelShape
from contract.parallel_config import (
    PIPELINE_SCHEDULES,
    CheckpointMode,
    Float8Recipe,
    PipelineSchedule,
    ShardingStrategy,
)
from contract.training_config import DERIVED_TRAINING, STATE_DTYPE_NEEDS_BF16, TrainingConfig
from planner.bounds import (
    MAX_ACTIVATION_BYTES_PER_TOKEN,
    MAX_DEVICE_MEMORY_GIB,
    MAX_DIMENSION,
    MAX_FLOPS_PER_TOKEN,
    MAX_GLOBAL_BATCH_TOKENS,
    MAX_GPUS_PER_NODE,
    MAX_LAYERS,
    MAX_LINK_OVERRIDE_GBPS,
    MAX_MICRO_BATCH,
    MAX_NODES,
    MAX_SCALEUP_DOMAIN_GPUS,
    MAX_SEQ_LEN,
    MAX_UNIT_PARAMS,
    MIN_DEVICE_MEMORY_GIB,
    MIN_LINK_GBPS,
    pinned_degree,
)
from planner.catalog.gpus import GPU_CATALOG, resolve_gpu
from planner.errors import UnknownCatalogEntryError
from planner.gpu_spec import GpuSpec

PositiveInt = Annotated[int, Field(ge=1)]
Dimension = Annotated[int, Field(ge=1, le=MAX_DIMENSION)]
NodeCount = Annotated[int, Field(ge=1, le=MAX_NODES)]
GpusPerNode = Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]
ScaleupDomainGpus = Annotated[int, Field(ge=1, le=MAX_SCALEUP_DOMAIN_GPUS)]
LinkOverrideGbps = Annotated[float, Field(ge=MIN_LINK_GBPS, le=MAX_LINK_OVERRIDE_GBPS, allow_inf_nan=False)]
SeqLen = Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)]
GlobalBatchTokens = Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH_TOKENS)]
UNION_TAG_PREFIX = "~"
"""Starts the tags of tagged unions: loc segments that name a union's branch, not a field a user
wrote (error messages leave them out)."""


class StrictModel(BaseModel):
    """Base for every spec: strict types, unknown keys refused, immutable once built."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        return whole_numbers(cls, data)


def whole_numbers(model: type[BaseModel], data: Any) -> Any:
    """`data` with integral floats in `model`'s integer fields made ints, for strict models.

    JSON has one number type: 8.0 is the integer 8 (JSON Schema's `integer` includes it, and so do
    clients that write every number as a float), while "8" stays refused.
    """
    if not isinstance(data, dict):
        return data
    names, lists = _integer_fields(model)
    changed = {
        name: int(value) for name, value in data.items()
        if name in names and isinstance(value, float) and value.is_integer()
    }
    changed |= {
        name: [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]
        for name, value in data.items()
        if name in lists and isinstance(value, list)
    }
    return {**data, **changed} if changed else data


@functools.cache
def _integer_fields(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    """`model`'s integer fields, and its (optional) lists of integers."""

    def is_integer(annotation: Any) -> bool:
        if typing.get_origin(annotation) is Annotated:
            return is_integer(typing.get_args(annotation)[0])
        if annotation is int:
            return True
        arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        return union and len(arguments) == 1 and is_integer(arguments[0])

    def unwrapped(annotation: Any) -> Any:
        while typing.get_origin(annotation) is Annotated:  # tagged union branches, constrained lists
            annotation = typing.get_args(annotation)[0]
        return annotation

    def is_integer_list(annotation: Any) -> bool:
        options = typing.get_args(annotation) if typing.get_origin(annotation) in (
            typing.Union, types.UnionType) else (annotation,)
        return any(
            typing.get_origin(unwrapped(o)) is list and is_integer(typing.get_args(unwrapped(o))[0])
            for o in options
        )

    fields = model.model_fields.items()
    return (
        frozenset(name for name, field in fields if is_integer(field.annotation)),
        frozenset(name for name, field in fields if is_integer_list(field.annotation)),
    )


class LayerUnit(StrictModel):
    """One module of a traced layer graph (`fsdp-planner trace`), as the cost model sees it."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    """Module path in the user's model, e.g. `layers.3`."""
    num_params: Annotated[int, Field(ge=0, le=MAX_UNIT_PARAMS)]
    """Parameters owned by this module (not counting children listed separately)."""
    fwd_flops_per_token: Annotated[float, Field(ge=0, le=MAX_FLOPS_PER_TOKEN, allow_inf_nan=False)]
    """Forward FLOPs per token; backward is taken as twice this."""
    activation_bytes_per_token: Annotated[
        float, Field(ge=0, le=MAX_ACTIVATION_BYTES_PER_TOKEN, allow_inf_nan=False)
    ]
    """Bytes saved for backward per token when the module is not checkpointed."""
    is_block: bool = True
    """Whether the module is a repeated block (a candidate FSDP wrap unit and checkpoint unit)."""


def contract_fields(cls: type, *, bounds: dict[str, Any], exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """pydantic field definitions of the contract dataclass `cls` (its types, defaults and docstrings),
    with the `bounds` a request must keep added to the named fields (inside an optional field's
    `| None`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    # The docstrings as the JSON Schema reads them, without building one (half this module's import).
    described = field_descriptions(cls)
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        hint = hints[f.name]
        if f.name in bounds:
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            options = typing.get_args(hint) if union else ()
            if type(None) in options:
                (inner,) = (o for o in options if o is not type(None))
                hint = Annotated[inner, bounds[f.name]] | None
            else:
                hint = Annotated[hint, bounds[f.name]]
        default = ... if f.default is dataclasses.MISSING else f.default
        definitions[f.name] = (hint, Field(default, description=described.get(f.name)))
    return definitions


LLAMA_ONLY_FIELDS = ("moe", "latent_attention", "qk_norm")
"""Model fields only the llama family's blocks price (mixture-of-experts feed-forwards, latent
attention, query/key norms)."""

_MODEL_BOUNDS: dict[str, Any] = {
    "name": Field(min_length=1, max_length=200),
    **{name: Field(le=MAX_DIMENSION) for name in (
        "vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_size", "intermediate_size")},
    "num_layers": Field(le=MAX_LAYERS),
    "max_seq_len": Field(le=MAX_SEQ_LEN),
    "rope_theta": Field(gt=0, le=1e12, allow_inf_nan=False),
    "norm_eps": Field(gt=0, le=1.0, allow_inf_nan=False),
}
"""What a request's model may ask for beyond the contract's own bounds (planner/bounds.py)."""

_ModelFields = create_model(
    "_ModelFields",
    __base__=StrictModel,
    __module__=__name__,
    **contract_fields(ModelConfig, bounds=_MODEL_BOUNDS, exclude=DERIVED_COUNTS),
)


class ModelSpec(_ModelFields, ModelShape):  # type: ignore[misc, valid-type]
    """A model's architecture and dimensions: enough to count parameters, FLOPs and activations.

    Its fields are the contract's `ModelConfig` (contract/model_config.py), bounded for a request;
    a traced model adds its layer graph."""

    layer_graph: Annotated[list[LayerUnit], Field(max_length=MAX_LAYERS)] | None = None
    """Modules of a traced model, in forward order (only for `architecture == "layer_graph"`)."""

    @model_validator(mode="after")
    def _check_dimensions(self) -> ModelSpec:
        if self.architecture == "layer_graph":
            if not self.layer_graph:
                raise ValueError(
                    "layer_graph: a `layer_graph` model needs its traced modules; write them with "
                    "`fsdp-planner trace package.module:factory -o graph.json` and send that file "
                    "as the model"
                )
            return self
        if self.layer_graph is not None:
            raise ValueError(
                f"layer_graph: only allowed with architecture 'layer_graph', not '{self.architecture}'"
            )
        for field in LLAMA_ONLY_FIELDS:
            if getattr(self, field) and self.architecture != "llama":
                raise ValueError(
                    f"{field}: only the llama family's blocks have it (architecture 'llama'), not "
                    f"'{self.architecture}'"
                )
        if self.head_size is not None and self.architecture != "llama":
            raise ValueError(
                f"head_size: {self.architecture} heads are hidden_size / num_heads wide; leave head_size out "
                "(only the llama family's attention has heads of their own width)"
            )
        if self.head_size is None and self.hidden_size % self.num_heads:
            suggestion = _nearest_divisor(self.hidden_size, self.num_heads)
            raise ValueError(
                f"num_heads: {self.num_heads} heads do not divide hidden_size {self.hidden_size}; "
                f"pick a head count that divides it (e.g. {suggestion})"
            )
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(
                f"num_kv_heads: {kv} key/value heads must divide num_heads {self.num_heads} "
                "(grouped-query attention shares each kv head among a whole group of query heads)"
            )
        if self.architecture == "llama" and self.head_dim % 2:
            raise ValueError(
                f"num_heads: head dimension {self.head_dim} (head_size, or hidden_size / num_heads) must be "
                "even for RoPE"
            )
        return self

DeviceMemoryGib = Annotated[
    float, Field(ge=MIN_DEVICE_MEMORY_GIB, le=MAX_DEVICE_MEMORY_GIB, allow_inf_nan=False)
]
"""Memory per GPU usable by the framework, GiB."""
PowerLimitW = Annotated[float, Field(ge=10, le=1e5, allow_inf_nan=False)]
"""A board power limit, watts."""


class ClusterSpec(StrictModel):
    """The GPUs to train on: nodes (hosts) x GPUs per node of one GPU type, in scale-up domains
    (NVLink, Infinity Fabric) of one host or of several (`scaleup_domain_gpus`)."""

    num_nodes: NodeCount = 1
    """Number of machines."""
    gpus_per_node: GpusPerNode = 8
    """GPUs (ranks) per machine."""
    custom_gpu: GpuSpec | None = None
    """A GPU type that is not in the catalog, given by its datasheet figures; `gpu` must then be its
    name (a name of its own: catalog names and aliases are taken). None: `gpu` names a catalog entry."""
    # Declared after custom_gpu: the `gpu` validator reads it.
    gpu: Annotated[str, Field(min_length=1, max_length=64)]
    """GPU type: a catalog name or alias (`H100`, `A100-80GB`, `cpu`, ...)."""
    intra_node_bandwidth_gbps: LinkOverrideGbps | None = None
    """Override of the per-GPU scale-up link bandwidth (NVLink, Infinity Fabric) inside a scale-up
    domain, GB/s (default: the GPU catalog's)."""
    inter_node_bandwidth_gbps: LinkOverrideGbps | None = None
    """Override of the per-GPU scale-out network bandwidth between scale-up domains, GB/s (default:
    the GPU catalog's NIC; a node's is this x gpus_per_node)."""
    scaleup_domain_gpus: ScaleupDomainGpus | None = None
    """GPUs joined by one scale-up fabric (NVLink, Infinity Fabric), a whole number of nodes: 72 for
    a GB200 NVL72 rack of 18 nodes of 4. Collectives whose groups stay inside one run at the scale-up
    bandwidth, the others over the network (contract/topology.py). None: the GPU type's system
    (`scaleup_domain_gpus` in the catalog: 72 for GB200 and GB300), else one node."""

    gpu_memory_gib: DeviceMemoryGib | None = None
    """Memory per GPU usable by the framework, GiB, where the cards are another size than the GPU
    type's (scaled from the sold size by the type's usable share); default: the GPU type's."""
    gpu_power_limit_w: PowerLimitW | None = None
    """Board power limit in watts where the GPUs are capped below their rating (an H100 SXM at 500 W
    of 700): compute-bound kernels slow down with the clock the cap allows
    (planner/cost/parameters.py `power_limited_clock`); default: the GPU type's own
    (`GpuSpec.power_limit_w`: 500 W for H100-SXM-96GB), otherwise no cap."""

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str, info: ValidationInfo) -> str:
        if "custom_gpu" not in info.data:
            return value  # the custom spec was invalid: its own error says why
        custom = info.data["custom_gpu"]
        if custom is None:
            return resolve_gpu(value).name
        if custom.name.lower() in {key.lower() for g in GPU_CATALOG.values() for key in (g.name, *g.aliases)}:
            raise ValueError(
                f"custom_gpu.name {custom.name!r} is a catalog GPU: plan it by name without custom_gpu, "
                f"or give your GPU type a name of its own (e.g. {custom.name + '-custom'!r})"
            )
        if value != custom.name:
            raise ValueError(f"must be the custom GPU's name {custom.name!r} (it is {value!r})")
        return value

    @model_validator(mode="after")
    def _whole_hosts_per_domain(self) -> ClusterSpec:
        domain = self.scaleup_domain_gpus
        if domain is not None and domain % self.gpus_per_node:
            whole = max(1, domain // self.gpus_per_node) * self.gpus_per_node
            raise ValueError(
                f"scaleup_domain_gpus: {domain} is not a whole number of {self.gpus_per_node}-GPU nodes "
                f"(a node's GPUs share one fabric); use a multiple of gpus_per_node such as {whole}"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_catalog_gpu(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Clusters of catalog GPUs, and of the GPU type's own domains, serialise (and so hash) as
        # before custom GPUs and scale-up domains existed.
        data = handler(self)
        for name in ("custom_gpu", "scaleup_domain_gpus"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @property
    def scaleup_gpus(self) -> int:
        """GPUs per scale-up domain: `scaleup_domain_gpus`, else the GPU type's domain where it is a
        whole number of these nodes, else one node; at most the cluster's GPUs, which then make one
        domain (16 nodes of an NVL72 rack: 64 GPUs on one fabric, whose tp 16 or 32 groups stay on it)."""
        domain = self.gpus_per_node
        typical = self.resolved_gpu().scaleup_domain_gpus
        if self.scaleup_domain_gpus is not None:
            domain = self.scaleup_domain_gpus
        elif typical and typical > self.gpus_per_node and typical % self.gpus_per_node == 0:
            domain = typical
        return min(domain, self.world_size)

    def resolved_gpu(self) -> GpuSpec:
        """The GPU's datasheet figures: the custom spec, or the catalog entry `gpu` names."""
        gpu = self.custom_gpu or resolve_gpu(self.gpu)
        if self.gpu_memory_gib is not None:
            gpu = gpu.model_copy(update={"memory_gib": self.gpu_memory_gib})
        return gpu

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def text(self, *, num_nodes: int | None = None) -> str:
        """The cluster as `--cluster` reads it back (with `num_nodes` nodes instead, for advice about
        other sizes): `NODESxGPUSxGPU`, or `DOMAINSxGPUSxGPU` where a scale-up domain of its own
        spans nodes (`4x64xGB200`)."""
        nodes = self.num_nodes if num_nodes is None else num_nodes
        return cluster_text(nodes, self.gpus_per_node, self.gpu, self.scaleup_domain_gpus)

    def domains(self) -> str:
        """` in scale-up domains of 72` where a domain spans nodes (NVL72 racks), else nothing: what a
        plan's headline adds after its GPUs."""
        domain = self.scaleup_gpus
        return f" in scale-up domains of {domain}" if domain > self.gpus_per_node else ""

    def ranks(self) -> str:
        """`16 GPUs`, or `2 CPU processes` on the `cpu` device, whose ranks are no GPUs."""
        what = ("CPU process", "CPU processes") if self.resolved_gpu().is_cpu else ("GPU", "GPUs")
        return f"{self.world_size:,} {what[self.world_size != 1]}"

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """Read `NODESxGPUSxGPU` (e.g. `2x8xH100`) or `GPUSxGPU` (one node), with the bounds and the
        catalog check of the object form: the text only spells its fields (`cluster_fields`).

        Raises ValidationError, whatever is wrong: the format, a count out of bounds, an unknown GPU.
        """
        return cls.model_validate(cluster_fields(text))


CLUSTER_FORMAT = (
    "NODESxGPUSxGPU, e.g. 1x8xH100 or 4x8xA100-80GB (GPUSxGPU, e.g. 8xH100, for one node; for GPUs whose "
    "NVLink domain spans nodes, DOMAINSxGPUSxGPU: 4x72xGB200 is four NVL72 racks)"
)
CLUSTER_PATTERN = r"^(?:([0-9]+)[xX])?([0-9]+)[xX]([A-Za-z][A-Za-z0-9._-]*)$"
"""The cluster text, as a regular expression both Python and JSON Schema (ECMA-262) read alike (ASCII
digits only: `int` would read other scripts' digits too). Nothing around it, not even a newline: Python
reads it with `fullmatch` (its `$` also matches before a final newline)."""
_CLUSTER_TEXT = re.compile(CLUSTER_PATTERN)
ASCII_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
"""A decimal number typed as text (`2.49`, `-.5`, `1e3`), to `fullmatch`: ASCII digits only, as the
cluster text (`float` would read other scripts' digits too, and `inf` or `nan`)."""


def whole_number_pattern(high: int) -> str:
    """A regular expression (Python and ECMA-262 alike) for the ASCII numbers 1 to `high`, no leading 0."""
    digits = str(high)
    options = [f"[1-9][0-9]{{{length - 1}}}" if length > 1 else "[1-9]" for length in range(1, len(digits))]
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = "[0-9]" * (len(digits) - i - 1)
            options.append(f"{digits[:i]}[{low}-{int(digit) - 1}]{rest}")
    options.append(digits)
    return "(?:" + "|".join(options) + ")"


def _any_case(name: str) -> str:
    """`name` as a regular expression (Python and ECMA-262 alike) matching it in any letter case."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else ("\\." if c == "." else c) for c in name)


RACK_GPUS: tuple[str, ...] = tuple(
    key for gpu in GPU_CATALOG.values()
    if gpu.scaleup_domain_gpus and gpu.scaleup_domain_gpus > gpu.default_gpus_per_node
    for key in (gpu.name, *gpu.aliases)
)
"""The names and aliases of catalog GPUs whose scale-up domain spans nodes (GB200, GB300): the text
may count their GPUs by the domain (`4x72xGB200`), beyond a node's MAX_GPUS_PER_NODE."""
CLUSTER_SCHEMA_PATTERN = (
    rf"^(?:{whole_number_pattern(MAX_NODES)}[xX])?(?:{whole_number_pattern(MAX_GPUS_PER_NODE)}[xX]"
    r"[A-Za-z][A-Za-z0-9._-]*"
    rf"|{whole_number_pattern(MAX_SCALEUP_DOMAIN_GPUS)}[xX](?:{'|'.join(map(_any_case, RACK_GPUS))}))$"
)
"""The cluster text as the API's JSON schema states it: CLUSTER_PATTERN with the counts' bounds written
out (1 to MAX_NODES nodes, 1 to MAX_GPUS_PER_NODE GPUs per node, or 1 to MAX_SCALEUP_DOMAIN_GPUS per
domain for the RACK_GPUS), so that a schema-valid string is refused only for what no schema can state
(which GPU names the catalog knows, a domain of whole nodes). The text itself is read with
CLUSTER_PATTERN, so that a count out of bounds is refused naming the bound."""
MAX_CLUSTER_TEXT = 80
"""Longer than any cluster written as text (and than the API's cluster strings)."""


def cluster_text(num_nodes: int, gpus_per_node: int, gpu: str, scaleup_domain_gpus: int | None) -> str:
    """A cluster as `--cluster` reads it back (`cluster_fields`): `NODESxGPUSxGPU`, or `DOMAINSxGPUSxGPU`
    where a stated scale-up domain spans nodes and the cluster is whole domains (`2x36xGB200`)."""
    domain, gpus = scaleup_domain_gpus, num_nodes * gpus_per_node
    if domain is not None and domain > gpus_per_node and gpus % domain == 0:
        return f"{gpus // domain}x{domain}x{gpu}"
    return f"{num_nodes}x{gpus_per_node}x{gpu}"


def cluster_fields(text: str) -> dict[str, Any]:
    """The object form of a cluster written as text: `{num_nodes, gpus_per_node, gpu}`, for ClusterSpec
    (or the API's cluster object) to validate, so that both spellings meet one set of bounds.

    The GPU must start with a letter: `2x8H100` and `1x8` are a mistyped format, not a GPU named `8H100`
    or `8`. Raises ValidationError (naming `CLUSTER_FORMAT`) for text that spells no cluster.
    """
    match = _CLUSTER_TEXT.fullmatch(text) if len(text) <= MAX_CLUSTER_TEXT else None
    if match is None:
        raise ValidationError.from_exception_data(ClusterSpec.__name__, [InitErrorDetails(
            type=PydanticCustomError(
                "cluster_format", "cannot read {text} as a cluster; write {format}",
                {"text": repr(text if len(text) <= MAX_CLUSTER_TEXT else text[:MAX_CLUSTER_TEXT] + "..."),
                 "format": CLUSTER_FORMAT},
            ),
            loc=(), input=text,
        )])
    nodes, gpus, gpu = match.groups()
    return _domains_as_nodes(num_nodes=int(nodes or 1), gpus=int(gpus), gpu=gpu)


def _domains_as_nodes(*, num_nodes: int, gpus: int, gpu: str) -> dict[str, Any]:
    """`{num_nodes, gpus_per_node, gpu}` as written, except for a catalog GPU whose scale-up domain
    spans several nodes (GB200 NVL72: nodes of 4 in domains of 72) written with more GPUs than its
    node holds: that count is a domain's, as racks are sold (`4x72xGB200` is 72 nodes of 4 in four
    72-GPU domains, `scaleup_domain_gpus` left to the catalog's default where it is that)."""
    try:
        spec = resolve_gpu(gpu)
    except UnknownCatalogEntryError:
        spec = None  # ClusterSpec refuses it, naming the known GPUs
    host = spec.default_gpus_per_node if spec else gpus
    if spec is None or not spec.scaleup_domain_gpus or gpus <= host:
        return {"num_nodes": num_nodes, "gpus_per_node": gpus, "gpu": gpu}
    nodes = num_nodes * (gpus // host)
    if gpus % host or nodes > MAX_NODES:
        problem = (
            f"{gpus} GPUs is not a whole number of {spec.name}'s {host}-GPU nodes" if gpus % host
            else f"{num_nodes} domains of {gpus} GPUs are {nodes:,} nodes of {host}, more than {MAX_NODES:,}"
        )
        raise ValidationError.from_exception_data(ClusterSpec.__name__, [InitErrorDetails(
            type=PydanticCustomError("cluster_domain", "{problem}; write {format}",
                                     {"problem": problem, "format": CLUSTER_FORMAT}),
            loc=(), input=f"{num_nodes}x{gpus}x{gpu}",
        )])
    domain = {} if gpus == spec.scaleup_domain_gpus else {"scaleup_domain_gpus": gpus}
    return {"num_nodes": nodes, "gpus_per_node": host, "gpu": gpu, **domain}


_TRAINING_BOUNDS: dict[str, Any] = {
    "seq_len": Field(le=MAX_SEQ_LEN),
    "global_batch_tokens": Field(le=MAX_GLOBAL_BATCH_TOKENS),
}
"""What a request's training may ask for beyond the contract's own bounds (planner/bounds.py)."""

_TrainingFields = create_model(
    "_TrainingFields",
    __base__=StrictModel,
    __module__=__name__,
    **contract_fields(TrainingConfig, bounds=_TRAINING_BOUNDS, exclude=DERIVED_TRAINING),
)


class TrainingSpec(_TrainingFields):  # type: ignore[misc, valid-type]
    """What one optimizer step processes and how numbers are represented (the contract's
    `TrainingConfig`, contract/training_config.py, bounded for a request)."""

    @model_validator(mode="after")
    def _whole_sequences(self) -> TrainingSpec:
        if self.global_batch_tokens % self.seq_len:
            lower = max(self.seq_len, self.global_batch_tokens // self.seq_len * self.seq_len)
            raise ValueError(
                f"global_batch_tokens: {self.global_batch_tokens} is not a whole number of "
                f"{self.seq_len}-token sequences; use a multiple of seq_len such as {lower} "
                f"or {lower + self.seq_len}"
            )
        return self

    @field_validator("state_dtype")
    @classmethod
    def _pure_bf16_computes_in_bf16(cls, value: str, info: ValidationInfo) -> str:
        # A field's check (not the model's), so that the refusal is located at training.state_dtype.
        if value == "bfloat16" and info.data.get("precision", "bf16") != "bf16":
            raise ValueError(STATE_DTYPE_NEEDS_BF16.removeprefix("state_dtype: "))
        return value

    @model_serializer(mode="wrap")
    def _omit_mixed_precision_states(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Requests and plans with fp32 states (the default) serialise, and so hash, as before the
        # field existed.
        data = handler(self)
        if data.get("state_dtype") == "float32":
            data.pop("state_dtype", None)
        return data

    @property
    def global_batch_sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len


MAX_SEARCH_OPTIONS = 16
"""The most entries one search list (`search.shardings`, `search.compile`, the pinned degrees, ...)
may hold as sent, duplicates included. Each list is then de-duplicated and put in one order (the
options' declared order, degrees ascending): its length never multiplies the search, and two requests
that differ only by duplicates or order plan, and hash, the same."""
_OPTION_ORDER: dict[str, tuple[object, ...]] = {
    "shardings": typing.get_args(ShardingStrategy),
    "compile": (True, False),
    "checkpointing": typing.get_args(CheckpointMode),
    "pipeline_schedules": PIPELINE_SCHEDULES,
    "float8": typing.get_args(Float8Recipe),
}
"""The order each list of named options is kept in (the defaults' order, so defaults hash as before);
lists of degrees are kept ascending."""
_Option = typing.TypeVar("_Option")
Options = Annotated[list[_Option], Field(max_length=MAX_SEARCH_OPTIONS)]
"""A search list: at most MAX_SEARCH_OPTIONS entries as sent."""


class _SearchChoices(StrictModel):
    """The search space's first fields: the choices that are not mesh axes."""

    shardings: Options[ShardingStrategy] = ["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
    """Sharding strategies to consider."""
    compile: Options[bool] = [True, False]
    """Whether to consider torch.compile (True) and eager FSDP2 (False)."""
    checkpointing: Options[CheckpointMode] = ["none", "selective", "op_selective", "full"]
    """Activation checkpointing modes to consider. `blocks` (the first n blocks recomputed, at a quarter,
    a half and three quarters of them) is searched only when listed."""


PIN_FIELDS: tuple[str, ...] = tuple(entry.search_field for entry in searched_axes() if entry.search_field)
"""The search fields that pin a mesh axis's degrees (`tensor_parallel_degrees`, ...), one per axis of
contract/mesh.py's registry that has one; None (absent) searches the axis."""

_SearchPins = create_model(
    "_SearchPins",
    __base__=_SearchChoices,
    __module__=__name__,
    **{
        entry.search_field: (
            Options[pinned_degree(entry)] | None, Field(default=None, description=entry.search_doc)
        )
        for entry in searched_axes()
        if entry.search_field
    },
)


class SearchSpace(_SearchPins):  # type: ignore[misc, valid-type]
    """Limits on what the search may choose; the defaults search everything. A field per mesh axis
    pins its degrees (`PIN_FIELDS`, from contract/mesh.py's registry)."""

    pipeline_schedules: Options[PipelineSchedule] = Field(default=list(PIPELINE_SCHEDULES))
    """Pipeline schedules to consider when pp > 1 (contract/parallel_config.py `PipelineSchedule`)."""
    float8: Options[Float8Recipe] | None = None
    """Float8 training recipes to consider beside the compute precision (`["none", "tensorwise"]`),
    on GPUs with float8 tensor cores (`mxfp8`: MX tensor cores) and bf16 training. None: `none` only,
    the compute precision (Float8 pricing is not yet checked against measured runs, so it is asked
    for, not chosen by default)."""
    async_tp: bool = False
    """Run the tensor-parallel collectives of compiled plans with tp > 1 asynchronously (inductor's
    micro-pipelined TP over CUDA symmetric memory), priced as overlapping the matmuls they feed.
    Off by default: asked for, not chosen, until a GPU has measured it here."""
    max_micro_batch_size: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCH)] = 64
    """Largest micro-batch (sequences per data-parallel rank per forward) to consider."""
    memory_headroom: Annotated[float, Field(ge=0.0, le=0.5)] = 0.0
    """Extra fraction of usable GPU memory kept free, on top of the margin the memory model's
    measured error calls for: a plan fits when peak x (1 + margin) <= usable x (1 - headroom)."""
    max_peak_memory_gib: Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)] | None = None
    """Exclusive ceiling on predicted peak memory per GPU (GiB): configurations predicted at or above
    it are treated as not fitting. Re-planning after an out-of-memory run sets it to the failed
    configuration's predicted peak. None: only the GPU's capacity limits."""

    @model_serializer(mode="wrap")
    def _omit_unset_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Requests without a ceiling or tp pins serialise (and so hash) as before the fields existed.
        data = handler(self)
        for name in ("max_peak_memory_gib", *PIN_FIELDS, "float8"):
            if data.get(name) is None:
                data.pop(name, None)
        if data.get("pipeline_schedules") == list(PIPELINE_SCHEDULES):
            data.pop("pipeline_schedules", None)
        if data.get("async_tp") is False:
            data.pop("async_tp", None)
        return data

    @field_validator("shardings", "compile", "checkpointing", *PIN_FIELDS, "float8", "pipeline_schedules")
    @classmethod
    def _one_order(cls, value: list | None, info: ValidationInfo) -> list | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one option")
        order = _OPTION_ORDER.get(info.field_name or "")
        return sorted(set(value), key=order.index if order else None)


class PlanRequest(StrictModel):
    """Everything the planner needs: what to train, where, how much, and optional calibration.

    Validation is structural (each part's own checks). Whether the batch splits over the cluster,
    and what would, is the search's pre-check (planner/precheck.py), which prices its advice.
    """

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    search: SearchSpace = SearchSpace()
    """Restrictions on the search space."""
    top_k: Annotated[int, Field(ge=1, le=50)] = 5
    """How many ranked alternatives to return beside the best plan."""


_DIVISOR_SEARCH = 100_000
"""How far from `near` _nearest_divisor looks: its input is a user's number, which may be huge."""


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of n nearest to `near` (the smaller on a tie), searching outwards from it: never
    more than _DIVISOR_SEARCH steps, whatever n is (1 divides everything, if nothing nearer does)."""
    near = max(1, min(near, n))
    for step in range(_DIVISOR_SEARCH):
        found = [d for d in (near - step, near + step) if 1 <= d <= n and n % d == 0]
        if found:
            return min(found)
    return 1
