"""The trainer on a tiny DeepSeek-like model (latent attention, a dense first block, then MoE blocks
with a shared expert and a sigmoid router balanced by its bias) on CPU gloo (issue 40): with expert
parallelism its loss falls and a checkpoint resumes it exactly (the routers' biases are in the
checkpoint: without them routing changes), and a 2-stage pipeline trains like one rank (the bias
update sums the counts over the stage's ranks). Under tensor parallelism (tp 2) an MoE model (FSDP2,
SimpleFSDP eager and compiled), the DeepSeek-like one and a dense one with query/key norms train like
one rank. A planner's plan of a tiny MoE model with expert parallelism (ep 2) trains through its
bundle's launch.sh on prepared text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from contract.model_config import MoeConfig
from executor.launch.bundle import bundle_name, write_bundle
from planner.catalog.models import catalog_model
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec
from tests.executor.conftest import explain, read_metrics
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan
from tests.executor.test_production_run import _corpus
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
    # With expert parallelism (ep 2): the checkpoint holds each rank's experts, DTensors on the
    # experts' own mesh beside the dense parameters'.
    document = debug_plan(micro_batch_size=1, grad_accum_steps=2, model=DEEPSEEK_LIKE, name="ds-tiny")
    document["config"]["mesh"]["ep"] = 2
    plan = write_plan(document)
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


# gpt-oss-style expert and router biases, on 2 blocks.
MOE_TINY = {
    **LLAMA_DEBUG,
    "num_layers": 2,
    "moe": {"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128,
            "num_shared_experts": 1, "expert_bias": True},
}
MOE_TINY_COMMON = {"micro_batch_size": 2, "grad_accum_steps": 1, "model": MOE_TINY, "name": "moe-tiny"}


@pytest.fixture(scope="module")
def moe_tiny_one_rank(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One rank's 3 steps of MOE_TINY, which each engine's tp 2 run is held to: one launch for all three."""
    tmp = tmp_path_factory.mktemp("moe-tiny-one")
    one = tmp / "one.json"
    one.write_text(json.dumps(debug_plan(gpus_per_node=1, **MOE_TINY_COMMON)))
    return _train(one, tmp, "one", "--steps", "3", nproc=1)


@pytest.mark.parametrize("engine", ["fsdp2", "simple_fsdp", "compiled"])
def test_moe_model_under_tensor_parallelism_trains_like_one_rank(
    tmp_path: Path, write_plan, engine: str, moe_tiny_one_rank: list[dict]
) -> None:
    # tp 2: every expert's hidden units and the shared expert's split over the ranks, the router
    # replicated (its gradient, the auxiliary loss's included, summed over them once); gpt-oss-style
    # expert and router biases.
    compiled = {"compile": True, "bucket_mb": 64.0} if engine == "compiled" else {}
    tp = write_plan(debug_plan(gpus_per_node=2, tp=2, **compiled, **MOE_TINY_COMMON), "tp.json")
    flags = {
        "fsdp2": (),
        "simple_fsdp": ("--engine", "simple_fsdp", "--no-compile"),
        # aot_eager: the same traced graph and AOTAutograd partitioning as inductor, without codegen.
        "compiled": ("--compile-backend", "aot_eager"),
    }[engine]
    split = _train(tp, tmp_path, "tp", "--steps", "3", *flags)
    single = moe_tiny_one_rank
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


def test_an_expert_parallel_bundle_trains_on_prepared_text(tmp_path: Path) -> None:
    # The planner's plan for a tiny MoE model on 1x2 cpu with ep pinned to 2 (each rank holds 2 of the
    # 4 experts); the byte tokenizer's 257 ids fit its 264-entry vocabulary.
    moe = MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=128, num_shared_experts=1)
    model = catalog_model("llama-debug").model_copy(
        update={"name": "moe-debug", "vocab_size": 264, "num_layers": 2, "moe": moe}
    )
    request = PlanRequest(
        model=model,
        cluster=ClusterSpec.parse("1x2xcpu"),
        training=TrainingSpec(seq_len=64, global_batch_tokens=64 * 8, precision="fp32"),
        search=SearchSpace(compile=[False], expert_parallel_degrees=[2]),
    )
    plan = make_plan(request)
    assert plan.config.mesh.ep == 2
    write_bundle(plan, tmp_path / "out", target="torchrun")
    bundle = tmp_path / "out" / bundle_name(plan)
    data = tmp_path / "data"
    corpus = _corpus(tmp_path / "corpus.txt")
    prepared = CliRunner().invoke(
        app, ["prepare-data", str(corpus), "--out", str(data), "--tokenizer", "bytes"]
    )
    assert prepared.exit_code == 0, prepared.output
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPROC_PER_NODE", "NNODES")}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1")
    metrics = tmp_path / "metrics.jsonl"
    result = subprocess.run(
        ["./launch.sh", "--steps", "12", "--lr", "3e-3", "--warmup", "2", "--metrics-file", str(metrics),
         "--data", str(data)],
        cwd=bundle, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, explain(result)
    assert "expert parallel: ep=2" in result.stdout, explain(result)
    losses = [r["loss"] for r in read_metrics(metrics)]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
