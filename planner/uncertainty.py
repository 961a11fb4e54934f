"""How sure a prediction is: 80% intervals on tokens/s per GPU and peak memory, and where the corpus ends.

The intervals are split-conformal (planner/fidelity/intervals.py computes them, `fsdp-planner fidelity
--write` stores them in planner/fidelity/intervals.json): the held-out sources' runs, which no fit
reads, are priced at their exact configurations, and the 80% quantile of their log errors
|log(predicted / measured)| becomes a factor the prediction is divided and multiplied by. A group (GPU
type or chip, and the parallel dimensions beyond data parallelism) gets a quantile of its own where
enough held-out runs fall in it; otherwise the pooled one applies.

A cluster that does not state its network (`ClusterSpec.inter_node_bandwidth_gbps`) is priced on the
catalog's NIC; what that unknown costs is the spread between the plan priced on a low and a high
plausible network for the GPU type (`network_spread`), and the throughput interval spans it.

This module only reads data: the web process, the search and the CLI may call it freely.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from contract.mesh import AXES, Mesh
from planner.catalog.gpus import resolve_gpu
from planner.gpu_spec import GpuSpec
from planner.specs import ClusterSpec

INTERVALS_PACKAGE = "planner.fidelity"
INTERVALS_RESOURCE = "intervals.json"
LEVEL = 0.8
"""The intervals' nominal coverage: 4 runs in 5 measure inside them."""
EXTRA_DIMENSIONS = tuple(axis.name for axis in AXES if not axis.data_parallel)
"""The mesh axes beyond data parallelism that name an interval's group (`dimension_key`): the model-
parallel ones and expert parallelism, whose all-to-alls and grouped GEMMs are errors of their own."""
NETWORK_RANGES_GBPS_PER_NODE: dict[str, tuple[float, float]] = {
    # A100 clusters: AWS p4d.24xlarge nodes have 400 Gb/s of EFA; a DGX A100 SuperPOD 8 x 200 Gb/s
    # HDR InfiniBand (the catalog's NIC).
    "GA100": (400.0, 1600.0),
    # H100 / H200 clusters: 8 x 100 Gb/s Ethernet-class nodes to a DGX SuperPOD's (and AWS p5's)
    # 8 x 400 Gb/s (the catalog's NIC).
    "GH100": (800.0, 3200.0),
}
"""The low and high plausible network of a chip's clusters, Gb/s per node each way: what a plan on
a cluster that does not state its network is also priced on. Chips not named here: a quarter of
the catalog's NIC to the catalog's NIC (`network_range`)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """Where the measured value should fall, `level` of the time."""

    low: float
    high: float
    level: float = LEVEL
    basis: str = ""
    """Which held-out runs calibrated it, in words a plan shows (e.g. `H100-SXM-80GB, 12 held-out
    runs`), and what widened it (the network, where it was assumed)."""

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


@dataclass(frozen=True, slots=True)
class NetworkSpread:
    """A plan priced on the low and the high plausible network of its GPU type (the cluster did
    not state its own)."""

    low_gbps_per_node: float
    high_gbps_per_node: float
    tokens_per_s_low_network: float
    tokens_per_s_high_network: float


@dataclass(frozen=True, slots=True)
class LeadUncertainty:
    """How far the model misranks two configurations of one setup, `level` of the time: the
    quantile `q` of |log(predicted ratio / measured ratio)| over pairs of held-out runs from one
    source on one GPU type and model (planner/fidelity/intervals.py `lead_calibration`)."""

    q: float
    pairs: int
    sources: int
    level: float = LEVEL


def lead_uncertainty() -> LeadUncertainty | None:
    """The stored paired quantile (None where the held-out runs made too few pairs, or an older
    intervals.json has none)."""
    lead = interval_data().get("lead")
    if not lead:
        return None
    return LeadUncertainty(q=lead["q"], pairs=lead["pairs"], sources=lead["sources"])


@dataclass(frozen=True, slots=True)
class Caveat:
    """A named warning about a prediction (a plan carries it as a `PlanWarning` of the same code)."""

    code: str
    """`network_assumed`, `gpu_outside_corpus`, `cluster_size_outside_corpus`, `degree_outside_corpus`."""
    message: str


def dimension_key(mesh: Mesh, *, experts: bool = False) -> str:
    """The parallel dimensions beyond data parallelism a mesh uses (`dp` for FSDP / DDP alone). A
    mixture of experts (`experts`) without expert parallelism adds `EXPERTS_DIMENSION`."""
    used = [axis for axis in EXTRA_DIMENSIONS if getattr(mesh, axis) > 1]
    if experts and mesh.ep == 1:
        used.append(EXPERTS_DIMENSION)
    return "+".join(used) or "dp"


EXPERT_FAMILY = "ep*"
"""The wildcard of expert-parallel dimensions: mixture-of-experts runs form groups of their own (their
all-to-alls and grouped GEMMs err their own way), so that their residuals neither widen nor narrow a
dense plan's interval; `*` is the dense runs' wildcard."""


EXPERTS_DIMENSION = "experts"
"""The dimension a mixture of experts sharded by FSDP alone (ep 1) names: its routed experts' grouped
GEMMs and dispatch err as the expert-parallel runs' do, so it joins their family, not the dense one."""


