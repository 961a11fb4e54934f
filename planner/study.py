"""What-if studies: the time and cost to train one model on a token budget, across GPU types and sizes.

A study names a model, a token budget, candidate GPU types (catalog names or specs of the user's own)
with a price per GPU-hour, and cluster sizes. Every (GPU type, size) pair is an ordinary plan request
(`StudyRequest.candidates`), searched independently; the caller runs the searches (in parallel) and
hands the plans back to `study_point` / `refused_point`, and `summarize` marks the time-cost Pareto
front and the cheapest cluster that finishes within the deadline.

The arithmetic is deliberately plain: training takes `token_budget / tokens_per_s` seconds at the
predicted cluster throughput (no step rounding, no warm-up or checkpoint overhead), GPU-hours are
GPUs x hours, and the cost is GPU-hours x the price.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)

from contract.parallel_config import Float8Recipe
from contract.training_config import STATE_DTYPE_NEEDS_BF16, Optimizer, Precision, StateDType
from planner.enumeration import check_float8
from planner.errors import InfeasiblePlanError, PlanningError
from planner.gpu_spec import GpuSpec
from planner.plan import Plan, PredictionInterval
from planner.specs import (
    ASCII_DECIMAL,
    UNION_TAG_PREFIX,
    ClusterSpec,
    GpusPerNode,
    LinkOverrideGbps,
    ModelSpec,
    PlanRequest,
    PositiveInt,
    ScaleupDomainGpus,
    SearchSpace,
    StrictModel,
    cluster_text,
)

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0

MAX_TOKEN_BUDGET = 10**16
"""Ten quadrillion tokens: ~600x Llama 3's 15.6T; larger budgets are typos (and overflow float days)."""
MAX_PRICE_PER_GPU_HOUR = 10_000.0
MAX_CANDIDATES = 256
"""GPU types x cluster sizes one study may plan (each is a full search)."""
MAX_CLUSTER_GPUS = 1 << 18

DEFAULT_PRICES_PER_GPU_HOUR: dict[str, float] = {
    "H100-SXM-80GB": 2.99,
    "H100-SXM-96GB": 2.99,  # not rented by public clouds: priced as the 80 GB card
    "H200-141GB": 3.79,
    "A100-80GB": 1.79,
    "A100-40GB": 1.29,
    "L4": 0.80,
    "B200": 4.99,
    "B300": 6.49,
    "GB200": 5.99,  # rented by the rack's GPU-hour
    "GB300": 7.49,
    "H800": 2.49,  # not rented outside China: priced below the H100 its network trails
    "H20": 1.49,
    "L40S": 1.29,
    "MI300X": 2.29,
    "MI325X": 2.69,
    "MI355X": 3.49,
    "cpu": 0.05,
}
"""USD per GPU-hour when a study names no price: indicative on-demand list prices of GPU clouds in
2026 (a CPU "GPU" is a share of a cloud VM). Contracts and spot prices differ: give your own."""

# ASCII digits only, as the cluster text (planner/specs.py CLUSTER_PATTERN): `\d`, str.isdigit() and
# float() also take other scripts' digits, and int() then refuses some ('²') and reads others ('٣' is 3).
_SIZE_RANGE = re.compile(r"^([0-9]+)-([0-9]+)(?::\+([0-9]+))?$")
_WHOLE = re.compile(r"[0-9]+")
_COUNT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMBT]?)$", re.IGNORECASE)
_COUNT_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

BatchRule = Literal["fixed", "per_gpu"]
Price = Annotated[float, Field(gt=0, le=MAX_PRICE_PER_GPU_HOUR, allow_inf_nan=False)]
ClusterGpus = Annotated[int, Field(ge=1, le=MAX_CLUSTER_GPUS)]


