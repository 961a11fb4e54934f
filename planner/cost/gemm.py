"""What a GPU achieves at a plan's shapes: GEMMs by (M, N, K) and dtype, attention by sequence length.

One curve serves the uncalibrated model and a calibrated one. Uncalibrated, a GEMM's time is a roofline
over the GPU's datasheet numbers (planner/catalog/gpus.py): the compute side is the ceiling (the best
large GEMM's share of the dense peak, times the training share the corpus fits) reduced by how well the
output tiles fill the GPU (tile padding at the edges, waves of tiles over the SMs, the operand reuse of
the tile that fits), the memory side the operands' bytes at HBM bandwidth; the slower side wins. A
calibration measures GEMMs at the model's own shapes (executor/profile/run.py `model_shapes`): those
measured times replace the curve at their shapes, and its ceiling is fitted to them
(`fit_gemm_ceiling`, from planner/calibration.py).

A GEMM here is C[M, N] = A[M, K] @ B[K, N] with M the tokens of a micro-batch (per rank), K a layer's
input features and N its output features (per tensor-parallel rank). Backward's two GEMMs per layer
(the input gradient, M x K over N; the weight gradient, K x N over M) are priced at the forward's
shape: the same FLOPs, and the weight gradient's long inner dimension only helps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from planner.cost.model_costs import UnitCost
from planner.cost.parameters import CostParameters

TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128), (64, 128))
"""Output tiles (rows, columns) a GEMM library picks from for 16-bit tensor-core GEMMs (cuBLAS and
CUTLASS on Ampere and Hopper): the largest reuses its operands most, the smaller ones fill more SMs
when the output is small."""
MIN_SPLIT_K = 256
"""The shortest slice of K a split-K kernel hands one SM: when the output has fewer tiles than the
GPU has SMs, the library splits the inner dimension across them down to about this length."""
ATTENTION_KEY_BLOCK = 128
"""Keys a flash-attention kernel takes per step. A causal kernel computes the diagonal blocks whole
(half of each is masked) and pays a query block's load, rescale and store once per row of blocks:
about two blocks' time per row beside the useful work, so its efficiency at sequence s is s / (s + 2
blocks)."""
ATTENTION_REFERENCE = 16384
"""The sequence length at which a catalog's `attention_efficiency` is quoted: the published
FlashAttention-2 forward-and-backward benchmarks' longest causal sequence, at head dim 128 (about 35% of
an H100's dense peak, 60% of an A100's). Shorter sequences reach less of it, longer ones hardly more.

