"""torch.compile of the SimpleFSDP model, with inductor's collective bucketing / reordering knobs
derived from the plan.

The knobs are passed as `torch.compile(options=...)`, which scopes them to this model's
compilation instead of mutating global inductor config. Each knob is used only when the installed
torch has it (names moved between releases), and the ones skipped are reported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from contract.parallel_config import ParallelConfig

PLANNER_MB = 1e6
"""The planner's bucket caps are in MB (1e6 bytes); inductor's in MiB."""


def _bucket_cap_mib(bucket_index: int, *, cap_mib: float) -> float:
    del bucket_index  # the same cap for every bucket (the planner prices uniform buckets)
    return cap_mib


@dataclass(slots=True)
class CompileSettings:
    """What torch.compile is asked to do."""

    backend: str = "inductor"
    """torch.compile backend (`inductor`; `aot_eager` traces the same graphs without codegen)."""
    fullgraph: bool = True
    """Fail instead of silently splitting the graph (a graph break would split the buckets)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Inductor config entries for this compilation."""
    skipped: list[str] = field(default_factory=list)
    """Plan knobs this torch has no config entry for."""


def inductor_options(
    cfg: ParallelConfig, *, micro_pipeline_tp: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Inductor config entries implied by the plan's bucket caps and reordering choice, and
    `micro_pipeline_tp` (the plan's async TP, where the tp group has symmetric memory)."""
    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    options: dict[str, Any] = {}
    skipped: list[str] = []

    def want(key: str, value: Any, reason: str) -> None:
        if key in known:
            options[key] = value
        else:
            skipped.append(f"{key} ({reason})")

    knobs = cfg.inductor
    if knobs.bucket_all_gathers and cfg.all_gather_bucket_mb > 0:
        # "only_fsdp": bucket all-gathers whose input is a parameter (SimpleFSDP's), not others.
        want("bucket_all_gathers_fx", "only_fsdp", "all-gather bucketing")
        want(
            "bucket_all_gathers_fx_bucket_size_determinator",
            functools.partial(_bucket_cap_mib, cap_mib=cfg.all_gather_bucket_mb * PLANNER_MB / 2**20),
            "all-gather bucket cap",
        )
    if knobs.bucket_reduce_scatters and cfg.reduce_scatter_bucket_mb > 0:
        cap = functools.partial(_bucket_cap_mib, cap_mib=cfg.reduce_scatter_bucket_mb * PLANNER_MB / 2**20)
        if cfg.sharding in ("full_shard", "shard_grad_op", "hybrid_shard"):
            want("bucket_reduce_scatters_fx", "all", "reduce-scatter bucketing")
            want("bucket_reduce_scatters_fx_bucket_size_determinator", cap, "reduce-scatter bucket cap")
        if cfg.sharding in ("hybrid_shard", "no_shard"):
            # Replicas reduce gradients with all-reduce: the same cap buckets those.
            want("bucket_all_reduces_fx", "all", "all-reduce bucketing")
            want("bucket_all_reduces_fx_bucket_size_determinator", cap, "all-reduce bucket cap")
    if micro_pipeline_tp:
        # Inductor's micro-pipelined TP: all-gather -> matmul and matmul -> reduce-scatter pairs
        # become fused, chunked ops over symmetric memory (enabled on the tp group by parallelize).
        want("_micro_pipeline_tp", True, "async tensor parallelism")
    if knobs.reorder_for_compute_comm_overlap:
        want("reorder_for_compute_comm_overlap", True, "compute/communication reordering")
        # Move collectives early (prefetch) and their waits late, without raising peak memory.
        want(
            "reorder_for_compute_comm_overlap_passes",
            ["sink_waits_iterative", "reorder_communication_preserving_peak_memory"],
            "reordering passes",
        )
    return options, skipped


def compile_settings(
    cfg: ParallelConfig, *, backend: str = "inductor", micro_pipeline_tp: bool = False
) -> CompileSettings:
    """Settings for compiling a model planned with `cfg`."""
    options, skipped = (
        inductor_options(cfg, micro_pipeline_tp=micro_pipeline_tp) if backend == "inductor" else ({}, [])
    )
    return CompileSettings(backend=backend, options=options, skipped=skipped)


def apply_compile(model: nn.Module, settings: CompileSettings) -> nn.Module:
    """Compile the whole model as one graph: all-gathers of every unit are visible together, which
    is what lets inductor bucket across units and prefetch the next unit's gather."""
    kwargs: dict[str, Any] = {"backend": settings.backend, "fullgraph": settings.fullgraph}
    if settings.options:
        kwargs["options"] = settings.options
    return torch.compile(model, **kwargs)
