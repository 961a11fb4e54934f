"""What a plan that fits should carry: warnings where data parallelism alone serves it badly (most
of the step is exposed communication), where the request goes past what the model was built for
(a sequence beyond its positions), or where published runs with a parallel dimension the plan uses
ran slower than the model prices them.
"""

from __future__ import annotations

from contract.float8 import GROUPED_GEMM_KERNELS
from contract.mesh import Mesh
from planner.cost.estimate import TimeEstimate
from planner.cost.model_costs import ModelCosts
from planner.cost.parameters import DimensionThroughput
from planner.enumeration import pipeline_parallel_degrees
from planner.formatting import duration
from planner.infeasibility import tensor_parallel_reach
from planner.plan import PlanWarning
from planner.specs import PlanRequest

COMM_BOUND_FRACTION = 0.25
"""A plan whose exposed communication is at least this share of its step is flagged."""


def plan_warnings(
    request: PlanRequest,
    time: TimeEstimate,
    *,
    micro_batch: int,
    mfu: float,
    mesh: Mesh,
    evidence: tuple[DimensionThroughput, ...],
    float8: str = "none",
    model_costs: ModelCosts | None = None,
) -> tuple[PlanWarning, ...]:
    """What a person should know about a plan that fits, in the order they matter."""
    out: list[PlanWarning] = []
    model = request.model
    seq_len = request.training.seq_len
    # A layer graph's default max_seq_len is nobody's statement about the model: only warn when
    # the model (catalog, HF config, or the caller) named its positions.
    if seq_len > model.max_seq_len and (
        model.architecture != "layer_graph" or "max_seq_len" in model.model_fields_set
    ):
        out.append(
            PlanWarning(
                code="seq_len_beyond_max_position",
                message=(
                    f"seq_len {seq_len} is beyond {model.name}'s {model.max_seq_len} positions "
                    f"(model.max_seq_len; a config's max_position_embeddings): the model was not "
                    f"trained on positions past "
                    f"{model.max_seq_len}; extend its context (e.g. RoPE scaling) or expect worse quality"
                ),
            )
        )
    step = time.step_time_s
    exposed = time.exposed_comm_s
    if step > 0 and exposed / step >= COMM_BOUND_FRACTION:
        head = (
            f"communication-bound: {exposed / step:.0%} of the step is exposed communication "
            f"({duration(exposed)} of {duration(step)}; MFU {mfu:.1%})"
        )
        # Where most of it is expert parallelism's token all-to-alls, the FSDP story (every
        # micro-batch moves the whole model) is not what the step waits on: say what is.
        if time.expert_parallel_s >= exposed / 2:
            message = f"{head}, {duration(time.expert_parallel_s)} of it {_what_cuts_all_to_alls(request)}"
        else:
            message = (
                f"{head}: every micro-batch moves the whole model's parameters and gradients while each "
                f"GPU computes only {micro_batch} x {seq_len} tokens, and more data-parallel GPUs do not "
                f"change that. {_what_cuts_communication(request)}"
            )
        out.append(PlanWarning(code="communication_bound", message=message))
    out.extend(
        PlanWarning(code="optimistic_throughput", message=slower.reason)
        for slower in evidence
        if getattr(mesh, slower.dimension) >= slower.degree
    )
    if float8 != "none" and model_costs is not None:
        out.extend(_experts_in_bf16(float8, model_costs))
    return tuple(out)


def _experts_in_bf16(recipe: str, model: ModelCosts) -> list[PlanWarning]:
    """A Float8 plan of a mixture of experts: its routed experts' grouped GEMMs stay in bf16 (no
    trainer here converts them: contract/float8.py's GROUPED_GEMM_KERNELS), and how much of the
    matmul work per token that is."""
    blocks = [(b.expert_matmul_params, b.matmul_params) for b in model.blocks]
    experts, matmuls = sum(e for e, _ in blocks), sum(m for _, m in blocks)
    if not experts:
        return []
    kernel = GROUPED_GEMM_KERNELS.get(recipe)
    torchao = (
        f"torchao has a {kernel} as a prototype, which this trainer does not apply yet"
        if kernel else
        f"torchao has no {recipe} grouped GEMM (its rowwise and mxfp8 recipes have one)"
    )
    return [PlanWarning(
        code="float8_experts_in_bf16",
        message=(
            f"Float8 ({recipe}) converts the linear layers only: the routed experts' grouped GEMMs, "
            f"{experts / matmuls:.0%} of the blocks' matmul work per token, run in bf16 and are priced "
            f"so; {torchao}"
        ),
    )]


def _what_cuts_all_to_alls(request: PlanRequest) -> str:
    """What the expert-parallel all-to-alls are, and what would shrink them.

    They carry every routed token to its experts' ranks and back, so their time grows with the
    tokens a GPU computes: a larger batch does not shrink their share, unlike FSDP's gathers.
    """
    across = request.cluster.world_size > request.cluster.scaleup_gpus
    return (
        "is expert parallelism's token dispatch and combine all-to-alls: every routed token goes to "
        "its experts' ranks and back, so more tokens per step do not shrink their share"
        + ("; a faster network between nodes would cut it" if across else "")
    )


def _what_cuts_communication(request: PlanRequest) -> str:
    """What would shrink exposed FSDP communication that this request's search did not try.

    Across nodes every all-gather brings the whole model's parameters into each node whatever the
    tensor-parallel degree (a node's ranks hold one copy between them either way), so there only more
    tokens per step, a faster network or pipeline stages help.
    """
    searched, possible = tensor_parallel_reach(request)
    # Pipeline stages, where the search left them out (pinned, or one node).
    pipeline = " or pipeline parallelism" if max(pipeline_parallel_degrees(request)) == 1 else ""
    if request.cluster.world_size > request.cluster.scaleup_gpus:  # the network carries it
        return (
            "A larger global batch (more tokens per GPU per step)"
            + (", a faster network between nodes" if pipeline else " or a faster network between nodes")
            + f"{pipeline} would cut it"
        )
    if possible > searched:
        return (
            f"Tensor parallelism inside nodes would cut it (widen search.tensor_parallel_degrees: "
            f"up to tp={possible} splits this model)"
        )
    return f"A larger global batch (more tokens per GPU per step){pipeline} would cut it"