def series_name(gpu: str, float8: str, scaleup_domain_gpus: int | None = None) -> str:
    """A study's name for a candidate GPU type trained with a Float8 recipe (or not), in scale-up domains
    of its own size (or its system's): `GB200 fp8-tensorwise (domains of 36)`."""
    name = gpu if float8 == "none" else f"{gpu} fp8-{float8}"
    return name if scaleup_domain_gpus is None else f"{name} (domains of {scaleup_domain_gpus})"


class StudyGpu(StrictModel):
    """One candidate GPU type and what an hour of one costs."""

    gpu: Annotated[str, Field(min_length=1, max_length=64)]
    """A catalog name or alias (`H100`), or the name of `custom_gpu`."""
    custom_gpu: GpuSpec | None = None
    """The datasheet of a GPU type not in the catalog (its `name` is `gpu`)."""
    price_per_gpu_hour: Price | None = None
    """USD per GPU-hour. None: the catalog default (DEFAULT_PRICES_PER_GPU_HOUR); custom GPUs need one."""
    gpus_per_node: GpusPerNode | None = None
    """GPUs per node. None: the GPU type's usual node (8 for datacenter GPUs)."""
    calibration_id: Annotated[int, Field(ge=1, le=(1 << 53) - 1)] | None = None
    """A calibration profile stored on the service, measured on this GPU type: its clusters are planned
    with it, as `POST /plans` with `calibration_id` does. None: catalog peaks (uncalibrated)."""
    float8: Float8Recipe = "none"
    """Train this candidate's linears with a Float8 recipe (`none`: the study's precision). The same GPU
    type may be listed once per recipe, so a study compares bf16 and Float8 side by side."""
    scaleup_domain_gpus: ScaleupDomainGpus | None = None
    """GPUs per scale-up domain (NVLink, Infinity Fabric), a whole number of nodes, as a plan's
    `cluster.scaleup_domain_gpus`: 36 for GB200 in NVL36 racks. None: the GPU type's system (72 for
    GB200 and GB300), else one node. The same GPU type may be listed once per domain size."""

    @model_validator(mode="after")
    def _resolvable(self) -> StudyGpu:
        spec = self._one_gpu()  # raises for unknown names and bad customs
        if self.price_per_gpu_hour is None and spec.gpu not in DEFAULT_PRICES_PER_GPU_HOUR:
            raise ValueError(
                f"price_per_gpu_hour: {spec.gpu!r} has no default price; give its price in USD per GPU-hour"
            )
        if self.scaleup_domain_gpus is not None:
            self.cluster(num_nodes=1, gpus_per_node=self.node_size)  # raises for a domain of part nodes
        return self

    def _one_gpu(self) -> ClusterSpec:
        return ClusterSpec(num_nodes=1, gpus_per_node=1, gpu=self.gpu, custom_gpu=self.custom_gpu)

    def cluster(
        self, *, num_nodes: int, gpus_per_node: int, inter_node_bandwidth_gbps: float | None = None
    ) -> ClusterSpec:
        """`num_nodes` x `gpus_per_node` of this GPU type, in its scale-up domains where the nodes are whole
        (a part of one node is on that node's fabric whatever the domain), on the study's network (None:
        the GPU type's NIC)."""
        whole = gpus_per_node == self.node_size
        return ClusterSpec(num_nodes=num_nodes, gpus_per_node=gpus_per_node, gpu=self.gpu,
                           custom_gpu=self.custom_gpu,
                           scaleup_domain_gpus=self.scaleup_domain_gpus if whole else None,
                           inter_node_bandwidth_gbps=inter_node_bandwidth_gbps)

    @property
    def name(self) -> str:
        """The canonical name (catalog aliases resolved)."""
        return self._one_gpu().gpu

    @property
    def series(self) -> str:
        """The candidate as the study names it: the GPU type, its Float8 recipe and its domains if any."""
        return series_name(self.name, self.float8, self.scaleup_domain_gpus)

    @property
    def price(self) -> float:
        return self.price_per_gpu_hour or DEFAULT_PRICES_PER_GPU_HOUR[self.name]

    @property
    def node_size(self) -> int:
        spec = self._one_gpu().resolved_gpu()
        return self.gpus_per_node or spec.default_gpus_per_node


