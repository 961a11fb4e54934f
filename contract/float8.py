"""Which linear layers a Float8 recipe converts: one rule for the planner (what it prices in float8)
and the runtime (what it hands torchao).

torchao's own filter for each recipe, stated here as numbers: a layer's in- and out-features must be
multiples of 16 (float8 tensor-core GEMMs need them; 32 for MX), and layers below a size gain nothing from
float8 because the casts cost more than the faster GEMM saves (torchao's H100 GEMM benchmarks). The
output head is never converted (its logits feed the loss in the compute precision).
"""

from __future__ import annotations

from typing import get_args

from contract.parallel_config import Float8Recipe

TORCHAO_REQUIREMENT = "torchao==0.18.0"
"""What Float8 training needs beside torch: the executor extra's pin (pyproject.toml; a test keeps them
equal), stated here for the runtime's and the launch scripts' install hints alike."""
FLOAT8_RECIPES: tuple[str, ...] = tuple(r for r in get_args(Float8Recipe) if r != "none")
"""The recipes that convert layers (all but `none`)."""


def float8_converts(recipe: str, in_features: int, out_features: int) -> bool:
    """Whether `recipe` trains a block linear of this shape in float8 (torchao 0.18's
    `_auto_filter_for_recipe`, with N = out_features and K = in_features as its weight's shape)."""
    if recipe == "none":
        return False
    multiple = 32 if recipe == "mxfp8" else 16  # MX scales blocks of 32 values
    if in_features % multiple or out_features % multiple:
        return False
    if recipe == "rowwise":
        # Rowwise scaling's GEMM gains less, so it needs the larger shapes.
        return not (out_features <= 2048 or in_features <= 1024
                    or (out_features <= 4096 and in_features <= 2048))
    # tensorwise, and mxfp8 (torchao states no rule of its own for MX)
    return not (in_features <= 4096 and out_features <= 1024)


GROUPED_GEMM_KERNELS: dict[str, str] = {
    "rowwise": "float8 rowwise grouped GEMM (Float8TrainingOpConfig, on GPUs with float8 tensor cores)",
    "mxfp8": "MXFP8 grouped GEMM (MXFP8TrainingOpConfig, on Blackwell)",
}
"""torchao 0.18's scaled grouped GEMMs for a mixture of experts' routed experts, by recipe
(torchao.prototype.moe_training, a prototype: token groups padded to 16 rows, 32 for MX; tensorwise
has none). This project's trainer converts linear layers only (`float8_converts`), and its torchtitan
bundles list linear converters only: under every recipe the experts' grouped GEMMs run, and are
priced, in bf16, and the plan says so (planner/plan_warnings.py)."""
