"""Rank priced configurations and explain why the others lost.

The search (planner/search.py) prices configurations into `Evaluated` entries; this module orders
them, picks distinct alternatives and the throughput/memory Pareto front, and says for every other
family (sharding x compile, and each tensor-parallel degree) why it was not chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.estimate import TimeEstimate
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
        return setting.seq_len * choice.sequences_per_step / step_time_s / choice.mesh.tp

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


def rejected_families(evaluated: list[Evaluated], best: Evaluated, limit: float) -> list[RejectedFamily]:
    """For each family other than the winner's, why it lost: each sharding x compile family, and
    (when the search tried more than one) each tensor-parallel degree."""
    by_sharding: dict[str, list[Evaluated]] = {}
    by_tp: dict[str, list[Evaluated]] = {}
    for e in evaluated:
        by_sharding.setdefault(e.choice.family, []).append(e)
        by_tp.setdefault(e.choice.tp_family, []).append(e)
    out = [
        _why_lost(family, members, best, limit)
        for family, members in by_sharding.items()
        if family != best.choice.family
    ]
    if len(by_tp) > 1:
        out += [
            _why_lost(family, members, best, limit)
            for family, members in by_tp.items()
            if family != best.choice.tp_family
        ]
    out.sort(key=lambda r: (r.kind != "slower", -(r.best_tokens_per_s_per_gpu or 0.0), r.family))
    return out


def _why_lost(family: str, members: list[Evaluated], best: Evaluated, limit: float) -> RejectedFamily:
    # A family with a fitting member has a timed one: the search times each family's fastest.
    fitting = [e for e in members if e.time is not None]
    smallest = min(e.peak_gib for e in members)
    if not any(e.fits for e in members):
        return RejectedFamily(
            family=family,
            kind="oom",
            reason=f"OOM by {smallest - limit:.1f} GiB: needs at least {smallest:.1f} GiB per GPU, "
            f"at most {limit:.1f} GiB fits with the memory margin",
            min_peak_memory_gib=smallest,
        )
    top = max(fitting, key=lambda e: (e.tokens_per_s_per_gpu, -e.peak_gib))
    return RejectedFamily(
        family=family,
        kind="slower",
        reason=slower_reason(top, best),
        best_tokens_per_s_per_gpu=top.tokens_per_s_per_gpu,
        min_peak_memory_gib=smallest,
    )


def slower_reason(loser: Evaluated, best: Evaluated) -> str:
    """`17% slower: exposed all-gather 41 ms/step`: the cost that grew most, per token."""
    assert loser.time is not None and best.time is not None
    slower_fraction = 1.0 - loser.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu
    slower = f"{slower_fraction:.0%}" if slower_fraction >= 0.01 else f"{slower_fraction:.1%}"

    # Compare per token each GPU handles, so that micro-batching and tp stay comparable.
    def per_token(e: Evaluated, seconds: float) -> float:
        return seconds * e.choice.mesh.tp / e.choice.sequences_per_step

    lt, bt = loser.time, best.time
    reduce_name = "all-reduce" if loser.choice.sharding == "no_shard" else "reduce-scatter"
    deltas = {
        "exposed all-gather": (
            per_token(loser, lt.exposed_all_gather_s) - per_token(best, bt.exposed_all_gather_s)
        ),
        f"exposed {reduce_name}": (
            per_token(loser, lt.exposed_reduce_s) - per_token(best, bt.exposed_reduce_s)
        ),
        "tensor-parallel collectives": (
            per_token(loser, lt.tensor_parallel_s) - per_token(best, bt.tensor_parallel_s)
        ),
        "compute": per_token(loser, lt.compute_s) - per_token(best, bt.compute_s),
    }
    cause, _ = max(deltas.items(), key=lambda kv: kv[1])
    if cause == "compute":
        c = loser.choice
        why = []
        if c.checkpointing != "none":
            why.append(f"recomputation ({c.checkpointing.replace('_', ' ')} checkpointing)")
        if not c.compile and best.choice.compile:
            why.append("unfused eager kernels")
        if c.mesh.tp > best.choice.mesh.tp:
            why.append(f"narrower tp={c.mesh.tp} matmuls")
        detail = " and ".join(why) or "smaller, less efficient kernels"
        return f"{slower} slower: {detail}, compute {duration(lt.compute_s)}/step"
    if cause == "tensor-parallel collectives":
        return (
            f"{slower} slower: tp={loser.choice.mesh.tp} per-layer collectives "
            f"{duration(lt.tensor_parallel_s)}/step"
        )
    exposed = lt.exposed_all_gather_s if cause == "exposed all-gather" else lt.exposed_reduce_s
    return f"{slower} slower: {cause} {duration(exposed)}/step"