def dimension_family(dims: str) -> str:
    """The wildcard a `dimension_key` falls back to: `EXPERT_FAMILY` where it uses ep or names a
    mixture of experts without it, else `*`."""
    parts = dims.split("+")
    return EXPERT_FAMILY if "ep" in parts or EXPERTS_DIMENSION in parts else "*"


@cache
def interval_data() -> dict[str, Any]:
    """The stored quantiles, network ranges and corpus reach (planner/fidelity/intervals.json)."""
    text = resources.files(INTERVALS_PACKAGE).joinpath(INTERVALS_RESOURCE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _spec(gpu: str | GpuSpec) -> GpuSpec:
    """A catalog name's entry, or a resolved one as it is (a GPU of the user's own has no name the
    catalog knows: `ClusterSpec.resolved_gpu`)."""
    return gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)


def _group(quantity: str, gpu: str | GpuSpec, mesh: Mesh, *, experts: bool) -> dict[str, Any]:
    spec = _spec(gpu)
    dims = dimension_key(mesh, experts=experts)
    return find_group(interval_data()[quantity], gpu=spec.name, chip=spec.chip, dims=dims)


def find_group(groups: Sequence[dict[str, Any]], *, gpu: str, chip: str | None, dims: str) -> dict[str, Any]:
    """The most specific of `groups` for a GPU type and its dimensions: (GPU type, dimensions), GPU
    type, chip, dimensions, their family (expert-parallel or dense: `dimension_family`), then pooled
    (which every calibration has)."""
    by_key = {(g["gpu"], g["dims"]): g for g in groups}
    family = dimension_family(dims)
    for key in ((gpu, dims), (gpu, family), (f"chip:{chip}", family), ("*", dims), ("*", family), ("*", "*")):
        if key in by_key:
            return by_key[key]
    raise KeyError(f"{INTERVALS_RESOURCE}: no pooled group; run `fsdp-planner fidelity --write`")


def _basis(group: dict[str, Any]) -> str:
    where = "all GPU types" if group["gpu"] == "*" else group["gpu"].removeprefix("chip:")
    dims = "" if group["dims"] == "*" else f", {group['dims']}"
    return f"{where}{dims}: {group['runs']} {group['split']} runs from {group['sources']} sources"


def throughput_interval(
    *,
    predicted: float,
    gpu: str | GpuSpec,
    mesh: Mesh,
    network_stated: bool = True,
    spread: NetworkSpread | None = None,
    experts: bool = False,
) -> Interval:
    """The 80% interval on a plan's tokens/s per GPU (`experts`: of a mixture-of-experts model). Where
    the network was assumed, `spread` (from `network_spread`) widens it to the predictions on the low
    and the high plausible network."""
    group = _group("throughput", gpu, mesh, experts=experts)
    q = max(0.0, group["q"])
    low = high = predicted
    basis = _basis(group)
    if not network_stated and spread is not None:
        low = min(low, spread.tokens_per_s_low_network)
        high = max(high, spread.tokens_per_s_high_network)
        basis += (
            f"; network not stated: spans {spread.low_gbps_per_node:g}-{spread.high_gbps_per_node:g} Gb/s "
            "per node"
        )
    return Interval(low=low * math.exp(-q), high=high * math.exp(q), basis=basis)


def memory_interval(
    *, predicted_gib: float, gpu: str | GpuSpec, mesh: Mesh, experts: bool = False
) -> Interval:
    """The 80% interval on a plan's peak memory per GPU (GiB) (`experts`: of a mixture-of-experts
    model)."""
    group = _group("memory", gpu, mesh, experts=experts)
    q = max(0.0, group["q"])
    return Interval(low=predicted_gib * math.exp(-q), high=predicted_gib * math.exp(q), basis=_basis(group))