class SizeRange(StrictModel):
    """Cluster sizes from `min_gpus` to `max_gpus` (both included): doubling, or in equal steps."""

    min_gpus: Annotated[int, Field(ge=1, le=MAX_CLUSTER_GPUS)]
    max_gpus: Annotated[int, Field(ge=1, le=MAX_CLUSTER_GPUS)]
    progression: Literal["double", "step"] = "double"
    """`double`: min, 2 min, 4 min, ...; `step`: min, min + step, ..."""
    step: Annotated[int, Field(ge=1, le=MAX_CLUSTER_GPUS)] | None = None
    """The increment of a `step` progression (default: min_gpus)."""

    @model_validator(mode="after")
    def _not_empty(self) -> SizeRange:
        if self.min_gpus > self.max_gpus:
            raise ValueError(
                f"cluster_sizes: the range from {self.min_gpus} to {self.max_gpus} GPUs is empty; "
                "min_gpus must be at most max_gpus"
            )
        if self.step is not None and self.progression != "step":
            raise ValueError("cluster_sizes.step: only a `step` progression takes a step")
        return self

    def sizes(self) -> list[int]:
        sizes, size = [], self.min_gpus
        while size <= self.max_gpus and len(sizes) <= MAX_CANDIDATES:
            sizes.append(size)
            size = size * 2 if self.progression == "double" else size + (self.step or self.min_gpus)
        return sizes


