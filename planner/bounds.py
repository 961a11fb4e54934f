"""Physical bounds on measured values: what a timing, a rate, a memory size can plausibly be.

Every measurement the service accepts (calibration samples, validation runs) is typed with these, so
the OpenAPI schema shows the limits and a value outside them is refused at the edge, naming the field,
instead of being stored and breaking a fit, an error percentage or a chart later. The limits lie
orders of magnitude beyond any hardware today, but they are finite and away from zero: that is what
keeps every ratio, logarithm and line fit computed from stored values finite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from contract.mesh import Axis

MIN_KERNEL_SECONDS = 1e-7
"""100 ns: below a single kernel launch, so no timed GEMM, copy or collective can be shorter."""
MIN_STEP_SECONDS = 1e-6
"""1 µs: a whole training step (forward, backward, update) takes far longer on any device."""
MAX_SECONDS = 1e6
"""About 11.6 days: longer than any calibration sample or validation step is ever timed."""
MAX_BYTES_PER_S = 100e12
"""100 TB/s: beyond any memory or link (HBM3e is ~8 TB/s per GPU, NVLink 5 ~1.8 TB/s)."""
MAX_FLOPS_PER_S = 1e17
"""100 PFLOP/s per device: ~20x the fastest accelerator's dense low-precision peak."""
MIN_TOKENS_PER_S = 1e-6
MAX_TOKENS_PER_S = 1e9
"""Per GPU: a billion tokens a second, beyond the smallest model on the largest GPU."""
MIN_MEMORY_GIB = 1e-6
"""About 1 KiB: the smallest peak a training process can report and still have run a model."""
MAX_MEMORY_GIB = float(1 << 20)
"""1 PiB per device."""

_RANGE_ERRORS = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
)


def _physical(*, low: float, high: float, unit: str, meaning: str) -> Any:
    """A float type bounded to [low, high] (shown in the JSON schema), whose out-of-range error says
    what range is plausible and why, instead of pydantic's bare "should be less than or equal to"."""
    advice = f"give {unit} between {low:g} and {high:g} ({meaning})"
    return Annotated[
        float,
        Field(ge=low, le=high, allow_inf_nan=False, description=f"{unit.capitalize()}, {low:g} to {high:g}."),
        _explained_range(
            error_type="physical_bound", message="{value} is not physically plausible: " + advice
        ),
    ]