Its dependence on the head dim (softmax's exponentials against 4 x head dim tensor-core FLOPs a score)
is left out: priced from the SFU rates, it made the corpus' three head-dim-64 runs 4-8 points more
under-predicted (bench/RESULTS.md, issue 37)."""


def _reuse(tile: tuple[int, int]) -> float:
    """FLOPs per operand element loaded by one tile per step of K (rows x columns / (rows + columns))."""
    rows, columns = tile
    return rows * columns / (rows + columns)


_BEST_REUSE = max(_reuse(tile) for tile in TILES)


@functools.lru_cache(maxsize=1 << 16)
def tile_efficiency(m: int, n: int, k: int, sms: int, groups: int = 1) -> float:
    """Of the ceiling (a large GEMM's rate), the share a GEMM of this shape reaches on `sms` SMs: its
    best tile's useful share of the padded output, times the share of the SMs its waves keep busy,
    times its operand reuse against the largest tile's (a smaller tile loads more per FLOP). 1.0
    without an SM count (the CPU device, a user's GPU type): the shape is not modelled.

    `groups` GEMMs of this shape run as one grouped kernel (a mixture of experts' experts): each pads
    its own output to whole tiles, and the tiles of all of them are spread over the SMs together, so
    the waves count them all (a persistent grouped kernel, CUTLASS's and torch's `_grouped_mm`)."""
    if sms <= 0:
        return 1.0
    best = 0.0
    for tile in TILES:
        rows, columns = math.ceil(m / tile[0]), math.ceil(n / tile[1])
        tiles = rows * columns * groups
        split = max(1, min(sms // tiles, k // MIN_SPLIT_K)) if tiles < sms else 1
        work = tiles * split
        waves = math.ceil(work / sms)
        padding = m * n / (rows * tile[0] * columns * tile[1])
        best = max(best, padding * work / (waves * sms) * _reuse(tile) / _BEST_REUSE)
    return best


def gemm_seconds(p: CostParameters, m: int, n: int, k: int, *, dtype_bytes: int) -> float:
    """Seconds of one GEMM kernel, its launch included: measured by a calibration at this shape, else
    the curve (`tile_efficiency` under the ceiling `p.peak_flops * p.matmul_efficiency`, or the
    operands' bytes at `p.gemm_bandwidth`, whichever is slower) plus `p.matmul_overhead_s`."""
    return _gemm_seconds(m, n, k, dtype_bytes, _device(p))


@dataclass(frozen=True, slots=True, eq=False)
class _Device:
    """What of the cost parameters the GEMM curve reads: a cache key whose measured points count by
    identity, so that a profile's thousands of them are not hashed on every lookup (the key holds
    them, so their id is not reused while it is cached; fitted parameters keep one tuple)."""

    rate: float
    bandwidth: float
    sms: int
    overhead: float
    points: tuple[tuple[int, int, int, float], ...]

    def _key(self) -> tuple[float, float, int, float, int]:
        return self.rate, self.bandwidth, self.sms, self.overhead, id(self.points)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Device) and self._key() == other._key()


def _device(p: CostParameters) -> _Device:
    return _Device(p.peak_flops * p.matmul_efficiency, p.gemm_bandwidth, p.sm_count, p.matmul_overhead_s,
                   p.gemm_points)


def _gemm_seconds(m: int, n: int, k: int, dtype_bytes: int, device: _Device) -> float:
    measured = _measured(device).get((m, n, k)) if device.points else None
    if measured is not None:
        return measured
    return curve_seconds(
        m, n, k, rate=device.rate, bandwidth=device.bandwidth, sms=device.sms, overhead=device.overhead,
        dtype_bytes=dtype_bytes,
    )


def curve_seconds(
    m: int, n: int, k: int, *, rate: float, bandwidth: float, sms: int, overhead: float, dtype_bytes: int
) -> float:
    """The curve alone (what `gemm_seconds` prices where nothing was measured): the compute at `rate`
    (the ceiling's FLOP/s) times the shape's `tile_efficiency`, or the operands' bytes at `bandwidth`
    (0: no memory-bound regime), whichever is slower, plus the launch's `overhead`."""
    compute = 2.0 * m * n * k / (rate * tile_efficiency(m, n, k, sms))
    memory = (m * k + k * n + m * n) * dtype_bytes / bandwidth if bandwidth else 0.0
    return max(compute, memory) + overhead


def fit_gemm_ceiling(
    p: CostParameters, samples: list[tuple[int, int, int, float]], *, dtype_bytes: int
) -> float | None:
    """The ceiling (`matmul_efficiency`) that makes the curve's compute-bound GEMMs take as long in all
    as `samples` (m, n, k, seconds) measured, launches (`p.matmul_overhead_s`) taken off: the
    measured curve's level, whose shape the tile and wave model gives. None when no sample is
    compute-bound or none took longer than its launch."""
    rate = p.peak_flops
    curve = measured = 0.0
    for m, n, k, seconds in samples:
        compute = 2.0 * m * n * k / (rate * tile_efficiency(m, n, k, p.sm_count))
        memory = (m * k + k * n + m * n) * dtype_bytes / p.gemm_bandwidth if p.gemm_bandwidth else 0.0
        kernel = seconds - p.matmul_overhead_s
        if kernel > 0 and compute >= memory:
            curve += compute
            measured += kernel
    if not measured:
        return None
    return min(1.0, curve / measured)


@functools.lru_cache(maxsize=64)
def _measured(device: _Device) -> dict[tuple[int, int, int], float]:
    return {(m, n, k): seconds for m, n, k, seconds in device.points}


def unit_gemms(unit: UnitCost) -> tuple[tuple[int, int], ...]:
    """(N, K) of each GEMM kernel one forward of `unit` runs on a rank: its linear layers split as
    tensor parallelism splits them (column-parallel layers, at even positions, split N; row-parallel
    ones split K). A unit without stated layers (the head, a traced module) runs `gemms` square
    GEMMs of its weights' mean size."""
    return _gemm_shapes(unit.linear_shapes, unit.linear_share, unit.gemms, unit.matmul_params)


def _gemm_shapes(
    linear_shapes: tuple[tuple[int, tuple[int, ...]], ...], share: int, gemms: int, matmul_params: int
) -> tuple[tuple[int, int], ...]:
    if linear_shapes:
        shapes = []
        for position, (inputs, outputs) in enumerate(linear_shapes):
            column_parallel = position % 2 == 0
            for out in outputs:
                if column_parallel:
                    shapes.append((max(1, out // share), inputs))
                else:
                    shapes.append((out, max(1, inputs // share)))
        return tuple(shapes)
    if not gemms or not matmul_params:
        return ()
    side = max(1, round(math.sqrt(matmul_params / gemms)))
    return ((side, side),) * gemms


def matmul_seconds(p: CostParameters, unit: UnitCost, tokens: int, *, dtype_bytes: int) -> float:
    """Seconds of one forward's GEMMs of `unit` over `tokens` tokens (launches included), scaled so that
    the unit's FLOPs (`matmul_params`, which a tensor-parallel share may round) are what is priced.
    Cached by what it reads: a search prices the same few units at the same few micro-batches."""
    device = _device(p)
    dense_params = unit.matmul_params - unit.expert_matmul_params
    shapes = (unit.linear_shapes, unit.linear_share, unit.gemms, dense_params)
    seconds = _matmul_seconds(shapes, tokens, dtype_bytes, device)
    if unit.routed_experts:
        experts = (unit.expert_shapes, unit.linear_share, unit.routed_experts, unit.experts_per_token)
        # The grouped kernel runs below the dense GEMMs' rate at the same shapes (`GROUPED_MM_EFFICIENCY`).
        grouped = replace(device, rate=device.rate * p.grouped_gemm_efficiency)
        seconds += _grouped_seconds(experts, tokens, p.expert_load_imbalance, dtype_bytes, grouped)
    return seconds


@functools.lru_cache(maxsize=1 << 14)
def _matmul_seconds(
    unit: tuple[tuple[tuple[int, tuple[int, ...]], ...], int, int, int], tokens: int, dtype_bytes: int,
    device: _Device,
) -> float:
    shapes = _gemm_shapes(*unit)
    matmul_params = unit[3]
    if not shapes or not tokens:
        return 0.0
    seconds = sum(_gemm_seconds(tokens, n, k, dtype_bytes, device) for n, k in shapes)
    shape_params = sum(n * k for n, k in shapes)
    return seconds * matmul_params / shape_params


def expert_rows(tokens: int, *, experts: int, experts_per_token: int, imbalance: float) -> int:
    """Rows (tokens) one routed expert's GEMMs run in a forward over `tokens` tokens: its even share of
    the tokens x top-k routed rows, times the load imbalance of the rank's experts together
    (`rank_imbalance`)."""
    return max(1, math.ceil(tokens * experts_per_token * rank_imbalance(imbalance, experts) / experts))


def rank_imbalance(imbalance: float, experts: int) -> float:
    """The most-loaded rank's routed rows over the mean, for ranks of `experts` experts each, from one
    expert's (`CostParameters.expert_load_imbalance`: the most-loaded expert's rows over the mean).

    One grouped kernel spreads the tiles of all the rank's experts over its SMs, so what sets the pace
    is the rank's rows, the sum of its experts' loads. A sum of n experts' loads strays from its mean
    by about 1 / sqrt(n) of what one expert's does (loads that vary independently), so a rank holding
    every expert of a layer (ep 1) is within a few percent of the mean, and one holding a single expert
    carries that expert's whole imbalance."""
    return 1.0 + (imbalance - 1.0) / math.sqrt(max(1, experts))


@functools.lru_cache(maxsize=1 << 12)
def _grouped_seconds(
    experts: tuple[tuple[tuple[int, tuple[int, ...]], ...], int, int, int], tokens: int, imbalance: float,
    dtype_bytes: int, device: _Device,
) -> float:
    """One forward's grouped GEMMs of a mixture of experts' routed experts: per linear layer one kernel
    (one launch) running every expert's GEMM, each at `expert_rows` rows, priced by the curve at that
    shape, so that few rows per expert (many experts, a small micro-batch) run at the smaller tiles'
    and the padding's lower efficiency, the tiles of all experts sharing the kernel's waves. Every
    expert is priced at the rows of the most-loaded rank's mean expert (`rank_imbalance`): under
    expert parallelism the rank holding the busiest experts sets the pace."""
    shapes, share, count, top_k = experts
    if not tokens:
        return 0.0
    rows = expert_rows(tokens, experts=count, experts_per_token=top_k, imbalance=imbalance)
    seconds = 0.0
    for n, k in _gemm_shapes(shapes, share, 0, 0):
        # One launch for every expert's GEMM: their tiles share the waves (`tile_efficiency`'s groups).
        compute = 2.0 * rows * n * k * count / (device.rate * tile_efficiency(rows, n, k, device.sms, count))
        memory = 0.0
        if device.bandwidth:
            memory = count * (rows * k + k * n + rows * n) * dtype_bytes / device.bandwidth
        seconds += max(compute, memory) + device.overhead
    return seconds


def attention_scale(p: CostParameters, seq_len: int) -> float:
    """`sequence_scale` capped where `p.attention_efficiency` times it would pass the dense peak."""
    return min(sequence_scale(seq_len), 1.0 / p.attention_efficiency)


def sequence_scale(seq_len: int) -> float:
    """Flash attention's efficiency at `seq_len` over its efficiency at `ATTENTION_REFERENCE`, where the
    catalog quotes it: longer sequences amortise the diagonal and each row's fixed work
    (`ATTENTION_KEY_BLOCK`)."""
    if seq_len <= 0:
        return 1.0
    return _sequence_efficiency(seq_len) / _sequence_efficiency(ATTENTION_REFERENCE)


def _sequence_efficiency(seq_len: int) -> float:
    return seq_len / (seq_len + 2 * ATTENTION_KEY_BLOCK)
