"""Float8 training of the blocks' linear layers (torchao), as the plan's `config.float8` asks.

Recipes (`contract.parallel_config.Float8Recipe`):
  tensorwise  torchao `Float8LinearConfig` tensorwise recipe: one dynamic scale per tensor for the
              input, weight and output gradient; the fastest. Under FSDP2 the weights are cast to
              float8 *before* the all-gather (`enable_fsdp_float8_all_gather`, half the bf16 bytes),
              and after each optimizer step one all-reduce computes every weight's scale
              (`precompute_float8_dynamic_scale_for_fsdp`, `after_optimizer_step`).
  rowwise     torchao's rowwise recipe: one scale per row (power-of-2 scales); closer to bf16, slower
              GEMMs. Parameters are all-gathered in the plan's param dtype (torchao casts rowwise
              after the gather: a row's scale needs the whole row).
  mxfp8       MX blocks of 32 values sharing an e8m0 exponent (B200, compute capability 10.0+), via
              torchao's prototype `MXFP8TrainingOpConfig` (`quantize_`), all-gathered in the param
              dtype; refused by name when this torchao lacks that API.

Which linears convert (`contract.float8.float8_converts`, shared with the planner's pricing;
torchao's own auto filter `_auto_filter_for_recipe`, whose
thresholds come from its H100 benchmarks: smaller GEMMs lose to the cast overhead). Only `nn.Linear`
layers inside the model's blocks (`find_parts(model).blocks`) are candidates: the output head, the
embedding and anything outside the blocks stay in the compute precision. A candidate with weight
(out_features N, in_features K) converts when both N and K are multiples of 16 (FP8 GEMM shape
requirement; 32 for mxfp8, its block size) and
  tensorwise: not (K <= 4096 and N <= 1024)
  rowwise:    N > 2048 and K > 1024 and not (N <= 4096 and K <= 2048)
  mxfp8:      not (K <= 4096 and N <= 1024)  (torchao states no rule for MX; the tensorwise one is used)
e.g. tensorwise converts every linear of a block with hidden size 1040+ (a multiple of 16, as many kv
heads as heads) and only w1/w3 of a block with hidden 256 and ffn 1280. mxfp8 also needs each
micro-batch's token count (micro_batch_size x seq_len) to be a multiple of 32.

Hardware: FP8 GEMMs need CUDA compute capability 8.9+ (L40S, H100, H200; MX: 10.0+, B200), or on a
ROCm build of torch an Instinct architecture with FP8 matrix cores (`ROCM_FLOAT8`: gfx942, MI300X and
MI325X; gfx950, MI355X), told by the device's `gcnArchName`: there `get_device_capability` answers the
architecture's numbers (gfx942 reads as 9.4, gfx90a as 9.0), which are no CUDA capability. torchao's
MX training kernels are CUDA's: no mxfp8 on ROCm. On CPU
torchao *emulates* them (`emulate=True`: quantize and dequantize, matmul in high precision), which
is what the CPU tests run. A CUDA GPU without FP8 tensor cores refuses the plan before training
(`Float8Error`, reported as one line), as does a missing torchao (`INSTALL_HINT`: `pip install
torchao==0.18.0` where a bundle runs, `.venv/bin/pip install '.[executor]'` in a checkout).

Order in `parallelize` (torchtitan's): Float8 conversion first, on the unsharded (meta) model, then
tensor parallelism (the converted layers are still `nn.Linear` subclasses under the same names, so
the TP plan applies unchanged; its collectives run in the param dtype), activation checkpointing,
data parallelism (FSDP2 sees the float8 weight subclass and gathers it in float8) and compilation
(which fuses the amax / scale / cast kernels around the GEMMs).

SimpleFSDP: the conversion composes (the parametrization's gathered weight feeds `Float8Linear`,
which casts it after the gather), but its all-gathers stay in the param dtype: torchao's float8
all-gather hooks (`fsdp_pre_all_gather` / `fsdp_post_all_gather`) are FSDP2's extension points, which
SimpleFSDP's DTensor redistribute does not call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from contract.float8 import FLOAT8_RECIPES, TORCHAO_REQUIREMENT, float8_converts

RECIPES = FLOAT8_RECIPES
INSTALL_HINT = (
    f"install it into the Python that runs the trainer: pip install '{TORCHAO_REQUIREMENT}' where a "
    "launch bundle runs, .venv/bin/pip install '.[executor]' in a checkout of fsdp-planner (the "
    "executor extra pins it)"
)
FP8_CAPABILITY = (8, 9)
"""Smallest CUDA compute capability with FP8 tensor cores (Ada / Hopper)."""
MX_CAPABILITY = (10, 0)
"""Smallest CUDA compute capability with MX (block-scaled) FP8 tensor cores (Blackwell)."""
ROCM_FLOAT8: dict[str, torch.dtype] = {
    "gfx942": torch.float8_e4m3fnuz,
    "gfx950": torch.float8_e4m3fn,
}
"""The Instinct architectures (`gcnArchName`) with FP8 matrix cores, and the float8 encoding their GEMMs
take (MI300-series: e4m3 `fnuz`, what torchao picks there; CDNA4 runs the OCP e4m3 of NVIDIA's GPUs).
Architectures not named (gfx90a: MI210, MI250X) have none."""
ROCM_FLOAT8_GPUS = "AMD Instinct MI300X, MI325X (gfx942), MI355X (gfx950)"


class Float8Error(RuntimeError):
    """The plan asks for Float8 training that this machine cannot run (reported without traceback)."""


@dataclass(slots=True)
class Float8Conversion:
    """What `convert_to_float8` did."""

    recipe: str
    emulate: bool
    fsdp_float8_all_gather: bool
    converted: list[str] = field(default_factory=list)
    """Fully qualified names of the converted linears."""
    kept: list[str] = field(default_factory=list)
    """Names of the linears that stay in the compute precision (blocks' linears the filter refused,
    and every linear outside the blocks, the output head among them)."""

    def notes(self) -> list[str]:
        if self.emulate:
            mode = "emulated (no FP8 tensor cores: quantize/dequantize, high-precision matmul)"
        else:
            mode = "FP8 tensor cores"
        if self.fsdp_float8_all_gather:
            gather = "float8 all-gather of FSDP2 parameters"
        else:
            gather = "parameters all-gathered in the param dtype"
        lines = [
            f"float8: {self.recipe} on {len(self.converted)} linear(s), {mode}; {gather}",
            "float8 converted: " + _compact(self.converted),
        ]
        if self.kept:
            lines.append("float8 kept in compute precision: " + _compact(self.kept))
        return lines


def _compact(names: list[str]) -> str:
    """`layers.0.attention.wq, layers.1.attention.wq` -> `layers.{0,1}.attention.wq` (readable logs)."""
    if not names:
        return "none"
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if index is None:
            groups.setdefault(name, [])
            continue
        key = ".".join([*parts[:index], "{}", *parts[index + 1 :]])
        groups.setdefault(key, []).append(parts[index])
    out = []
    for key, ids in groups.items():
        if not ids:
            out.append(key)
        elif len(ids) == 1:
            out.append(key.replace("{}", ids[0]))
        elif _consecutive(ids):
            out.append(key.replace("{}", f"{{{ids[0]}..{ids[-1]}}}"))
        else:
            out.append(key.replace("{}", "{" + ",".join(ids) + "}"))
    return ", ".join(out)


def _consecutive(ids: list[str]) -> bool:
    values = [int(i) for i in ids]
    return len(values) > 2 and values == list(range(values[0], values[0] + len(values)))


def is_rocm() -> bool:
    """Whether this torch is a ROCm (HIP) build (its `torch.cuda` is HIP)."""
    return getattr(torch.version, "hip", None) is not None


def architecture(device: torch.device) -> str | None:
    """The ROCm device's architecture (`gfx942`), without its feature flags; None on CUDA and CPU."""
    if device.type != "cuda" or not is_rocm():
        return None
    name = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") or ""
    return name.split(":", 1)[0] or None


def device_supports(device: torch.device, recipe: str) -> bool:
    """Whether `device` runs `recipe`'s GEMMs in hardware (CUDA capability 8.9+, MX: 10.0+; on ROCm an
    architecture of ROCM_FLOAT8, no MX)."""
    if device.type != "cuda":
        return False
    if is_rocm():
        return recipe != "mxfp8" and architecture(device) in ROCM_FLOAT8
    needed = MX_CAPABILITY if recipe == "mxfp8" else FP8_CAPABILITY
    return cuda_capability(device) >= needed


def cuda_capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def check_device(device: torch.device, recipe: str) -> bool:
    """Whether to emulate (True on CPU); raises Float8Error on a CUDA GPU without the tensor cores."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        if device_supports(device, recipe):
            return False
        if is_rocm():
            raise Float8Error(_rocm_refusal(device, recipe))
        major, minor = cuda_capability(device)
        needed = MX_CAPABILITY if recipe == "mxfp8" else FP8_CAPABILITY
        gpus = "B200" if recipe == "mxfp8" else "L40S, H100, H200, B200"
        raise Float8Error(
            f"the plan trains with Float8 ({recipe}), which needs FP8 tensor cores (CUDA compute capability "
            f"{needed[0]}.{needed[1]}+: {gpus}); {torch.cuda.get_device_name(device)} is {major}.{minor}. "
            f"Run it on such GPUs, or make the plan again without Float8 (config.float8 'none') for this GPU"
        )
    raise Float8Error(f"the plan trains with Float8 ({recipe}); device type {device.type!r} cannot run it")


def _rocm_refusal(device: torch.device, recipe: str) -> str:
    """Why a ROCm device does not run `recipe`: no FP8 matrix cores, or MX kernels that are CUDA's."""
    arch = architecture(device) or "an unknown architecture"
    name = f"{torch.cuda.get_device_name(device) or 'this GPU'} ({arch})"
    if recipe == "mxfp8":
        need = "torchao's MX training kernels, which run on CUDA (compute capability 10.0+) only"
    else:
        need = f"FP8 matrix cores ({ROCM_FLOAT8_GPUS})"
    return (f"the plan trains with Float8 ({recipe}), which needs {need}; {name} has none. Run it on such "
            "GPUs, or make the plan again without Float8 (config.float8 'none') for this GPU")


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """torchao's import logs a warning per CUDA kernel library a CPU-only torch cannot load, and torch
    logs a deprecation per enum torchao registers with pytree: benign, and noise in every rank's log."""
    loggers = [logging.getLogger("torch.utils._pytree")]
    if torch.version.cuda is None:
        loggers.append(logging.getLogger("torchao"))
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _missing(recipe: str, what: str, exc: ImportError) -> Float8Error:
    return Float8Error(f"the plan trains with Float8 ({recipe}), which needs {what} ({exc}); {INSTALL_HINT}")


def _torchao_float8(recipe: str):
    """torchao.float8, or Float8Error saying how to install it."""
    with _quiet_import():
        try:
            import torchao.float8 as float8
        except ImportError as exc:
            raise _missing(recipe, "torchao", exc) from None
    return float8


def _linears(module: nn.Module, prefix: str) -> list[tuple[str, nn.Linear]]:
    return [
        (f"{prefix}.{name}" if prefix else name, m)
        for name, m in module.named_modules()
        if isinstance(m, nn.Linear)
    ]


def convert_to_float8(
    model: nn.Module,
    blocks: list[nn.Module],
    *,
    recipe: str,
    device: torch.device,
    fsdp2: bool,
) -> Float8Conversion:
    """Convert the eligible linears of `blocks` (submodules of `model`) in place. `fsdp2`: the plan's
    data parallelism is FSDP2 (float8 all-gather for tensorwise). Call before TP / AC / FSDP / compile."""
    if recipe not in RECIPES:
        raise Float8Error(f"unknown Float8 recipe {recipe!r} (expected one of {', '.join(RECIPES)})")
    emulate = check_device(device, recipe)
    block_prefix = {id(m): name for name, m in model.named_modules()}
    chosen: set[int] = set()
    conversion = Float8Conversion(recipe=recipe, emulate=emulate, fsdp_float8_all_gather=False)
    for block in blocks:
        for name, linear in _linears(block, block_prefix[id(block)]):
            if float8_converts(recipe, linear.in_features, linear.out_features):
                chosen.add(id(linear))
                conversion.converted.append(name)
    conversion.kept = [name for name, m in _linears(model, "") if id(m) not in chosen]
    if not chosen:
        return conversion

    def wanted(module: nn.Module, fqn: str) -> bool:
        return id(module) in chosen

    if recipe == "mxfp8":
        _convert_mxfp8(blocks, wanted, emulate=emulate)
    else:
        float8 = _torchao_float8(recipe)
        config = float8.Float8LinearConfig.from_recipe_name(recipe)
        gather = recipe == "tensorwise" and fsdp2
        config = dataclasses.replace(config, emulate=emulate, enable_fsdp_float8_all_gather=gather)
        conversion.fsdp_float8_all_gather = gather
        for block in blocks:
            float8.convert_to_float8_training(block, module_filter_fn=wanted, config=config)
    return conversion


def _convert_mxfp8(
    blocks: list[nn.Module], wanted: Callable[[nn.Module, str], bool], *, emulate: bool
) -> None:
    what = "torchao's prototype MX training API (MXFP8TrainingOpConfig, torchao 0.18)"
    with _quiet_import():
        try:
            import torchao  # noqa: F401  (a missing torchao is told apart from an older one)
        except ImportError as exc:
            raise _missing("mxfp8", "torchao", exc) from None
        try:
            from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
            from torchao.quantization import quantize_
            from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
        except ImportError as exc:
            raise _missing("mxfp8", what, exc) from None
    config = MXFP8TrainingOpConfig(
        kernel_preference=KernelPreference.EMULATED if emulate else KernelPreference.AUTO,
        out_dtype=None,  # the input's dtype (the plan's compute precision)
    )
    for block in blocks:
        quantize_(block, config, filter_fn=wanted)


def after_optimizer_step(conversion: Float8Conversion | None) -> Callable[[nn.Module], None] | None:
    """What the trainer runs after each optimizer step: with float8 all-gather, torchao's one
    all-reduce computing every float8 weight's scale (instead of one per weight at its all-gather)."""
    if conversion is None or not conversion.fsdp_float8_all_gather:
        return None
    return _torchao_float8(conversion.recipe).precompute_float8_dynamic_scale_for_fsdp
