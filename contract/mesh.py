"""The device mesh as a registry of axes: every parallel dimension declared once, in `AXES`.

Each `Axis` entry says everything a layer needs that only *names* the axis: its place in the device
mesh (the table's order), its search field and command-line option with their help, its label in
plan names, its bounds and what its degree must divide, and what it shards. The layers iterate the
table: the search space's pin fields (planner/specs.py), the CLI pins (api/cli/axis_pins.py), error
messages in command-line terms, the dashboard's mesh row and plan form, compare, the what-if study's
pins and the launcher's checks; storage keeps the mesh as one document (`Mesh.as_document`). An axis
writes code only where it has physics: its cost term (planner/cost/estimate.py), its memory term
(planner/cost/memory.py) and its runtime apply step (executor/runtime/). tests/test_mesh_layers.py
adds a hypothetical axis to the table and checks that nothing else needs to change.

The mesh is laid out row-major over `MESH_AXES`, the last innermost: a tensor-parallel group is `tp`
consecutive ranks, so it stays inside one node, a context-parallel group the next `cp x tp`, a
data-parallel shard group strides over them, and pipeline stages are the outermost blocks of
`world / pp` ranks each (the stages' point-to-point sends are what crosses the slow links).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from contract.topology import LinkClass as LinkClass
from contract.topology import span_link


@dataclass(frozen=True, slots=True, kw_only=True)
class Size:
    """A number of the model, the training or the cluster that an axis's degree must divide."""

    name: str
    """As messages name it (a request's field name: `num_kv_heads`, `seq_len`, `gpus_per_node`)."""
    of: Literal["model", "training", "cluster"]
    attribute: str = ""
    """Where it is read on `of` when not under `name` (the model's `kv_heads`: num_kv_heads or num_heads)."""
    why: str = ""
    """Said after it in a refusal, e.g. `(sequence parallelism splits it)`."""

    def read(self, model: Any, training: Any, gpus_per_node: int | None) -> int | None:
        """Its value, or None where the caller does not know it (the cluster of a stored plan)."""
        if self.of == "cluster":
            return gpus_per_node
        return getattr(model if self.of == "model" else training, self.attribute or self.name)

    def shown(self, value: int) -> str:
        return f"{self.name} {value}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One parallel dimension of the device mesh: what every layer that only names it reads."""

    name: str
    """The `Mesh` field, the runtime's DeviceMesh dimension name and the plan document's key."""
    what: str
    """Its kind of parallelism as an adjective: `tensor-parallel` (a `tensor-parallel degree`)."""
    doc: str
    """What its degree means (the `Mesh` field's documentation)."""
    search_field: str | None = None
    """The search space's field pinning its degrees (`search.tensor_parallel_degrees`); None: the
    search chooses it through another choice (the data-parallel axes follow the sharding)."""
    search_doc: str = ""
    """The search field's description (the API's JSON Schema)."""
    cli_help: str = ""
    """The command-line option's help (`--tp`); the option itself is `option`."""
    form_help: str = ""
    """The dashboard's plan form: what its pin field does (empty: searched by default)."""
    label: str = ""
    """Its prefix in plan names (`tp` in `dp8x1 tp2`); empty: shown inside another axis's part."""
    joins: str | None = None
    """The axis whose part of the label it is shown in, after an `x` (dp_replicate in dp_shard's
    `dp8x2`)."""
    optional: bool = False
    """Named in labels and descriptions only above 1 (axes added after the others, rarely used)."""
    added_after_schema_2: bool = False
    """Added to the plan document after schema 2.0: at degree 1 a plan hashes as it did without it."""
    fixed_layout: bool = False
    """The plan lays its groups over the nodes (the pipeline's stages, outermost): a bundle runs on exactly
    the mesh's world, each group on the whole nodes the plan gave it (the launcher checks both)."""
    data_parallel: bool = False
    """Its ranks see different sequences (the data-parallel axes); the others are model-parallel."""
    shards_parameters: bool = False
    """FSDP shards parameters over it (torchtitan's `dp_shard_cp`)."""
    shards: str = ""
    """What it splits, for a degree above 1 (`{degree}` is replaced): `blocks in 4 pipeline stages`."""
    note: str = ""
    """What it brings, for a degree above 1, as the dashboard's mesh row says it (`{degree}` and
    `{mesh.<property>}` are replaced)."""
    compare_label: str = ""
    """Its row in the compare table."""
    compare_shown: str = ""
    """How the compare table writes a degree above 1 (`{degree} stages`); 1 is then `none (1)`. Empty:
    the degree as it is."""
    sequence_chunks: int = 0
    """Pieces of every sequence one of its ranks holds (cp: 2 load-balanced chunks; tp: 1, sequence
    parallelism); 0: it does not split sequences. Their product is `Mesh.sequence_pieces`."""
    architectures: tuple[str, ...] = ()
    """The model architectures its runtime step can split (empty: every one)."""
    architecture_reason: str = ""
    """Why another architecture cannot take it (above 1)."""
    divides: tuple[Size, ...] = ()
    """What its degree must divide (above 1)."""
    divides_reason: str = ""
    """Why, said after them (`{domain}` is replaced: `a node`, or `a scale-up domain` where the
    cluster's spans nodes)."""
    at_most: Size | None = None
    """What its degree may not exceed (a pipeline's stages need a block each)."""
    at_most_reason: str = ""
    """Why, said after it (`{degree}` and `{limit}` are replaced)."""
    carved_from: tuple[str, ...] = ()
    """The axes whose groups its ranks are carved out of, instead of multiplying the world size: an
    expert-parallel group is made of ranks of the data-parallel shard group (torchtitan's ep inside
    dp_shard x cp), so its degree must divide their product and the world is the product of the
    other axes. It is no dimension of the runtime's DeviceMesh (`WORLD_AXES`)."""
    needs: str = ""
    """The model's attribute that must be set for a degree above 1 (ep: `moe`, experts to split)."""
    needs_reason: str = ""
    """Why, said when it is not (`{degree}` is replaced)."""
    exposed_comm: str = ""
    """The plan's prediction field holding the time its collectives leave exposed, where the cost model
    prices them apart (`exposed_tensor_parallel_s`): the printout, the dashboard and compare show it for
    a degree above 1. Empty: its communication is counted with the others (or shown as a bubble)."""
    exposed_comm_why: str = ""
    """Why that time is exposed, as the printout says it after the time."""
    exposed_comm_detail: str = ""
    """What that time is, as the dashboard's row says it (`{degree}` is replaced)."""
    torchtitan_degree: str = ""
    """torchtitan's `ParallelismConfig` field for its degree (`tensor_parallel_degree`), which the
    torchtitan launch target sets (executor/launch/torchtitan.py); empty: torchtitan has no such axis,
    and a plan with it above 1 is refused there."""

    @property
    def option(self) -> str | None:
        """Its command-line pin (`--tp`): one where it has a search field."""
        return f"--{self.name.replace('_', '-')}" if self.search_field else None

    @property
    def spoken(self) -> str:
        """Its kind of parallelism as words (`tensor parallel`): the rows of its exposed communication."""
        return self.what.replace("-", " ")

    @property
    def within_node(self) -> bool:
        """Its groups stay inside one node (its degree divides the GPUs per node)."""
        return any(size.of == "cluster" for size in self.divides)

    @property
    def form_field(self) -> str | None:
        """Its pin's field in the dashboard's plan form: the search field, one degree
        (`tensor_parallel_degree`)."""
        return self.search_field.removesuffix("s") if self.search_field else None

    def part(self, degree: int) -> str:
        """What it splits at `degree`, or an empty string."""
        return self.shards.format(degree=degree) if degree > 1 else ""

    def noted(self, mesh: Mesh) -> str:
        """What it brings to `mesh` (its `note`), or an empty string at degree 1."""
        degree = mesh.degree(self.name)
        return self.note.format(degree=degree, mesh=mesh) if degree > 1 else ""

    def compared(self, degree: int) -> str:
        """A degree as the compare table writes it."""
        if not self.compare_shown:
            return str(degree)
        return self.compare_shown.format(degree=degree) if degree > 1 else "none (1)"


