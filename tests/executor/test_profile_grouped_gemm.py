"""The profiler's grouped GEMM timings (executor/profile/grouped_gemm.py) on CPU: which points a model's
experts give, a real tiny measurement where torch runs `torch._grouped_mm` on CPU, and what the profile
says where it cannot."""

from __future__ import annotations

import pytest
import torch

from executor.profile.grouped_gemm import grouped_gemm_points, grouped_gemm_profile, grouped_mm_problem
from executor.profile.measure import Budget
from planner.calibration import GroupedGemmProfile

CPU = torch.device("cpu")
TINY_MOE = {
    "hidden_size": 64,
    "moe": {"num_experts": 2, "experts_per_token": 2, "expert_intermediate_size": 32},
}


def test_points_are_the_expert_shapes_at_a_few_experts_per_gpu() -> None:
    deepseek = {"hidden_size": 7168,
                "moe": {"num_experts": 256, "experts_per_token": 8, "expert_intermediate_size": 2048}}
    points = grouped_gemm_points(deepseek, seq_len=4096, micro_batches=[1])
    # All 256 experts on the GPU, and 32 and 4 (expert parallelism over 8 and 64 GPUs); the rows a
    # micro-batch's 4096 x 8 routed tokens give each; w1/w3 (7168 -> 2048) and w2 (2048 -> 7168).
    assert {(e, r) for e, r, _, _ in points} == {(256, 128), (32, 1024), (4, 8192)}
    assert {(n, k) for _, _, n, k in points} == {(2048, 7168), (7168, 2048)}
    assert points == sorted(points, key=lambda p: p[0] * p[1] * p[2] * p[3])
    assert grouped_gemm_points({"hidden_size": 64}, seq_len=64, micro_batches=[1]) == []  # dense
    # Rows are whole tiles (16), at least one.
    mixtral = {"hidden_size": 4096, "moe": {"num_experts": 8, "experts_per_token": 2,
                                            "expert_intermediate_size": 14336}}
    assert {(e, r) for e, r, _, _ in grouped_gemm_points(mixtral, seq_len=5, micro_batches=[1])} == {
        (8, 16), (1, 16)}


def test_a_dense_model_has_no_grouped_section() -> None:
    dense = {"hidden_size": 64, "num_heads": 4}
    assert grouped_gemm_profile(dense, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(5)) is None
    assert grouped_gemm_profile(None, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(5)) is None


def test_cpu_times_the_grouped_gemm_where_torch_runs_it() -> None:
    section = grouped_gemm_profile(TINY_MOE, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(20))
    assert section is not None
    parsed = GroupedGemmProfile.model_validate(section)
    problem = grouped_mm_problem(CPU, torch.float32)
    if problem is not None:  # a torch whose CPU build has no grouped GEMM: said, nothing timed
        assert parsed.samples == [] and parsed.not_measured == problem
        return
    assert parsed.not_measured is None
    assert len(parsed.samples) == len(grouped_gemm_points(TINY_MOE, seq_len=16, micro_batches=[1]))
    for sample in parsed.samples:
        assert sample.dtype == "float32"
        assert sample.efficiency > 0


def test_without_torch_grouped_mm_nothing_is_timed_and_the_profile_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    section = grouped_gemm_profile(TINY_MOE, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(5))
    parsed = GroupedGemmProfile.model_validate(section)
    assert parsed.samples == [] and "has no torch._grouped_mm" in (parsed.not_measured or "")


def test_a_device_that_refuses_the_kernel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("grouped gemm is only supported on CUDA devices with compute capability = 9.0")

    monkeypatch.setattr(torch, "_grouped_mm", refuse, raising=False)
    section = grouped_gemm_profile(TINY_MOE, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(5))
    assert section == {"samples": [], "not_measured": (
        "torch._grouped_mm does not run on cpu in float32: grouped gemm is only supported on CUDA devices "
        "with compute capability = 9.0")}


def test_a_spent_budget_says_so() -> None:
    section = grouped_gemm_profile(TINY_MOE, seq_len=16, micro_batches=[1], device=CPU, budget=Budget(0))
    if grouped_mm_problem(CPU, torch.float32) is None:
        spent = "the time budget ended before the first grouped GEMM"
        assert section == {"samples": [], "not_measured": spent}


def test_an_moe_models_blocks_are_built_from_its_spec_dict() -> None:
    """The profiler reads the model as JSON: its experts (and latent attention) arrive as dicts."""
    from contract.model_config import LatentAttention, MoeConfig
    from executor.profile.blocks import model_config
    from tests.executor.plan_factory import LLAMA_DEBUG

    latent = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
    spec = {**LLAMA_DEBUG, "moe": {**TINY_MOE["moe"], "unknown": 1}, "latent_attention": latent}
    config = model_config(spec)
    assert config.moe == MoeConfig(num_experts=2, experts_per_token=2, expert_intermediate_size=32)
    assert config.latent_attention == LatentAttention(**latent)
