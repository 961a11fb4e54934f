"""Split-conformal 80% intervals from the held-out runs' residuals (issue 37 item 4).

Each held-out run priced at its exact configuration gives a conformity score: |log(predicted /
measured)| for peak memory; for tokens/s, how far the measured value falls outside the band of the
predictions on the GPU type's low and high plausible network where the source did not state its
network (planner/uncertainty.py `network_range`), else outside the prediction itself. A group's
quantile is the ceil((n + 1) x 0.8)-th smallest of its n scores, so that a new run of the same
kind falls inside [prediction / e^q, prediction x e^q] (widened to that band) 80% of the time.

Groups are the GPU type and the parallel dimensions beyond data parallelism (`dimension_key`), the
GPU type alone, the chip, the dimensions alone and everything pooled; a group gets its own quantile
with at least `MIN_GROUP_RUNS` runs from `MIN_GROUP_SOURCES` sources. Mixture-of-experts runs fall
back to a family of their own (`dimension_family`), those without expert parallelism too (their key
names `experts`), so that they leave the dense groups' quantiles as the dense runs set them. Where
the held-out split has too few memory peaks for any quantile (fewer than 4), the fit split's
residuals join them (the group says so).

Coverage is measured honestly: each held-out source's runs against intervals calibrated on the
other held-out sources' runs only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract.mesh import MODEL_PARALLEL_AXES
from planner.catalog.gpus import resolve_gpu
from planner.cost.parameters import CorpusFit
from planner.fidelity.fit import Prices, SourceRun
from planner.fidelity.pricing import PricedRun, run_cluster, run_model
from planner.uncertainty import LEVEL, dimension_family, dimension_key, find_group, network_range

MIN_GROUP_RUNS = 8
MIN_GROUP_SOURCES = 2


@dataclass(frozen=True, slots=True)
class Residual:
    """One priced run's conformity score for one quantity."""

    source: str
    run_id: str
    gpu: str
    chip: str | None
    dims: str
    score: float
    """How far (log) the measured value falls outside the prediction (or its network band); <= 0 inside."""
    split: str
    band: tuple[float, float] = (1.0, 1.0)
    """The predictions on the low and high plausible network over the prediction (throughput)."""


def _network_band(item: SourceRun, priced: PricedRun, fit: CorpusFit, prices: Prices) -> tuple[float, float]:
    """The predictions on the low and high plausible network over the prediction (1, 1 where the
    source states its network or the run is one node)."""
    run = item.run
    cluster = run_cluster(run)
    if run.hardware.network_gbps_per_node is not None or cluster.num_nodes == 1:
        return 1.0, 1.0
    predicted = priced.predicted_tokens_per_s_per_gpu
    edges = []
    for gbps in network_range(run.hardware.gpu):
        hardware = run.hardware.model_copy(update={"network_gbps_per_node": gbps})
        other = SourceRun(item.source, run.model_copy(update={"hardware": hardware}))
        edges.append(prices(other, fit).predicted_tokens_per_s_per_gpu / predicted)
    return min(1.0, *edges), max(1.0, *edges)


def residuals(
    priced: Sequence[tuple[SourceRun, PricedRun]], *, fit: CorpusFit, prices: Prices, split: str
) -> dict[str, list[Residual]]:
    """The throughput and memory conformity scores of `priced`."""
    out: dict[str, list[Residual]] = {"throughput": [], "memory": []}
    for item, result in priced:
        run = item.run
        spec = resolve_gpu(run.hardware.gpu)
        experts = run_model(run).moe is not None
        common = dict(source=item.source, run_id=run.id, gpu=spec.name, chip=spec.chip,
                      dims=dimension_key(run.config.mesh, experts=experts), split=split)
        if spec.is_cpu:  # a run on CPU tests nothing a GPU plan carries
            continue
        if result.throughput_error is not None:
            ratio = 1.0 + result.throughput_error
            low, high = _network_band(item, result, fit, prices)
            score = max(math.log(ratio * low), -math.log(ratio * high))
            out["throughput"].append(Residual(**common, score=score, band=(low, high)))  # type: ignore[arg-type]
        if result.memory_error is not None:
            score = abs(math.log1p(result.memory_error))
            out["memory"].append(Residual(**common, score=score))  # type: ignore[arg-type]
    return out


def conformal_quantile(scores: Sequence[float], level: float = LEVEL) -> float:
    """The ceil((n + 1) x level)-th smallest score (the largest when n is too small for it)."""
    ordered = sorted(scores)
    k = min(len(ordered), math.ceil((len(ordered) + 1) * level))
    return ordered[k - 1]


def _group_keys(r: Residual) -> list[tuple[str, str]]:
    # An expert-parallel run's wildcard is its family's (`dimension_family`): it stays out of the
    # dense runs' groups, the pooled one (a dense run's ("*", "*")) included.
    family = dimension_family(r.dims)
    return [(r.gpu, r.dims), (r.gpu, family), (f"chip:{r.chip}", family), ("*", r.dims), ("*", family)]