def network_range(gpu: str | GpuSpec) -> tuple[float, float]:
    """The low and high plausible network of a GPU type's clusters, Gb/s per node each way
    (`NETWORK_RANGES_GBPS_PER_NODE`)."""
    spec = _spec(gpu)
    if spec.chip in NETWORK_RANGES_GBPS_PER_NODE:
        return NETWORK_RANGES_GBPS_PER_NODE[spec.chip]
    catalog = spec.inter_node_bandwidth_gbps * 8 * spec.default_gpus_per_node
    return catalog / 4, catalog


def network_assumed(cluster: ClusterSpec) -> bool:
    """Whether a cluster's plan rests on the catalog's network rather than one the request stated:
    one that spans nodes and leaves `inter_node_bandwidth_gbps` out."""
    return cluster.num_nodes > 1 and cluster.inter_node_bandwidth_gbps is None


def network_spread(*, cluster: ClusterSpec, price: Callable[[ClusterSpec], float]) -> NetworkSpread | None:
    """What the unstated network costs: `price` (tokens/s per GPU of the same configuration on a
    cluster) on the GPU type's low and high plausible network. None where the network is stated or
    the cluster is one node. Call it for the plans a person reads, not per candidate (two pricings)."""
    if not network_assumed(cluster):
        return None
    low, high = network_range(cluster.resolved_gpu())
    def on(gbps_per_node: float) -> float:  # ClusterSpec states GB/s per GPU
        per_gpu = gbps_per_node / 8 / cluster.gpus_per_node
        return price(cluster.model_copy(update={"inter_node_bandwidth_gbps": per_gpu}))

    return NetworkSpread(
        low_gbps_per_node=low, high_gbps_per_node=high,
        tokens_per_s_low_network=on(low), tokens_per_s_high_network=on(high),
    )


def coverage_warnings(*, cluster: ClusterSpec, mesh: Mesh) -> tuple[Caveat, ...]:
    """Named warnings where a plan goes past what the corpus' priced runs reach: a GPU type none ran
    on (or whose every held-out run the model over-predicted past its interval), more GPUs than the
    largest run, a parallel degree above any run's, and an assumed network."""
    reach = interval_data()["reach"]
    spec = cluster.resolved_gpu()
    out: list[Caveat] = []
    if spec.name not in reach["gpus"]:
        out.append(Caveat("gpu_outside_corpus", (
            f"no priced run of the corpus ran on {spec.name} (it has {', '.join(reach['gpus'])}): its "
            "predictions rest on the datasheet alone; calibrate on the GPU (`fsdp-planner calibrate`) "
            "before trusting the interval"
        )))
    missed = reach.get("optimistic_gpus", {}).get(spec.name)
    if missed:
        runs = int(missed["runs"])
        out.append(Caveat("optimistic_throughput", (
            f"optimistic throughput on {spec.name}: {'the' if runs == 1 else 'all'} {runs} published "
            f"run{'s' if runs > 1 else ''} on it the model has priced ran slower than priced and outside "
            f"the 80% interval, by up to {1 + missed['worst']:.2f}x: take this plan's tokens/s as an "
            "upper bound until a calibration on the GPU (`fsdp-planner calibrate`) measures it"
        )))
    world = cluster.num_nodes * cluster.gpus_per_node
    if world > reach["max_gpus"]:
        out.append(Caveat("cluster_size_outside_corpus", (
            f"{world} GPUs: the corpus' largest priced run used {reach['max_gpus']}; communication at "
            "this scale is priced by the model alone"
        )))
    for axis, most in reach["max_degree"].items():
        degree = getattr(mesh, axis)
        if degree > most:
            out.append(Caveat("degree_outside_corpus", (
                f"{axis}={degree}: no priced run of the corpus went past {axis}={most}"
            )))
    if network_assumed(cluster):
        low, high = network_range(cluster.resolved_gpu())
        out.append(Caveat("network_assumed", (
            f"the cluster does not state its network: priced on the catalog's "
            f"{spec.inter_node_bandwidth_gbps * 8 * cluster.gpus_per_node:g} Gb/s per node; the tokens/s "
            f"interval spans {low:g}-{high:g} Gb/s per node (cluster.inter_node_bandwidth_gbps states it)"
        )))
    return tuple(out)


__all__ = [
    "Caveat", "Interval", "LeadUncertainty", "NetworkSpread", "coverage_warnings", "dimension_family",
    "dimension_key",
    "find_group", "lead_uncertainty", "memory_interval", "network_assumed", "network_range", "network_spread",
    "throughput_interval",
]
