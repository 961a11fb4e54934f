"""The search space: every configuration a request allows, in a fixed order.

Axes, outermost first: the device mesh (tensor-parallel degree, then the data-parallel sharding
over what remains), compile, wrap unit, bucket caps, activation checkpointing, micro-batch. The
loss is sliced by one rule (`loss_chunks_for`), not searched. The search (planner/search.py) and
its advice (planner/infeasibility.py) both walk this one enumeration.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from contract.loss_slices import loss_chunks_for
from contract.mesh import MODEL_PARALLEL_AXES, Axis, Mesh, axis, axis_problems, mesh_problems, searched_axes
from contract.parallel_config import (
    EAGER_ONLY_SCHEDULES,
    ParallelConfig,
    PipelineConfig,
    PipelineError,
    PipelineSchedule,
)
from planner.catalog.gpus import MX_GPUS
from planner.cost.estimate import block_step_time
from planner.cost.model_costs import UnitCost
from planner.cost.pipeline import balanced_stage_split
from planner.cost.setting import Choice, Setting
from planner.errors import PlanningError, SearchSpaceError
from planner.specs import PlanRequest

BLOCKS_PER_UNIT = (1, 2, 4, 8)
BUCKET_CAPS_MB = (0.0, 64.0, 512.0)
SELECTIVE_EVERY_K = (2, 4)
CHECKPOINT_BLOCK_SHARES = (0.25, 0.5, 0.75)
"""With checkpointing mode `blocks` allowed, the shares of the model's blocks searched as the number
recomputed (the first ones): a few, so that the search stays as fast; `predict` prices any number."""


def hybrid_shard_sizes(dp: int, gpus_per_node: int, *, tp: int = 1) -> list[int]:
    """Shard-group sizes for a 2-D data-parallel mesh of `dp` ranks (each a `tp`-wide group):
    divisors of dp strictly between 1 and dp whose groups line up with nodes (`gpus_per_node`: the
    scale-up domain; dp_shard x tp ranks divide it, or are a whole number of them), of the form 2^k or
    3 x 2^k, or a whole domain.

    Only those forms are tried (about 2 log2(dp) candidates), never every number below dp: dp is
    the cluster's size, and the pre-check's advice runs it for many clusters (planner/precheck.py)."""
    candidates = {
        base << k for base in (1, 3) for k in range(dp.bit_length()) if 1 < base << k < dp
    }
    if gpus_per_node % tp == 0 and 1 < gpus_per_node // tp < dp:
        candidates.add(gpus_per_node // tp)  # a whole domain of another form (72 GPUs of an NVL72)
    return sorted(
        s
        for s in candidates
        if dp % s == 0 and (gpus_per_node % (s * tp) == 0 or (s * tp) % gpus_per_node == 0)
    )


def micro_batch_sizes(local_batch: int, limit: int) -> list[int]:
    """Divisors of the per-rank batch up to a limit: powers of two, plus the whole local batch."""
    sizes = {d for d in (2**i for i in range(0, 16)) if d <= limit and local_batch % d == 0}
    if local_batch <= limit:
        sizes.add(local_batch)
    return sorted(sizes)


def pin_problems(request: PlanRequest, name: str, degree: int) -> list[str]:
    """Why `degree` on the mesh axis `name` cannot run this request's model, sequence and nodes
    (contract.mesh's rules, for a mesh of that axis alone): each `tp=3 must divide ...`."""
    entry = axis(name)
    # An axis carved out of others (ep, out of dp_shard x cp) is pinned before that group is known: a
    # group of its own size keeps that relation silent here (the search keeps the meshes it divides).
    carved = {entry.carved_from[0]: degree} if entry.carved_from else {}
    return axis_problems(
        entry, Mesh(**{name: degree, **carved}), model=request.model, training=request.training,
        gpus_per_node=request.cluster.scaleup_gpus, node_gpus=request.cluster.gpus_per_node,
    )


def splits_model(request: PlanRequest, tp: int) -> bool:
    """Whether `tp` ranks can split the model's heads, FFN, vocabulary and sequence inside one node."""
    return not pin_problems(request, "tp", tp)


def check_pins(request: PlanRequest, name: str) -> list[int] | None:
    """The request's pinned degrees on the axis `name` (its search field), None where unpinned.

    Raises PlanningError for a pinned degree the model, sequence or nodes cannot take, saying why.
    """
    field = f"search.{axis(name).search_field}"
    pinned: list[int] | None = getattr(request.search, field.removeprefix("search."))
    for degree in pinned or []:
        if problems := pin_problems(request, name, degree):
            raise PlanningError(f"{field}: {problems[0]}", field=field)
    return pinned


def tensor_parallel_degrees(request: PlanRequest) -> list[int]:
    """The tensor-parallel degrees to search: the request's pins, else every power of two that
    splits the model inside a node (1 for architectures without a tensor-parallel runtime).

    Raises PlanningError for a pinned degree the model or cluster cannot take, saying why.
    """
    pinned = check_pins(request, "tp")
    if pinned is None:
        if request.model.architecture != "llama":
            return [1]
        node = request.cluster.scaleup_gpus
        return [tp for tp in (2**i for i in range(0, 8)) if tp <= node and splits_model(request, tp)]
    return sorted(set(pinned))


def expert_parallel_degrees(request: PlanRequest) -> list[int]:
    """The expert-parallel degrees to search: the request's pins, else, for a mixture-of-experts model,
    every power of two up to the world that divides its routed experts (each rank holds whole
    experts); a dense model plans ep 1. Each mesh keeps those that divide its shard group, dp_shard x
    cp, out of which the ep ranks are carved (`data_parallel_meshes`).

    Raises PlanningError for a pinned degree the model cannot take, saying why.
    """
    pinned = check_pins(request, "ep")
    if pinned is None:
        experts = request.model.routed_experts
        if not experts:
            return [1]
        powers = (2**i for i in range(0, 11))
        return [ep for ep in powers if ep <= request.cluster.world_size and experts % ep == 0]
    return sorted(set(pinned))


CONTEXT_PARALLEL_FROM_SEQ_LEN = 32768
"""Sequences this long or longer search context parallelism by default: below, each rank's share of
the all-gathered keys and values costs more than the activation memory it saves."""
MAX_CONTEXT_PARALLEL = 64
"""The largest context-parallel degree searched unpinned."""


def context_parallel_degrees(request: PlanRequest) -> list[int]:
    """The context-parallel degrees to search: the request's pins, else (long sequences of a llama
    model) every power of two whose 2 x cp load-balanced chunks split the sequence.

    Raises PlanningError for a pinned degree the model or sequence cannot take, saying why.
    """
    pinned = check_pins(request, "cp")
    if pinned is None:
        if request.model.architecture != "llama" or request.training.seq_len < CONTEXT_PARALLEL_FROM_SEQ_LEN:
            return [1]
        limit = min(MAX_CONTEXT_PARALLEL, request.cluster.world_size)
        powers = (2**i for i in range(0, 7))
        return [cp for cp in powers if cp <= limit and not pin_problems(request, "cp", cp)]
    return sorted(set(pinned))


MAX_PIPELINE_PARALLEL = 16
"""The largest pipeline-parallel degree searched unpinned (torchtitan's 405B runs use 8 and 16)."""
INTERLEAVED_STAGES_PER_RANK = (2, 4)
"""Stages per rank the search tries for interleaved 1F1B (more cut the bubble further but add
sends and activations in flight)."""
SCHEDULE_PREFERENCE = ("ZBVZeroBubble", "Interleaved1F1B", "1F1B")
"""The order schedules are tried in: the search prices the first allowed one across the whole
space, and the others as variants of each pipeline family's best (`schedule_variants`). Zero-bubble
V comes first: it has the smallest bubble and holds no more activations than 1F1B (its weight
gradients fill the waits), at twice 1F1B's sends."""


def _pipelined_blocks(request: PlanRequest) -> int | None:
    """The blocks a pipeline splits into stages (None: the runtime cannot split this model)."""
    if request.model.architecture == "layer_graph":
        return None
    return request.model.num_layers


def pipeline_parallel_degrees(request: PlanRequest) -> list[int]:
    """The pipeline-parallel degrees to search: the request's pins, else (clusters of several nodes,
    the runtime's own models) every power of two up to MAX_PIPELINE_PARALLEL that divides the nodes,
    so that each stage is whole nodes and only the stages' sends cross between them.

    Raises PlanningError for a pinned degree the model or cluster cannot take, saying why.
    """
    pinned = check_pins(request, "pp")
    blocks = _pipelined_blocks(request)
    nodes, world = request.cluster.num_nodes, request.cluster.world_size
    if pinned is None:
        if blocks is None or nodes == 1:
            return [1]
        limit = min(MAX_PIPELINE_PARALLEL, nodes, blocks)
        return [pp for pp in (2**i for i in range(0, 5)) if pp <= limit and nodes % pp == 0]
    field = "search.pipeline_parallel_degrees"
    for pp in pinned:
        if pp == 1:
            continue
        if world % pp:
            raise PlanningError(
                f"{field}: pp={pp}: {pp} stages do not divide the cluster's {world} GPUs evenly; pick a "
                "divisor of it", field=field,
            )
        assert blocks is not None
        _check_schedules(request, pp, blocks)
    return sorted(set(pinned))


def _check_schedules(request: PlanRequest, pp: int, blocks: int) -> None:
    """Refuse a pinned pipeline degree none of the allowed schedules can run (too few blocks for
    their stages, or only eager schedules where only compiled plans are searched)."""
    field = "search.pipeline_schedules"
    schedules = request.search.pipeline_schedules
    if not any(pp * min(_STAGES_PER_RANK[s]) <= blocks for s in schedules):
        raise PlanningError(
            f"{field}: pp={pp} with {', '.join(schedules)} needs at least "
            f"{pp * min(min(_STAGES_PER_RANK[s]) for s in schedules)} stages of a block each, "
            f"the model has {blocks} blocks; allow 1F1B (one stage per rank) or pin a smaller pp",
            field=field,
        )
    if request.search.compile == [True] and all(s in EAGER_ONLY_SCHEDULES for s in schedules):
        raise PlanningError(
            f"{field}: {', '.join(schedules)} runs only stages that are not compiled, and "
            "search.compile allows compiled plans only; allow 1F1B or Interleaved1F1B, or eager plans",
            field=field,
        )


_STAGES_PER_RANK: dict[str, tuple[int, ...]] = {
    "1F1B": (1,), "ZBVZeroBubble": (2,), "Interleaved1F1B": INTERLEAVED_STAGES_PER_RANK,
}
"""The stages per rank the search tries for each schedule."""


def searched_degrees(axis: Callable[[PlanRequest], list[int]], request: PlanRequest) -> list[int]:
    """The degrees `axis` (`pipeline_parallel_degrees`, ...) searches for `request`, or `[1]` where it
    refuses the request's pin: planning itself names that error, the batch and cluster advice only
    needs the degrees that can run."""
    try:
        return axis(request)
    except PlanningError:
        return [1]


SEARCH_DEGREES: dict[str, Callable[[PlanRequest], list[int]]] = {
    degrees.__name__: degrees
    for degrees in (
        tensor_parallel_degrees, context_parallel_degrees, expert_parallel_degrees, pipeline_parallel_degrees
    )
}
"""The functions choosing each searched axis's degrees (its physics: what is worth trying), by the
search field the registry names for the axis (`Axis.search_field`)."""


def degree_search(entry: Axis) -> Callable[[PlanRequest], list[int]]:
    """The function choosing the degrees the search tries on a searched axis: the one named as the
    axis's search field (`tensor_parallel_degrees`)."""
    return SEARCH_DEGREES[entry.search_field or ""]


def model_parallel_meshes(degrees: Callable[[Axis], list[int]]) -> Iterator[Mesh]:
    """Every mesh of one data-parallel rank (its data-parallel axes at 1): each combination of the
    degrees `degrees` gives each model-parallel axis (`MODEL_PARALLEL_AXES`, outermost first)."""
    axes = [axis(name) for name in MODEL_PARALLEL_AXES]
    for chosen in itertools.product(*(degrees(entry) for entry in axes)):
        yield Mesh(**dict(zip(MODEL_PARALLEL_AXES, chosen, strict=True)))


def splitting_meshes(request: PlanRequest) -> list[Mesh]:
    """The model-parallel meshes (pp, cp, tp; data-parallel axes at 1) of the searched degrees whose
    data-parallel ranks (world / model_parallel) split the global batch evenly, whose sequence splits
    into its `sequence_pieces`, and whose per-rank batch fills the pipeline (at least pp sequences);
    pipelines with context parallelism are searched together (the runtime runs cp inside each stage);
    a pin the model cannot take counts as 1 here: planning names that error."""
    world, sequences = request.cluster.world_size, request.training.global_batch_sequences
    seq_len = request.training.seq_len
    meshes = []
    for parallel in model_parallel_meshes(lambda entry: searched_degrees(degree_search(entry), request)):
        ranks = parallel.model_parallel
        if world % ranks or sequences % (world // ranks):
            continue
        if seq_len % parallel.sequence_pieces == 0 and sequences // (world // ranks) >= parallel.pp:
            meshes.append(parallel)
    return meshes


def splitting_degrees(request: PlanRequest) -> list[int]:
    """The searched tensor-parallel degrees that split the batch with some pp and cp degree."""
    return sorted({parallel.tp for parallel in splitting_meshes(request)})


def pipeline_configs(
    request: PlanRequest, costs: tuple[float, float], *, pp: int, micro_batches: int, compile_: bool
) -> list[PipelineConfig]:
    """The schedules and stage splits searched for `pp` stages running `micro_batches` micro-batches,
    in SCHEDULE_PREFERENCE order: each allowed schedule (interleaved 1F1B with each of
    INTERLEAVED_STAGES_PER_RANK), where the model has a block per stage and the schedule can run
    that many micro-batches, the blocks split so the stages take equal time (`costs`: the
    embeddings' and the head's time, in blocks: `stage_costs`)."""
    blocks = _pipelined_blocks(request)
    assert blocks is not None
    if micro_batches < pp:
        return []  # the pipeline would not fill: every schedule needs a micro-batch per stage
    configs = []
    allowed = set(request.search.pipeline_schedules)
    for schedule in (s for s in SCHEDULE_PREFERENCE if s in allowed):
        if compile_ and schedule in EAGER_ONLY_SCHEDULES:
            continue
        for v in _STAGES_PER_RANK[schedule]:
            if pp * v > blocks or (v > 1 and micro_batches % pp):
                continue
            configs.append(balanced_pipeline(blocks, costs, schedule=schedule, stages_per_rank=v, pp=pp))
    return configs


def balanced_pipeline(
    blocks: int, costs: tuple[float, float], *, schedule: PipelineSchedule, stages_per_rank: int, pp: int
) -> PipelineConfig:
    """A schedule's pipeline with `blocks` split so its stages take equal time (`costs`: the
    embeddings' and the head's time, in blocks: `stage_costs`)."""
    first_extra, last_extra = costs
    split = balanced_stage_split(blocks, pp * stages_per_rank, first_extra=first_extra, last_extra=last_extra)
    return PipelineConfig(schedule=schedule, stages_per_rank=stages_per_rank, stage_blocks=split)


def check_mesh(request: PlanRequest, sharding: str, mesh: Mesh) -> None:
    """Refuse a mesh the cluster, the sharding or the model cannot take (a given configuration)."""
    world = request.cluster.world_size
    problem = None
    if mesh.world_size != world:
        problem = (
            f"pp x dp_replicate x dp_shard x cp x tp = {mesh.world_size} must equal the cluster's "
            f"{world} GPUs"
        )
    elif sharding in ("full_shard", "shard_grad_op") and mesh.dp_replicate != 1:
        problem = f"{sharding} shards over every data-parallel rank: dp_replicate must be 1"
    elif sharding == "no_shard" and mesh.dp_shard != 1:
        problem = "no_shard replicates: dp_shard must be 1"
    if problem:
        raise PlanningError(f"config.mesh: {problem}", field="config")
    model, training, gpus_per_node = request.model, request.training, request.cluster.scaleup_gpus
    node_gpus = request.cluster.gpus_per_node
    for problem in mesh_problems(mesh, model, training, gpus_per_node=gpus_per_node, node_gpus=node_gpus):
        if problem.startswith("config.mesh."):  # the sequence's own limit is the pre-check's
            raise PlanningError(problem, field="config")


def check_pipeline(request: PlanRequest, config: ParallelConfig) -> None:
    """Refuse a given configuration's pipeline that the model cannot take (every block placed once,
    a model the runtime can split)."""
    if config.pipeline is None:
        return
    blocks = _pipelined_blocks(request)
    if blocks is None:
        raise PlanningError(
            "config.pipeline: a traced layer graph has no runtime model to split into stages; price it "
            "with mesh.pp 1", field="config.pipeline",
        )
    try:
        config.pipeline.check(pp=config.mesh.pp, grad_accum_steps=config.grad_accum_steps, num_layers=blocks)
    except PipelineError as exc:
        raise PlanningError(f"config.{exc}", field="config.pipeline") from None


def data_parallel_meshes(request: PlanRequest, parallel: Mesh) -> Iterator[tuple[str, Mesh]]:
    """(sharding, mesh) for every allowed sharding of the dp = world / model_parallel data-parallel
    ranks around the model-parallel mesh `parallel` (FSDP shards over dp_shard x cp: the cp ranks hold
    the same parameters), each with every searched expert-parallel degree that divides its shard group
    (the ep ranks are carved out of it)."""
    dp = request.cluster.world_size // parallel.model_parallel
    experts = searched_degrees(expert_parallel_degrees, request)
    for sharding in request.search.shardings:
        if dp * parallel.fsdp_shards == 1 and sharding != "no_shard":
            continue  # one rank per model replica has nothing to shard over
        if sharding == "hybrid_shard":
            meshes = [
                replace(parallel, dp_replicate=dp // s, dp_shard=s)
                for s in hybrid_shard_sizes(dp, request.cluster.scaleup_gpus, tp=parallel.sequence_ranks)
            ]
        elif sharding == "no_shard":
            meshes = [replace(parallel, dp_replicate=dp)]
        else:
            meshes = [replace(parallel, dp_shard=dp)]
        for mesh in meshes:
            for ep in mesh_expert_degrees(request, mesh, experts):
                yield sharding, mesh if ep == 1 else replace(mesh, ep=ep)


def mesh_expert_degrees(request: PlanRequest, mesh: Mesh, degrees: list[int]) -> list[int]:
    """Of the searched expert-parallel `degrees`, those `mesh` can carve out of its shard group
    (dividing dp_shard x cp). Pinned, every one; unpinned, 1 and the largest on each link: the
    largest whose ep x tp ranks fit in a node (all-to-all over NVLink) and the largest of all.
    On one link a larger ep sends only (ep - 1) / ep of the same bytes per rank, while it divides
    the experts' gathered parameters, their FSDP traffic and their GEMMs' padding by ep: the
    largest dominates the smaller ones (and searching each would price the space several times)."""
    fit = [ep for ep in degrees if mesh.fsdp_shards % ep == 0]
    if request.search.expert_parallel_degrees is not None or len(fit) <= 1:
        return fit
    domain = request.cluster.scaleup_gpus
    node = [ep for ep in fit if replace(mesh, ep=ep).expert_link(domain) == "intra"]
    return sorted({1, max(node, default=1), max(fit)})


def float8_recipes(request: PlanRequest) -> list[str]:
    """The Float8 recipes the search tries (`search.float8`, `none` alone by default); refused, with
    why, where the GPU, the precision or the model cannot take one."""
    recipes = list(dict.fromkeys(request.search.float8 or ["none"]))
    for recipe in recipes:
        check_float8(request, recipe, field="search.float8")
    return recipes


def check_float8(request: PlanRequest, recipe: str, *, field: str) -> None:
    """Refuse a Float8 recipe this request cannot train with (PlanningError naming `field`)."""
    if recipe == "none":
        return
    gpu = request.cluster.resolved_gpu()
    problem = None
    if gpu.peak_fp8_tflops is None:
        problem = (f"the {gpu.name} has no float8 tensor cores (H100, H200, L40S, Blackwell and AMD "
                   "Instinct GPUs have); "
                   "plan it without Float8")
    elif recipe == "mxfp8" and not gpu.mx_formats:
        problem = (f"needs MX tensor cores (Blackwell: {MX_GPUS}), the {gpu.name} has "
                   "none; use tensorwise or rowwise")
    elif request.training.precision != "bf16":
        problem = "Float8 training needs bf16 as the compute precision; set training.precision to bf16"
    elif request.model.architecture == "layer_graph":
        problem = ("a traced layer graph does not say which modules are linear layers; Float8 is "
                   "priced for the llama and gpt2 architectures")
    if problem:
        raise PlanningError(f"{field}: {recipe}: {problem}", field=field)


def check_async_tp(request: PlanRequest, *, field: str) -> None:
    """Refuse asynchronous tensor parallelism where it cannot run (PlanningError naming `field`)."""
    gpu = request.cluster.resolved_gpu()
    if gpu.is_cpu:
        raise PlanningError(
            f"{field}: async TP needs CUDA symmetric memory between the GPUs of a node; the cpu "
            "device has none: plan without it", field=field,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """The configurations of one sharding on one mesh and compile mode (the enumeration's outer
    axes), its inner axes as lists: a search can build the few members that tell whether any can
    fit (`lightest`) before it builds them all (`choices`), and most families of a large cluster
    cannot."""

    sharding: str
    mesh: Mesh
    compile: bool
    units: tuple[int, ...]
    """Blocks per FSDP2 wrap unit (1 alone where nothing is gathered per unit, or compiled)."""
    caps: tuple[tuple[float, float], ...]
    """(all-gather, reduce-scatter) bucket caps in MB."""
    checkpointing: tuple[tuple[str, int], ...]
    """(mode, every_k) policies."""
    pipelines: Mapping[int, PipelineConfig | None]
    """The micro-batch sizes, in increasing order, each with its pipeline (None without one)."""
    recipes: tuple[str, ...]
    """The Float8 recipes searched (`none` for bf16)."""
    loss_chunks: Mapping[int, int]
    """The loss's slices per micro-batch size."""
    local_batch: int
    """Sequences per data-parallel rank and step."""
    async_tp: bool
    """Whether the family's tensor-parallel collectives run micro-pipelined (compiled, tp > 1)."""
    reduce_dtype: str = "float32"
    """The gradients' reduction dtype (`Setting.reduce_dtype`: bf16 in pure bf16 training)."""

    def choices(
        self,
        *,
        checkpointing: Sequence[tuple[str, int]] | None = None,
        micro_batches: Sequence[int] | None = None,
    ) -> list[Choice]:
        """Every member in the enumeration's order (only the given policies or micro-batch sizes)."""
        policies = self.checkpointing if checkpointing is None else checkpointing
        sizes = list(self.pipelines) if micro_batches is None else micro_batches
        return [
            self.choice(unit, caps, policy, mb, recipe)
            for unit in self.units
            for caps in self.caps
            for policy in policies
            for mb, recipe in itertools.product(sizes, self.recipes)
        ]

    def choice(
        self, unit: int, caps: tuple[float, float], policy: tuple[str, int], mb: int, recipe: str
    ) -> Choice:
        """The member with these inner axes (policy: (mode, every_k); mb: micro-batch size)."""
        return Choice(
            sharding=self.sharding,
            mesh=self.mesh,
            blocks_per_unit=unit,
            all_gather_bucket_mb=caps[0],
            reduce_scatter_bucket_mb=caps[1],
            checkpointing=policy[0],
            every_k=policy[1],
            micro_batch_size=mb,
            grad_accum_steps=self.local_batch // mb,
            compile=self.compile,
            loss_chunks=self.loss_chunks[mb],
            float8=recipe,
            async_tp=self.async_tp,
            pipeline=self.pipelines[mb],
            reduce_dtype=self.reduce_dtype,
        )

    def first(self) -> Choice:
        """The family's first member."""
        mb = next(iter(self.pipelines))
        return self.choice(self.units[0], self.caps[0], self.checkpointing[0], mb, self.recipes[0])

    def lightest(self, layers: int) -> list[Choice]:
        """Of each checkpointing policy, the members that hold the least: the smallest micro-batch
        (and the single micro-batch per step, which holds no accumulated gradients), the smallest
        unit and bucket caps (the first such in the enumeration's order) and the first recipe;
        ordered by `policy_keeps` of a model of `layers` blocks (the policies from the one that keeps
        the fewest activations), then by micro-batch."""
        smallest = min(self.pipelines)
        sizes = [mb for mb in self.pipelines if mb == smallest or self.local_batch // mb == 1]
        unit, caps = min(itertools.product(self.units, self.caps), key=lambda uc: (uc[0], sum(uc[1])))
        probes = sorted(
            ((policy_keeps(policy, layers), mb, policy) for policy in self.checkpointing for mb in sizes),
            key=lambda t: t[:2],
        )
        return [self.choice(unit, caps, policy, mb, self.recipes[0]) for _, mb, policy in probes]


def enumerate_choices(request: PlanRequest, setting: Setting) -> Iterator[Choice]:
    """Every configuration the request allows that the runtime executes differently, in a fixed
    order (`enumerate_families`' members, family by family)."""
    for family in enumerate_families(request, setting):
        yield from family.choices()


def _layers(request: PlanRequest) -> int:
    """The blocks that wrap units and checkpointing policies group (a layer graph's block units)."""
    if request.model.architecture == "layer_graph":
        return max(1, sum(1 for u in request.model.layer_graph or [] if u.is_block))
    return request.model.num_layers


def wrap_units(request: PlanRequest) -> tuple[int, ...]:
    """The blocks per FSDP2 wrap unit searched (those the model has)."""
    return tuple(k for k in BLOCKS_PER_UNIT if k <= _layers(request))


def checkpointing_policies(request: PlanRequest) -> tuple[tuple[str, int], ...]:
    """The (mode, every_k) checkpointing policies searched: each allowed mode, selective checkpointing
    once per SELECTIVE_EVERY_K the model has blocks for, and `blocks` (its every_k the number of
    first blocks recomputed, `Choice.every_k`) once per CHECKPOINT_BLOCK_SHARES of them."""
    layers = _layers(request)
    policies: list[tuple[str, int]] = []
    for mode in request.search.checkpointing:
        if mode == "selective":
            policies += [(mode, k) for k in SELECTIVE_EVERY_K if k <= layers]
        elif mode == "blocks":
            counts = sorted({max(1, round(share * layers)) for share in CHECKPOINT_BLOCK_SHARES})
            policies += [(mode, n) for n in counts if n < layers]
        else:
            policies.append((mode, 1))
    return tuple(policies)


def policy_keeps(policy: tuple[str, int], layers: int) -> tuple[int, float]:
    """Sort key of a (mode, every_k) checkpointing policy on a model of `layers` blocks, from the one
    that keeps the fewest activations to the one that keeps them all: every block recomputed, then
    op-level, then whole blocks by the share left whole (every k-th, or the first n), then none."""
    mode, k = policy
    if mode == "selective":
        return 2, 1.0 - 1.0 / k
    if mode == "blocks":
        return 2, 1.0 - k / max(layers, 1)
    return {"full": 0, "op_selective": 1}.get(mode, 3), 0.0


MAX_SEARCH_SPACE = 2_000_000
"""The most configurations one request's enumeration may hold (`space_size`): a request past it is
refused before anything is priced. Every request that searches the default space on any cluster a
request may name stays under it; pinning many degrees at once on a very large cluster can pass it."""


def space_size(request: PlanRequest, *, limit: int | None = None) -> int:
    """How many configurations `enumerate_choices` can yield for `request`, counted from the axes
    without building or pricing any (each micro-batch counted whether or not a pipeline schedule runs
    it, so a bound; a pipeline family's other schedules are priced beside its best one only).
    Counting stops once past `limit` (the count then is some number over it)."""
    search = request.search
    units, policies = len(wrap_units(request)), len(checkpointing_policies(request))
    recipes = len(set(search.float8 or ["none"]))
    total = 0
    for parallel in splitting_meshes(request):
        dp = request.cluster.world_size // parallel.model_parallel
        micro_batches = len(micro_batch_sizes(request.training.global_batch_sequences // dp,
                                              search.max_micro_batch_size))
        for sharding, mesh in data_parallel_meshes(request, parallel):
            gathers = sharding != "no_shard" and mesh.dp > 1
            for compile_ in search.compile:
                members_units = units if mesh.dp > 1 and not compile_ else 1
                caps = len(BUCKET_CAPS_MB) ** 2 if compile_ and gathers else 1
                total += members_units * caps * policies * micro_batches * recipes
        if limit is not None and total > limit:
            break
    return total


def check_space(request: PlanRequest, *, limit: int = MAX_SEARCH_SPACE) -> None:
    """Refuse (PlanningError) a request whose enumeration holds more than `limit` configurations,
    before any is priced, saying which lists make it large."""
    size = space_size(request, limit=limit)
    if size <= limit:
        return
    raise SearchSpaceError(
        f"search: this request's search space holds more than {limit:,} configurations (at least "
        f"{size:,} counted), more than one request may price; narrow it: fewer pinned degrees "
        f"({', '.join(f'search.{entry.search_field}' for entry in searched_axes())}), Float8 recipes, "
        "shardings or checkpointing modes, or a smaller search.max_micro_batch_size",
        configurations=size, limit=limit,
    )


def enumerate_families(request: PlanRequest, setting: Setting) -> Iterator[Family]:
    """Every family of configurations the request allows, in a fixed order (none without members).
    Wrap units matter only to eager FSDP2 with something to gather: compiled SimpleFSDP never
    groups parameters by unit (inductor buckets them by the caps)."""
    search = request.search
    units = wrap_units(request)
    checkpointing = checkpointing_policies(request)
    tensor_parallel_degrees(request)  # a pin the model cannot take is refused here, with why
    recipes = tuple(float8_recipes(request))
    if search.async_tp:
        check_async_tp(request, field="search.async_tp")
    context_parallel_degrees(request)  # a cp pin the model cannot take is refused here, with why
    expert_parallel_degrees(request)  # an ep pin
    pipeline_parallel_degrees(request)  # and a pp pin
    if not checkpointing:
        return
    staged_checkpointing = tuple(policy for policy in checkpointing if policy[0] != "blocks")
    costs = stage_costs(setting)
    all_caps = tuple((a, r) for a in BUCKET_CAPS_MB for r in BUCKET_CAPS_MB)
    for parallel in splitting_meshes(request):
        pp = parallel.pp
        if pp > 1 and not staged_checkpointing:
            continue
        dp = request.cluster.world_size // parallel.model_parallel
        local_batch = request.training.global_batch_sequences // dp
        micro_batches = micro_batch_sizes(local_batch, search.max_micro_batch_size)
        # Per compile mode, the pipeline (the preferred schedule: schedule_variants tries the rest)
        # of each micro-batch; the schedule's micro-batches are the accumulation steps.
        pipelines: dict[bool, dict[int, PipelineConfig | None]] = {
            compile_: dict.fromkeys(micro_batches) for compile_ in search.compile
        }
        if pp > 1:
            pipelines = {
                compile_: {
                    mb: configs[0] for mb in micro_batches
                    if (configs := pipeline_configs(
                        request, costs, pp=pp, micro_batches=local_batch // mb, compile_=compile_
                    ))
                }
                for compile_ in search.compile
            }
        vocab_share = setting.model.vocab_size // parallel.tp
        chunks = {
            mb: loss_chunks_for(mb * setting.seq_len // parallel.cp, vocab_share, setting.act_bytes)
            for mb in micro_batches
        }
        for sharding, mesh in data_parallel_meshes(request, parallel):
            gathers = sharding != "no_shard" and mesh.dp > 1
            for compile_ in search.compile:
                if not pipelines[compile_]:
                    continue
                yield Family(
                    sharding=sharding,
                    mesh=mesh,
                    compile=compile_,
                    units=units if mesh.dp > 1 and not compile_ else (1,),
                    # Without gathers, DDP-style buckets are fixed.
                    caps=all_caps if compile_ and gathers else ((0.0, 0.0),),
                    # The first n blocks of the model are not the first of each stage: no pipeline.
                    checkpointing=checkpointing if pp == 1 else staged_checkpointing,
                    pipelines=pipelines[compile_],
                    recipes=recipes,
                    loss_chunks=chunks,
                    local_batch=local_batch,
                    async_tp=search.async_tp and compile_ and parallel.tp > 1,
                    reduce_dtype=setting.reduce_dtype,
                )


def stage_costs(setting: Setting) -> tuple[float, float]:
    """The embeddings' and the head's (with the loss) training time, in blocks: what the first and
    the last pipeline stage do besides their blocks."""
    m = setting.model
    tokens = setting.seq_len

    def step(unit: UnitCost) -> float:
        return block_step_time(
            setting.params, unit, tokens=tokens, seq_len=m.seq_len, act_bytes=setting.act_bytes,
            checkpointing="none", compile_=True,
        )

    kinds = {id(b): b for b in m.blocks}  # one object per kind of block (dense, MoE)
    if len(kinds) > 1:
        # A model with blocks of two kinds (leading dense blocks, interleaved MoE ones): their mean.
        counts = Counter(id(b) for b in m.blocks)
        block = sum(step(b) * counts[key] for key, b in kinds.items()) / len(m.blocks)
    else:
        block = step(m.blocks[0]) if m.blocks else 0.0
    if not block:
        return 0.0, 0.0
    return step(m.embedding) / block, step(m.head) / block


def schedule_variants(request: PlanRequest, setting: Setting, choice: Choice) -> list[Choice]:
    """The choice with each other allowed schedule (and stage split) for its pipeline degree and
    micro-batches: what the search prices beside a pipeline family's best (the enumeration yields
    the preferred schedule only)."""
    if choice.pipeline is None:
        return []
    configs = pipeline_configs(
        request, stage_costs(setting), pp=choice.mesh.pp, micro_batches=choice.grad_accum_steps,
        compile_=choice.compile,
    )
    return [replace(choice, pipeline=config) for config in configs if config != choice.pipeline]
