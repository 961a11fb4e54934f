"""What fits where: the one source of advice on what to change so that a request plans.

`advise` answers for every caller (the search's pre-check for a batch that does not split, the
infeasibility diagnosis when nothing fits, the dashboard form's hint): batches that round the
requested one on its cluster, nearest first, or, when none plans there, the smallest cluster of the
same nodes on which one does (and the one that keeps the batch unchanged). A batch rounds the
request when it is the nearest multiple, below or above, of the data-parallel ranks (world / tp) of
a searched tensor-parallel degree: a batch need split over data-parallel ranks only. Every
suggestion is checked by the same test the search applies, over the same configurations it
enumerates (`Prober`), so the advice and the search cannot disagree, and no nearer rounding, nor
smaller cluster, plans. The diagnosis also names the memory term that really dominates, because
that decides what helps: sharded states shrink with more GPUs, activations of one sequence do not.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from contract.mesh import MODEL_PARALLEL_AXES, SEQUENCE_AXES, Axis, Mesh, axis
from planner.bounds import MAX_GLOBAL_BATCH_TOKENS
from planner.cost.estimate import Estimator
from planner.cost.memory import MemoryEstimate, MemoryLimits, fits_in_memory
from planner.cost.parameters import GIB
from planner.cost.setting import Choice, Setting
from planner.deadline import CpuDeadline
from planner.document import to_parallel_config
from planner.enumeration import (
    CONTEXT_PARALLEL_FROM_SEQ_LEN,
    MAX_CONTEXT_PARALLEL,
    context_parallel_degrees,
    degree_search,
    enumerate_families,
    expert_parallel_degrees,
    model_parallel_meshes,
    pin_problems,
    pipeline_parallel_degrees,
    searched_degrees,
    splitting_degrees,
    tensor_parallel_degrees,
)
from planner.errors import InfeasiblePlanError, SearchDeadlineError
from planner.specs import PlanRequest

MAX_NODES_TRIED = 4096
"""The advice looks for a fitting cluster up to this many nodes."""

DOMINANT_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "states": ("parameters, gradients and optimizer state", ("params", "grads", "optimizer")),
    "activations": ("activations and the loss", ("activations", "logits")),
    "gathered": ("gathered parameters and gradient buffers", ("unsharded_params", "grad_buffers")),
    "overhead": ("workspace and allocator reserve", ("workspace", "allocator_reserve")),
}
"""MEMORY_TERMS grouped by what changes them: sharded states shrink as more GPUs share them; the
activations of one micro-batch do not; gathered buffers follow the wrap unit and buckets."""


@dataclass(frozen=True, slots=True)
class Dominant:
    """The group of memory terms holding most of a peak."""

    group: str
    label: str
    gib: float
    share: float


def dominant_term(memory: MemoryEstimate) -> Dominant:
    """Which group of terms holds most of `memory` (ties: the first in DOMINANT_GROUPS)."""
    terms = memory.terms()
    total = memory.total or 1.0
    group, (label, names) = max(DOMINANT_GROUPS.items(), key=lambda kv: sum(terms[n] for n in kv[1][1]))
    held = sum(terms[n] for n in names)
    return Dominant(group=group, label=label, gib=held / GIB, share=held / total)


@dataclass(frozen=True, slots=True)
class Probe:
    """The lightest configuration found for one cluster size and batch, and whether one fits."""

    num_nodes: int
    global_batch_sequences: int
    choice: Choice
    memory: MemoryEstimate
    fits: bool


class Prober:
    """Prices the request's own search space on other cluster sizes and batches, memoized.

    Peak memory depends on the cluster only through each configuration's shard group (the cost
    parameters that differ between node counts are link speeds, which only timing reads), so one
    estimator of the request's fitted setting prices every probe and shares its layouts.

    With a `deadline`, a probe past it raises SearchDeadlineError: advice is priced within the
    caller's limit per plan, like the search it advises on.
    """

    def __init__(
        self, request: PlanRequest, setting: Setting, *, deadline: CpuDeadline | None = None
    ) -> None:
        self.request = request
        self.setting = setting
        self.deadline = deadline
        self.priced = 0
        """Configurations priced so far (what a deadline error reports)."""
        self.limits = MemoryLimits(setting.params, request.search.memory_headroom)
        self.ceiling_gib = request.search.max_peak_memory_gib
        self._estimator = Estimator(setting)
        self._cache: dict[tuple[int, int, bool], Probe] = {}
        self._keys: dict[Choice, tuple[int, ...]] = {}

    def at(self, num_nodes: int, sequences: int, *, lightest: bool = False) -> Probe:
        """Probe `num_nodes` nodes with a global batch of `sequences`: the first fitting
        configuration in search order, or (with `lightest`, or when none fits) the lightest."""
        for key in ((num_nodes, sequences, True), (num_nodes, sequences, lightest)):
            if key in self._cache:
                return self._cache[key]
        self._check_deadline()
        request = self.variant(num_nodes, sequences)
        assert splitting_degrees(request), "probe only batches that split"
        setting = replace(
            self.setting,
            world_size=request.cluster.world_size,
            num_nodes=num_nodes,
            global_batch_sequences=sequences,
        )
        families = enumerate_families(request, setting)
        first_family = next(families)
        first = first_family.first()
        if not lightest and not self._states_may_fit(first, request.cluster.world_size):
            probe = Probe(num_nodes, sequences, first, self._estimator.memory(first), False)
            self._cache[(num_nodes, sequences, lightest)] = probe
            return probe
        best: tuple[Choice, MemoryEstimate] | None = None
        found = False
        sharded: set[tuple] = set()  # fully sharded configurations priced, by everything else

        def candidates() -> Iterator[Choice]:
            # A family whose parameters and optimizer states alone hold more than the lightest
            # configuration so far can neither fit (nothing fitted yet) nor be lighter: not built.
            # (Its configurations' other shardings hold at least as much: passed over as well.)
            for family in itertools.chain([first_family], families):
                if best is None or self._estimator.states_gib(family.first()) * GIB <= best[1].total + 1:
                    yield from family.choices()

        for choice in candidates():
            key = _all_but_sharding(choice)
            if choice.sharding == "full_shard":
                sharded.add(key)
            elif key in sharded:
                continue  # never lighter than its fully sharded twin (tests/planner/test_advice.py)
            self._check_deadline()
            self.priced += 1
            memory = self._estimator.memory(choice)
            if self._fits(memory, choice) and not lightest:
                best, found = (choice, memory), True
                break
            if best is None or (
                self._lighter(choice, memory, best) if lightest else memory.total < best[1].total
            ):
                best = (choice, memory)
        assert best is not None, "every request enumerates at least one configuration"
        found = found or self._fits(best[1], best[0])
        probe = Probe(num_nodes, sequences, best[0], best[1], found)
        self._cache[(num_nodes, sequences, lightest)] = probe
        return probe

    def _check_deadline(self) -> None:
        if self.deadline is not None and self.deadline.passed():
            raise SearchDeadlineError(
                f"advice: stopped after {self.deadline.limit_s:g} s of CPU time, the limit per plan, with "
                f"{self.priced} configurations priced",
                time_limit_s=self.deadline.limit_s,
                candidates_priced=self.priced,
            )

    def _fits(self, memory: MemoryEstimate, choice: Choice) -> bool:
        return fits_in_memory(memory, limit_gib=self.limits(choice.mesh), ceiling_gib=self.ceiling_gib)

    def _lighter(self, choice: Choice, memory: MemoryEstimate, than: tuple[Choice, MemoryEstimate]) -> bool:
        if round(memory.total) != round(than[1].total):
            return memory.total < than[1].total
        # Equal peaks (the optimizer step often sets them): the one whose other moments are
        # lighter, so that the configuration named is also the lightest through the step.
        return self._moments_key(choice) < self._moments_key(than[0])

    def _moments_key(self, choice: Choice) -> tuple[int, ...]:
        # Memoized: at a small cluster thousands of configurations tie with the one kept.
        if choice not in self._keys:
            moments = self._estimator.moments(choice)
            self._keys[choice] = tuple(sorted((round(m.total) for m in moments), reverse=True))
        return self._keys[choice]

    def _states_may_fit(self, choice: Choice, world: int) -> bool:
        """A lower bound that skips hopeless probes: every configuration's peak is at least its
        optimizer step (parameters, gradients, optimizer states and the update's temporaries),
        which no configuration holds in less than fully sharded over the whole world (a pipeline
        shards its stages' states over the rest of the world: no less per rank)."""
        sharded = replace(choice, sharding="full_shard", mesh=Mesh(dp_shard=world), pipeline=None)
        step = next(m for m in self._estimator.moments(sharded) if m.moment == "optimizer step")
        return self._fits(step, sharded)

    def variant(self, num_nodes: int, sequences: int) -> PlanRequest:
        """The request on `num_nodes` nodes of the same kind with a global batch of `sequences`."""
        r = self.request
        # model_copy skips validation: the batch splits over the new cluster by construction.
        return r.model_copy(
            update={
                "cluster": r.cluster.model_copy(update={"num_nodes": num_nodes}),
                "training": r.training.model_copy(
                    update={"global_batch_tokens": sequences * r.training.seq_len}
                ),
            }
        )


def _all_but_sharding(c: Choice) -> tuple:
    # A tuple rather than dataclasses.replace: a probe compares thousands of configurations.
    return (
        *(c.mesh.degree(name) for name in MODEL_PARALLEL_AXES),
        c.pipeline,
        c.float8,
        c.async_tp,
        c.blocks_per_unit,
        c.all_gather_bucket_mb,
        c.reduce_scatter_bucket_mb,
        c.checkpointing,
        c.every_k,
        c.micro_batch_size,
        c.grad_accum_steps,
        c.compile,
        c.prefetch_depth,
        c.loss_chunks,
    )


def roundings(request: PlanRequest, num_nodes: int, tokens: int) -> list[int]:
    """The global batches (sequences) that round `tokens` to a whole split on `num_nodes` nodes of the
    request's kind, nearest first (a tie goes to the smaller): for each searched tensor-parallel
    degree (and context-parallel one), the multiples of its data-parallel ranks (world / (tp x cp)) just
    below and just above, or
    `tokens` itself where it splits. Batches beyond the request's bound are left out."""
    seq_len = request.training.seq_len
    world = num_nodes * request.cluster.gpus_per_node
    cluster = request.cluster.model_copy(update={"num_nodes": num_nodes})
    there = request.model_copy(update={"cluster": cluster})
    batches: set[int] = set()

    def degrees(entry: Axis) -> list[int]:
        # The pipeline's stages are laid over the nodes: its degrees are those of the cluster tried.
        return searched_degrees(degree_search(entry), there if entry.fixed_layout else request)

    for parallel in model_parallel_meshes(degrees):
        if world % parallel.model_parallel:
            continue
        # A batch giving each data-parallel rank a sequence.
        unit = world // parallel.model_parallel * seq_len
        below = tokens // unit * unit
        nearest = (below,) if below == tokens else (below, below + unit)
        # A pipeline needs a sequence per stage on every data-parallel rank.
        batches |= {max(b, parallel.pp * unit) // seq_len for b in nearest if b > 0}
    fitting = (b for b in batches if b * seq_len <= MAX_GLOBAL_BATCH_TOKENS)
    return sorted(fitting, key=lambda b: (abs(b * seq_len - tokens), b))


def planning_batches(
    prober: Prober, num_nodes: int, tokens: int, *, first: bool = False
) -> tuple[Probe, ...]:
    """The roundings of `tokens` on `num_nodes` nodes that plan: the nearest, then the nearest on
    the other side of `tokens` (none when `tokens` itself plans, or with `first`). Every rounding
    nearer on the same side was probed and does not plan."""
    seq_len = prober.request.training.seq_len

    def side(batch: int) -> int:
        return (batch * seq_len > tokens) - (batch * seq_len < tokens)

    found: list[Probe] = []
    for batch in roundings(prober.request, num_nodes, tokens):
        if found and side(batch) == side(found[0].global_batch_sequences):
            continue  # farther than the one found on that side
        probe = prober.at(num_nodes, batch)
        if probe.fits:
            found.append(probe)
            if first or side(batch) == 0 or len(found) == 2:
                break
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Advice:
    """What to change so that a request plans, every suggestion planned with the search's own test."""

    tokens: int
    """The global batch asked for, in tokens (not necessarily whole sequences)."""
    batches: tuple[Probe, ...]
    """Roundings of `tokens` that plan, nearest first, all on one node count: the requested one when
    any plans there, else the smallest that plans one (`planning_batches`); empty when no cluster up
    to MAX_NODES_TRIED nodes does."""
    same_batch: Probe | None = None
    """When the batches change the batch asked for: the smallest cluster that plans it unchanged."""
    largest_tried: Probe | None = None
    """When nothing plans: the lightest configuration on the largest cluster tried."""


def advise(prober: Prober, tokens: int) -> Advice:
    """The one source of advice: the roundings of `tokens` nearest it that plan on the request's
    cluster, or, when none does, on the smallest cluster (same GPU and GPUs per node) where one
    does, with the smallest cluster that plans `tokens` unchanged. Each suggestion is a request that
    `make_plan` accepts (with the prober's setting); no nearer rounding, nor smaller cluster, plans."""
    request = prober.request
    nodes = request.cluster.num_nodes
    batches = planning_batches(prober, nodes, tokens)
    if not batches:
        found = _smallest_nodes(prober, tokens)
        if isinstance(found, Probe):
            return Advice(tokens=tokens, batches=(), largest_tried=found)
        nodes, batches = found, planning_batches(prober, found, tokens, first=True)
    same_batch = None
    if batches[0].global_batch_sequences * request.training.seq_len != tokens:
        same_batch = _smallest_keeping_batch(prober, tokens, at_least=nodes)
    return Advice(tokens=tokens, batches=batches, same_batch=same_batch)


def _smallest_nodes(prober: Prober, tokens: int) -> int | Probe:
    """Bisect node counts above the request's for the smallest on which a rounding of `tokens`
    plans; when none up to MAX_NODES_TRIED does, the lightest configuration on the largest tried.

    Fitting is monotone in the node count in all but rounding of the batch (sharded states shrink,
    one micro-batch's activations stay), so doubling then bisecting finds the boundary in a few
    dozen probes; every probe is the exact test the search would apply there.
    """
    request = prober.request

    def fits_at(nodes: int) -> bool:
        return bool(planning_batches(prober, nodes, tokens, first=True))

    low = request.cluster.num_nodes  # no rounding plans here: that is why we are here
    while True:
        high = min(low * 2, MAX_NODES_TRIED)
        # More nodes leave fewer roundings within the batch bound: past the last, none plans.
        if low >= MAX_NODES_TRIED or not roundings(request, high, tokens):
            return prober.at(low, roundings(request, low, tokens)[0], lightest=True)
        if fits_at(high):
            break
        low = high
    while high - low > 1:
        mid = (low + high) // 2
        if fits_at(mid):
            high = mid
        else:
            low = mid
    return high


def _smallest_keeping_batch(prober: Prober, tokens: int, *, at_least: int) -> Probe | None:
    """The smallest node count from `at_least` on over whose data-parallel ranks (for a searched
    tensor-parallel degree) the requested batch splits, and where it fits."""
    request = prober.request
    seq_len, gpn = request.training.seq_len, request.cluster.gpus_per_node
    if tokens % seq_len:
        return None
    sequences = tokens // seq_len
    degrees = tensor_parallel_degrees(request)
    most = min(MAX_NODES_TRIED, sequences * max(degrees) // gpn)  # at least one sequence per rank
    for nodes in range(at_least, most + 1):
        if any(sequences % (nodes * gpn // tp) == 0 for tp in degrees):
            probe = prober.at(nodes, sequences)
            if probe.fits:
                return probe
    return None


def cluster_name(request: PlanRequest, nodes: int) -> str:
    return request.cluster.text(num_nodes=nodes)


def _gpus(request: PlanRequest, nodes: int) -> str:
    return f"{nodes * request.cluster.gpus_per_node} GPUs"


def _sequences(n: int) -> str:
    return f"{n} sequence" if n == 1 else f"{n} sequences"


def suggested_batch(request: PlanRequest, probe: Probe) -> str:
    """`12 sequences = 98304 tokens (split over 4 data-parallel ranks at tp=2)`: a batch that plans,
    and the mesh of the first configuration found to fit it (the search may choose another)."""
    sequences = probe.global_batch_sequences
    return f"{_sequences(sequences)} = {sequences * request.training.seq_len} tokens ({_over_ranks(probe)})"


def _over_ranks(probe: Probe) -> str:
    mesh = probe.choice.mesh
    ranks = "1 data-parallel rank" if mesh.dp == 1 else f"{mesh.dp} data-parallel ranks"
    degrees = mesh.degrees_above_one()
    return f"split over {ranks}" + (f" at {degrees}" if degrees else "")


def infeasible_error(
    request: PlanRequest,
    setting: Setting,
    *,
    limit_gib: float,
    peak_gib: float,
    advise_other_clusters: bool = True,
    deadline: CpuDeadline | None = None,
) -> InfeasiblePlanError:
    """Why nothing fits on the requested cluster, and what would (`advise`): a cluster and batch
    that the planner accepts, or, when data parallelism cannot fit the model at all, what would.
    Without `advise_other_clusters` only why (a what-if study tries its cluster sizes itself: the
    search of other clusters was most of the time a study spent on those that do not fit); past
    `deadline` (the search's own) only why, saying the search for a cluster that fits stopped."""
    prober = Prober(request, setting)
    here = prober.at(request.cluster.num_nodes, request.training.global_batch_sequences, lightest=True)
    dominant = dominant_term(here.memory)

    def unadvised(why_not_elsewhere: str = "") -> InfeasiblePlanError:
        return InfeasiblePlanError(
            _why_not_here(request, here, None, peak_gib=peak_gib, limit_gib=limit_gib) + why_not_elsewhere,
            min_fitting_nodes=None,
            min_peak_memory_gib=peak_gib,
            capacity_gib=limit_gib,
            dominant_memory_term=dominant.label,
            dominant_memory_gib=dominant.gib,
        )

    if not advise_other_clusters:
        return unadvised()
    prober.deadline = deadline
    try:
        advice = advise(prober, request.training.global_batch_tokens)
    except SearchDeadlineError as stopped:
        return unadvised(
            f" Looking for a cluster that fits stopped after {stopped.time_limit_s:g} s of CPU time, the "
            "limit per plan."
        )
    first = advice.batches[0] if advice.batches else None
    fitting = prober.at(first.num_nodes, first.global_batch_sequences, lightest=True) if first else None
    # Where data parallelism runs out: the fitting cluster (or the largest tried) is held up by
    # what more data-parallel GPUs do not shrink.
    limiting = fitting or advice.largest_tried
    assert limiting is not None
    needs_model_parallelism = fitting is None or dominant_term(limiting.memory).group == "activations"
    remedy = [what_fits(request, advice) if fitting else data_parallel_cannot(request, limiting)]
    if dominant.group == "states":
        remedy += [sentence for sentence in [_pure_bf16_fits_here(request, setting, deadline)] if sentence]
    if fitting and needs_model_parallelism:
        remedy.append(_model_parallelism_would_help(request, fitting))
    if needs_model_parallelism:
        # Say where the parallelism named plans, checked as the search would: advice that names only
        # an option (`--cp`) may not plan on this cluster at all (one GPU cannot split a sequence).
        remedy.append(parallelism_that_plans(request, setting, advice.tokens, deadline=deadline))
    parts = [_why_not_here(request, here, fitting, peak_gib=peak_gib, limit_gib=limit_gib), *remedy]
    suggested = first.global_batch_sequences * request.training.seq_len if first else None
    keeps_batch = suggested == request.training.global_batch_tokens
    same = advice.same_batch
    return InfeasiblePlanError(
        " ".join(parts),
        min_fitting_nodes=first.num_nodes if first else None,
        min_peak_memory_gib=peak_gib,
        capacity_gib=limit_gib,
        suggested_global_batch_tokens=suggested,
        min_fitting_nodes_same_batch=(
            first.num_nodes if first and keeps_batch else (same.num_nodes if same else None)
        ),
        dominant_memory_term=dominant.label,
        dominant_memory_gib=dominant.gib,
        needs_model_parallelism=needs_model_parallelism,
        advice=" ".join(remedy),
    )


def _why_not_here(
    request: PlanRequest, here: Probe, there: Probe | None, *, peak_gib: float, limit_gib: float
) -> str:
    """What holds the memory on the cluster asked for, and whether more GPUs shrink it, in terms the
    advice that follows agrees with: `there` is the lightest configuration on the smallest cluster
    that fits (None when none does). Activations shrink with more GPUs only where those split each
    sequence further (more cp or tp ranks); more data-parallel GPUs never shrink them."""
    dominant = dominant_term(here.memory)
    text = (
        f"{request.model.name} does not fit on {cluster_name(request, here.num_nodes)}: the least "
        f"memory-hungry configuration ({to_parallel_config(here.choice, request).label()}) needs "
        f"{peak_gib:.1f} GiB per GPU, {_allowed(request, limit_gib)}; "
        f"{dominant.gib:.1f} GiB of it ({dominant.share:.0%}) is {dominant.label}"
    )
    if dominant.group == "states":
        return text + ", which shrink as more GPUs shard them."
    if dominant.group == "activations":
        text += f" of {_sequences(here.choice.micro_batch_size)}{_split(here.choice.mesh)}"
        if there is not None and there.choice.mesh.sequence_ranks > here.choice.mesh.sequence_ranks:
            return text + ", which more GPUs shrink only by splitting each sequence over more of them."
        return text + ", which more data-parallel GPUs do not shrink."
    if dominant.group == "gathered":
        text += " of whole blocks, which more data-parallel GPUs do not shrink"
        return text + _expert_parallel_hint(request, here.choice.mesh) + "."
    return text + "."


def _expert_parallel_hint(request: PlanRequest, mesh: Mesh) -> str:
    """How expert parallelism would shrink a mixture of experts' gathered blocks on `mesh`: the
    largest degree its shard group and the experts allow, where above the mesh's own (the request
    pinned a smaller one); empty for a dense model or where none is larger."""
    if not request.model.routed_experts:
        return ""
    unpinned = _ep_unpinned(request)
    largest = max(ep for ep in expert_parallel_degrees(unpinned) if mesh.fsdp_shards % ep == 0)
    if largest <= mesh.ep:
        return ""
    return (
        f"; expert parallelism does: {axis('ep').option} {largest} holds 1/{largest} of the routed "
        "experts per rank, and gathers only those"
        + (" (the request pins the expert-parallel degrees)" if unpinned.search != request.search else "")
    )


def _pure_bf16_fits_here(request: PlanRequest, setting: Setting, deadline: CpuDeadline | None) -> str:
    """Where fp32 master parameters, gradients and optimizer states hold most of the peak: whether
    pure bf16 training (half their bytes) fits on the cluster asked for, as a sentence (empty when it
    does not, or when the request trains in pure bf16 or fp32 already). Priced by the advice's own
    probe, the search's memory test on the lightest configurations."""
    training = request.training
    if training.precision != "bf16" or training.state_dtype == "bfloat16":
        return ""
    pure = request.model_copy(update={"training": training.model_copy(update={"state_dtype": "bfloat16"})})
    prober = Prober(pure, replace(setting, state_dtype="bfloat16"), deadline=deadline)
    try:
        probe = prober.at(request.cluster.num_nodes, training.global_batch_sequences, lightest=True)
    except SearchDeadlineError:
        return ""  # the refusal says what it found within the limit per plan
    if not probe.fits:
        return ""
    return (
        "Pure bf16 training fits it here: with training.state_dtype bfloat16 the parameters, gradients "
        f"and optimizer states are kept in bf16, with no fp32 master copy (the lightest configuration: "
        f"{to_parallel_config(probe.choice, pure).label()}, {probe.memory.total / GIB:.1f} GiB per GPU)."
    )


def _ep_unpinned(request: PlanRequest) -> PlanRequest:
    """The request with its expert-parallel degrees searched as the model allows."""
    return request.model_copy(
        update={"search": request.search.model_copy(update={"expert_parallel_degrees": None})}
    )


def _expert_parallel_beyond(request: PlanRequest) -> str:
    """Expert parallelism above the degrees the request pinned, where the model takes more: it
    divides the routed experts' gathered blocks, which more data-parallel GPUs leave whole (a
    sentence's first item, empty for a dense model or an unpinned search)."""
    if not request.model.routed_experts:
        return ""
    searched = max(expert_parallel_degrees(request))
    possible = max(expert_parallel_degrees(_ep_unpinned(request)))
    if possible <= searched:
        return ""
    return (
        f"expert parallelism beyond ep={searched} (up to ep={possible} splits its "
        f"{request.model.routed_experts} routed experts, each rank gathering only its own; widen "
        "search.expert_parallel_degrees), "
    )


def _split(mesh: Mesh) -> str:
    """` per GPU`, or ` split over 8 GPUs at cp=4 tp=2`."""
    if mesh.sequence_ranks == 1:
        return " per GPU"
    return f" split over {mesh.sequence_ranks} GPUs at {mesh.degrees_above_one(SEQUENCE_AXES)}"


def _allowed(request: PlanRequest, limit_gib: float) -> str:
    ceiling = request.search.max_peak_memory_gib
    if ceiling is not None and ceiling <= limit_gib:
        return f"the ceiling (search.max_peak_memory_gib) admits less than {ceiling:.1f} GiB"
    return f"at most {limit_gib:.1f} GiB fits with the memory margin"


def what_fits(request: PlanRequest, advice: Advice) -> str:
    """The advice's cluster and batch in a sentence or two (its batches must not be empty)."""
    first = advice.batches[0]
    nodes, seq_len = first.num_nodes, request.training.seq_len
    where = f"{cluster_name(request, nodes)} ({_gpus(request, nodes)})"
    here = nodes == request.cluster.num_nodes
    text = f"It fits on {where}" if here else f"Smallest cluster that fits: {where}"
    if first.global_batch_sequences * seq_len == advice.tokens:
        return text + "."
    text += (
        f" with global_batch_tokens {first.global_batch_sequences * seq_len} "
        f"({_sequences(first.global_batch_sequences)}, {_over_ranks(first)}: "
        f"{_not_there(request, advice, nodes)})"
    )
    if advice.tokens % seq_len:
        return text + "."
    if advice.same_batch is not None:
        same = advice.same_batch
        return text + (
            f"; keeping global_batch_tokens {advice.tokens}: "
            f"{cluster_name(request, same.num_nodes)} ({_gpus(request, same.num_nodes)})."
        )
    return text + f"; {_sequences(advice.tokens // seq_len)} split over no larger cluster that fits."


def _not_there(request: PlanRequest, advice: Advice, nodes: int) -> str:
    """Why the batch asked for is not the one suggested on `nodes` nodes."""
    seq_len = request.training.seq_len
    if advice.tokens % seq_len:
        return f"{advice.tokens} tokens are not a whole number of {seq_len}-token sequences"
    sequences = advice.tokens // seq_len
    if advice.tokens in (b * seq_len for b in roundings(request, nodes, advice.tokens)):
        return f"{sequences} do not fit there"
    return f"{sequences} do not split evenly over its data-parallel ranks at any tp degree searched"


def _unshrinkable(request: PlanRequest, probe: Probe) -> str:
    """What more data-parallel GPUs leave as it is: one micro-batch's activations and whole
    gathered blocks, against the peak."""
    terms = probe.memory.terms()

    def gib(group: str) -> float:
        return sum(terms[n] for n in DOMINANT_GROUPS[group][1]) / GIB

    tokens = f"{_sequences(probe.choice.micro_batch_size)} of {request.training.seq_len} tokens"
    if probe.choice.mesh.sequence_ranks > 1:
        tokens += _split(probe.choice.mesh)
    return (
        f"activations and the loss ({gib('activations'):.1f} GiB for {tokens}) and gathered "
        f"parameters and gradient buffers of whole blocks ({gib('gathered'):.1f} GiB) hold "
        f"{gib('activations') + gib('gathered'):.1f} of its {probe.memory.total / GIB:.1f} GiB per GPU, "
        "and more data-parallel GPUs shrink neither"
    )


def tensor_parallel_reach(request: PlanRequest) -> tuple[int, int]:
    """The largest tensor-parallel degree the request searched, and the largest the model takes."""
    unpinned = request.search.model_copy(update={"tensor_parallel_degrees": None})
    possible = max(tensor_parallel_degrees(request.model_copy(update={"search": unpinned})))
    return max(tensor_parallel_degrees(request)), possible


def _beyond_the_search(request: PlanRequest) -> str:
    """The parallelism this request's search left out that would divide activations further, or a
    mixture of experts' gathered blocks (`_expert_parallel_beyond`).

    Pipeline stages do not: under the 1F1B schedules the first stage holds a micro-batch in flight
    per stage, as many blocks' activations as the whole model's for one micro-batch."""
    return _expert_parallel_beyond(request) + _sequence_splits_beyond(request)


def _sequence_splits_beyond(request: PlanRequest) -> str:
    """`_beyond_the_search`'s tensor and context parallelism (or why there is none to add)."""
    searched, possible = tensor_parallel_reach(request)
    context = max(context_parallel_degrees(request))
    if possible > searched:
        return (
            f"tensor parallelism beyond tp={searched} (up to tp={possible} splits this model; widen "
            "search.tensor_parallel_degrees) or context parallelism (search.context_parallel_degrees)"
        )
    if context == 1 and request.model.architecture == "llama":
        return (
            "context parallelism (search.context_parallel_degrees: it splits every sequence, and is "
            f"searched unpinned only from {CONTEXT_PARALLEL_FROM_SEQ_LEN:,}-token sequences)"
        )
    if searched > 1 or context > 1:
        return (
            f"GPUs with more memory (this planner splits activations with tensor parallelism up to "
            f"tp={searched} inside a node and context parallelism up to cp={context}; pipeline stages "
            "leave the first stage one micro-batch's activations per stage, the whole model's worth)"
        )
    return "tensor or context parallelism (this model's runtime has data parallelism only)"


def _searched_parallelism(request: PlanRequest) -> str:
    axes = {
        "tensor": max(tensor_parallel_degrees(request)) > 1,
        "context": max(context_parallel_degrees(request)) > 1,
        "pipeline": max(pipeline_parallel_degrees(request)) > 1,
    }
    named = [axis for axis, searched in axes.items() if searched]
    if not named:
        return "Data parallelism alone"
    if len(named) == 1:
        return f"Data and {named[0]} parallelism"
    return f"Data, {', '.join(named[:-1])} and {named[-1]} parallelism"


def _model_parallelism_would_help(request: PlanRequest, there: Probe) -> str:
    return (
        f"At that size {_unshrinkable(request, there)}: {_beyond_the_search(request)} would fit on "
        "fewer GPUs."
    )


def data_parallel_cannot(request: PlanRequest, largest: Probe) -> str:
    return (
        f"{_searched_parallelism(request)} cannot fit it: even on "
        f"{cluster_name(request, largest.num_nodes)} ({_gpus(request, largest.num_nodes)}) the lightest "
        f"configuration ({to_parallel_config(largest.choice, request).label()}) needs "
        f"{largest.memory.total / GIB:.1f} GiB per GPU; {_unshrinkable(request, largest)}. "
        f"It needs {_beyond_the_search(request)}."
    )


def parallelism_that_plans(
    request: PlanRequest, setting: Setting, tokens: int, *, deadline: CpuDeadline | None = None
) -> str:
    """The smallest cluster on which the request plans once its search takes every degree of the
    parallelism that splits a sequence (every context-parallel degree the sequence takes, every
    tensor-parallel one a node allows), on nodes as wide as the request's or, where the GPU's usual
    node is wider, as wide as that (one GPU per node leaves tensor parallelism nothing to split):
    `... it plans on 120 GPUs: cluster "15x8xH100", search.context_parallel_degrees [2], ...`, the
    inputs to set (`--cluster 15x8xH100, --cp 2` on the command line), priced by the
    search's own test (`advise`). Empty when none plans up to MAX_NODES_TRIED nodes, or when looking
    passes `deadline`."""
    found: list[tuple[int, PlanRequest, Advice]] = []
    usual = request.cluster.resolved_gpu().default_gpus_per_node
    for width in dict.fromkeys([request.cluster.gpus_per_node, max(usual, request.cluster.gpus_per_node)]):
        widened = _widened(request, width)
        prober = Prober(widened, replace(setting, gpus_per_node=width), deadline=deadline)
        try:
            advice = advise(prober, tokens)
        except SearchDeadlineError:
            return ""
        if advice.batches:
            found.append((advice.batches[0].num_nodes * width, widened, advice))
    if not found:
        return ""
    _, widened, advice = min(found, key=lambda entry: entry[0])
    first = advice.batches[0]
    mesh = first.choice.mesh
    # In the request's terms (the command line names its options: api/cli/common.py `in_cli_terms`).
    options = [f'cluster "{cluster_name(widened, first.num_nodes)}"']
    split = [name for name in SEQUENCE_AXES if mesh.degree(name) > 1]
    options += [f"search.{axis(name).search_field} [{mesh.degree(name)}]" for name in split]
    batch = first.global_batch_sequences * request.training.seq_len
    if batch != tokens:
        options.append(f"training.global_batch_tokens {batch}")
    return (
        "Searching every context- and tensor-parallel degree, it plans on "
        f"{_gpus(widened, first.num_nodes)}: {', '.join(options)} (the lightest configuration there: "
        f"{to_parallel_config(first.choice, widened).label()})."
    )


def _widened(request: PlanRequest, gpus_per_node: int) -> PlanRequest:
    """The request on nodes of `gpus_per_node` GPUs, searching every tensor-parallel degree a node
    allows and every context-parallel degree the model and sequence take (the search's threshold on
    sequence length left aside: it is about speed, not about what fits)."""
    wider = request.model_copy(
        update={"cluster": request.cluster.model_copy(update={"gpus_per_node": gpus_per_node})}
    )
    powers = (2**i for i in range(MAX_CONTEXT_PARALLEL.bit_length()))
    context = [cp for cp in powers if cp <= MAX_CONTEXT_PARALLEL and not pin_problems(wider, "cp", cp)]
    search = request.search.model_copy(
        update={"tensor_parallel_degrees": None, "context_parallel_degrees": context}
    )
    return wider.model_copy(update={"search": search})