AXES: tuple[Axis, ...] = (
    Axis(
        name="pp",
        torchtitan_degree="pipeline_parallel_degree",
        what="pipeline-parallel",
        doc="Pipeline-parallel degree: ranks holding consecutive stages of the model's blocks (the first "
        "with the embeddings, the last with the final norm and the head), each micro-batch's "
        "activations sent forward and their gradients back between neighbours (`ParallelConfig."
        "pipeline` says how).",
        search_field="pipeline_parallel_degrees",
        search_doc="Pipeline-parallel degrees to consider (`[8]` pins pp=8: the blocks split into 8 "
        "stages). None: pp=1 where a plan without a pipeline fits; where none does (the model's states "
        "outgrow the data-parallel group), every power of two up to the model's layers that divides "
        "the world.",
        cli_help="Pin the pipeline-parallel degrees to search (repeatable or comma-separated): --pp 4 "
        "splits the blocks into 4 stages, --pp 1 plans no pipeline. Default: pp 1 where a plan without a "
        "pipeline fits, else every power of two up to the model's layers that divides the GPUs.",
        form_help="Empty: on clusters of several nodes the planner also searches pipeline stages (every "
        "power of two up to 16 that divides the nodes); one node plans none. A number pins it: 4 splits "
        "the blocks into 4 stages; 1 plans no pipeline.",
        label="pp",
        optional=True,
        fixed_layout=True,
        added_after_schema_2=True,
        shards="blocks in {degree} pipeline stages",
        note="the blocks are split into {degree} pipeline stages of {mesh.stage_ranks} GPU(s) each "
        "(outermost: consecutive blocks of ranks), micro-batches sent stage to stage",
        compare_label="Pipeline stages (pp)",
        compare_shown="{degree} stages",
        architectures=("llama", "gpt2"),
        architecture_reason="a traced layer graph has no runtime model to split into stages",
        at_most=Size(name="num_layers", of="model"),
        at_most_reason="{degree} stages need at least {degree} blocks, the model has {limit}",
    ),
    Axis(
        name="dp_replicate",
        torchtitan_degree="data_parallel_replicate_degree",
        data_parallel=True,
        what="data-parallel replica",
        doc="Data-parallel replicas: ranks holding the same parameter shard (hybrid_shard across nodes, "
        "no_shard across everything).",
        joins="dp_shard",
        compare_label="Replicas",
    ),
    Axis(
        name="dp_shard",
        torchtitan_degree="data_parallel_shard_degree",
        data_parallel=True,
        what="data-parallel shard",
        doc="Data-parallel ranks a parameter is sharded over (FSDP's shard group, with the cp ranks).",
        label="dp",
        shards_parameters=True,
        compare_label="Shard group (GPUs)",
    ),
    Axis(
        name="ep",
        torchtitan_degree="expert_parallel_degree",
        what="expert-parallel",
        doc="Expert-parallel degree: ranks of the data-parallel shard group (dp_shard x cp) that split "
        "every MoE block's routed experts, each holding num_experts / ep of them, FSDP-sharded over the "
        "other (dp_shard x cp) / ep ranks (torchtitan's `dp_shard_mod_ep`); tokens are sent to their "
        "experts' ranks and back by all-to-all inside the group. Not a factor of the world size.",
        search_field="expert_parallel_degrees",
        search_doc="Expert-parallel degrees to consider (`[8]` pins ep=8: each rank holds 1/8 of every "
        "MoE block's routed experts). None: for a mixture-of-experts model, per mesh, ep=1, the largest "
        "power of two dividing num_experts and the data-parallel shard group (dp_shard x cp) whose "
        "all-to-alls stay inside a scale-up domain, and the largest of all; dense models plan ep=1.",
        cli_help="Pin the expert-parallel degrees to search (repeatable or comma-separated): --ep 8 "
        "holds 1/8 of the routed experts per rank (ep ranks are carved out of dp_shard x cp), --ep 1 "
        "plans none. Default (MoE models): ep 1, the largest degree dividing the experts and the shard group "
        "whose all-to-alls stay inside a node (or NVLink domain), and the largest of all.",
        form_help="Empty: for a mixture-of-experts model the planner searches ep 1, the largest degree "
        "dividing the experts and the shard group whose all-to-alls stay inside a node (or NVLink "
        "domain), and the largest of all. A number pins it: 8 holds 1/8 of the experts per rank; 1 "
        "plans none.",
        label="ep",
        optional=True,
        added_after_schema_2=True,
        shards="experts over {degree} ranks",
        note="each rank of an ep group of {degree} (carved out of dp_shard × cp) holds 1/{degree} of the "
        "routed experts, FSDP-sharded over the other {mesh.expert_shards}; tokens go to their experts "
        "and back by all-to-all",
        compare_label="Expert parallel (GPUs)",
        compare_shown="{degree} (experts split)",
        exposed_comm="exposed_expert_parallel_s",
        exposed_comm_why="token dispatch and combine all-to-alls: the experts wait for their tokens",
        exposed_comm_detail="the ep={degree} token dispatch and combine all-to-alls of every MoE layer, "
        "which the experts' matmuls wait for",
        carved_from=("dp_shard", "cp"),
        needs="moe",
        needs_reason="a mixture-of-experts model (it splits the routed experts), and this one is dense",
        divides=(Size(name="num_experts", of="model", attribute="routed_experts"),),
        divides_reason="each rank holds the same number of whole experts",
    ),
    Axis(
        name="cp",
        torchtitan_degree="context_parallel_degree",
        what="context-parallel",
        doc="Context-parallel degree: ranks splitting every sequence (load-balanced chunks for the causal "
        "mask), each attending its queries to the keys and values all-gathered from the others; they "
        "hold the same parameters, which FSDP shards over dp_shard x cp.",
        search_field="context_parallel_degrees",
        search_doc="Context-parallel degrees to consider (`[4]` pins cp=4: every sequence split over 4 "
        "ranks). None: for sequences of CONTEXT_PARALLEL_FROM_SEQ_LEN tokens or more (llama family), "
        "every power of two whose 2 x cp chunks split the sequence; shorter sequences plan cp=1 (the "
        "all-gathered keys and values then cost more than the memory they save).",
        cli_help="Pin the context-parallel degrees to search (repeatable or comma-separated): --cp 4 "
        "splits every sequence over 4 ranks. Default: every degree that splits the sequence, for "
        "sequences of 32,768 tokens or more (llama family); shorter ones plan cp 1.",
        form_help="Empty: the planner searches context parallelism for sequences of 32,768 tokens or more "
        "(llama family). A number pins it: 4 splits every sequence over 4 ranks; 1 plans none.",
        label="cp",
        optional=True,
        added_after_schema_2=True,
        shards_parameters=True,
        shards="sequences split over {degree} ranks",
        note="each sequence is split over a cp group of {degree} ranks (load-balanced chunks; keys and "
        "values all-gathered for attention), and FSDP shards over dp_shard × cp",
        compare_label="Context parallel (GPUs)",
        compare_shown="{degree} (sequences split)",
        sequence_chunks=2,
        architectures=("llama",),
        architecture_reason="the runtime splits its attention over the sequence",
    ),
    Axis(
        name="tp",
        torchtitan_degree="tensor_parallel_degree",
        what="tensor-parallel",
        doc="Tensor-parallel degree: ranks splitting every block's matmuls (Megatron column/row "
        "parallel), with sequence parallelism between them and a vocabulary-parallel loss when > 1.",
        search_field="tensor_parallel_degrees",
        search_doc="Tensor-parallel degrees to consider (`[8]` pins tp=8; `[1]` keeps data parallelism "
        "only). None: every power of two up to the GPUs per node that divides the model's heads, "
        "key/value heads, FFN and vocabulary (llama family; other architectures plan tp=1).",
        cli_help="Pin the tensor-parallel degrees to search (repeatable or comma-separated): --tp 8 plans "
        "tp=8 only, --tp 1 data parallelism only. Default: every degree that splits the model in a node.",
        form_help="Empty: the planner searches every degree that splits the model's heads, FFN and "
        "vocabulary inside a node (llama family). A number pins it: 8 plans tp=8 (tensor parallel with "
        "sequence and loss parallel, FSDP over the rest); 1 plans data parallelism only.",
        label="tp",
        shards="sequence + loss parallel",
        note="each tp group is {degree} consecutive ranks inside a scale-up domain (a node, or an NVLink "
        "rack), with sequence parallel and loss parallel (vocabulary-sharded cross-entropy)",
        compare_label="Tensor parallel (GPUs)",
        compare_shown="{degree} (sequence + loss parallel)",
        exposed_comm="exposed_tensor_parallel_s",
        exposed_comm_why="between the matmuls: never overlapped",
        exposed_comm_detail="the tp={degree} collectives of every layer sit between its matmuls",
        sequence_chunks=1,
        architectures=("llama",),
        architecture_reason="the runtime splits its attention, MLP and vocabulary",
        divides=(
            Size(name="num_heads", of="model"),
            Size(name="num_kv_heads", of="model", attribute="kv_heads"),
            Size(name="intermediate_size", of="model", attribute="ffn_size"),
            Size(name="vocab_size", of="model"),
            Size(name="seq_len", of="training", why="sequence parallelism splits it"),
            Size(name="gpus_per_node", of="cluster"),
        ),
        divides_reason="tensor parallelism stays inside {domain} and splits heads, FFN and vocabulary "
        "evenly",
    ),
)
"""The mesh's axes, outermost first: the rank layout, and the runtime's DeviceMesh dimension order."""

