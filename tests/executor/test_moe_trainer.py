"""The trainer on a tiny DeepSeek-like model (latent attention, a dense first block, then MoE blocks
with a shared expert and a sigmoid router balanced by its bias) on CPU gloo (issue 40): its loss falls,
a checkpoint resumes it exactly (the routers' biases are in the checkpoint: without them routing
changes), and a 2-stage pipeline trains like one rank (the bias update sums the counts over the
stage's ranks). Under tensor parallelism (tp 2) an MoE model (FSDP2, SimpleFSDP eager and compiled),
the DeepSeek-like one and a dense one with query/key norms train like one rank."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan
from tests.executor.test_trainer_e2e import _train

pytestmark = pytest.mark.distributed

DEEPSEEK_LIKE = {
    **LLAMA_DEBUG,
    "num_layers": 4,
    "moe": {
        "num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128, "num_shared_experts": 1,
        "first_dense_layers": 1, "router": "sigmoid", "router_bias": True,
    },
    "latent_attention": {
        "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "q_lora_rank": 96,
    },
}


def test_moe_model_trains_and_resumes_exactly(tmp_path: Path, write_plan) -> None:
    plan = write_plan(debug_plan(micro_batch_size=1, grad_accum_steps=2, model=DEEPSEEK_LIKE, name="ds-tiny"))
    ckpt = tmp_path / "ckpt"
    save = ("--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--keep-checkpoints", "0")
    straight = _train(plan, tmp_path, "straight", "--steps", "8", *save)
    losses = [r["loss"] for r in straight]
    assert losses[-1] < losses[0], losses
    shutil.rmtree(ckpt / "step-00000008")
    resumed = _train(plan, tmp_path, "resumed", "--steps", "8", "--checkpoint-dir", str(ckpt), "--resume")
    assert [r["step"] for r in resumed] == [5, 6, 7, 8]
    assert [r["loss"] for r in resumed] == pytest.approx(losses[4:], rel=1e-6)


def test_moe_pipeline_trains_like_one_rank(tmp_path: Path, write_plan) -> None:
    pipeline = {"schedule": "1F1B", "stages_per_rank": 1, "stage_blocks": [2, 2]}
    common = {"micro_batch_size": 1, "grad_accum_steps": 2, "model": DEEPSEEK_LIKE, "name": "ds-tiny"}
    pp = write_plan(debug_plan(gpus_per_node=2, pipeline=pipeline, **common), "pp.json")
    one = write_plan(debug_plan(gpus_per_node=1, **common), "one.json")
    split = _train(pp, tmp_path, "pp", "--steps", "4")
    single = _train(one, tmp_path, "one", "--steps", "4", nproc=1)
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)


def test_qk_norm_model_under_tensor_parallelism_trains_like_one_rank(tmp_path: Path, write_plan) -> None:
    # tp 2: the query/key norms' weights replicated over the ranks' heads, their gradients summed.
    model = {**LLAMA_DEBUG, "num_layers": 2, "qk_norm": True}
    common = {"micro_batch_size": 2, "grad_accum_steps": 1, "model": model, "name": "qk-tiny"}
    tp = write_plan(debug_plan(gpus_per_node=2, tp=2, **common), "tp.json")
    one = write_plan(debug_plan(gpus_per_node=1, **common), "one.json")
    split = _train(tp, tmp_path, "tp", "--steps", "3")
    single = _train(one, tmp_path, "one", "--steps", "3", nproc=1)
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)


@pytest.mark.parametrize("engine", ["fsdp2", "simple_fsdp", "compiled"])
def test_moe_model_under_tensor_parallelism_trains_like_one_rank(
    tmp_path: Path, write_plan, engine: str
) -> None:
    # tp 2: every expert's hidden units and the shared expert's split over the ranks, the router
    # replicated (its gradient, the auxiliary loss's included, summed over them once); gpt-oss-style
    # expert and router biases.
    model = {
        **LLAMA_DEBUG,
        "num_layers": 2,
        "moe": {"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128,
                "num_shared_experts": 1, "expert_bias": True},
    }
    common = {"micro_batch_size": 2, "grad_accum_steps": 1, "model": model, "name": "moe-tiny"}
    compiled = {"compile": True, "bucket_mb": 64.0} if engine == "compiled" else {}
    tp = write_plan(debug_plan(gpus_per_node=2, tp=2, **compiled, **common), "tp.json")
    one = write_plan(debug_plan(gpus_per_node=1, **common), "one.json")
    flags = {
        "fsdp2": (),
        "simple_fsdp": ("--engine", "simple_fsdp", "--no-compile"),
        # aot_eager: the same traced graph and AOTAutograd partitioning as inductor, without codegen.
        "compiled": ("--compile-backend", "aot_eager"),
    }[engine]
    split = _train(tp, tmp_path, "tp", "--steps", "3", *flags)
    single = _train(one, tmp_path, "one", "--steps", "3", nproc=1)
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)


def test_latent_attention_moe_model_under_tensor_parallelism_trains_like_one_rank(
    tmp_path: Path, write_plan
) -> None:
    # tp 2 on the DeepSeek-like model: heads split (wq_b, wkv_b column-, wo row-parallel), the latent
    # down projections and norms replicated, the experts split as above.
    common = {"micro_batch_size": 2, "grad_accum_steps": 1, "model": DEEPSEEK_LIKE, "name": "ds-tiny"}
    tp = write_plan(debug_plan(gpus_per_node=2, tp=2, **common), "tp.json")
    one = write_plan(debug_plan(gpus_per_node=1, **common), "one.json")
    split = _train(tp, tmp_path, "tp", "--steps", "3")
    single = _train(one, tmp_path, "one", "--steps", "3", nproc=1)
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in single], rel=2e-5)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in single], rel=1e-4)
