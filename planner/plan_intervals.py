"""The 80% intervals a plan's numbers carry, and the warnings they imply.

planner/uncertainty.py says how far the cost model's tokens/s per GPU and peak memory stray from
what runs that no fit read measured (by GPU type and parallel dimensions), what an unstated network
costs, and where the corpus ends. This module puts that on the numbers a person reads: the pick's
prediction, each alternative and each configuration of the Pareto front (a handful per plan: never
per enumerated configuration, so that the search costs what it did), and says when the pick's lead
over the runner-up is inside its interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.cost.estimate import Estimator
from planner.cost.parameters import default_parameters
from planner.cost.setting import Choice, Setting
from planner.formatting import between
from planner.plan import Candidate, PlanWarning, Prediction, PredictionInterval, RejectedFamily
from planner.ranking import Evaluated
from planner.specs import ClusterSpec, PlanRequest
from planner.uncertainty import (
    Interval,
    coverage_warnings,
    lead_uncertainty,
    memory_interval,
    network_assumed,
    network_spread,
    throughput_interval,
)


def document_interval(interval: Interval) -> PredictionInterval:
    """The plan document's form of an interval."""
    return PredictionInterval(
        low=interval.low, high=interval.high, level=interval.level, basis=interval.basis
    )


@dataclass
class PlanIntervals:
    """Intervals for the configurations of one request's plan (one setting: its calibration and
    cost parameters). Where the cluster leaves its network unstated, each configuration is priced
    again on the GPU type's low and high plausible network, with this setting otherwise."""

    request: PlanRequest
    setting: Setting
    estimator: Estimator | None = None
    """The search's, whose collective layouts the prices on other networks share (`with_params`)."""
    _estimators: dict[float | None, Estimator | None] = field(default_factory=dict)
    _of: dict[Choice, dict[str, PredictionInterval]] = field(default_factory=dict)
    """The alternatives and the Pareto front often share configurations: each is worked out once."""

    @property
    def network_assumed(self) -> bool:
        return network_assumed(self.request.cluster)

    def of(self, e: Evaluated) -> dict[str, PredictionInterval]:
        """`tokens_per_s_per_gpu_interval` and `peak_memory_gib_interval` for a timed configuration."""
        if e.choice not in self._of:
            self._of[e.choice] = self._intervals(e)
        return self._of[e.choice]

    def _intervals(self, e: Evaluated) -> dict[str, PredictionInterval]:
        cluster, mesh = self.request.cluster, e.choice.mesh
        gpu = cluster.resolved_gpu()  # a GPU of the user's own has no catalog name
        spread = network_spread(cluster=cluster, price=lambda other: self._tokens(other, e))
        experts = self.setting.model.has_routed_experts
        throughput = throughput_interval(
            predicted=e.tokens_per_s_per_gpu, gpu=gpu, mesh=mesh,
            network_stated=not self.network_assumed, spread=spread, experts=experts,
        )
        memory = memory_interval(predicted_gib=e.peak_gib, gpu=gpu, mesh=mesh, experts=experts)
        return {
            "tokens_per_s_per_gpu_interval": document_interval(throughput),
            "peak_memory_gib_interval": document_interval(memory),
        }

    def warnings(self, e: Evaluated) -> tuple[PlanWarning, ...]:
        """Where the pick goes past what the corpus reaches, and an assumed network."""
        return tuple(
            PlanWarning(code=caveat.code, message=caveat.message)  # type: ignore[arg-type]
            for caveat in coverage_warnings(cluster=self.request.cluster, mesh=e.choice.mesh)
        )

    def _tokens(self, cluster: ClusterSpec, e: Evaluated) -> float:
        """Tokens/s per GPU of `e`'s configuration on `cluster`'s network, everything else as this
        setting prices it (its calibration and parameter overrides): only the inter-node link changes,
        by the catalog's own rule (`default_parameters`)."""
        key = cluster.inter_node_bandwidth_gbps
        if key not in self._estimators:
            params = self.setting.params
            inter = default_parameters(cluster.resolved_gpu(), cluster, self.setting.precision).links["inter"]
            # The network the plan was priced on (the catalog's NIC is often an end of the range):
            # nothing to price again.
            base = self.estimator or Estimator(self.setting)
            self._estimators[key] = None if inter == params.links["inter"] else base.with_params(
                params.with_changes(links={**params.links, "inter": inter})
            )
        estimator = self._estimators[key]
        if estimator is None:
            return e.tokens_per_s_per_gpu
        return Evaluated.throughput(estimator.setting, e.choice, estimator.timing(e.choice).step_time_s)


def lead_within_interval(
    prediction: Prediction, alternatives: tuple[Candidate, ...], rejected: tuple[RejectedFamily, ...]
) -> PlanWarning | None:
    """A warning when the cost model cannot tell the pick from the runner-up: the runner-up's
    predicted throughput is within how far the model misranks two configurations of one setup
    (`lead_uncertainty`: measured on pairs of held-out runs, since the pick and the runner-up share
    their model, GPU and cluster and so most of the model's error), or, where no pairs were
    measured, inside the pick's interval. The runner-up is the fastest other family (one that lost
    on speed alone: planner/ranking.py); the alternatives, which often differ from the pick by a
    bucket cap only, stand in where no other family fits."""
    interval = prediction.tokens_per_s_per_gpu_interval
    families = [(r.best_tokens_per_s_per_gpu, r.family) for r in rejected
                if r.kind == "slower" and r.best_tokens_per_s_per_gpu is not None]
    others = families or [(a.tokens_per_s_per_gpu, a.config.label()) for a in alternatives[:1]]
    if interval is None or not others:
        return None
    tokens, name = max(others)
    pick = prediction.tokens_per_s_per_gpu
    paired = lead_uncertainty()
    if paired is None:
        if tokens < interval.low:
            return None
        evidence = f"the pick's {interval.level:.0%} interval is {between(interval.low, interval.high)}"
    else:
        if tokens < pick / math.exp(paired.q):
            return None
        evidence = (
            f"{paired.level:.0%} of the time the model ranks two configurations of one setup to within "
            f"{math.expm1(paired.q):.0%} ({paired.pairs} pairs of held-out runs, {paired.sources} sources)"
        )
    return PlanWarning(
        code="lead_within_interval",
        message=(
            f"the pick's lead is inside what the model can tell apart: the runner-up, {name}, is predicted "
            f"{1.0 - tokens / pick:.1%} slower ({tokens:,.0f} against {pick:,.0f} tokens/s/GPU), and "
            f"{evidence}; where it matters, run both for a few steps (`fsdp-planner validate`) and keep "
            "the faster"
        ),
    )