def groups(found: Sequence[Residual]) -> list[dict[str, Any]]:
    """The quantile of every group with enough runs and sources, and the pooled one."""
    members: dict[tuple[str, str], list[Residual]] = {}
    for r in found:
        for key in _group_keys(r):
            members.setdefault(key, []).append(r)
    out = []
    for (gpu, dims), rs in sorted(members.items()):
        sources = len({r.source for r in rs})
        pooled = (gpu, dims) == ("*", "*")
        if not pooled and (len(rs) < MIN_GROUP_RUNS or sources < MIN_GROUP_SOURCES):
            continue
        splits = sorted({r.split for r in rs})
        out.append({
            "gpu": gpu, "dims": dims, "runs": len(rs), "sources": sources, "split": "+".join(splits),
            "q": round(conformal_quantile([r.score for r in rs]), 4),
        })
    return out


def covered(r: Residual, calibration: Sequence[dict[str, Any]]) -> bool:
    group = find_group(calibration, gpu=r.gpu, chip=r.chip, dims=r.dims)
    return r.score <= max(0.0, group["q"])


def cross_validated(
    held_out: Sequence[Residual], extra: Sequence[Residual] = ()
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per held-out run (source, run id): the group calibrated on the other held-out sources (and
    `extra`), whether it covers the run."""
    out = {}
    for source in sorted({r.source for r in held_out}):
        others = [r for r in held_out if r.source != source]
        if not others and not extra:
            continue
        calibration = groups([*others, *extra])
        for r in held_out:
            if r.source == source:
                group = find_group(calibration, gpu=r.gpu, chip=r.chip, dims=r.dims)
                out[(r.source, r.run_id)] = {"q": max(0.0, group["q"]), "covered": covered(r, calibration)}
    return out


def fewest_for_a_quantile(level: float = LEVEL) -> int:
    """The fewest scores whose conformal quantile is one of them: ceil((n + 1) x level) <= n (4 at
    80%); with fewer, split conformal has no finite quantile to give."""
    n = 1
    while math.ceil((n + 1) * level) > n:
        n += 1
    return n


def calibrate(
    held_out: dict[str, list[Residual]], fit_split: dict[str, list[Residual]]
) -> dict[str, list[Residual]]:
    """The residuals each quantity is calibrated on: the held-out ones, joined by the fit split's
    only where the held-out split has too few for any quantile (`fewest_for_a_quantile`). In-sample
    residuals understate how far a prediction misses a run the fit never saw (the fit split's peaks
    are priced 5% off on average, the held-out ones 8%): mixed in, they narrow the interval below
    what it claims to cover."""
    return {
        quantity: found if len(found) >= fewest_for_a_quantile() else [*found, *fit_split[quantity]]
        for quantity, found in held_out.items()
    }


def lead_calibration(priced: Sequence[tuple[SourceRun, PricedRun]]) -> dict[str, Any] | None:
    """How surely the model ranks two configurations of one setup: the quantile of |log(predicted
    ratio / measured ratio)| over every pair of `priced` runs from one source on one GPU type and
    one model (the held-out runs). A pick and its runner-up share their model, GPU and cluster, so
    most of the model's error is common to both and cancels in their ratio; what is left is what
    this measures. None where the runs make too few pairs for a quantile."""
    errors: dict[tuple[str, str, str], list[float]] = {}
    for item, result in priced:
        if result.throughput_error is None:
            continue
        model = item.run.config.model
        name = model if isinstance(model, str) else model.name
        setup = (item.source, item.run.hardware.gpu, name)
        errors.setdefault(setup, []).append(math.log1p(result.throughput_error))
    pairs = {key: [abs(a - b) for a, b in itertools.combinations(found, 2)] for key, found in errors.items()}
    scores = [score for found in pairs.values() for score in found]
    if len(scores) < fewest_for_a_quantile():
        return None
    return {
        "pairs": len(scores),
        "sources": len({source for (source, _, _), found in pairs.items() if found}),
        "split": "held-out",
        "q": round(conformal_quantile(scores), 4),
    }


def reach(priced: Sequence[tuple[SourceRun, PricedRun]]) -> dict[str, Any]:
    """What the priced runs cover: GPU types, the largest cluster, each dimension's largest degree."""
    runs = [item.run for item, _ in priced if not resolve_gpu(item.run.hardware.gpu).is_cpu]
    meshes = [run.config.mesh for run in runs]
    return {
        "gpus": sorted({resolve_gpu(run.hardware.gpu).name for run in runs}),
        "max_gpus": max(mesh.world_size for mesh in meshes),
        "max_degree": {axis: max(getattr(mesh, axis) for mesh in meshes) for axis in MODEL_PARALLEL_AXES},
    }


__all__ = [
    "MIN_GROUP_RUNS", "Residual", "calibrate", "conformal_quantile", "cross_validated",
    "fewest_for_a_quantile", "groups", "lead_calibration", "reach", "residuals",
]
