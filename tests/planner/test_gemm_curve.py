"""The GEMM and attention curve (planner/cost/gemm.py): what a GPU achieves at a plan's shapes, from its
datasheet, and a calibration's measured GEMMs in place of the curve where it timed them."""

from __future__ import annotations

import pytest

from planner.calibration import CalibrationProfile, fit_parameters
from planner.catalog.gpus import resolve_gpu
from planner.cost.gemm import (
    ATTENTION_REFERENCE,
    attention_scale,
    gemm_seconds,
    matmul_seconds,
    tile_efficiency,
    unit_gemms,
)
from planner.cost.model_costs import model_costs, tensor_parallel_share
from planner.cost.parameters import default_parameters
from planner.specs import ClusterSpec, ModelSpec

H100 = default_parameters(resolve_gpu("H100"), ClusterSpec.parse("1x8xH100"), "bf16")
CPU = default_parameters(resolve_gpu("cpu"), ClusterSpec.parse("1x2xcpu"), "fp32")


def rate(p, m: int, n: int, k: int) -> float:
    """Achieved FLOP/s of one GEMM, its launch left out."""
    return 2.0 * m * n * k / (gemm_seconds(p, m, n, k, dtype_bytes=2) - p.matmul_overhead_s)


def test_rate_grows_with_size_and_never_passes_the_ceiling() -> None:
    ceiling = H100.peak_flops * H100.matmul_efficiency
    rates = [rate(H100, s, s, s) for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    assert rates == sorted(rates)
    assert all(r <= ceiling * (1 + 1e-12) for r in rates)
    assert rates[-1] > 0.95 * ceiling  # a large GEMM reaches its ceiling (the datasheet's max achievable)
    assert rates[0] < 0.1 * ceiling  # one tile's worth leaves most SMs idle


def test_wide_gemms_reach_more_of_the_ceiling_than_narrow_ones() -> None:
    tokens = 4096
    wide = rate(H100, tokens, 14336, 4096)
    narrow = rate(H100, tokens, 14336 // 8, 4096 // 8)  # the same layer split 8 ways
    assert narrow < wide


def test_skinny_gemms_are_memory_bound() -> None:
    # One token's row against a 4096 x 14336 weight: reading the weight is all the time it takes.
    m, n, k = 16, 14336, 4096
    seconds = gemm_seconds(H100, m, n, k, dtype_bytes=2) - H100.matmul_overhead_s
    weight_read = (m * k + k * n + m * n) * 2 / H100.gemm_bandwidth
    assert seconds == pytest.approx(weight_read)
    # About m FLOPs per byte read, 16 x 3.35 TB/s: a twentieth of the peak.
    assert 2.0 * m * n * k / seconds < 0.06 * H100.peak_flops
    # More bandwidth, the same compute: the H200 runs that skinny GEMM faster, a large one as fast.
    h200 = default_parameters(resolve_gpu("H200"), ClusterSpec.parse("1x8xH200"), "bf16")
    assert gemm_seconds(h200, m, n, k, dtype_bytes=2) < gemm_seconds(H100, m, n, k, dtype_bytes=2)
    big = (8192, 8192, 8192)
    assert gemm_seconds(h200, *big, dtype_bytes=2) == pytest.approx(
        gemm_seconds(H100, *big, dtype_bytes=2), rel=0.01
    )


def test_wave_quantization_over_the_sms() -> None:
    # 132 tiles of 128 x 256 fill an H100's 132 SMs once; one more tile takes a second wave.
    full = tile_efficiency(128 * 132, 256, 8192, 132)
    over = tile_efficiency(128 * 133, 256, 8192, 132)
    assert full == pytest.approx(1.0)
    assert over < 0.6
    # Without an SM count (the CPU device, a user's GPU type) the shape is not modelled.
    assert tile_efficiency(128 * 133, 256, 8192, 0) == 1.0


def test_measured_points_replace_the_curve_at_their_shapes_only() -> None:
    measured = H100.with_changes(gemm_points=((4096, 4096, 4096, 1e-3),))
    assert gemm_seconds(measured, 4096, 4096, 4096, dtype_bytes=2) == 1e-3
    assert gemm_seconds(measured, 4096, 4096, 2048, dtype_bytes=2) == gemm_seconds(
        H100, 4096, 4096, 2048, dtype_bytes=2
    )


def test_a_calibration_measures_the_same_curve() -> None:
    """A profile timed at the model's shapes: its points are priced as measured, and the curve's
    ceiling is fitted to them, so that unmeasured shapes move with the measured level."""
    slow = 0.5 * H100.peak_flops * 0.9  # a machine at half the peak (and the curve's shape at large sizes)
    shapes = [(8192, 4096, 4096), (8192, 1024, 4096), (8192, 14336, 4096), (8192, 4096, 14336)]
    samples = [
        {"m": m, "n": n, "k": k, "dtype": "bfloat16",
         "seconds": 2.0 * m * n * k / (slow * tile_efficiency(m, n, k, 132)) + 10e-6}
        for m, n, k in shapes + [(s, s, s) for s in (1024, 2048, 8192)]
    ]
    profile = CalibrationProfile.model_validate({
        "name": "synthetic", "gpu": "H100-SXM-80GB", "matmul": samples,
        "fingerprint": {"device_name": "NVIDIA H100 80GB HBM3", "device_count": 1, "backend": "nccl",
                        "torch_version": "2.13.0"},
    })
    fitted = fit_parameters(profile, base=H100, precision="bf16")
    assert fitted.matmul_efficiency == pytest.approx(0.45, rel=1e-3)
    assert fitted.matmul_overhead_s == pytest.approx(10e-6, rel=1e-3)
    for sample in samples:
        shape = (sample["m"], sample["n"], sample["k"])
        assert gemm_seconds(fitted, *shape, dtype_bytes=2) == sample["seconds"]
    # An unmeasured shape: the curve at the fitted ceiling, about half the catalog's rate.
    unmeasured = (16384, 4096, 4096)
    ratio = gemm_seconds(fitted, *unmeasured, dtype_bytes=2) / gemm_seconds(H100, *unmeasured, dtype_bytes=2)
    assert ratio == pytest.approx(H100.matmul_efficiency / 0.45, rel=0.02)


def test_a_block_prices_its_own_gemm_shapes_and_tensor_parallel_splits_them() -> None:
    spec = ModelSpec.model_validate({
        "name": "llama-8b-like", "architecture": "llama", "num_layers": 2, "hidden_size": 4096,
        "num_heads": 32, "num_kv_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    })
    block = model_costs(spec, 8192).blocks[0]
    assert unit_gemms(block) == (
        (4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336),
    )
    assert sum(n * k for n, k in unit_gemms(block)) == block.matmul_params
    split = tensor_parallel_share(model_costs(spec, 8192), 8).blocks[0]
    assert unit_gemms(split) == (
        (512, 4096), (128, 4096), (128, 4096), (4096, 512), (1792, 4096), (1792, 4096), (4096, 1792),
    )
    # The split block does an eighth of the work, at a lower rate.
    whole = matmul_seconds(H100, block, 8192, dtype_bytes=2)
    share = matmul_seconds(H100, split, 8192, dtype_bytes=2)
    assert whole / 8 < share
    # Calibrated at the block's own shapes (what the profiler times), its GEMMs take what they measured.
    measured = {shape: 1e-3 * (i + 1) for i, shape in enumerate(sorted(set(unit_gemms(block))))}
    calibrated = H100.with_changes(gemm_points=tuple((8192, n, k, t) for (n, k), t in measured.items()))
    expected = sum(measured[shape] for shape in unit_gemms(block))  # q and o alike, k and v, w1 and w3
    assert matmul_seconds(calibrated, block, 8192, dtype_bytes=2) == pytest.approx(expected)
    calibrated_16k, curve_16k = (matmul_seconds(p, block, 16384, dtype_bytes=2) for p in (calibrated, H100))
    assert calibrated_16k == curve_16k  # another micro-batch, not timed: the curve


def test_attention_efficiency_rises_with_the_sequence_up_to_the_catalogs_figure() -> None:
    assert attention_scale(H100, ATTENTION_REFERENCE) == pytest.approx(1.0)
    by_seq = [attention_scale(H100, s) for s in (512, 1024, 2048, 4096, 8192, 16384, 131072)]
    assert by_seq == sorted(by_seq)
    assert by_seq[0] < 0.75  # a short causal sequence spends a third of its blocks on the diagonal
    assert by_seq[-1] < 1.02  # past the benchmarks' longest sequence, hardly more
    capped = H100.with_changes(attention_efficiency=1.0)
    assert attention_scale(capped, 131072) == 1.0  # never past the dense peak


def test_the_cpu_device_keeps_its_flat_rate() -> None:
    """Nothing in the corpus ran on a CPU, and its GEMMs have no tiles over SMs: the calibrated rate."""
    ceiling = CPU.peak_flops * CPU.matmul_efficiency
    for size in (64, 512, 4096):
        seconds = gemm_seconds(CPU, size, size, size, dtype_bytes=4) - CPU.matmul_overhead_s
        assert 2.0 * size**3 / seconds == pytest.approx(ceiling)
