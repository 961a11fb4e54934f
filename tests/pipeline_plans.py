"""Plans with a pipeline (pp > 1) for the service's tests, built from a real plan with the contract's
dataclasses: a real planned pipeline comes from `search.pipeline_parallel_degrees` once the planner
searches it; these keep the pages, the CLI printout and the launchers testable on their own."""

from __future__ import annotations

import dataclasses

from contract.mesh import Mesh
from contract.parallel_config import PipelineConfig, PipelineSchedule
from planner.catalog.models import resolve_model
from planner.cost.pipeline import balanced_stage_split
from planner.hashing import plan_hash
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import ClusterSpec, PlanRequest, SearchSpace, TrainingSpec

# llama-debug has 4 blocks: with pp 2, 1F1B runs 2 stages, interleaved and ZB-V 4.
STAGE_BLOCKS: dict[PipelineSchedule, tuple[int, ...]] = {
    "1F1B": (1, 3), "Interleaved1F1B": (1, 1, 1, 1), "ZBVZeroBubble": (1, 1, 1, 1),
}


def pipeline_request(world: int = 4, nodes: int = 1) -> PlanRequest:
    return PlanRequest(
        model=resolve_model("llama-debug"), cluster=ClusterSpec.parse(f"{nodes}x{world // nodes}xcpu"),
        training=TrainingSpec(seq_len=128, global_batch_tokens=128 * 4 * world, precision="fp32"),
        search=SearchSpace(tensor_parallel_degrees=[1], shardings=["full_shard"]),
    )


def pipeline_plan(
    schedule: PipelineSchedule = "1F1B", *, pp: int = 2, world: int = 4, nodes: int = 1
) -> tuple[PlanRequest, Plan]:
    """llama-debug on `world` CPU ranks (over `nodes` nodes) as pp x dp_shard (world / pp), with
    `schedule`, 4 micro-batches."""
    request = pipeline_request(world, nodes)
    plan = make_plan(request)
    config = plan.config
    stages = pp * (1 if schedule == "1F1B" else 2)
    blocks = STAGE_BLOCKS[schedule] if pp == 2 else balanced_stage_split(
        plan.model.num_layers, stages, first_extra=0.0, last_extra=0.0
    )
    pipelined = dataclasses.replace(
        config, mesh=Mesh(pp=pp, dp_shard=world // pp),
        # The same global batch: 4 micro-batches on each of the world / pp data-parallel ranks.
        micro_batch_size=plan.training.global_batch_sequences // (4 * (world // pp)),
        grad_accum_steps=4,
        compile=config.compile and schedule != "ZBVZeroBubble",  # torch runs ZB-V's stages eager only
        pipeline=PipelineConfig(
            schedule=schedule, stages_per_rank=len(blocks) // pp, stage_blocks=blocks
        ),
    )
    return request, plan.model_copy(update={"config": pipelined, "alternatives": (), "pareto_front": ()})


def digest(request: PlanRequest, plan: Plan) -> str:
    """A hash of its own: the configuration is fixed, not searched."""
    return plan_hash(request, config=plan.config.as_document())