MESH_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES)
"""The axes' names, outermost first: the `Mesh` fields and the plan document's keys."""
WORLD_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if not axis.carved_from)
"""The axes whose degrees multiply into the world size, outermost first: the runtime's DeviceMesh
dimension names (an axis carved out of others, ep, is none)."""
OPTIONAL_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.optional)
"""Axes a mesh's description names only above 1 (added after the others, rarely used)."""
SHARD_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.shards_parameters)
"""The axes FSDP shards parameters over (torchtitan's `dp_shard_cp`): a context-parallel group holds
the same parameters, so its ranks share the shards too."""
MODEL_PARALLEL_AXES: tuple[str, ...] = tuple(
    axis.name for axis in AXES if not axis.data_parallel and not axis.carved_from
)
"""The axes beyond data parallelism (pp, cp, tp), outermost first: what splits one model replica (ep,
carved out of the data-parallel ranks, is none: its ranks read different sequences)."""
SEQUENCE_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.sequence_chunks)
"""The axes that split every sequence (cp, tp): their product is `Mesh.sequence_ranks`."""
ADDED_MESH_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.added_after_schema_2)
"""Mesh axes added after schema 2.0 (degree 1 means what their absence meant)."""


def axis(name: str) -> Axis:
    """The registry's entry for `name` (KeyError for an axis the mesh does not have)."""
    for entry in AXES:
        if entry.name == name:
            return entry
    raise KeyError(name)


