"""Why nothing fits on the requested cluster, and what would.

When no configuration fits, the diagnosis names a cluster (and, when the requested batch cannot be
split over it, a batch) on which `make_plan` succeeds. Each candidate is checked by the same test
the search applies, over the same configurations it enumerates (`Prober`), so the advice
and the search cannot disagree. It also names the memory term that really dominates, because that
decides what helps: sharded states shrink with more GPUs, activations of one sequence do not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.mesh import Mesh
from planner.cost.estimate import Estimator
from planner.cost.memory import MemoryEstimate, fits_in_memory
from planner.cost.parameters import GIB
from planner.cost.setting import Choice, Setting
from planner.document import to_parallel_config
from planner.enumeration import enumerate_choices, splitting_degrees, tensor_parallel_degrees
from planner.errors import InfeasiblePlanError
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
    """

    def __init__(self, request: PlanRequest, setting: Setting, *, limit_gib: float) -> None:
        self.request = request
        self.setting = setting
        self.limit_gib = limit_gib
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
        request = self.variant(num_nodes, sequences)
        assert splitting_degrees(request), "probe only batches that split"
        setting = replace(
            self.setting,
            world_size=request.cluster.world_size,
            num_nodes=num_nodes,
            global_batch_sequences=sequences,
        )
        choices = enumerate_choices(request, setting)
        first = next(choices)
        if not lightest and not self._states_may_fit(first, request.cluster.world_size):
            probe = Probe(num_nodes, sequences, first, self._estimator.memory(first), False)
            self._cache[(num_nodes, sequences, lightest)] = probe
            return probe
        best: tuple[Choice, MemoryEstimate] | None = None
        found = False
        sharded: set[tuple] = set()  # fully sharded configurations priced, by everything else
        for choice in (first, *choices):
            key = _all_but_sharding(choice)
            if choice.sharding == "full_shard":
                sharded.add(key)
            elif key in sharded:
                continue  # never lighter than its fully sharded twin (tests/planner/test_advice.py)
            memory = self._estimator.memory(choice)
            if self._fits(memory) and not lightest:
                best, found = (choice, memory), True
                break
            if best is None or (
                self._lighter(choice, memory, best) if lightest else memory.total < best[1].total
            ):
                best = (choice, memory)
        assert best is not None, "every request enumerates at least one configuration"
        found = found or self._fits(best[1])
        probe = Probe(num_nodes, sequences, best[0], best[1], found)
        self._cache[(num_nodes, sequences, lightest)] = probe
        return probe

    def _fits(self, memory: MemoryEstimate) -> bool:
        return fits_in_memory(memory, limit_gib=self.limit_gib, ceiling_gib=self.ceiling_gib)

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
        which no configuration holds in less than fully sharded over the whole world."""
        sharded = replace(choice, sharding="full_shard", mesh=Mesh(dp_shard=world))
        step = next(m for m in self._estimator.moments(sharded) if m.moment == "optimizer step")
        return self._fits(step)

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

    def nearest_batch(self, num_nodes: int) -> int:
        """The global batch (sequences) to advise on `num_nodes` nodes: the requested one when it
        splits over them, else the nearest that does."""
        world = num_nodes * self.request.cluster.gpus_per_node
        return batches_near(self.request.training.global_batch_sequences, world)[0]

    def fits_at(self, num_nodes: int) -> bool:
        """Whether the request, with the nearest batch that splits, plans on `num_nodes` nodes."""
        return self.at(num_nodes, self.nearest_batch(num_nodes)).fits


def _all_but_sharding(c: Choice) -> tuple:
    # A tuple rather than dataclasses.replace: a probe compares thousands of configurations.
    return (
        c.mesh.tp,
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


def batches_near(sequences: int, world: int) -> list[int]:
    """Global batches (sequences) that split evenly over `world` ranks, nearest to `sequences`
    first (the request's own when it splits; a tie goes to the smaller)."""
    if sequences % world == 0:
        return [sequences]
    below = sequences // world * world
    options = [b for b in (below, below + world) if b >= world]
    return sorted(options, key=lambda b: (abs(b - sequences), b))


@dataclass(frozen=True, slots=True)
class ClusterAdvice:
    """The smallest cluster found to fit, with the batch to use there."""

    smallest: Probe | None
    """Smallest node count that fits (its batch the requested one, or the nearest that splits)."""
    same_batch: Probe | None
    """When `smallest` changes the batch: the smallest node count that fits the requested batch."""
    largest_tried: Probe | None
    """When nothing fits: the lightest configuration on the largest cluster tried."""


def smallest_cluster(prober: Prober) -> ClusterAdvice:
    """Bisect node counts for the smallest cluster whose own search finds a fitting configuration.

    Fitting is monotone in the node count in all but rounding of the batch (sharded states shrink,
    one micro-batch's activations stay), so doubling then bisecting finds the boundary in a few
    dozen probes; every probe is the exact test the search would apply there.
    """
    request = prober.request
    low = request.cluster.num_nodes  # does not fit: that is why we are here
    if low >= MAX_NODES_TRIED:
        largest = prober.at(low, prober.nearest_batch(low), lightest=True)
        return ClusterAdvice(smallest=None, same_batch=None, largest_tried=largest)
    high = min(low * 2, MAX_NODES_TRIED)
    while not prober.fits_at(high):
        if high >= MAX_NODES_TRIED:
            largest = prober.at(high, prober.nearest_batch(high), lightest=True)
            return ClusterAdvice(smallest=None, same_batch=None, largest_tried=largest)
        low, high = high, min(high * 2, MAX_NODES_TRIED)
    while high - low > 1:
        mid = (low + high) // 2
        if prober.fits_at(mid):
            high = mid
        else:
            low = mid
    smallest = prober.at(high, prober.nearest_batch(high), lightest=True)
    same_batch = None
    if smallest.global_batch_sequences != request.training.global_batch_sequences:
        same_batch = _smallest_keeping_batch(prober, at_least=high)
    return ClusterAdvice(smallest=smallest, same_batch=same_batch, largest_tried=None)


def _gpn(request: PlanRequest) -> int:
    return request.cluster.gpus_per_node


def _smallest_keeping_batch(prober: Prober, *, at_least: int) -> Probe | None:
    """The smallest node count from `at_least` on over which the requested batch splits and fits."""
    sequences = prober.request.training.global_batch_sequences
    gpn = _gpn(prober.request)
    if sequences % gpn:
        return None
    per_node = sequences // gpn
    for nodes in range(at_least, min(per_node, MAX_NODES_TRIED) + 1):
        if per_node % nodes == 0:
            probe = prober.at(nodes, sequences)
            if probe.fits:
                return probe
    return None


def cluster_name(request: PlanRequest, nodes: int) -> str:
    c = request.cluster
    return f"{nodes}x{c.gpus_per_node}x{c.gpu}"


def _gpus(request: PlanRequest, nodes: int) -> str:
    return f"{nodes * request.cluster.gpus_per_node} GPUs"


def _sequences(n: int) -> str:
    return f"{n} sequence" if n == 1 else f"{n} sequences"


def infeasible_error(
    request: PlanRequest,
    setting: Setting,
    *,
    limit_gib: float,
    peak_gib: float,
) -> InfeasiblePlanError:
    """Why nothing fits on the requested cluster, and what would: a cluster and batch that the
    planner accepts, or, when data parallelism cannot fit the model at all, what would."""
    prober = Prober(request, setting, limit_gib=limit_gib)
    here = prober.at(request.cluster.num_nodes, request.training.global_batch_sequences, lightest=True)
    dominant = dominant_term(here.memory)
    advice = smallest_cluster(prober)
    # Where data parallelism runs out: the fitting cluster (or the largest tried) is held up by
    # what more data-parallel GPUs do not shrink.
    limiting = advice.smallest or advice.largest_tried
    assert limiting is not None
    needs_model_parallelism = (
        advice.smallest is None or dominant_term(limiting.memory).group == "activations"
    )
    remedy = [what_fits(request, advice) if advice.smallest else data_parallel_cannot(request, limiting)]
    if advice.smallest and needs_model_parallelism:
        remedy.append(_model_parallelism_would_help(request, advice.smallest))
    parts = [_why_not_here(request, here, peak_gib=peak_gib, limit_gib=limit_gib), *remedy]
    smallest, same = advice.smallest, advice.same_batch
    keeps_batch = smallest is not None and (
        smallest.global_batch_sequences == request.training.global_batch_sequences
    )
    return InfeasiblePlanError(
        " ".join(parts),
        min_fitting_nodes=smallest.num_nodes if smallest else None,
        min_peak_memory_gib=peak_gib,
        capacity_gib=limit_gib,
        suggested_global_batch_tokens=(
            smallest.global_batch_sequences * request.training.seq_len if smallest else None
        ),
        min_fitting_nodes_same_batch=(
            smallest.num_nodes if smallest and keeps_batch else (same.num_nodes if same else None)
        ),
        dominant_memory_term=dominant.label,
        dominant_memory_gib=dominant.gib,
        needs_model_parallelism=needs_model_parallelism,
        advice=" ".join(remedy),
    )


def _why_not_here(request: PlanRequest, here: Probe, *, peak_gib: float, limit_gib: float) -> str:
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
        sequences = _sequences(here.choice.micro_batch_size)
        return text + f" of {sequences} per GPU, which more GPUs do not shrink."
    if dominant.group == "gathered":
        return text + " of whole blocks, which more GPUs do not shrink."
    return text + "."


def _allowed(request: PlanRequest, limit_gib: float) -> str:
    ceiling = request.search.max_peak_memory_gib
    if ceiling is not None and ceiling <= limit_gib:
        return f"the ceiling (search.max_peak_memory_gib) admits less than {ceiling:.1f} GiB"
    return f"at most {limit_gib:.1f} GiB fits with the memory margin"


def what_fits(request: PlanRequest, advice: ClusterAdvice) -> str:
    smallest = advice.smallest
    assert smallest is not None
    requested = request.training.global_batch_sequences
    text = f"Smallest cluster that fits: {cluster_name(request, smallest.num_nodes)} "
    text += f"({_gpus(request, smallest.num_nodes)})"
    if smallest.global_batch_sequences == requested:
        return text + "."
    text += (
        f" with global_batch_tokens {smallest.global_batch_sequences * request.training.seq_len} "
        f"({_sequences(smallest.global_batch_sequences)}: {requested} do not split evenly over "
        f"{_gpus(request, smallest.num_nodes)})"
    )
    if advice.same_batch is not None:
        same = advice.same_batch
        return text + (
            f"; keeping global_batch_tokens {request.training.global_batch_tokens}: "
            f"{cluster_name(request, same.num_nodes)} ({_gpus(request, same.num_nodes)})."
        )
    return text + f"; {_sequences(requested)} split over no larger cluster that fits."


def _unshrinkable(request: PlanRequest, probe: Probe) -> str:
    """What more data-parallel GPUs leave as it is: one micro-batch's activations and whole
    gathered blocks, against the peak."""
    terms = probe.memory.terms()

    def gib(group: str) -> float:
        return sum(terms[n] for n in DOMINANT_GROUPS[group][1]) / GIB

    tokens = f"{_sequences(probe.choice.micro_batch_size)} of {request.training.seq_len} tokens"
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
    """The parallelism this request's search left out that would divide activations further."""
    searched, possible = tensor_parallel_reach(request)
    if possible > searched:
        return (
            f"tensor parallelism beyond tp={searched} (up to tp={possible} splits this model; widen "
            "search.tensor_parallel_degrees) or context parallelism"
        )
    if searched > 1:
        return (
            f"context or pipeline parallelism (this planner plans FSDP data parallelism with tensor "
            f"parallelism up to tp={searched}, inside a node)"
        )
    return "tensor or context parallelism (this model's runtime has data parallelism only)"


def _searched_parallelism(request: PlanRequest) -> str:
    tensor = max(tensor_parallel_degrees(request)) > 1
    return "Data and tensor parallelism" if tensor else "Data parallelism alone"


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