def _explained_range(
    *, error_type: str, message: str, context: dict[str, str] | None = None
) -> WrapValidator:
    """A validator that lets every error through but a range error, which it replaces by `message`
    (a template over `value` and `context`): pydantic's own says only "should be less than or equal to"."""

    def explain(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if not any(error["type"] in _RANGE_ERRORS for error in exc.errors()):
                raise
            raise PydanticCustomError(error_type, message, {"value": value, **(context or {})}) from None

    return WrapValidator(explain)


KernelSeconds = _physical(
    low=MIN_KERNEL_SECONDS, high=MAX_SECONDS, unit="seconds",
    meaning="100 ns to ~11.6 days; a time in ms or µs is off by 1000x",
)
StepSeconds = _physical(
    low=MIN_STEP_SECONDS, high=MAX_SECONDS, unit="seconds",
    meaning="a training step takes 1 µs to ~11.6 days; a time in ms is off by 1000x",
)
TokensPerSecond = _physical(
    low=MIN_TOKENS_PER_S, high=MAX_TOKENS_PER_S, unit="tokens per second per GPU",
    meaning="per GPU, not summed over the cluster",
)
MemoryGiB = _physical(
    low=MIN_MEMORY_GIB, high=MAX_MEMORY_GIB, unit="GiB per device",
    meaning="~1 KiB to 1 PiB; a value in bytes or MiB is off by 2^30 or 2^10",
)


def rate_problem(*, amount: float, unit: str, seconds: float, limit: float, what: str) -> str | None:
    """Why `amount` `unit`s in `seconds` is physically impossible (faster than `limit` per second), or None.

    The message names the implied rate and the likely mistake, for a validator to raise.
    """
    rate = amount / seconds
    if rate <= limit:
        return None
    return (
        f"{amount:g} {unit} in {seconds:g} s is {rate:.3g} {unit}/s, faster than {limit:.3g} {unit}/s "
        f"that any {what} reaches; check the units: `seconds` in seconds (not milliseconds), sizes in "
        f"{unit}"
    )


# ---------------------------------------------------------------- the inputs of a plan
# Every number of a plan request (planner/specs.py, planner/gpu_spec.py) is bounded by these, however it
# is spelled (a cluster string or object, a CLI option or file, a form, a study): far beyond any real
# model or cluster, yet small enough that the cost model's arithmetic stays finite at every bound and
# no step of validation or search loops over an input-sized range.

MAX_NODES = 4096
"""Nodes in one cluster: twice the largest published training jobs (Llama 3 405B: 2,048 nodes)."""
MAX_GPUS_PER_NODE = 64
"""GPUs (ranks) per node: 8x the usual 8-GPU server, beyond any NVLink domain sold as one node."""
MAX_SCALEUP_DOMAIN_GPUS = 1024
"""GPUs in one scale-up (NVLink or Infinity Fabric) domain of several hosts: beyond the largest
announced (NVIDIA's NVL576 racks), and a multiple of MAX_GPUS_PER_NODE."""
MAX_PARALLEL_DEGREE = 1024
"""The largest degree a request may pin on a mesh axis whose groups may reach over the network (pp,
cp, ep): as many GPUs as the largest scale-up domain, far beyond any published job's."""
MAX_SEQ_LEN = 1 << 20
"""Tokens per sequence: 1M, the longest contexts trained today."""
MAX_GLOBAL_BATCH_TOKENS = 1 << 36
"""Tokens per optimizer step: ~69G, four orders of magnitude beyond the largest published batches."""
MAX_MICRO_BATCH = 1 << 20
"""Sequences per micro-batch: a micro-batch never exceeds the global batch."""
MAX_SHARD_TOKENS = 10**12
"""Tokens per file of a prepared dataset (`prepare-data --shard-tokens`): 1T, 4 TB at uint32, beyond
any file a dataset is split into."""
MAX_DIMENSION = 1 << 24
"""A model's width, vocabulary, head count or FFN size: 16M, ~100x the widest models (vocabularies ~256K)."""
MAX_LAYERS = 1 << 16
"""Blocks or layer-graph units of one model (servers plan at most FSDP_PLANNER_MAX_MODEL_LAYERS of them)."""
MAX_UNIT_PARAMS = 10**13
"""Parameters of one layer-graph module: 10T, more than any whole model."""
MAX_FLOPS_PER_TOKEN = 1e15
"""Forward FLOPs per token of one module: 2 x MAX_UNIT_PARAMS x 50 (attention over long contexts)."""
MAX_ACTIVATION_BYTES_PER_TOKEN = 1e12
"""Bytes one module saves for backward per token: 1 TB, beyond a whole GPU's memory."""
MIN_DEVICE_MEMORY_GIB = 0.25
"""256 MiB: less than any device that trains a model (the CPU entry plans with 8 GiB)."""
MAX_DEVICE_MEMORY_GIB = 1e7
MIN_DEVICE_TFLOPS = 1e-3
"""1 GFLOP/s: a single CPU core of 2000 did more."""
MAX_DEVICE_TFLOPS = 1e7
MIN_MEMORY_BANDWIDTH_GBPS = 0.1
"""100 MB/s: slower than the DRAM of the 1990s."""
MIN_LINK_GBPS = 0.01
"""10 MB/s per GPU: slower than 100 Mb/s Ethernet."""
MAX_DEVICE_GBPS = 1e7
"""Upper bound of a device's memory or link bandwidth (GB/s) in a GPU datasheet."""
MAX_LINK_OVERRIDE_GBPS = MAX_BYTES_PER_S / 1e9
"""A cluster's bandwidth override: 100 TB/s per GPU, as a measured link is bounded."""


def all_finite(value: Any) -> bool:
    """Whether every number in a JSON-like value (dicts, lists, floats) is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    return True


def max_degree(entry: Axis) -> int:
    """The largest degree a request may pin on the mesh axis `entry`, the one bound the search, the API
    (pins and list filters), the command line and the dashboard's forms all keep: an axis whose groups
    stay inside one scale-up domain (tp) takes at most the largest domain one may describe
    (MAX_SCALEUP_DOMAIN_GPUS: a rack's 72 GPUs on a GB200 NVL72, not a node's MAX_GPUS_PER_NODE), the
    others MAX_PARALLEL_DEGREE. Whether a degree fits the cluster at hand is the planner's check."""
    return MAX_SCALEUP_DOMAIN_GPUS if entry.within_node else MAX_PARALLEL_DEGREE


def degree_range(entry: Axis) -> str:
    """What a pinned degree of `entry` may be, for a refusal: `whole numbers from 1 to 1024 (GPUs of
    one scale-up domain: tensor-parallel groups stay inside one)`."""
    why = (
        "GPUs of one scale-up domain: its groups stay inside one" if entry.within_node
        else "GPUs its groups may span"
    )
    return f"whole numbers from 1 to {max_degree(entry)} ({why})"


def pinned_degree(entry: Axis) -> Any:
    """The type of one pinned degree of `entry` in a request: bounded by `max_degree` (shown in the JSON
    schema), refused out of range saying what range it takes and why."""
    article = "an " if entry.what[0] in "aeiou" else "a "
    return Annotated[
        int,
        Field(ge=1, le=max_degree(entry)),
        _explained_range(
            error_type="degree_range", message="{value} is not {what} degree: give " + degree_range(entry),
            context={"what": article + entry.what},
        ),
    ]
