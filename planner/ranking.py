"""Rank priced configurations and explain why the others lost.

The search (planner/search.py) prices configurations into `Evaluated` entries; this module orders
them, picks distinct alternatives and the throughput/memory Pareto front, and says for every other
family (sharding x compile, and each model-parallel degree) why it was not chosen, each
configuration once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from contract.mesh import Mesh
from planner.cost.estimate import Estimator, TimeEstimate
from planner.cost.memory import MemoryEstimate
from planner.cost.parameters import GIB
from planner.cost.setting import Choice, Setting
from planner.formatting import duration
from planner.plan import RejectedFamily

PARETO_LIMIT = 40


@dataclass(frozen=True, slots=True)
class Evaluated:
    """One priced configuration. `time` is None when it does not fit (`fits` False), or when it
    fits but the search proved it beaten without timing it (planner/search.py's floor test)."""

    choice: Choice
    memory: MemoryEstimate
    time: TimeEstimate | None
    tokens_per_s_per_gpu: float
    fits: bool = True

    @classmethod
    def untimed(cls, choice: Choice, memory: MemoryEstimate, *, fits: bool) -> Evaluated:
        return cls(choice, memory, None, 0.0, fits)

    @classmethod
    def priced(
        cls, setting: Setting, choice: Choice, memory: MemoryEstimate, time: TimeEstimate | None
    ) -> Evaluated:
        """An entry with its throughput: each data-parallel rank's tokens, shared by its tp GPUs."""
        if time is None:
            return cls.untimed(choice, memory, fits=False)
        return cls(choice, memory, time, cls.throughput(setting, choice, time.step_time_s))

    @staticmethod
    def throughput(setting: Setting, choice: Choice, step_time_s: float) -> float:
        """Tokens/s per GPU: each data-parallel rank's tokens, shared by its tensor-parallel GPUs."""
        return setting.seq_len * choice.sequences_per_step / step_time_s / choice.mesh.model_parallel

    @property
    def peak_gib(self) -> float:
        return self.memory.total / GIB


def ranked(fitting: list[Evaluated]) -> list[Evaluated]:
    """Fastest first; ties broken by memory, then by the choice's fields, so the ranking never
    depends on enumeration details."""
    return sorted(
        fitting, key=lambda e: (-round(e.tokens_per_s_per_gpu, 6), round(e.peak_gib, 6), repr(e.choice))
    )


def distinct(best: Evaluated, ranked: list[Evaluated], k: int) -> list[Evaluated]:
    """The next k configurations that differ in more than bucket caps that change nothing."""

    def key(e: Evaluated) -> tuple:
        c = e.choice
        return (
            c.sharding,
            c.mesh,
            c.blocks_per_unit,
            c.checkpointing,
            c.every_k,
            c.micro_batch_size,
            c.compile,
            round(e.tokens_per_s_per_gpu, 3),
        )

    seen: set[tuple] = {key(best)}
    out: list[Evaluated] = []
    for e in ranked:
        if key(e) in seen:
            continue
        seen.add(key(e))
        out.append(e)
        if len(out) == k:
            break
    return out


def pareto(ranked: list[Evaluated]) -> list[Evaluated]:
    """Configurations no other beats on both throughput and peak memory (ranked: fastest first)."""
    front: list[Evaluated] = []
    lowest = math.inf
    for e in ranked:
        if e.peak_gib < lowest - 1e-9:
            front.append(e)
            lowest = e.peak_gib
    if len(front) > PARETO_LIMIT:
        step = (len(front) - 1) / (PARETO_LIMIT - 1)
        front = [front[round(i * step)] for i in range(PARETO_LIMIT)]
    return front


def rejected_families(
    evaluated: list[Evaluated], best: Evaluated, limit: Callable[[Mesh], float], estimator: Estimator
) -> list[RejectedFamily]:
    """Why every other family lost, each configuration once. The families are each sharding x
    compile family (a hybrid shard group its own) and, when the search tried more than one, each
    model-parallel degree (pp x cp x tp). A family is shown by the member that stands for it (its
    fastest, or the one closest to fitting), labelled with that member's sharding, whole mesh and
    compile mode (`Choice.mesh_family`): a sharding family spans every degree, a degree every
    sharding. Two families whose members standing for them share that label are one configuration
    seen twice (the fastest tp=4 configuration is often the fastest no_shard one: the same member,
    the same reason), so they are one row. `limit` is the largest peak a configuration on a mesh
    may have (its memory margin depends on the mesh)."""
    by_sharding: dict[str, list[Evaluated]] = {}
    by_degree: dict[str, list[Evaluated]] = {}
    for e in evaluated:
        by_sharding.setdefault(e.choice.family, []).append(e)
        by_degree.setdefault(e.choice.tp_family, []).append(e)
    families = [members for family, members in by_sharding.items() if family != best.choice.family]
    if len(by_degree) > 1:
        families += [members for family, members in by_degree.items() if family != best.choice.tp_family]
    rows: dict[str, RejectedFamily] = {}
    for members in families:
        row = _why_lost(members, best, limit, estimator)
        seen = rows.get(row.family)
        if seen is not None and seen.min_peak_memory_gib is not None and row.min_peak_memory_gib is not None:
            # The same configuration for both families: the least peak is over both.
            row = seen.model_copy(
                update={"min_peak_memory_gib": min(seen.min_peak_memory_gib, row.min_peak_memory_gib)}
            )
        rows[row.family] = row
    return sorted(
        rows.values(), key=lambda r: (r.kind != "slower", -(r.best_tokens_per_s_per_gpu or 0.0), r.family)
    )


def _why_lost(
    members: list[Evaluated], best: Evaluated, limit: Callable[[Mesh], float], estimator: Estimator
) -> RejectedFamily:
    # A family with a fitting member has a timed one: the search times each family's fastest.
    fitting = [e for e in members if e.time is not None]
    if not any(e.fits for e in members):
        closest = min(members, key=lambda e: (e.peak_gib - limit(e.choice.mesh), e.peak_gib))
        smallest, most = closest.peak_gib, limit(closest.choice.mesh)
        return RejectedFamily(
            family=closest.choice.mesh_family,
            kind="oom",
            reason=f"OOM by {smallest - most:.1f} GiB: needs at least {smallest:.1f} GiB per GPU, "
            f"at most {most:.1f} GiB fits with the memory margin",
            min_peak_memory_gib=smallest,
            memory_limit_gib=most,
        )
    top = max(fitting, key=lambda e: (e.tokens_per_s_per_gpu, -e.peak_gib))
    return RejectedFamily(
        family=top.choice.mesh_family,
        kind="slower",
        reason=slower_reason(top, best, estimator),
        best_tokens_per_s_per_gpu=top.tokens_per_s_per_gpu,
        min_peak_memory_gib=min(e.peak_gib for e in members),
    )


TIE_FRACTION = 0.001
"""A loser this close to the winner's throughput ties it: its reason names no cause."""
MATERIAL_SHARE = 0.25
"""A cost is named beside the largest only when its excess is at least this share of the largest's."""


def cost_components(e: Evaluated, estimator: Estimator) -> dict[str, float]:
    """The priced costs a reason may name, in seconds per token one data-parallel rank handles
    (so that micro-batching and tp stay comparable): they add up to the step's time."""
    t = e.time
    assert t is not None
    recompute_s, eager_s = estimator.compute_parts(e.choice)
    reduce_name = "all-reduce" if e.choice.sharding == "no_shard" else "reduce-scatter"
    seconds = {
        "recomputation": recompute_s,
        "unfused eager kernels": eager_s,
        "compute": t.compute_s - recompute_s - eager_s - t.optimizer_s - t.overhead_s,
        "optimizer step": t.optimizer_s,
        "framework overhead": t.overhead_s,
        "exposed all-gather": t.exposed_all_gather_s,
        f"exposed {reduce_name}": t.exposed_reduce_s,
        f"tp={e.choice.mesh.tp} per-layer collectives": t.tensor_parallel_s,
        f"ep={e.choice.mesh.ep} all-to-alls": t.expert_parallel_s,
        "pipeline bubble": t.pipeline_bubble_s,
        "pipeline sends": t.pipeline_p2p_s,
    }
    share = e.choice.mesh.model_parallel / e.choice.sequences_per_step
    return {name: s * share for name, s in seconds.items()}


def excess_costs(loser: Evaluated, best: Evaluated, estimator: Estimator) -> dict[str, float]:
    """Each of the loser's costs less the winner's same kind of cost, in seconds per loser's step
    (the winner's all-reduce stands against a reduce-scatter, its tp collectives against any)."""

    def kind(name: str) -> str:
        if name.endswith("per-layer collectives"):
            return "per-layer collectives"
        return name.replace("all-reduce", "reduce").replace("reduce-scatter", "reduce").split("=")[0]

    winner = {kind(n): s for n, s in cost_components(best, estimator).items()}
    per_step = loser.choice.sequences_per_step / loser.choice.mesh.model_parallel
    excess = {
        name: (s - winner[kind(name)]) * per_step
        for name, s in cost_components(loser, estimator).items()
    }
    if loser.choice.float8 != best.choice.float8:
        # The precision is what makes the compute differ: say so.
        compute = excess.pop("compute")
        excess[f"compute with {_matmul_precision(loser.choice)} matmuls (chosen: "
               f"{_matmul_precision(best.choice)})"] = compute
    return excess


def _matmul_precision(choice: Choice) -> str:
    return "bf16" if choice.float8 == "none" else f"float8 {choice.float8}"


def slower_reason(loser: Evaluated, best: Evaluated, estimator: Estimator) -> str:
    """`17% slower: exposed all-gather +41 ms/step`: the costs the loser pays materially more of
    than the winner, with the excess; `ties the chosen plan within 0.1%` when there is none to name."""
    assert loser.time is not None and best.time is not None
    slower_fraction = 1.0 - loser.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu
    if slower_fraction < TIE_FRACTION:
        more = loser.peak_gib - best.peak_gib
        return f"ties the chosen plan within {TIE_FRACTION:.1%}" + (
            f": needs {more:.1f} GiB more per GPU" if more >= 0.05 else ""
        )
    slower = f"{slower_fraction:.0%}" if slower_fraction >= 0.01 else f"{slower_fraction:.1%}"
    excess = sorted(excess_costs(loser, best, estimator).items(), key=lambda kv: -kv[1])
    largest = excess[0][1]
    named = [(n, s) for n, s in excess[:2] if s > 0 and s >= MATERIAL_SHARE * largest]
    if not named:
        return f"{slower} slower: many small costs"
    return f"{slower} slower: " + " and ".join(f"{n} +{duration(s)}/step" for n, s in named)
