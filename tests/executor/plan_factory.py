"""Plan documents for executor tests, in the exact JSON shape `planner.plan.Plan` dumps.

`debug_plan()` is a `llama-debug` plan on a 1x2 `cpu` cluster; keyword arguments override parts
(`tp` for tensor parallelism, `cp` for context parallelism; `dp_shard` to choose the shard group,
the rest of the data-parallel ranks being replicas; `float8` for a Float8 recipe, with
`FLOAT8_LLAMA` as the model whose block linears torchao's filter converts).
tests/executor/test_plan_contract.py checks this shape against the planner's pydantic model, so
the hand-made plans here cannot drift from real ones.
"""

from __future__ import annotations

import copy
from typing import Any

from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.cost.model_costs import model_costs
from planner.specs import ModelSpec

# The catalog's own entries, as a plan document carries them.
LLAMA_DEBUG: dict[str, Any] = resolve_model("llama-debug").model_dump(mode="json")
CPU_GPU_SPEC: dict[str, Any] = resolve_gpu("cpu").model_dump(mode="json")
# A tiny llama whose every block linear passes torchao's tensorwise filter (executor/runtime/float8.py:
# out_features > 1024 or in_features > 4096, multiples of 16; of 32 for mxfp8): hidden 1056 with as many
# kv heads as heads (head_dim 132), ffn 1056; 2 blocks, a small vocabulary: 17.8M parameters.
FLOAT8_LLAMA: dict[str, Any] = {
    **LLAMA_DEBUG,
    "name": "llama-fp8-debug",
    "vocab_size": 1024,
    "hidden_size": 1056,
    "num_layers": 2,
    "num_heads": 8,
    "num_kv_heads": 8,
    "intermediate_size": 1056,
}


def debug_plan(
    *,
    sharding: str = "full_shard",
    nodes: int = 1,
    gpus_per_node: int = 2,
    compile: bool = False,
    seq_len: int = 64,
    micro_batch_size: int = 2,
    grad_accum_steps: int = 1,
    checkpointing: str = "none",
    every_k: int = 1,
    precision: str = "fp32",
    optimizer: str = "adamw",
    blocks_per_unit: int = 1,
    bucket_mb: float = 0.0,
    name: str = "llama-debug",
    model: dict[str, Any] | None = None,
    dp_shard: int | None = None,
    tp: int = 1,
    cp: int = 1,
    loss_chunks: int = 1,
    float8: str = "none",
    pipeline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete plan document (as `Plan.model_dump(mode="json")` writes it). The ranks are
    nodes x gpus_per_node = pp x dp_replicate x dp_shard x cp x tp; `dp_shard` defaults to what
    `sharding` implies (hybrid_shard: the data-parallel ranks of one node). `pipeline` is a
    `PipelineConfig` document (`schedule`, `stages_per_rank`, `stage_blocks`) with `pp` its
    stages / stages_per_rank."""
    pp = len(pipeline["stage_blocks"]) // pipeline["stages_per_rank"] if pipeline else 1
    world = nodes * gpus_per_node
    dp = world // (pp * tp * cp)
    if dp_shard is None:
        dp_shard = {"no_shard": 1, "hybrid_shard": gpus_per_node // (tp * cp)}.get(sharding, dp)
    model_doc = copy.deepcopy(model or LLAMA_DEBUG)
    model_doc["name"] = name
    # A `layer_graph` model here stands for a user model the planner never priced (no traced modules).
    priced = model_doc["architecture"] != "layer_graph"
    costs = model_costs(ModelSpec.model_validate(model_doc), seq_len) if priced else None
    sequences = micro_batch_size * grad_accum_steps * dp
    bf16 = precision == "bf16"
    document = {
        "schema_version": "2.0",
        "planner_version": "0.1.0",
        "plan_hash": "0" * 64,
        "model": {
            **model_doc,
            "num_params": costs.num_params if costs else 0,
            "num_params_embedding": costs.num_params_embedding if costs else 0,
            "flops_per_token": costs.flops_per_token if costs else 0.0,
        },
        "cluster": {
            "num_nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "gpu": "cpu",
            "intra_node_bandwidth_gbps": None,
            "inter_node_bandwidth_gbps": None,
            "world_size": world,
            "gpu_spec": copy.deepcopy(CPU_GPU_SPEC),
        },
        "training": {
            "seq_len": seq_len,
            "global_batch_tokens": sequences * seq_len,
            "precision": precision,
            "optimizer": optimizer,
            "global_batch_sequences": sequences,
        },
        "config": {
            "sharding": sharding,
            # pp and cp written only above 1, as plans made before them read.
            "mesh": {
                **({"pp": pp} if pp > 1 else {}),
                "dp_replicate": dp // dp_shard,
                "dp_shard": dp_shard,
                **({"cp": cp} if cp > 1 else {}),
                "tp": tp,
            },
            "blocks_per_unit": blocks_per_unit,
            "all_gather_bucket_mb": bucket_mb,
            "reduce_scatter_bucket_mb": bucket_mb,
            "reshard_after_forward": sharding in ("full_shard", "hybrid_shard"),
            "prefetch_depth": 1,
            "checkpointing": {"mode": checkpointing, "every_k": every_k},
            "micro_batch_size": micro_batch_size,
            "grad_accum_steps": grad_accum_steps,
            "param_dtype": "bfloat16" if bf16 else "float32",
            "reduce_dtype": "float32",
            "compile": compile,
            "loss_chunks": loss_chunks,
            "inductor": {
                "bucket_all_gathers": compile and bucket_mb > 0,
                "bucket_reduce_scatters": compile and bucket_mb > 0,
                "reorder_for_compute_comm_overlap": compile and sharding != "no_shard",
            },
        },
        "prediction": {
            "step_time_s": 1.0,
            "tokens_per_s_per_gpu": 100.0,
            "tokens_per_s": 200.0,
            "mfu": 0.1,
            "peak_memory_gib": 1.0,
            "memory_breakdown_gib": {
                "params": 0.1,
                "grads": 0.1,
                "optimizer": 0.2,
                "activations": 0.3,
                "unsharded_params": 0.1,
                "grad_buffers": 0.0,
                "logits": 0.1,
                "workspace": 0.05,
                "allocator_reserve": 0.05,
            },
            "compute_s": 0.8,
            "comm_s": 0.3,
            "exposed_comm_s": 0.1,
            "exposed_all_gather_s": 0.05,
            "exposed_reduce_scatter_s": 0.05,
            "optimizer_s": 0.01,
            "timeline": [],
        },
        "alternatives": [],
        "pareto_front": [],
        "rejected": [],
        "calibration_id": None,
        "search": {"candidates_evaluated": 1, "candidates_fitting": 1},
    }
    if float8 != "none":  # schema 2.1's field, written only where it says something
        document["schema_version"] = "2.1"
        document["config"]["float8"] = float8
    if pipeline is not None:  # likewise
        document["schema_version"] = "2.1"
        document["config"]["pipeline"] = copy.deepcopy(pipeline)
    return document
