"""torchrun worker: the peak memory of a pipeline rank, measured over whole training steps of the
runtime (pp 2, eager FSDP2, bf16 compute, gloo), and what is alive at that peak.

    torchrun --nproc-per-node 2 tests/executor/workers/pipeline_memory.py --out result.json \
        [--dp 2 (4 ranks)] [--steps 3] [SCHEDULE ...]        # 1F1B, Interleaved1F1B (default: both)
    torchrun --nproc-per-node 2 tests/executor/workers/pipeline_memory.py --out result.json \
        --plans plans.json                                  # [{"label": ..., "plan": <Plan document>}]

Each plan is the planner's own (`pipeline_plan`: `planner.search.predict` of a PlanRequest and a
ParallelConfig, no search), so a test compares the measurement with the same plan's prediction. It
runs through the runtime's code path (`parallelize`, `materialize`, the trainer's optimizer,
`train_step`: torch's pipeline schedule over this rank's stages) for `--steps` AdamW steps, every
plan of a launch in the same process group (one mesh per shape).

Live bytes are every storage an op on the training thread outputs, from the model's
materialisation on (a TorchDispatchMode holding a weak reference per storage, its size read when
counted: FSDP2 resizes the gathered parameters' storages outside dispatch). gloo's worker-thread
temporaries are left out, as on a GPU (NCCL's buffers lie outside the allocator). A step's peak is
the most bytes alive at once from the step's start to its end; the first step (lazy
initialisation, optimizer state created) is not counted. At the last step's start and at each of
its new peaks the live storages are classified by what holds them (`CATEGORIES`), so the peak (and
what the step starts with) comes with a breakdown:
  params            this rank's sharded fp32 parameters (the optimizer's)
  unsharded_params  FSDP2's gathered bf16 copies (under pp: gathered once per step)
  grads             gradients: FSDP2's fp32 accumulation of the unsharded ones, the bf16 ones of the
                    micro-batch being reduced, the sharded ones
  optimizer         AdamW's moments
  recv_buffers      torch's receive buffers: one hidden-state tensor per micro-batch for each stage's
                    input from the stage before and one per micro-batch for each gradient from the
                    stage after, allocated at the first step and kept for the whole run
  stage_outputs     a non-last stage's forward outputs, kept (`fwd_cache`) until the micro-batch's
                    backward
  activations       the rest: saved activations, recomputation, logits and loss, temporaries

Every rank reports; rank 0 writes a JSON list with one record per plan and rank.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from contract.mesh import Mesh  # noqa: E402
from contract.parallel_config import (  # noqa: E402
    CheckpointingConfig,
    InductorConfig,
    ParallelConfig,
    PipelineConfig,
)
from contract.plan_document import RuntimePlan, parse_plan  # noqa: E402
from executor.runtime.data import BatchIndex, SyntheticTokens  # noqa: E402
from executor.runtime.distributed import (  # noqa: E402
    build_mesh,
    data_parallel_rank,
    exit_process,
    init_distributed,
)
from executor.runtime.materialize import materialize  # noqa: E402
from executor.runtime.models import build_model  # noqa: E402
from executor.runtime.optim import OptimizerSettings, build_optimizer  # noqa: E402
from executor.runtime.parallelize import parallelize  # noqa: E402
from executor.runtime.step import train_step  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.search import predict  # noqa: E402
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec  # noqa: E402
from tests.executor.plan_factory import LLAMA_DEBUG  # noqa: E402

PP = 2
MICRO_BATCHES = 4
MICRO_BATCH_SIZE = 2
SEQ = 1024
# A small llama whose activations weigh nearly as much as its states (long sequences, a small vocabulary),
# so that what a pipeline keeps per micro-batch (a hidden state: 2 MiB in bf16) is a few percent of
# a rank's peak: llama-debug at twice its width (hidden 512, ffn 1536), 14.7M parameters in 4 blocks.
MODEL: dict[str, Any] = {
    **LLAMA_DEBUG,
    "name": "llama-pp-memory",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "max_seq_len": SEQ,
}
SPLITS: dict[str, PipelineConfig] = {
    "1F1B": PipelineConfig(schedule="1F1B", stages_per_rank=1, stage_blocks=(2, 2)),
    "Interleaved1F1B": PipelineConfig(
        schedule="Interleaved1F1B", stages_per_rank=2, stage_blocks=(1, 1, 1, 1)
    ),
}
CATEGORIES = (
    "params", "unsharded_params", "grads", "optimizer", "recv_buffers", "stage_outputs", "activations"
)
CPU = torch.device("cpu")


def pipeline_plan(schedule: str, *, dp: int = 1) -> Plan:
    """The planner's plan (and prediction) for MODEL under pp 2 (x dp_shard `dp`) with `schedule`:
    eager FSDP2 full_shard, whole-block checkpointing, bf16 parameters and fp32 reduction, 4
    micro-batches of 2 sequences per data-parallel rank."""
    world = PP * dp
    request = PlanRequest(
        model=ModelSpec.model_validate(MODEL),
        cluster=ClusterSpec.parse(f"1x{world}xcpu"),
        training=TrainingSpec(
            seq_len=SEQ, global_batch_tokens=SEQ * MICRO_BATCH_SIZE * MICRO_BATCHES * dp, precision="bf16"
        ),
    )
    config = ParallelConfig(
        sharding="full_shard",
        mesh=Mesh(pp=PP, dp_shard=dp),
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        reshard_after_forward=True,
        prefetch_depth=1,
        checkpointing=CheckpointingConfig(mode="full"),
        micro_batch_size=MICRO_BATCH_SIZE,
        grad_accum_steps=MICRO_BATCHES,
        param_dtype="bfloat16",
        reduce_dtype="float32",
        compile=False,
        inductor=InductorConfig(
            bucket_all_gathers=False, bucket_reduce_scatters=False, reorder_for_compute_comm_overlap=False
        ),
        pipeline=SPLITS[schedule],
    )
    return predict(request, config)


def _storage(tensor: object) -> torch.UntypedStorage | None:
    """The storage under a tensor (a DTensor's local one); None for anything else or a meta tensor."""
    if isinstance(tensor, DTensor):
        tensor = tensor._local_tensor
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage of its own
        return None


def _storage_key(tensor: object) -> int | None:
    storage = _storage(tensor)
    return None if storage is None else storage._cdata


class LiveStorages(TorchDispatchMode):
    """Every storage an op outputs on this thread, by weak reference; the peak of their bytes while
    counting, the action running then, and (when `classify` is set) those bytes by category."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.counting = False
        self.peak = 0
        self.classify: Callable[[], dict[int, str]] | None = None
        self.at_peak: dict[str, int] = {}
        self.at_start: dict[str, int] = {}
        self.action = "start"
        self.peak_action = "start"

    def current(self) -> int:
        return sum(storage.nbytes() for ref in list(self.storages.values()) if (storage := ref()) is not None)

    def start_counting(self, *, classify: Callable[[], dict[int, str]] | None) -> None:
        """Count from now (the step's start: its bytes are the first peak, `at_start` their split)."""
        self.counting, self.classify, self.peak, self.at_peak = True, classify, 0, {}
        self._check()
        self.at_start = dict(self.at_peak)

    def _register(self, tensor: object) -> bool:
        storage = _storage(tensor)
        if storage is None:
            return False
        key, storages = storage._cdata, self.storages
        known = storages.get(key)
        if known is not None and known() is not None:
            return False

        def forget(ref: weakref.ref, key: int = key) -> None:
            if storages.get(key) is ref:
                del storages[key]

        storages[key] = weakref.ref(storage, forget)
        return True

    def _check(self) -> None:
        refs = list(self.storages.items())
        alive = [(key, storage.nbytes()) for key, ref in refs if (storage := ref()) is not None]
        total = sum(nbytes for _, nbytes in alive)
        if total <= self.peak:
            return
        self.peak, self.peak_action = total, self.action
        if self.classify is not None:
            kinds = self.classify()
            split: collections.Counter[str] = collections.Counter()
            for key, nbytes in alive:
                split[kinds.get(key, "activations")] += nbytes
            self.at_peak = dict(split)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        new = False
        for tensor in tree_flatten(out)[0]:
            new |= self._register(tensor)
        if new and self.counting:
            self._check()
        return out


def _fsdp_params(stages: list[PipelineStage]) -> Iterator[Any]:
    """FSDP2's per-parameter state of every stage (each stage module is an FSDP root); private API,
    so anything missing leaves its bytes under `activations`."""
    for stage in stages:
        get_state = getattr(stage.submod, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for state in get_state()._state_ctx.all_states:
            for group in state._fsdp_param_groups:
                yield from group.fsdp_params


def classifier(stages: list[PipelineStage], optimizer: torch.optim.Optimizer) -> Callable[[], dict[int, str]]:
    """storage key -> category of what holds it now (the first category that claims it)."""

    def classify() -> dict[int, str]:
        kinds: dict[int, str] = {}

        def put(tensor: object, kind: str) -> None:
            key = _storage_key(tensor)
            if key is not None:
                kinds.setdefault(key, kind)

        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.ndim:
                    put(value, "optimizer")
        for stage in stages:
            for infos in stage.args_recv_info.values():
                for info in infos:
                    put(getattr(info, "buffer", None), "recv_buffers")
            for infos in getattr(stage, "grad_recv_info", {}).values():
                for info in infos:
                    put(getattr(info, "buffer", None), "recv_buffers")
            if not stage.is_last:
                for outputs, _ in stage.fwd_cache.values():
                    for output in outputs:
                        put(output, "stage_outputs")
        for fsdp_param in _fsdp_params(stages):
            put(fsdp_param._sharded_param_data, "params")
            put(fsdp_param.sharded_param, "params")
            put(fsdp_param.sharded_param.grad, "grads")
            put(getattr(fsdp_param, "unsharded_accumulated_grad", None), "grads")
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                put(unsharded.grad, "grads")
                put(unsharded, "unsharded_params")
            for gathered in getattr(fsdp_param, "all_gather_outputs", None) or []:
                put(gathered, "unsharded_params")
        for stage in stages:
            for parameter in stage.submod.parameters():
                put(parameter, "params")
                put(parameter.grad, "grads")
        return kinds

    return classify


def _label_actions(stages: list[PipelineStage], live: LiveStorages) -> None:
    """Name the schedule's action running (`s0 F1`: stage 0's forward of micro-batch 1), for the
    record of where the peak happened."""
    for stage in stages:
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def labelled_forward(mb: int, *args: Any, _f: Callable = forward, _s: int = stage.stage_index,
                             **kwargs: Any) -> Any:
            live.action = f"s{_s} F{mb}"
            return _f(mb, *args, **kwargs)

        def labelled_backward(mb: int, *args: Any, _b: Callable = backward, _s: int = stage.stage_index,
                              **kwargs: Any) -> Any:
            live.action = f"s{_s} B{mb}"
            return _b(mb, *args, **kwargs)

        stage.forward_one_chunk = labelled_forward  # type: ignore[method-assign]
        stage.backward_one_chunk = labelled_backward  # type: ignore[method-assign]


def run_plan(label: str, plan: RuntimePlan, *, steps: int, meshes: dict[tuple, DeviceMesh]) -> dict[str, Any]:
    env = init_distributed(plan)
    cfg = plan.config
    if cfg.mesh.shape not in meshes:  # one set of process groups per mesh shape, reused across plans
        meshes[cfg.mesh.shape] = build_mesh(plan, env)
    mesh = meshes[cfg.mesh.shape]
    dp_rank, dp_size = data_parallel_rank(mesh)
    data = SyntheticTokens(vocab_size=plan.model.vocab_size, seq_len=plan.training.seq_len, seed=7)
    live = LiveStorages()
    step_peaks: list[int] = []
    step_start = 0
    with live:
        par = parallelize(build_model(plan.model, seq_len=plan.training.seq_len), plan=plan, mesh=mesh)
        assert par.pipeline is not None, f"{label}: not a pipeline plan"
        materialize(par.module, device=CPU, seed=7)
        optimizer = build_optimizer(par.module, OptimizerSettings(warmup_steps=1), device=CPU)
        stages = par.pipeline.stages
        _label_actions(stages, live)
        for step in range(1, steps + 1):
            batches = [
                data.batch(BatchIndex(step, micro, dp_rank, dp_size, cfg.micro_batch_size))
                for micro in range(cfg.grad_accum_steps)
            ]
            if step > 1:
                live.action = "step start"
                step_start = live.current()
                live.start_counting(classify=classifier(stages, optimizer) if step == steps else None)
            train_step(par, optimizer, iter(batches), grad_accum_steps=cfg.grad_accum_steps,
                       max_grad_norm=1.0, loss_chunks=cfg.loss_chunks)
            if step > 1:
                step_peaks.append(live.peak)
                live.counting = False
        record = {
            "label": label,
            "rank": env.rank,
            "stages": [stage.stage_index for stage in stages],
            "step_peaks": step_peaks,
            "peak_bytes": max(step_peaks),
            "step_start_bytes": step_start,
            "peak_action": live.peak_action,
            "at_peak": {kind: live.at_peak.get(kind, 0) for kind in CATEGORIES},
            "at_step_start": {kind: live.at_start.get(kind, 0) for kind in CATEGORIES},
            # One micro-batch's hidden states, as a stage boundary passes them (the compute dtype).
            "boundary_bytes": cfg.micro_batch_size * plan.training.seq_len * plan.model.hidden_size
            * getattr(torch, cfg.param_dtype).itemsize,
            "notes": par.notes,
        }
    del par, optimizer, stages
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--plans", type=Path, help='[{"label": ..., "plan": <Plan document>}]')
    parser.add_argument("--dp", type=int, default=1, help="dp_shard of the plans made from SCHEDULE")
    parser.add_argument("--steps", type=int, default=2, help="steps per plan (the first not counted)")
    parser.add_argument("schedules", nargs="*", default=list(SPLITS), metavar="SCHEDULE")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first step is not counted)")
    if args.plans is not None:
        cases = [(case["label"], case["plan"]) for case in json.loads(args.plans.read_text())]
    else:
        cases = [(s, pipeline_plan(s, dp=args.dp).model_dump(mode="json")) for s in args.schedules]
    meshes: dict[tuple, DeviceMesh] = {}
    records: list[dict[str, Any]] = []
    for label, document in cases:
        record = run_plan(label, parse_plan(document), steps=args.steps, meshes=meshes)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, record)
        records.extend(gathered)
        gc.collect()  # the last plan's model, optimizer and buffers, before the next plan is built
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(records, indent=1))
    dist.barrier()
    exit_process(0)


if __name__ == "__main__":
    main()