def searched_axes() -> tuple[Axis, ...]:
    """The axes a request pins by a search field, innermost first: the order the search space
    declares their fields in (`tensor_parallel_degrees` first, as it always was)."""
    return tuple(entry for entry in reversed(AXES) if entry.search_field)


def exposed_comm_axes() -> tuple[Axis, ...]:
    """The axes whose exposed communication the plan states apart (`Axis.exposed_comm`), innermost
    first (tensor parallelism's row, then expert parallelism's)."""
    return tuple(entry for entry in reversed(AXES) if entry.exposed_comm)


class MeshError(ValueError):
    """A mesh that cannot be: the message names the axis and the fix."""


@dataclass(frozen=True, slots=True)
class Mesh:
    """The degrees of the device mesh, one field per entry of `AXES` (in its order; a test holds
    them equal); their product is the world size. Everything else is read from the table."""

    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}  # pydantic: unknown axes refused

    pp: int = 1
    """Pipeline-parallel degree (`AXES`: pp)."""
    dp_replicate: int = 1
    """Data-parallel replicas (`AXES`: dp_replicate)."""
    dp_shard: int = 1
    """Data-parallel ranks a parameter is sharded over (`AXES`: dp_shard)."""
    ep: int = 1
    """Expert-parallel degree, carved out of dp_shard x cp (`AXES`: ep)."""
    cp: int = 1
    """Context-parallel degree (`AXES`: cp)."""
    tp: int = 1
    """Tensor-parallel degree (`AXES`: tp)."""

    def __post_init__(self) -> None:
        for entry in AXES:
            degree = getattr(self, entry.name)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise MeshError(f"{entry.name} must be a whole number >= 1, got {degree!r}")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """pydantic's hook (duck-typed: no import): the JSON Schema states each degree's bound."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        for entry in AXES:
            schema["properties"][entry.name]["minimum"] = 1
            schema["properties"][entry.name]["description"] = entry.doc
        return schema

    @classmethod
    def from_document(cls, document: Any, *, where: str = "mesh") -> Mesh:
        """The mesh of a JSON object `{pp, dp_replicate, dp_shard, cp, tp}` (a missing axis is 1).
        An axis this version does not know is accepted at degree 1 (no parallelism there: a newer
        planner's plan means the same) and refused above it, naming it."""
        names = mesh_axes()
        if not isinstance(document, dict):
            raise MeshError(f"{where} must be an object with {', '.join(names)}")
        unknown = sorted(name for name, degree in document.items() if name not in names and degree != 1)
        if unknown:
            raise MeshError(
                f"{where} has axes this version cannot run ({', '.join(unknown)}); it knows "
                f"{', '.join(names)}: use a launcher bundle made by the planner that made the plan"
            )
        try:
            return cls(**{name: degree for name, degree in document.items() if name in names})
        except MeshError as exc:
            raise MeshError(f"{where}.{exc}") from None

    def as_document(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def degree(self, name: str) -> int:
        """The degree of the axis `name`."""
        return int(getattr(self, name))

    @property
    def shape(self) -> tuple[int, ...]:
        """The degrees in `WORLD_AXES` order: the runtime's DeviceMesh shape."""
        return tuple(self.degree(name) for name in WORLD_AXES)

    @property
    def world_size(self) -> int:
        """The product of every axis's degree but those carved out of others (`WORLD_AXES`)."""
        return math.prod(self.shape)

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that see different sequences (the data-parallel axes)."""
        return math.prod(self.degree(entry.name) for entry in AXES if entry.data_parallel)

    @property
    def model_parallel(self) -> int:
        """Ranks that share one data-parallel rank's sequences (pp x cp x tp)."""
        return self.world_size // self.dp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage (the whole world when pp is 1)."""
        return self.world_size // self.pp

    @property
    def fsdp_shards(self) -> int:
        """Ranks a parameter is sharded over: the product of `SHARD_AXES` (dp_shard x cp)."""
        return math.prod(self.degree(entry.name) for entry in AXES if entry.shards_parameters)

    @property
    def expert_shards(self) -> int:
        """Ranks a routed expert's parameters are sharded over: the shard group less the expert-parallel
        ranks carved out of it, (dp_shard x cp) / ep (torchtitan's `dp_shard_mod_ep`)."""
        return max(1, self.fsdp_shards // self.ep)

    @property
    def expert_shards_borrowing_tp(self) -> int:
        """Ranks a routed expert's parameters are sharded over where the expert-parallel ranks are
        carved out of the tp ranks too, each expert whole on its rank (torchtitan 0.3's layout):
        (dp_shard x cp x tp) / ep."""
        return max(1, self.fsdp_shards * self.tp // self.ep)

    @property
    def experts_split_by_tp(self) -> bool:
        """Whether the routed experts run tensor-parallel inside each expert-parallel rank (ep and tp
        both above 1): the plan's layout, which a trainer that carves ep out of the tp ranks cannot
        express."""
        return self.ep > 1 and self.tp > 1

    @property
    def expert_span(self) -> int:
        """Consecutive ranks one expert-parallel group spans: it is carved out of the shard group,
        which strides over the tp ranks, so ep x tp."""
        return self.ep * self.tp

    @property
    def sequence_pieces(self) -> int:
        """Equal pieces every sequence is cut into: 2 x cp load-balanced chunks (cp above 1), each
        split again over the tp ranks (sequence parallelism): the product of each sequence-splitting
        axis's `sequence_chunks` x degree, over the axes above 1. seq_len must be a multiple of it."""
        return math.prod(
            entry.sequence_chunks * self.degree(entry.name)
            for entry in AXES
            if entry.sequence_chunks and self.degree(entry.name) > 1
        )

    @property
    def sequence_ranks(self) -> int:
        """The GPUs one sequence's activations are split over: the product of the sequence-splitting
        axes' degrees (cp x tp)."""
        return math.prod(self.degree(name) for name in SEQUENCE_AXES)

    def degrees_above_one(self, names: tuple[str, ...] | None = None) -> str:
        """`pp=4 cp=2 tp=2`: the axes above 1 among `names` (default: the model-parallel ones)."""
        shown = MODEL_PARALLEL_AXES if names is None else names
        return " ".join(f"{name}={self.degree(name)}" for name in shown if self.degree(name) > 1)

    def sequence_split(self) -> str:
        """`2 x cp 4 x tp 2`: how `sequence_pieces` is made (the axes above 1)."""
        split = [e for e in AXES if e.sequence_chunks and self.degree(e.name) > 1]
        chunks = [str(e.sequence_chunks) for e in split if e.sequence_chunks > 1]
        return " x ".join([*chunks, *(f"{e.name} {self.degree(e.name)}" for e in split)]) or "1"

    def shard_link(self, domain_gpus: int) -> LinkClass:
        """The link FSDP's all-gathers and reductions cross: a shard group strides over the tp ranks,
        so it spans dp_shard x cp x tp consecutive ranks (contract/topology.py `span_link`, on
        scale-up domains of `domain_gpus`)."""
        return span_link(self.fsdp_shards * self.tp, domain=domain_gpus, world=self.world_size)

    def context_link(self, domain_gpus: int) -> LinkClass:
        """The link the context-parallel all-gathers cross: a cp group is cp x tp consecutive ranks
        (tp innermost)."""
        return span_link(self.sequence_ranks, domain=domain_gpus, world=self.world_size)

    def expert_link(self, domain_gpus: int) -> LinkClass:
        """The link the expert-parallel all-to-alls cross: an ep group is carved out of the shard group,
        which strides over the tp ranks, so it spans ep x tp consecutive ranks (`expert_span`)."""
        return span_link(self.expert_span, domain=domain_gpus, world=self.world_size)

    def pipeline_link(self, domain_gpus: int) -> LinkClass:
        """The link the pipeline's slowest point-to-point send crosses: stages are the outermost
        blocks of `stage_ranks` ranks, so some neighbours sit in different domains unless the whole
        pipeline fits in one."""
        return span_link(self.world_size, domain=domain_gpus, world=self.world_size)

    def shown_axes(self) -> tuple[Axis, ...]:
        """The axes a description names, outermost first: optional ones only above 1."""
        return tuple(entry for entry in AXES if not entry.optional or self.degree(entry.name) > 1)

    def label(self) -> str:
        """The one way a mesh is shown, e.g. `dp8x1 tp1`, `pp4 dp2x4 cp2 tp2`: each axis's label and
        degree, outermost first (optional axes above 1 only), an axis that `joins` another after an
        `x` in its part (dp_shard x dp_replicate). Configurations (`ParallelConfig.label`), the
        planner's families (`config_family`) and the dashboard's plan list show meshes through it."""
        parts = []
        for entry in self.shown_axes():
            if not entry.label:
                continue
            joined = "".join(f"x{self.degree(j.name)}" for j in AXES if j.joins == entry.name)
            parts.append(f"{entry.label}{self.degree(entry.name)}{joined}")
        return " ".join(parts)

    def degrees_text(self, times: str = "x") -> str:
        """`pp 4 x dp_replicate 1 x dp_shard 8 x tp 8`: every shown axis by name, outermost first
        (`times`: the sign between them); an axis carved out of others in brackets after the last of
        them, not multiplied (`dp_shard 32 (ep 8) x tp 8`)."""
        shown = self.shown_axes()
        carved = [entry for entry in shown if entry.carved_from]
        parts = []
        for entry in shown:
            if entry.carved_from:
                continue
            part = f"{entry.name} {self.degree(entry.name)}"
            for inner in carved:
                present = [e.name for e in shown if e.name in inner.carved_from]
                if present and present[-1] == entry.name:
                    part += f" ({inner.name} {self.degree(inner.name)})"
            parts.append(part)
        return f" {times} ".join(parts)

    def describe(self) -> str:
        """`dp_replicate 1 x dp_shard 32 x tp 8 = 256 ranks` (pp and cp named when above 1)."""
        return f"{self.degrees_text()} = {self.world_size} ranks"

    def splits(self) -> list[str]:
        """What each axis above 1 splits, outermost first: `blocks in 4 pipeline stages`, ..."""
        return [part for entry in AXES if (part := entry.part(self.degree(entry.name)))]


def mesh_axes() -> tuple[str, ...]:
    """The axes' names, read from the table when asked (a test may extend it)."""
    return tuple(entry.name for entry in AXES)


def axis_problems(
    entry: Axis, mesh: Mesh, *, model: Any, training: Any, gpus_per_node: int | None = None,
    node_gpus: int | None = None,
) -> list[str]:
    """Why `mesh`'s degree on one axis cannot run `model` (the contract's ModelConfig or the
    planner's ModelSpec: both have the fields `Size` reads) at `training`'s sequence length: each a
    sentence starting `tp=3 ...`, without advice (the caller knows what to change: a pin, a plan).

    `gpus_per_node` is what a group that stays inside one scale-up domain may span: the node, or a
    domain of several nodes (a GB200 NVL72 rack's 72); `node_gpus`, where the caller knows it, is one
    node's, so that a refusal names such a domain as the domain (and the domain that would take the
    degree) instead of as a node."""
    degree = mesh.degree(entry.name)
    if degree <= 1:
        return []
    shown = f"{entry.name}={degree}"
    if entry.architectures and model.architecture not in entry.architectures:
        need = (
            "a llama-family model"
            if entry.architectures == ("llama",)
            else (f"a {' or '.join(entry.architectures)} model")
        )
        kind = entry.what.removesuffix("-parallel")
        return [
            f"{shown}: {kind} parallelism needs {need} ({entry.architecture_reason}), "
            f"not '{model.architecture}'; {entry.name} 1 runs without it"
        ]
    if entry.needs and not getattr(model, entry.needs, None):
        return [f"{shown} needs {entry.needs_reason}; {entry.name} 1 runs without it"]
    problems = []
    if entry.carved_from:
        group = math.prod(mesh.degree(name) for name in entry.carved_from)
        if group % degree:
            within = " x ".join(f"{name} {mesh.degree(name)}" for name in entry.carved_from)
            problems.append(
                f"{shown} must divide {within} = {group} (its ranks are carved out of that group); pick "
                "a degree that divides it"
            )
    known = [
        (size, value)
        for size in entry.divides
        if (value := size.read(model, training, gpus_per_node)) is not None
    ]
    if any(value % degree for _, value in known):
        limits = ", ".join(_shown_size(size, value, node_gpus=node_gpus) for size, value in known)
        racks = any(size.of == "cluster" and node_gpus and value > node_gpus for size, value in known)
        reason = entry.divides_reason.replace("{domain}", "a scale-up domain" if racks else "a node")
        problems.append(
            f"{shown} must divide each of {limits} ({reason}); "
            + _divisor_advice(entry.name, degree, known, node_gpus=node_gpus)
        )
    if entry.at_most is not None:
        limit = entry.at_most.read(model, training, gpus_per_node)
        if limit is not None and degree > limit:
            reason = entry.at_most_reason.replace("{degree}", str(degree)).replace("{limit}", str(limit))
            problems.append(f"{shown}: {reason}; pick a smaller degree")
    if entry.sequence_chunks > 1 and training.seq_len % mesh.sequence_pieces:
        problems.append(
            f"{shown} cuts every sequence into {mesh.sequence_split()} = {mesh.sequence_pieces} "
            f"load-balanced pieces, which seq_len {training.seq_len} does not split into; pick a degree "
            "whose pieces divide it"
        )
    return problems


def _shown_size(size: Size, value: int, *, node_gpus: int | None) -> str:
    """A size as a refusal names it: a cluster's scale-up domain that spans nodes as the domain."""
    if size.of == "cluster" and node_gpus and value > node_gpus:
        return (
            f"scaleup_domain_gpus {value} (one NVLink or Infinity Fabric domain of {value // node_gpus} "
            f"nodes of {node_gpus}: a rack)"
        )
    return size.shown(value)


_MOST_DIVISORS_SHOWN = 6
"""The largest common divisors a refusal lists (the smaller ones are what nobody pins)."""


def _divisor_advice(
    name: str, degree: int, known: list[tuple[Size, int]], *, node_gpus: int | None
) -> str:
    """How to fix a degree that does not divide every size: the degrees that do (`tp 2, 4 or 8`),
    and, where only a scale-up domain of several nodes is in the way, the domain that `degree` would
    divide (a rack's first 64 GPUs take tp 16; all 72 do not)."""
    common = math.gcd(*(value for _, value in known))
    divisors = [d for d in range(2, math.isqrt(common) + 1) if common % d == 0]
    divisors = sorted({*divisors, *(common // d for d in divisors), common} - {1})[-_MOST_DIVISORS_SHOWN:]
    if not divisors:
        advice = f"no {name} above 1 divides them all: {name} 1 runs without it"
    else:
        listed = ", ".join(f"{d}" for d in divisors[:-1]) + (" or " if len(divisors) > 1 else "")
        advice = f"pick a common divisor: {name} {listed}{divisors[-1]}"
    blocking = [(size, value) for size, value in known if value % degree]
    if len(blocking) == 1 and blocking[0][0].of == "cluster" and node_gpus and blocking[0][1] > node_gpus:
        domain, step = blocking[0][1], math.lcm(degree, node_gpus)
        fitting = domain // step * step
        if fitting:
            advice += (
                f"; or, for {name} {degree}, describe domains of {fitting} GPUs (scaleup_domain_gpus "
                f"{fitting}: {fitting // node_gpus} of the {domain // node_gpus} nodes each)"
            )
    return advice


def mesh_problems(
    mesh: Mesh, model: Any, training: Any, *, gpus_per_node: int | None = None, node_gpus: int | None = None
) -> list[str]:
    """Every rule a mesh must keep to run `model` at `training`'s sequence length, held once here
    and called by the planner's pre-check (each pinned degree, each given mesh) and the contract's
    plan check alike. Each problem is `<field>: <why>`, the field relative to a plan
    (`config.mesh.tp`, `training.seq_len`); `gpus_per_node`, where known, bounds the axes that must
    stay inside a scale-up domain (`node_gpus`: see `axis_problems`). An empty list: the mesh can run."""
    problems = [f"training.seq_len: {problem}" for problem in _sequence_problems(model, training)]
    for entry in AXES:
        found = axis_problems(
            entry, mesh, model=model, training=training, gpus_per_node=gpus_per_node, node_gpus=node_gpus
        )
        problems.extend(f"config.mesh.{entry.name}: {problem}" for problem in found)
    return problems


def _sequence_problems(model: Any, training: Any) -> list[str]:
    """What the model cannot run at `training`'s sequence length whatever the mesh: GPT-2 learns one
    position embedding per token."""
    seq_len = training.seq_len
    if model.architecture == "gpt2" and seq_len > model.max_seq_len:
        return [
            f"{seq_len} is longer than {model.name}'s {model.max_seq_len} learned positions (GPT-2 has "
            f"one position embedding per token); use seq_len <= {model.max_seq_len}"
        ]
    return []


def data_parallel_axes(sharding: str) -> tuple[str, ...]:
    """The mesh axes a sharding mode spreads parameters and gradient reduction over: the shard
    group (dp_shard x cp) for full_shard and shard_grad_op (dp_replicate is 1), (dp_replicate,
    dp_shard, cp) for hybrid_shard, the replicas and the cp group for no_shard (dp_shard is 1).
    The cp ranks hold the same parameters as data-parallel ranks do (their gradients are reduced
    over them too); only the sequences they read are split differently."""
    if sharding in ("full_shard", "shard_grad_op"):
        return SHARD_AXES
    if sharding == "hybrid_shard":
        return ("dp_replicate", *SHARD_AXES)
    if sharding == "no_shard":
        return ("dp_replicate", *(name for name in SHARD_AXES if name != "dp_shard"))
    raise MeshError(
        f"unknown sharding {sharding!r}: one of full_shard, shard_grad_op, hybrid_shard, no_shard"
    )