class StudyRequest(StrictModel):
    """Everything a what-if study plans: one model and token budget on many candidate clusters."""

    model: ModelSpec
    token_budget: Annotated[int, Field(ge=1, le=MAX_TOKEN_BUDGET)]
    """Tokens to train on (e.g. 15_000_000_000_000 for 15T)."""
    gpus: Annotated[list[StudyGpu], Field(min_length=1, max_length=16)]
    """Candidate GPU types."""
    cluster_sizes: Annotated[
        Annotated[Annotated[list[ClusterGpus], Field(min_length=1, max_length=MAX_CANDIDATES)],
                  Tag(f"{UNION_TAG_PREFIX}list")]
        | Annotated[SizeRange, Tag(f"{UNION_TAG_PREFIX}range")],
        Discriminator(lambda value: UNION_TAG_PREFIX + ("list" if isinstance(value, list) else "range")),
    ]
    """Total GPUs per candidate cluster: a list, or a range. A size above one node must be whole nodes."""
    seq_len: PositiveInt
    """Tokens per sequence."""
    batch_rule: BatchRule = "fixed"
    """`fixed`: every cluster trains with `global_batch_tokens`; `per_gpu`: the global batch grows
    with the cluster, `batch_tokens_per_gpu` x GPUs (constant work per GPU: weak scaling)."""
    global_batch_tokens: PositiveInt | None = None
    """Tokens per optimizer step (the `fixed` rule); a multiple of seq_len."""
    batch_tokens_per_gpu: PositiveInt | None = None
    """Tokens per step per GPU (the `per_gpu` rule); a multiple of seq_len."""
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    state_dtype: StateDType = "float32"
    """What the optimizer updates on every candidate: fp32 (mixed precision) or `bfloat16` (pure bf16
    training, as the plans' `training.state_dtype`)."""
    search: SearchSpace = SearchSpace()
    """Restrictions applied to every candidate's search."""
    deadline_days: Annotated[float, Field(gt=0, le=1e5, allow_inf_nan=False)] | None = None
    """Train within this many days: the study names the cheapest cluster that does."""
    inter_node_bandwidth_gbps: LinkOverrideGbps | None = None
    """The scale-out network every candidate cluster has between its nodes (between its scale-up
    domains where those span nodes), GB/s per GPU, as a plan's `cluster.inter_node_bandwidth_gbps`:
    50 for one 400 Gb/s NIC per GPU. None: each GPU type's catalog NIC (`inter_node_bandwidth_gbps` in
    GET /api/v1/gpus), which each plan's tokens/s interval then spreads over the networks such clusters
    have."""

    @model_validator(mode="after")
    def _consistent(self) -> StudyRequest:
        per_step = self.global_batch_tokens if self.batch_rule == "fixed" else self.batch_tokens_per_gpu
        needed = "global_batch_tokens" if self.batch_rule == "fixed" else "batch_tokens_per_gpu"
        other = "batch_tokens_per_gpu" if self.batch_rule == "fixed" else "global_batch_tokens"
        if per_step is None:
            raise ValueError(f"{needed}: the {self.batch_rule!r} batch rule needs it")
        if getattr(self, other) is not None:
            raise ValueError(f"{other}: the {self.batch_rule!r} batch rule takes {needed} instead")
        if per_step % self.seq_len:
            lower = max(self.seq_len, per_step // self.seq_len * self.seq_len)
            raise ValueError(f"{needed}: {per_step} is not a whole number of {self.seq_len}-token sequences; "
                             f"use a multiple of seq_len such as {lower}")
        if self.state_dtype == "bfloat16" and self.precision != "bf16":
            raise ValueError(STATE_DTYPE_NEEDS_BF16.replace("training.", ""))
        names = [gpu.series for gpu in self.gpus]
        if len(set(names)) != len(names):
            raise ValueError(
                f"gpus: each GPU type once per Float8 recipe and domain size (got {', '.join(names)})"
            )
        sizes = self.sizes()
        if len(sizes) * len(self.gpus) > MAX_CANDIDATES:
            raise ValueError(
                f"cluster_sizes: {len(self.gpus)} GPU types x {len(sizes)} sizes is more than the "
                f"{MAX_CANDIDATES} candidates a study plans; use fewer sizes (a doubling range) or GPU types"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unstated_additions(self, handler: SerializerFunctionWrapHandler) -> dict:
        # Studies in mixed precision (the default) serialise, and are stored, as before the field existed.
        # So do studies on each GPU type's own network.
        data = handler(self)
        if data.get("state_dtype") == "float32":
            data.pop("state_dtype", None)
        if data.get("inter_node_bandwidth_gbps") is None:
            data.pop("inter_node_bandwidth_gbps", None)
        return data

    def sizes(self) -> list[int]:
        """The cluster sizes, ascending, each once."""
        raw = self.cluster_sizes.sizes() if isinstance(self.cluster_sizes, SizeRange) else self.cluster_sizes
        return sorted(set(raw))

    def batch_tokens(self, num_gpus: int) -> int:
        if self.batch_rule == "fixed":
            assert self.global_batch_tokens is not None
            return self.global_batch_tokens
        assert self.batch_tokens_per_gpu is not None
        return self.batch_tokens_per_gpu * num_gpus

    def candidates(self) -> list[StudyCandidate]:
        """Every GPU type x size, in that order."""
        return [StudyCandidate.of(self, gpu, size) for gpu in self.gpus for size in self.sizes()]


class StudyCluster(BaseModel):
    """One cluster a study considers: what it is, what a step holds on it, what an hour of it costs."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    """Canonical GPU type name."""
    float8: str = "none"
    """The candidate's Float8 recipe (`none`: the study's precision)."""
    num_gpus: int
    num_nodes: int
    gpus_per_node: int
    global_batch_tokens: int
    price_per_gpu_hour: float
    """USD."""
    scaleup_domain_gpus: int | None = None
    """The candidate's own scale-up domain size (None: its GPU type's system)."""

    @property
    def series(self) -> str:
        """`H100-SXM-80GB`, or `H100-SXM-80GB fp8-tensorwise` for a Float8 candidate."""
        return series_name(self.gpu, self.float8, self.scaleup_domain_gpus)

    @property
    def label(self) -> str:
        """The cluster as `--cluster` reads it (`NODESxGPUSxGPU`, `DOMAINSxGPUSxGPU` in domains of the
        candidate's own size), or `GPUSxGPU` for a size that is not whole nodes."""
        if self.num_nodes * self.gpus_per_node != self.num_gpus:
            return f"{self.num_gpus}x{self.gpu}"
        return cluster_text(self.num_nodes, self.gpus_per_node, self.gpu, self.scaleup_domain_gpus)

    def cluster_fields(self) -> dict[str, object]:
        return self.model_dump(include=set(StudyCluster.model_fields))


class StudyCandidate(StudyCluster):
    """A cluster to search, and the plan request for it (None when it cannot be formed)."""

    calibration_id: int | None = None
    """The stored calibration profile its GPU type is planned with."""
    request: PlanRequest | None
    refusal: str | None = None
    """Why no plan request exists for this cluster (e.g. not whole nodes)."""

    @classmethod
    def of(cls, study: StudyRequest, gpu: StudyGpu, num_gpus: int) -> StudyCandidate:
        node = gpu.node_size
        nodes, gpus_per_node = (1, num_gpus) if num_gpus <= node else (num_gpus // node, node)
        fields = dict(gpu=gpu.name, float8=gpu.float8, num_gpus=num_gpus, num_nodes=nodes,
                      gpus_per_node=gpus_per_node,
                      global_batch_tokens=study.batch_tokens(num_gpus), price_per_gpu_hour=gpu.price,
                      calibration_id=gpu.calibration_id, scaleup_domain_gpus=gpu.scaleup_domain_gpus)
        if nodes * gpus_per_node != num_gpus:
            return cls(**fields, request=None,
                       refusal=f"{num_gpus} GPUs is not a whole number of {node}-GPU {gpu.name} nodes")
        try:
            request = PlanRequest(
                model=study.model,
                cluster=gpu.cluster(num_nodes=nodes, gpus_per_node=gpus_per_node,
                                    inter_node_bandwidth_gbps=study.inter_node_bandwidth_gbps),
                training={"seq_len": study.seq_len, "global_batch_tokens": fields["global_batch_tokens"],
                          "precision": study.precision, "optimizer": study.optimizer,
                          "state_dtype": study.state_dtype},
                search=study.search if gpu.float8 == "none" else study.search.model_copy(
                    update={"float8": [gpu.float8]}
                ),
            )
            check_float8(request, gpu.float8, field="gpus.float8")
        except PlanningError as exc:
            return cls(**fields, request=None, refusal=exc.message)
        except ValueError as exc:
            return cls(**fields, request=None, refusal=str(exc))
        return cls(**fields, request=request)



class TrainingCost(BaseModel):
    """How long a token budget takes at a throughput, and what it costs."""

    model_config = ConfigDict(frozen=True)

    seconds: float
    days: float
    gpu_hours: float
    cost: float


def training_cost(
    *, token_budget: int, tokens_per_s: float, num_gpus: int, price_per_gpu_hour: float
) -> TrainingCost:
    """Time and cost of `token_budget` tokens at `tokens_per_s` (whole cluster) on `num_gpus` GPUs."""
    seconds = token_budget / tokens_per_s
    gpu_hours = num_gpus * seconds / SECONDS_PER_HOUR
    return TrainingCost(seconds=seconds, days=seconds / SECONDS_PER_DAY, gpu_hours=gpu_hours,
                        cost=gpu_hours * price_per_gpu_hour)


class StudyPoint(StudyCluster):
    """One candidate cluster's outcome: its plan's headline numbers and what training would take."""

    fits: bool
    """A configuration fits in memory and the batch splits; False: `reason` says why not."""
    calibration_id: int | None = None
    """The calibration profile its GPU type was planned with (None: catalog peaks)."""
    reason: str | None = None
    plan_hash: str | None = None
    config_label: str | None = None
    """The chosen configuration (sharding, mesh, AC, micro-batching, compile)."""
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    usable_memory_gib: float | None = None
    days: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    """USD."""
    tokens_per_s_per_gpu_interval: PredictionInterval | None = None
    """The plan's 80% interval on its throughput (None: a plan stored before schema 2.2)."""
    peak_memory_gib_interval: PredictionInterval | None = None
    days_interval: PredictionInterval | None = None
    """The days the throughput's interval implies (its high end from the low throughput)."""
    cost_interval: PredictionInterval | None = None
    pareto: bool = False
    """No other fitting cluster is both faster to train and cheaper."""
    within_deadline: bool | None = None
    """Trains within the study's deadline (None: no deadline, or does not fit)."""


def study_point(study: StudyRequest, candidate: StudyCandidate, plan: Plan) -> StudyPoint:
    """The outcome of a candidate whose search found a plan."""
    prediction = plan.prediction

    def cost_at(tokens_per_s_per_gpu: float) -> TrainingCost:
        return training_cost(token_budget=study.token_budget,
                             tokens_per_s=tokens_per_s_per_gpu * candidate.num_gpus,
                             num_gpus=candidate.num_gpus, price_per_gpu_hour=candidate.price_per_gpu_hour)

    spent = cost_at(prediction.tokens_per_s_per_gpu)
    ranges: dict[str, PredictionInterval | None] = {"days_interval": None, "cost_interval": None}
    if (throughput := prediction.tokens_per_s_per_gpu_interval) is not None:
        # Time and cost go as one over the throughput: its low end is the long, dear one.
        slow, fast = cost_at(throughput.low), cost_at(throughput.high)
        for name, low, high in (("days", fast.days, slow.days), ("cost", fast.cost, slow.cost)):
            ranges[f"{name}_interval"] = PredictionInterval(
                low=low, high=high, level=throughput.level, basis=throughput.basis
            )
    return StudyPoint(
        **candidate.cluster_fields(), fits=True, calibration_id=candidate.calibration_id,
        plan_hash=plan.plan_hash,
        config_label=plan.config.label(),
        step_time_s=prediction.step_time_s, tokens_per_s=prediction.tokens_per_s,
        tokens_per_s_per_gpu=prediction.tokens_per_s_per_gpu, mfu=prediction.mfu,
        peak_memory_gib=prediction.peak_memory_gib, usable_memory_gib=prediction.usable_memory_gib,
        days=spent.days, gpu_hours=spent.gpu_hours, cost=spent.cost,
        tokens_per_s_per_gpu_interval=prediction.tokens_per_s_per_gpu_interval,
        peak_memory_gib_interval=prediction.peak_memory_gib_interval, **ranges,
    )


def refused_point(candidate: StudyCandidate, error: PlanningError | None = None) -> StudyPoint:
    """The outcome of a candidate that could not be planned: why, in one sentence or two."""
    if error is None:
        reason = candidate.refusal or "not planned"
    elif isinstance(error, InfeasiblePlanError):
        reason = (f"out of memory: the lightest configuration needs {error.min_peak_memory_gib:.1f} GiB "
                  f"per GPU, {error.capacity_gib:.1f} GiB fit")
    else:
        reason = error.message
    return StudyPoint(**candidate.cluster_fields(), fits=False, reason=reason,
                      calibration_id=candidate.calibration_id)


class StudySummary(BaseModel):
    """The study's answer: every point (Pareto and deadline marks set) and the clusters to pick."""

    model_config = ConfigDict(frozen=True)

    points: tuple[StudyPoint, ...]
    fastest: int | None
    """Index of the fitting point that trains soonest."""
    cheapest: int | None
    """Index of the fitting point that costs least."""
    cheapest_within_deadline: int | None
    """Index of the cheapest point that trains within the deadline (None: no deadline, or none does)."""


def summarize(points: list[StudyPoint], *, deadline_days: float | None) -> StudySummary:
    """Mark the time-cost Pareto front and deadlines; name the fastest and cheapest clusters."""
    fitting = [i for i, p in enumerate(points) if p.fits and _finite(p.days, p.cost)]
    front = set(pareto_front([(points[i].days, points[i].cost) for i in fitting]))
    marked = []
    for index, point in enumerate(points):
        on_front = index in fitting and fitting.index(index) in front
        within = None if deadline_days is None or index not in fitting else point.days <= deadline_days
        marked.append(point.model_copy(update={"pareto": on_front, "within_deadline": within}))

    def best(indices: list[int], key: tuple[str, ...]) -> int | None:
        return min(indices, key=lambda i: (*(getattr(points[i], k) for k in key), points[i].num_gpus, i),
                   default=None)

    in_time = [i for i in fitting if marked[i].within_deadline]
    return StudySummary(
        points=tuple(marked),
        fastest=best(fitting, ("days", "cost")),
        cheapest=best(fitting, ("cost", "days")),
        cheapest_within_deadline=best(in_time, ("cost", "days")) if deadline_days is not None else None,
    )


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better on each);
    equal points are all on the front."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best_second = [], math.inf
    previous: tuple[float, float] | None = None
    for i in order:
        if points[i][1] < best_second or points[i] == previous:
            front.append(i)
            best_second = min(best_second, points[i][1])
        previous = points[i] if i in front else previous
    return sorted(front)


def _finite(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def parse_token_count(text: str) -> int:
    """`15T` -> 15_000_000_000_000; `300B`, `2.5e12`, `1_000_000` too. ValueError says what to write."""
    cleaned = text.strip().replace("_", "").replace(",", "")
    match = _COUNT.match(cleaned)
    if match:
        value = float(match.group(1)) * _COUNT_SUFFIXES[match.group(2).upper()]
    elif ASCII_DECIMAL.fullmatch(cleaned):
        value = float(cleaned)
    else:
        raise ValueError(f"cannot read {text!r} as a token count; write e.g. 15T, 300B, 2.5e12 or 1000000")
    if not 1 <= value <= MAX_TOKEN_BUDGET:
        raise ValueError(f"token count {text.strip()!r} is out of range: give 1 to {MAX_TOKEN_BUDGET:,} "
                         f"tokens ({MAX_TOKEN_BUDGET // _COUNT_SUFFIXES['T']:,}T)")
    return round(value)


def parse_cluster_sizes(text: str) -> list[int] | dict[str, int | str]:
    """`64,128` -> [64, 128]; `8-4096` -> a doubling range; `64-512:+64` -> a stepped range (the
    `cluster_sizes` of a StudyRequest). ValueError says what to write."""
    cleaned = text.replace(" ", "")
    if match := _SIZE_RANGE.match(cleaned):
        low, high, step = (_cluster_gpus(count) if count is not None else None for count in match.groups())
        if step is None:
            return {"min_gpus": low, "max_gpus": high}
        return {"min_gpus": low, "max_gpus": high, "progression": "step", "step": step}
    parts = [part for part in cleaned.split(",") if part]
    if not parts or not all(_WHOLE.fullmatch(part) for part in parts):
        raise ValueError(f"cannot read {text!r}; write a list (64,128,512), a doubling range (8-4096) or a "
                         "stepped range (64-512:+64), in ASCII digits")
    return [_cluster_gpus(part) for part in parts]


def _cluster_gpus(count: str) -> int:
    """One size (or step) of `parse_cluster_sizes`, within the bounds every study's sizes keep."""
    value = int(count) if len(count) <= len(str(MAX_CLUSTER_GPUS)) + 2 else MAX_CLUSTER_GPUS + 1
    if not 1 <= value <= MAX_CLUSTER_GPUS:
        shown = count if len(count) <= 20 else count[:20] + "..."
        raise ValueError(f"{shown} is out of range: give 1 to {MAX_CLUSTER_GPUS:,} GPUs")
    return value
