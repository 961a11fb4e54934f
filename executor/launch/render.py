"""The bundle's text files: launch.sh (torchrun), slurm.sbatch, k8s.yaml (TrainJob), k8s-pytorchjob.yaml,
README.md. Each renderer takes a LaunchContext whose fields are already validated or quoted."""

from __future__ import annotations

from dataclasses import dataclass

from contract.float8 import TORCHAO_REQUIREMENT
from contract.mesh import MESH_AXES, Mesh
from contract.parallel_config import PipelineConfig
from executor.launch import environment
from executor.launch.quoting import comment, sh, yaml_str


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """What the templates need from a plan, in safe forms."""

    title: str
    """Comment-safe one-line description (model, cluster, strategy)."""
    plan_hash: str
    """Validated hex digest."""
    short_hash: str
    """First 12 hex digits (rendezvous id, file names)."""
    job_name: str
    """Slug for SLURM job names."""
    k8s_name: str
    """DNS-1123 label for Kubernetes objects."""
    num_nodes: int
    gpus_per_node: int
    gpu: str
    """Comment-safe GPU name."""
    uses_gpus: bool
    """False for `cpu` plans (no GPU resource requests, gloo)."""
    image: str
    """Validated container image reference."""
    label: str
    """Comment-safe strategy label (e.g. `full_shard/8 u2 AC=sel2 mb2x4 compiled`)."""
    mesh: Mesh | None = None
    """The training plan's mesh (None: a calibration run, which has none)."""
    float8: str = "none"
    """The plan's Float8 recipe (`config.float8`: none, tensorwise, rowwise, mxfp8; a checked choice)."""
    async_tp: bool = False
    """The plan's async tensor parallelism (`config.async_tp`)."""
    pipeline: PipelineConfig | None = None
    """The plan's pipeline (`config.pipeline`, present when mesh.pp > 1; its schedule a checked choice)."""
    pure_bf16: bool = False
    """The plan trains in pure bf16 (`training.state_dtype` bfloat16: no fp32 master)."""


FLOAT8_GPUS = {"mxfp8": "compute capability 10.0+: B200"}
"""GPUs each Float8 recipe needs (default: compute capability 8.9+: L40S, H100, H200, B200)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What a torchrun script starts: the training run, or a calibration run."""

    script: str
    """File name of the torchrun script (`launch.sh`)."""
    module: str
    """Python module every process runs."""
    args: str
    """Its fixed arguments, as bash words (paths under $HERE, the bundle directory)."""
    usage: str
    """The usage line shown at the top of the scripts."""
    resumable: bool
    """Whether CHECKPOINT_DIR makes the run save and resume checkpoints."""
    reads_data: bool = False
    """Whether the run trains on data: DATA / SYNTHETIC_DATA choose it, and one of them is required."""


TRAIN = Entry(
    script="launch.sh",
    module="executor.runtime.train",
    args='--plan "$HERE/plan.json"',
    usage="DATA=/path/to/dataset ./launch.sh [trainer options]   e.g. DATA=/data/ds ./launch.sh --steps 1000",
    resumable=True,
    reads_data=True,
)


def _mesh_header(ctx: LaunchContext) -> str:
    """Header comment lines stating the mesh ('' without one)."""
    mesh = ctx.mesh
    if mesh is None:
        return ""
    if mesh.tp == 1:
        only = " (data parallelism only)" if mesh.pp == 1 and mesh.cp == 1 else ""
        return f"# mesh: {mesh.describe()}{only}\n{_pipeline_header(ctx)}"
    pipelined = (
        "#   async TP: the tp collectives are micro-pipelined with their matmuls (inductor, CUDA symmetric\n"
        "#   memory between the node's GPUs; a CPU run falls back to plain collectives).\n"
        if ctx.async_tp else ""
    )
    return (
        f"# mesh: {mesh.describe()}\n"
        f"#   tp groups are {mesh.tp} consecutive ranks inside a node (tensor parallel with sequence + loss\n"
        f"#   parallel); FSDP shards over the data-parallel dims. Every node runs a multiple of {mesh.tp}.\n"
        f"{pipelined}{_pipeline_header(ctx)}"
    )


def _pipeline_header(ctx: LaunchContext) -> str:
    """Header comment lines stating the pipeline ('' without one): schedule, stages, blocks per stage."""
    if ctx.mesh is None or ctx.pipeline is None:
        return ""
    mesh, pipeline = ctx.mesh, ctx.pipeline
    blocks = "/".join(str(b) for b in pipeline.stage_blocks)
    stages = f"{pipeline.num_stages} stages, {pipeline.stages_per_rank} per pipeline rank"
    return (
        f"# pipeline: {pipeline.schedule}, {stages}, blocks per stage {blocks}\n"
        f"#   (the first stage also runs the embeddings, the last the head and the loss). Pipeline rank p\n"
        f"#   is the p-th block of {mesh.stage_ranks} consecutive ranks (pp outermost): the world must be\n"
        f"#   exactly {mesh.world_size} ranks{_stage_layout(ctx)}.\n"
    )


def _stages_tile_nodes(ctx: LaunchContext) -> bool:
    """Whether the plan's own layout puts every pipeline stage on whole nodes (several nodes per stage,
    or several stages per node): then a per-node process count that breaks it is refused."""
    stage = ctx.mesh.stage_ranks if ctx.mesh is not None else 0
    return stage > 0 and (stage % ctx.gpus_per_node == 0 or ctx.gpus_per_node % stage == 0)


def _stage_layout(ctx: LaunchContext) -> str:
    assert ctx.mesh is not None
    stage = ctx.mesh.stage_ranks
    if not _stages_tile_nodes(ctx):
        return ""
    if stage >= ctx.gpus_per_node:
        return f", each stage on {stage // ctx.gpus_per_node} whole node(s) in node order"
    return f", {ctx.gpus_per_node // stage} whole stages per node in node order"


def _pipeline_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses a world the pipeline cannot run on ('' without a pipeline): its size must be the
    mesh's product (the stages cannot be re-laid), and where the plan puts its stages on whole nodes,
    the per-node process count must keep them there."""
    if ctx.mesh is None or ctx.mesh.pp == 1:
        return ""
    mesh, stage = ctx.mesh, ctx.mesh.stage_ranks
    tiling = f"""
# Each pipeline stage is {stage} consecutive ranks on whole nodes, as the plan priced its
# collectives: a node must not hold part of one stage and part of the next.
if [ "$(({stage} % NPROC_PER_NODE))" -ne 0 ] && [ "$((NPROC_PER_NODE % {stage}))" -ne 0 ]; then
  echo "{script}: NPROC_PER_NODE=$NPROC_PER_NODE would split the plan's pipeline stages of {stage}" \\
       "ranks across nodes; run a divisor or a multiple of {stage} processes per node (the plan's" \\
       "{ctx.gpus_per_node})" >&2
  exit 2
fi""" if _stages_tile_nodes(ctx) else ""
    return f"""
# The plan's pipeline runs {mesh.pp} stages of {stage} ranks each (pp outermost): the world must be exactly
# {mesh.describe()}, or stages and their blocks would not line up.
if [ "$((NPROC_PER_NODE * NNODES))" -ne {mesh.world_size} ]; then
  echo "{script}: $NNODES node(s) x $NPROC_PER_NODE process(es) = $((NPROC_PER_NODE * NNODES)) ranks, but" \\
       "the plan's mesh is {mesh.describe()}: run {ctx.num_nodes} node(s) x {ctx.gpus_per_node}" \\
       "processes, or re-plan for this cluster (fsdp-planner plan ... --pp N)" >&2
  exit 2
fi{tiling}"""


def _float8_header(ctx: LaunchContext) -> str:
    """Header comment lines stating a Float8 plan's precision and requirements ('' without Float8)."""
    if ctx.float8 == "none":
        return ""
    gpus = FLOAT8_GPUS.get(ctx.float8, "compute capability 8.9+: L40S, H100, H200, B200")
    return (
        f"# precision: Float8 {ctx.float8} (torchao) for the blocks' eligible linears; the output head and\n"
        f"#   small linears stay in the plan's compute precision. Needs {TORCHAO_REQUIREMENT} (the executor\n"
        f"#   extra) and FP8 GPUs ({gpus}); on CPU torchao emulates it.\n"
    )


def _pure_bf16_header(ctx: LaunchContext) -> str:
    """Header comment lines stating that a plan trains in pure bf16 ('' in mixed precision)."""
    if not ctx.pure_bf16:
        return ""
    return (
        "# precision: pure bf16 (training.state_dtype bfloat16): parameters, gradients and AdamW's states\n"
        "#   in bf16, no fp32 master; on CPU the trainer runs fp32 unless given --precision plan.\n"
    )


def _float8_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses to start a Float8 plan where torchao is missing ('' without Float8)."""
    if ctx.float8 == "none":
        return ""
    return f"""
if ! "$PYTHON" -c "import torchao.float8" 2>/dev/null; then
  echo "{script}: the plan trains with Float8 ({ctx.float8}), which needs torchao; '$PYTHON' cannot" \\
       "import it: install it there ($PYTHON -m pip install '{TORCHAO_REQUIREMENT}')," \\
       "or set PYTHON to an interpreter that has it" >&2
  exit 2
fi"""


def _tensor_parallel_check(ctx: LaunchContext, script: str) -> str:
    """Bash that refuses a per-node process count the tp groups cannot tile ('' when tp is 1)."""
    if ctx.mesh is None or ctx.mesh.tp == 1:
        return ""
    tp = ctx.mesh.tp
    return f"""
# The plan's tensor-parallel groups are {tp} consecutive ranks inside one node: a node running a
# process count that is not a multiple of {tp} would split a group across nodes (or leave one short).
if [ "$((NPROC_PER_NODE % {tp}))" -ne 0 ]; then
  echo "{script}: NPROC_PER_NODE=$NPROC_PER_NODE (GPUs per node) is not a multiple of the plan's" \\
       "tensor-parallel degree {tp}: each tp group is {tp} consecutive ranks inside one node; run a" \\
       "multiple of {tp} processes per node (the plan's {ctx.gpus_per_node}), or re-plan with --tp" >&2
  exit 2
fi"""


def _data_args(script: str) -> str:
    """Bash that adds the training data to ARGS: DATA (or --data), or SYNTHETIC_DATA=1 (or
    --synthetic-data) for a rehearsal, and refuses a run that names neither before torchrun starts."""
    return f"""
# Training data: DATA (or --data), or SYNTHETIC_DATA=1 (or --synthetic-data) for a rehearsal on
# synthetic tokens, which are never a default.
DATA_CHOSEN=""
if [ -n "${{DATA:-}}" ]; then
  case "$DATA" in /*) ;; *) DATA="$PWD/$DATA" ;; esac  # relative to where you are: torchrun runs in $HERE
  ARGS+=(--data "$DATA")
  DATA_CHOSEN=DATA
fi
case "${{SYNTHETIC_DATA:-0}}" in
  0|"") ;;
  1) ARGS+=(--synthetic-data); DATA_CHOSEN=SYNTHETIC_DATA ;;
  *) echo "{script}: SYNTHETIC_DATA must be 1 or 0, got '$SYNTHETIC_DATA'" >&2; exit 2 ;;
esac
for arg in "$@"; do
  case "$arg" in --data|--data=*|--synthetic-data|-h|--help) DATA_CHOSEN=arguments ;; esac
done
if [ -z "$DATA_CHOSEN" ]; then
  echo "{script}: no training data: set DATA to a dataset directory made by" \\
       "\\`fsdp-planner prepare-data\\` (DATA=/path/to/dataset ./{script} ...), or SYNTHETIC_DATA=1" \\
       "for a rehearsal on synthetic tokens" >&2
  exit 2
fi"""


def launch_sh(ctx: LaunchContext, entry: Entry = TRAIN) -> str:
    resume = (
        """
if [ -n "${CHECKPOINT_DIR:-}" ]; then
  ARGS+=(--checkpoint-dir "$CHECKPOINT_DIR" --resume)
fi"""
        if entry.resumable
        else ""
    )
    data = _data_args(entry.script) if entry.reads_data else ""
    data_doc = (
        "\n#   DATA            training data: a `fsdp-planner prepare-data` directory (or token file)"
        "\n#   SYNTHETIC_DATA  1: synthetic tokens instead (a rehearsal); DATA or this is required"
        if entry.reads_data
        else ""
    )
    restart_doc = "; pair with CHECKPOINT_DIR" if entry.resumable else ""
    signals_doc = (
        "# Signals: SIGTERM (torchrun passes it on to the trainer processes) or SIGUSR1 (SLURM's --signal,\n"
        "#   which reaches every process of the job step) make every rank stop after the current step,\n"
        "#   save a checkpoint to CHECKPOINT_DIR and exit 0. torchrun itself ignores SIGUSR1.\n"
        if entry.resumable
        else ""
    )
    ignore_usr1 = (
        """
# SIGUSR1 is for the trainer processes (they checkpoint and stop); torchrun, which would die of it,
# inherits it ignored. The trainer installs its own handler.
trap '' USR1"""
        if entry.resumable
        else ""
    )
    checkpoint_doc = (
        "\n#   CHECKPOINT_DIR  shared directory: checkpoints are saved there and runs resume from the newest"
        if entry.resumable
        else ""
    )
    return f"""#!/usr/bin/env bash
# torchrun launcher generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}{_float8_header(ctx)}{_pure_bf16_header(ctx)}#
#   {entry.usage}
# Environment (all optional):
#   NPROC_PER_NODE  processes on this node   (default {ctx.gpus_per_node}, the plan's GPUs per node)
#   NNODES          nodes in the job         (default {ctx.num_nodes}; else PET_NNODES or SLURM_NNODES)
#   MASTER_ADDR     rendezvous host: node 0's address, the same on every node (required with
#                   NNODES > 1, else PET_MASTER_ADDR; one node needs none)
#   MASTER_PORT     rendezvous port          (default 29500)
#   MAX_RESTARTS    torchrun restarts        (default 0{restart_doc}){checkpoint_doc}
#   RDZV_ID         rendezvous id            (default: the plan hash)
#   PYTHON          interpreter with torch   (default python3){data_doc}
{environment.header()}{signals_doc}set -euo pipefail

HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NPROC_PER_NODE="${{NPROC_PER_NODE:-{ctx.gpus_per_node}}}"
NNODES="${{NNODES:-${{PET_NNODES:-${{SLURM_NNODES:-{ctx.num_nodes}}}}}}}"
MASTER_ADDR="${{MASTER_ADDR:-${{PET_MASTER_ADDR:-}}}}"
MASTER_PORT="${{MASTER_PORT:-${{PET_MASTER_PORT:-29500}}}}"
MAX_RESTARTS="${{MAX_RESTARTS:-0}}"
RDZV_ID="${{RDZV_ID:-{sh(ctx.short_hash)}}}"
PYTHON="${{PYTHON:-python3}}"

for var in NPROC_PER_NODE NNODES MAX_RESTARTS MASTER_PORT; do
  if ! [[ "${{!var}}" =~ ^[0-9]+$ ]]; then
    echo "{entry.script}: $var must be a whole number, got '${{!var}}'" >&2
    exit 2
  fi
done
# Every node must reach node 0's rendezvous: a default address would be each node's own loopback, where
# every node would wait for the others forever (or train alone).
if [ "$NNODES" -gt 1 ] && [ -z "$MASTER_ADDR" ]; then
  echo "{entry.script}: NNODES=$NNODES needs MASTER_ADDR, the address of node 0 (which hosts the" \\
       "rendezvous), the same on every node: e.g. NNODES=$NNODES MASTER_ADDR=10.0.0.1 ./{entry.script}" \\
       "on each node (NNODES=1 runs on this node alone)" >&2
  exit 2
fi{_tensor_parallel_check(ctx, entry.script)}{_pipeline_check(ctx, entry.script)}
if [ "$((NPROC_PER_NODE * NNODES))" -ne {ctx.num_nodes * ctx.gpus_per_node} ]; then
  echo "{entry.script}: warning: $NNODES node(s) x $NPROC_PER_NODE process(es) is not the plan's" \\
       "{ctx.num_nodes} x {ctx.gpus_per_node}; the trainer will refuse a different world size" >&2
fi
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "{entry.script}: '$PYTHON' cannot import torch; set PYTHON to an interpreter that has it" >&2
  exit 2
fi{_float8_check(ctx, entry.script)}

{environment.bash_defaults(entry.script, cores="$(nproc 2>/dev/null || echo 1)")}

ARGS=({entry.args}){resume}{data}

if [ "$NNODES" -gt 1 ]; then
  # Multi-node: elastic c10d rendezvous hosted by the trainer on MASTER_ADDR:MASTER_PORT.
  RDZV=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"
        --rdzv-id "$RDZV_ID")
else
  # One node: a private rendezvous on a free port (several jobs can share a machine).
  RDZV=(--standalone --nnodes 1)
fi

export PYTHONPATH="$HERE${{PYTHONPATH:+:$PYTHONPATH}}"{ignore_usr1}
cd "$HERE"
exec "$PYTHON" -m torch.distributed.run "${{RDZV[@]}}" \\
  --nproc-per-node "$NPROC_PER_NODE" --max-restarts "$MAX_RESTARTS" \\
  -m {entry.module} "${{ARGS[@]}}" "$@"
"""


SIGNAL_LEAD_S = environment.TERMINATION_GRACE_S
"""SLURM sends SIGUSR1 this many seconds before the job's end (--signal=B:USR1@...)."""
EXIT_NOT_REQUEUED = 75
"""slurm.sbatch: stopped by SIGUSR1 with a checkpoint, but not requeued (EX_TEMPFAIL: submit again)."""


def _sbatch_preemption_doc(entry: Entry) -> str:
    if not entry.resumable:
        return ""
    return f"""#
# Time limits and preemption: SLURM sends this script SIGUSR1 {SIGNAL_LEAD_S} s before the job ends
# (--signal). It passes the signal to every process of the job step: each rank stops after its
# current step, saves a checkpoint in CHECKPOINT_DIR and exits; then this script requeues the job
# (scontrol requeue: same job id, SLURM_RESTART_COUNT + 1), which resumes from the newest checkpoint.
# A job preempted with PreemptMode=REQUEUE comes back the same way (--requeue).
#   CHECKPOINT_DIR  on a filesystem every node sees (default: $BUNDLE_DIR/checkpoints; set it
#                   empty to run without checkpoints, and then without requeueing)
#   REQUEUE         1 requeue after SIGUSR1 (default); 0 exit {EXIT_NOT_REQUEUED} instead
#   MAX_REQUEUES    stop requeueing once SLURM_RESTART_COUNT reaches it (default: no limit)
# Exit status: 0 trained to the end, or stopped and requeued; 2 invalid bundle or settings (nothing
#   started); {EXIT_NOT_REQUEUED} stopped by SIGUSR1 with a checkpoint but not requeued (REQUEUE=0,
#   MAX_REQUEUES reached, no CHECKPOINT_DIR, or scontrol requeue failed): submit again to resume;
#   otherwise srun's status (1: a trainer process failed; the metrics file tells an out-of-memory).
"""


def _sbatch_run(entry: Entry) -> str:
    """The srun line: in the foreground, or (resumable runs) in the background under signal traps."""
    srun = f'srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$BUNDLE_DIR/{entry.script}" "$@"'
    if not entry.resumable:
        return f"""
# One torchrun per node; it starts NPROC_PER_NODE processes.
{srun}
"""
    return f"""
PREEMPTED=0
SRUN_PID=""
# shellcheck disable=SC2317  # run by trap
on_usr1() {{
  PREEMPTED=1
  echo "sbatch: SIGUSR1 (the time limit or a preemption is near): every rank checkpoints and stops"
  if [ -n "$SRUN_PID" ]; then
    kill -USR1 "$SRUN_PID" 2>/dev/null || true  # srun passes it to every process of the step
  fi
}}
# shellcheck disable=SC2317  # run by trap
on_term() {{
  echo "sbatch: SIGTERM (the job is ending): waiting for the ranks to save and exit"
}}
trap on_usr1 USR1
trap on_term TERM

# One torchrun per node; it starts NPROC_PER_NODE trainer processes. srun runs in the background so
# that this script takes SLURM's signal while it waits: bash runs a trap only between commands.
{srun} &
SRUN_PID=$!
while :; do
  STATUS=0
  wait "$SRUN_PID" || STATUS=$?
  # A trap's signal ends `wait` early (status > 128) while srun still runs: wait again.
  if [ "$STATUS" -gt 128 ] && kill -0 "$SRUN_PID" 2>/dev/null; then continue; fi
  break
done
trap - USR1 TERM

if [ "$PREEMPTED" -eq 0 ]; then
  exit "$STATUS"
fi
RESTARTS="${{SLURM_RESTART_COUNT:-0}}"
if [ -z "$CHECKPOINT_DIR" ]; then
  echo "sbatch: stopped early (status $STATUS) with no CHECKPOINT_DIR: not requeued" >&2
elif [ "$REQUEUE" != 1 ]; then
  echo "sbatch: stopped early (status $STATUS), checkpoint in $CHECKPOINT_DIR; REQUEUE=0: submit" \\
       "again to resume" >&2
elif [ -n "$MAX_REQUEUES" ] && [ "$RESTARTS" -ge "$MAX_REQUEUES" ]; then
  echo "sbatch: stopped early (status $STATUS) after $RESTARTS requeue(s), MAX_REQUEUES=$MAX_REQUEUES:" \\
       "not requeued; submit again to resume from $CHECKPOINT_DIR" >&2
else
  echo "sbatch: stopped early (status $STATUS); requeueing job $SLURM_JOB_ID (restart $((RESTARTS + 1)))" \\
       "to resume from $CHECKPOINT_DIR"
  if scontrol requeue "$SLURM_JOB_ID"; then
    exit 0
  fi
  echo "sbatch: scontrol requeue $SLURM_JOB_ID failed: submit again to resume from $CHECKPOINT_DIR" >&2
fi
exit {EXIT_NOT_REQUEUED}
"""


def _sbatch_checkpoint_settings(entry: Entry) -> str:
    if not entry.resumable:
        return ""
    return """
# Checkpoints (launch.sh passes --checkpoint-dir and --resume) and requeueing: see the header.
export CHECKPOINT_DIR="${CHECKPOINT_DIR-$BUNDLE_DIR/checkpoints}"
REQUEUE="${REQUEUE:-1}"
MAX_REQUEUES="${MAX_REQUEUES:-}"
if ! [[ "$REQUEUE" =~ ^[01]$ ]] || ! [[ "$MAX_REQUEUES" =~ ^[0-9]*$ ]]; then
  echo "sbatch: REQUEUE must be 0 or 1 and MAX_REQUEUES a whole number," \\
       "got REQUEUE='$REQUEUE' MAX_REQUEUES='$MAX_REQUEUES'" >&2
  exit 2
fi
if [ -n "$CHECKPOINT_DIR" ]; then
  mkdir -p "$CHECKPOINT_DIR"
fi"""


def slurm_sbatch(ctx: LaunchContext, entry: Entry = TRAIN) -> str:
    data_env = "DATA=/shared/dataset " if entry.reads_data else ""  # sbatch and srun pass it on
    gpu_line = f"#SBATCH --gpus-per-node={ctx.gpus_per_node}\n" if ctx.uses_gpus else ""
    preemption_lines = (
        f"#SBATCH --signal=B:USR1@{SIGNAL_LEAD_S}\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
        if entry.resumable
        else ""
    )
    checkpoints = " checkpoints ${CHECKPOINT_DIR:-(none)}," if entry.resumable else ""
    return f"""#!/usr/bin/env bash
# SLURM batch script generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}{_float8_header(ctx)}{_pure_bf16_header(ctx)}#
#   {data_env}sbatch <this file> [options]   (options go to {entry.script})
#   e.g. {data_env}sbatch slurm.sbatch --steps 1000
# Submit from the unpacked bundle directory on a filesystem every node sees. Add partition,
# account and time limits on the command line (sbatch -p gpu -A myproj -t 4:00:00 slurm.sbatch).
{_sbatch_preemption_doc(entry)}#
{environment.header()}#   ({entry.script} on every node keeps what this script set.)
#SBATCH --job-name={ctx.job_name}
#SBATCH --nodes={ctx.num_nodes}
#SBATCH --ntasks-per-node=1
{gpu_line}#SBATCH --exclusive
#SBATCH --output=%x-%j.out
{preemption_lines}set -euo pipefail

BUNDLE_DIR="${{BUNDLE_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}}}"
if [ ! -x "$BUNDLE_DIR/{entry.script}" ]; then
  echo "sbatch: $BUNDLE_DIR/{entry.script} not found; submit from the bundle directory or set BUNDLE_DIR" >&2
  exit 2
fi
# Rendezvous on the job's first node. (sed reads every name: `head -n 1` would close the pipe early,
# and under pipefail the SIGPIPE scontrol may then get would end the job.)
HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export MASTER_ADDR="${{MASTER_ADDR:-$HEAD_NODE}}"
export MASTER_PORT="${{MASTER_PORT:-29500}}"
export NNODES="$SLURM_JOB_NUM_NODES"
export NPROC_PER_NODE="${{NPROC_PER_NODE:-{ctx.gpus_per_node}}}"
export RDZV_ID="${{RDZV_ID:-slurm-$SLURM_JOB_ID}}"
if ! [[ "$NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]]; then
  echo "sbatch: NPROC_PER_NODE must be a positive whole number, got '$NPROC_PER_NODE'" >&2
  exit 2
fi{_tensor_parallel_check(ctx, "sbatch")}{_pipeline_check(ctx, "sbatch")}{_sbatch_checkpoint_settings(entry)}
{environment.bash_defaults("sbatch", cores="${SLURM_CPUS_ON_NODE:-$(nproc 2>/dev/null || echo 1)}")}
echo "job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}):" \\
     "$NNODES node(s) x $NPROC_PER_NODE,{checkpoints} rendezvous $MASTER_ADDR:$MASTER_PORT"
{_sbatch_run(entry)}"""


@dataclass(frozen=True, slots=True)
class KubeContext:
    """What the Kubernetes manifests need beyond LaunchContext (validated by bundle.py)."""

    torch_version: str
    """The torch the image carries (e.g. `2.13.0`): stated in the header."""
    bundle_b64: str
    """base64 of the bundle archive (launch.sh, plan.json, runtime) the ConfigMap carries."""
    bundle_bytes: int
    """Its size before base64 (what counts against the ConfigMap limit)."""
    checkpoint_gib: int
    """Size requested by the checkpoint PersistentVolumeClaim."""
    shm_gib: int
    """sizeLimit of the memory-backed /dev/shm."""
    rdma_resource: str | None = None
    """Extended resource of the RDMA device plugin (None: the block is rendered commented out)."""
    rdma_count: int = 1


BUNDLE_MOUNT = "/etc/fsdp-bundle"
"""Where the ConfigMap (one file, bundle.tar.gz) is mounted, read-only."""
WORK_DIR = "/tmp/fsdp-bundle"
"""Where each pod unpacks it (writable: metrics files and the like land beside launch.sh)."""
CHECKPOINT_MOUNT = "/checkpoints"
"""Where the checkpoint PersistentVolumeClaim is mounted: CHECKPOINT_DIR in the pods."""
RDMA_EXAMPLE = "rdma/rdma_shared_device_a"

# Every pod unpacks the ConfigMap's archive into a writable directory and runs launch.sh there.
_UNPACK = (
    f"set -euo pipefail; mkdir -p {WORK_DIR} && cd {WORK_DIR} && "
    f'tar -xzf {BUNDLE_MOUNT}/bundle.tar.gz && exec ./launch.sh "$@"'
)


def _lines(text: str, indent: int) -> str:
    """`text` (lines without indentation) indented by `indent` spaces."""
    pad = " " * indent
    return "".join(f"{pad}{line}\n" if line else "\n" for line in text.splitlines())


def _env_yaml(entries: list[tuple[str, str]], indent: int, optional: tuple[str, ...] = ()) -> str:
    pad = " " * indent
    out = "".join(f"{pad}- name: {name}\n{pad}  value: {yaml_str(value)}\n" for name, value in entries)
    if optional:
        out += f"{pad}# Unset unless you set them (launch.sh's header says what each does):\n"
        out += "".join(f'{pad}# - name: {name}\n{pad}#   value: ""\n' for name in optional)
    return out


def _pod_env(ctx: LaunchContext) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    given, optional = environment.k8s_env()
    entries = [
        ("NNODES", str(ctx.num_nodes)),
        ("NPROC_PER_NODE", str(ctx.gpus_per_node)),
        ("RDZV_ID", ctx.k8s_name),
        ("CHECKPOINT_DIR", CHECKPOINT_MOUNT),
        *given,
    ]
    return entries, tuple(optional)


def _resources_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    if ctx.uses_gpus:
        text = f"limits:\n  nvidia.com/gpu: {ctx.gpus_per_node}\n"
    else:
        text = f"requests:\n  cpu: {ctx.gpus_per_node}\n"
        if kube.rdma_resource:
            text += "limits:\n"
    if kube.rdma_resource:
        text += "  # RDMA / InfiniBand adapters for NCCL (rendered with --rdma-resource)\n"
        text += f"  {kube.rdma_resource}: {kube.rdma_count}\n"
    elif ctx.uses_gpus:
        text += (
            "  # --- RDMA / InfiniBand (optional) ---------------------------------------------------\n"
            "  # Uncomment with the resource your RDMA device plugin advertises (e.g.\n"
            f"  # {RDMA_EXAMPLE} from the k8s-rdma-shared-dev-plugin, rdma/ib, or an SR-IOV\n"
            "  # resource such as nvidia.com/hostdev), and the IPC_LOCK capability below; set\n"
            "  # NCCL_IB_HCA in env to the adapters. Or render with --rdma-resource NAME.\n"
            f"  # {RDMA_EXAMPLE}: 1\n"
            "  # -------------------------------------------------------------------------------------\n"
        )
    return _lines(text, indent)


def _security_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    """IPC_LOCK (RDMA memory registration): set with an RDMA resource, else a commented hint."""
    if kube.rdma_resource:
        return _lines(
            'securityContext:\n  capabilities:\n    add: ["IPC_LOCK"]  # RDMA: pinned memory\n', indent
        )
    if ctx.uses_gpus:
        return _lines(
            "# securityContext:          # RDMA (see resources): lets NCCL pin memory for the adapters\n"
            '#   capabilities:\n#     add: ["IPC_LOCK"]\n',
            indent,
        )
    return ""


def _volumes_yaml(ctx: LaunchContext, kube: KubeContext, indent: int) -> str:
    return _lines(
        f"""- name: bundle
  configMap:
    name: {ctx.k8s_name}-bundle
- name: dshm  # NCCL and torch share memory between a node's processes through /dev/shm
  emptyDir:
    medium: Memory
    sizeLimit: {kube.shm_gib}Gi
- name: checkpoints
  persistentVolumeClaim:
    claimName: {ctx.k8s_name}-checkpoints
""",
        indent,
    )


def _mounts_yaml(indent: int) -> str:
    return _lines(
        f"""- name: bundle
  mountPath: {BUNDLE_MOUNT}
  readOnly: true
- name: dshm
  mountPath: /dev/shm
- name: checkpoints
  mountPath: {CHECKPOINT_MOUNT}
""",
        indent,
    )


def _k8s_header(ctx: LaunchContext, kube: KubeContext, *, what: str, apply: str, extra: str) -> str:
    return f"""# {what} generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}{_float8_header(ctx)}{_pure_bf16_header(ctx)}#
#   {apply}
# Three objects: the checkpoint PersistentVolumeClaim, the job, and the ConfigMap that carries the
# bundle (launch.sh, plan.json, the runtime: {kube.bundle_bytes:,} bytes as bundle.tar.gz; a ConfigMap holds
# at most 1 MiB). Every pod unpacks it into {WORK_DIR} and runs launch.sh, which sets the cluster
# environment (listed in env below: edit a value there to override it).
# --server-side: a client-side apply copies each object into an annotation limited to 256 KiB.
# Trainer options go in `args` after the "launch" placeholder; name the training data there (a path the
# pods mount), e.g. ["launch", "--data", "/data/ds", "--steps", "1000"], or "--synthetic-data".
# image: the official PyTorch image for torch {kube.torch_version}, the version the plan was made for
#   (`fsdp-planner launcher --torch-version X.Y.Z --cuda-version A.B`, or --image for your own image
#   with torch and your --model-factory code).{_k8s_float8_image(ctx)}
# Volumes: /dev/shm in memory ({kube.shm_gib} GiB at most), checkpoints on the claim at {CHECKPOINT_MOUNT}
#   (CHECKPOINT_DIR: a restarted pod resumes from the newest). Pod deletion sends SIGTERM: every rank
#   saves, with {environment.TERMINATION_GRACE_S} s of grace.
{extra}"""


def _k8s_float8_image(ctx: LaunchContext) -> str:
    if ctx.float8 == "none":
        return ""
    return (
        f"\n# Float8 ({ctx.float8}): the official image has no torchao; use --image with one that has"
        f"\n#   {TORCHAO_REQUIREMENT} (launch.sh refuses to start without it)."
    )


def _pvc_yaml(ctx: LaunchContext, kube: KubeContext) -> str:
    shared = ctx.num_nodes > 1
    access = "ReadWriteMany" if shared else "ReadWriteOnce"
    why = (
        "every node's pod writes its shards into the same checkpoint: the claim needs ReadWriteMany\n"
        "# storage (NFS, CephFS, a Lustre/GPFS CSI driver, a cloud filestore): set storageClassName to one"
        if shared
        else "one pod writes it (ReadWriteOnce); set storageClassName for a class other than the default"
    )
    return f"""---
# Checkpoint storage: {why}.
# {kube.checkpoint_gib} GiB: the trainer keeps two checkpoints and writes a third before deleting the oldest.
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {ctx.k8s_name}-checkpoints
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  accessModes: ["{access}"]
  # storageClassName: ""
  resources:
    requests:
      storage: {kube.checkpoint_gib}Gi
"""


def _configmap_yaml(ctx: LaunchContext, kube: KubeContext) -> str:
    return f"""---
# The bundle: launch.sh, plan.json and executor/runtime as one tar.gz (mounted at {BUNDLE_MOUNT}).
apiVersion: v1
kind: ConfigMap
metadata:
  name: {ctx.k8s_name}-bundle
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
binaryData:
  bundle.tar.gz: {kube.bundle_b64}
"""


def k8s_trainjob(ctx: LaunchContext, kube: KubeContext) -> str:
    entries, optional = _pod_env(ctx)
    header = _k8s_header(
        ctx,
        kube,
        what="Kubeflow Trainer (v2) TrainJob",
        apply="kubectl apply --server-side -f k8s.yaml   (Kubeflow Trainer v2.3+, torch-distributed runtime)",
        extra=(
            "# The runtime sets PET_NNODES / PET_MASTER_ADDR / PET_MASTER_PORT, which launch.sh reads.\n"
            "# Volumes, the grace period and IPC_LOCK reach the pods through runtimePatches (Trainer v2.2+;\n"
            "# terminationGracePeriodSeconds v2.3+). Trainer v2.1 called it podTemplateOverrides, v2.0\n"
            "# podSpecOverrides: on those, use k8s-pytorchjob.yaml or move the volumes there.\n"
        ),
    )
    return f"""{header}{_pvc_yaml(ctx, kube)}---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {ctx.k8s_name}
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    image: {yaml_str(ctx.image)}
    numNodes: {ctx.num_nodes}
    command: ["bash", "-c", {yaml_str(_UNPACK)}]
    args: ["launch"]
    resourcesPerNode:
{_resources_yaml(ctx, kube, indent=6)}    env:
{_env_yaml(entries, 6, optional)}  runtimePatches:
    - manager: fsdp-planner
      trainingRuntimeSpec:
        template:
          spec:
            replicatedJobs:
              - name: node
                template:
                  spec:
                    template:
                      spec:
                        terminationGracePeriodSeconds: {environment.TERMINATION_GRACE_S}
                        volumes:
{_volumes_yaml(ctx, kube, 26)}                        containers:
                          - name: node
{_security_yaml(ctx, kube, 28)}                            volumeMounts:
{_mounts_yaml(30)}{_configmap_yaml(ctx, kube)}"""


def k8s_pytorchjob(ctx: LaunchContext, kube: KubeContext) -> str:
    entries, optional = _pod_env(ctx)
    # The training operator sets MASTER_ADDR / MASTER_PORT; NNODES comes from the plan (its
    # WORLD_SIZE / RANK count pods or processes depending on the operator version: not used).
    header = _k8s_header(
        ctx,
        kube,
        what="Kubeflow Training Operator (v1) PyTorchJob",
        apply="kubectl apply --server-side -f k8s-pytorchjob.yaml   (clusters without Trainer v2)",
        extra="",
    )

    def replica(kind: str, count: int) -> str:
        return f"""    {kind}:
      replicas: {count}
      restartPolicy: OnFailure
      template:
        spec:
          terminationGracePeriodSeconds: {environment.TERMINATION_GRACE_S}
          volumes:
{_volumes_yaml(ctx, kube, 12)}          containers:
            - name: pytorch
              image: {yaml_str(ctx.image)}
              command: ["bash", "-c", {yaml_str(_UNPACK)}]
              args: ["launch"]
              resources:
{_resources_yaml(ctx, kube, indent=16)}{_security_yaml(ctx, kube, 14)}              env:
{_env_yaml(entries, 16, optional)}              volumeMounts:
{_mounts_yaml(16)}"""

    workers = replica("Worker", ctx.num_nodes - 1) if ctx.num_nodes > 1 else ""
    return f"""{header}{_pvc_yaml(ctx, kube)}---
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {ctx.k8s_name}
  labels:
    fsdp-planner/plan: {yaml_str(ctx.short_hash)}
spec:
  runPolicy:
    cleanPodPolicy: None
  pytorchReplicaSpecs:
{replica("Master", 1)}{workers}{_configmap_yaml(ctx, kube)}"""


def readme(
    ctx: LaunchContext, *, targets: list[str], prediction: str, kube: KubeContext | None = None
) -> str:
    sections = [
        f"""# Launch bundle: {ctx.title}

Plan `{ctx.short_hash}` (sha256 `{ctx.plan_hash}`), strategy `{ctx.label}`, for {ctx.num_nodes} node(s) x
{ctx.gpus_per_node} x {ctx.gpu}. {prediction}

Contents: `plan.json` (the plan), `executor/runtime/` (the trainer: needs only Python >= 3.10 and
torch >= 2.6), `launch.sh` (torchrun){", `slurm.sbatch`" if "slurm" in targets else ""}\
{", `k8s.yaml` (Kubeflow TrainJob), `k8s-pytorchjob.yaml` (PyTorchJob)" if "k8s" in targets else ""}.

## One node

    DATA=/data/my-dataset ./launch.sh --steps 1000 --eval-every 100   # `fsdp-planner prepare-data` output
    SYNTHETIC_DATA=1 ./launch.sh --steps 20      # a rehearsal on synthetic tokens (speed, memory)
    ./launch.sh --steps 1000 --data tokens.bin   # a flat uint16 token file (uint32: --data-dtype)
    NPROC_PER_NODE=4 DATA=/data/my-dataset ./launch.sh   # override the local process count

Training data is required: `DATA` (or `--data`) names a dataset directory made by
`fsdp-planner prepare-data` (index.json + token shards, on a filesystem every node sees); synthetic
tokens run only when asked for (`SYNTHETIC_DATA=1` or `--synthetic-data`), and the run says so.
`--eval-every N` logs the loss on the dataset's held-out split every N steps.

Metrics: `--metrics-file metrics.jsonl` (one JSON line per step: loss, eval loss, step time,
tokens/s/GPU, MFU, peak memory); `--tensorboard DIR` and `--wandb-project NAME` also log there when
those packages are installed. Checkpoints:
`CHECKPOINT_DIR=/shared/ckpt DATA=/data/my-dataset ./launch.sh --steps 1000 --checkpoint-every 100`
saves there and resumes from the newest on the next start (also after a `MAX_RESTARTS` restart).
`python -m executor.runtime.train --help` lists every option (learning rate, warmup, seed,
`--model-factory package.module:function` for your own model, ...).

## Several nodes (plain torchrun)

On every node, with the same `MASTER_ADDR` (node 0's address) and `MASTER_PORT`:

    NNODES={ctx.num_nodes} MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 DATA=/shared/dataset ./launch.sh \\
        --steps 1000
"""
    ]
    if ctx.mesh is not None:
        sections.append(_readme_mesh(ctx, ctx.mesh))
    sections.append(
        f"""
## Cluster environment

`launch.sh` (and `slurm.sbatch`, once for the whole job) sets these unless the environment already
has them, and prints what is set when it starts. Export a variable to override it
(`NCCL_SOCKET_IFNAME=ib0 ./launch.sh`, `NCCL_DEBUG=INFO sbatch slurm.sbatch`); one shown unset stays
unset unless you set it. Any other `NCCL_*` or `TORCH_*` variable you export reaches the trainer as is.

{environment.readme_table()}"""
    )
    if "slurm" in targets:
        sections.append(
            f"""
## SLURM

From the unpacked bundle on a shared filesystem:

    DATA=/shared/dataset sbatch -p <partition> -t 04:00:00 slurm.sbatch --steps 1000

Nodes come from the allocation; the first node hosts the rendezvous (`scontrol show hostnames`).
Checkpoints go to `CHECKPOINT_DIR` (default `checkpoints/` in the bundle directory; on a filesystem
every node sees), and every start resumes from the newest there. Add `--checkpoint-every N` so that
a node failure loses at most N steps.

**Time limits and preemption.** The job asks SLURM for `SIGUSR1` {SIGNAL_LEAD_S} s before its end
(`#SBATCH --signal=B:USR1@{SIGNAL_LEAD_S}`). The batch script passes it to every process of the step;
each rank finishes its step, saves a checkpoint and exits, `torchrun` (which ignores `SIGUSR1`) exits 0,
and the script runs `scontrol requeue $SLURM_JOB_ID`: the same job id goes back to the queue (`--requeue`,
output appended to the same `%x-%j.out`) and resumes from the checkpoint. `REQUEUE=0` stops after the
checkpoint instead; `MAX_REQUEUES=N` stops requeueing after N restarts. A job preempted by
`PreemptMode=REQUEUE` comes back the same way. The trainer must finish a step and save within
{SIGNAL_LEAD_S} s; otherwise raise the lead (`sbatch --signal=B:USR1@600 ...`).

Exit status: 0 trained to the end, or stopped and requeued; 2 invalid bundle or settings (nothing
started); {EXIT_NOT_REQUEUED} stopped by `SIGUSR1` with a checkpoint but not requeued (`REQUEUE=0`,
`MAX_REQUEUES` reached, no `CHECKPOINT_DIR`, or `scontrol requeue` failed): submit again to resume;
anything else is srun's status (1: a trainer process failed; the metrics file's record tells an
out-of-memory apart).
"""
        )
    if "k8s" in targets and kube is not None:
        sections.append(_readme_k8s(ctx, kube))
    return "".join(sections)


def _readme_k8s(ctx: LaunchContext, kube: KubeContext) -> str:
    access = "ReadWriteMany" if ctx.num_nodes > 1 else "ReadWriteOnce"
    shared = (
        "Every node writes its shards there: set a storageClassName that offers ReadWriteMany."
        if ctx.num_nodes > 1
        else "Set storageClassName for a class other than the default."
    )
    rdma = (
        f"requested: `{kube.rdma_resource}: {kube.rdma_count}` per pod, with the `IPC_LOCK` capability"
        if kube.rdma_resource
        else "a commented-out block under `resources` (and `IPC_LOCK` beside it): uncomment it with the "
        "resource your RDMA device plugin advertises, or render with "
        "`fsdp-planner launcher --rdma-resource NAME [--rdma-count N]`"
    )
    return f"""
## Kubernetes

    kubectl apply --server-side -f k8s.yaml              # Kubeflow Trainer v2.3+, torch-distributed runtime
    kubectl apply --server-side -f k8s-pytorchjob.yaml   # or: Training Operator v1 PyTorchJob

Each file holds three objects:

- the job, running `{ctx.image}` (torch {kube.torch_version}, the version the plan was made for;
  `fsdp-planner launcher --torch-version X.Y.Z --cuda-version A.B` picks another official image,
  `--image` your own). Trainer options go into `args` after `"launch"`; name the training data there
  (`["launch", "--data", "/data/ds"]`, a path the pods mount, or `"--synthetic-data"` for a rehearsal):
  `launch.sh` refuses to start without one;
- a ConfigMap `{ctx.k8s_name}-bundle` carrying the bundle (launch.sh, plan.json, the runtime) as one
  `bundle.tar.gz` ({kube.bundle_bytes:,} bytes; a ConfigMap holds at most 1 MiB, and a larger bundle is
  refused when it is rendered). Every pod unpacks it into `{WORK_DIR}` and runs `launch.sh`.
  `--server-side`: a client-side apply copies the object into an annotation limited to 256 KiB;
- a PersistentVolumeClaim `{ctx.k8s_name}-checkpoints` ({kube.checkpoint_gib} GiB, {access}) mounted at
  `{CHECKPOINT_MOUNT}` = `CHECKPOINT_DIR`: a restarted pod resumes from the newest checkpoint.
  {shared}

The pods get `/dev/shm` as a memory-backed emptyDir ({kube.shm_gib} GiB at most: NCCL and torch share
memory between a node's processes there) and {environment.TERMINATION_GRACE_S} s of termination grace:
deleting a pod sends SIGTERM, which `torchrun` passes to the ranks; they save a checkpoint and exit.
RDMA / InfiniBand: {rdma}. The cluster environment above is listed in each manifest's `env`: edit it
there.
"""


def _readme_mesh(ctx: LaunchContext, mesh: Mesh) -> str:
    if mesh.tp == 1:
        only = "Data parallelism only" if mesh.pp == 1 and mesh.cp == 1 else "No tensor parallelism"
        parallelism = (
            f"{only} (tp 1): every rank runs whole layers; FSDP shards the parameters, gradients and "
            "optimizer states over dp_shard and replicates them over dp_replicate."
        )
    else:
        parallelism = f"""\
Tensor parallelism over tp groups of {mesh.tp} **consecutive ranks inside one node** (ranks
0..{mesh.tp - 1} are the first group), with sequence parallel (norms and residuals hold 1/{mesh.tp} of
the sequence) and loss parallel (the output projection and cross-entropy on a vocabulary shard). Each
block's matmuls are split Megatron-style; then activation checkpointing, then FSDP (SimpleFSDP when
compiled) over the data-parallel dims, then torch.compile.

Every node must run a multiple of {mesh.tp} processes (the plan's {ctx.gpus_per_node} GPUs per node):
`launch.sh` and `slurm.sbatch` refuse an `NPROC_PER_NODE` that is not. A different tensor-parallel
degree is a different plan: re-plan with `fsdp-planner plan ... --tp N`."""
    return f"""
## Device mesh

`{mesh.describe()}` (laid out row-major over {' x '.join(MESH_AXES)}: tp innermost).

{parallelism}
{_readme_pipeline(ctx, mesh)}"""


def _readme_pipeline(ctx: LaunchContext, mesh: Mesh) -> str:
    """The bundle README's pipeline paragraph ('' without a pipeline)."""
    pipeline = ctx.pipeline
    if pipeline is None:
        return ""
    ranks = pipeline.stage_ranks(mesh.pp)
    starts = pipeline.first_blocks()
    rows = "\n".join(
        f"| {stage} | {ranks[stage]} | {starts[stage]}–{starts[stage] + count - 1} |"
        for stage, count in enumerate(pipeline.stage_blocks)
    )
    layout = _stage_layout(ctx).removeprefix(", ")
    nodes = (
        f" The plan puts {layout}: `launch.sh` and `slurm.sbatch` refuse an `NPROC_PER_NODE` that "
        "would split a stage across nodes." if layout else ""
    )
    stage = mesh.stage_ranks
    return f"""
### Pipeline

`{pipeline.schedule}` over {mesh.pp} pipeline ranks, {pipeline.num_stages} stages
({pipeline.stages_per_rank} per rank); each optimizer step runs the schedule over the plan's
accumulation steps as micro-batches. Pipeline rank p is ranks {stage}·p to {stage}·(p+1) − 1 (pp is the
outermost axis), so the stages follow the node order: torchrun gives node k the ranks from
k·NPROC_PER_NODE on. The first stage also runs the embeddings, the last the final norm, the head and
the loss.

| stage | pipeline rank | blocks |
|---|---|---|
{rows}

The world must be exactly {mesh.world_size} ranks: `launch.sh` and `slurm.sbatch` refuse another node
or process count.{nodes} Another pipeline degree is another plan: `fsdp-planner plan ... --pp N`.
"""


__all__ = [
    "LaunchContext",
    "comment",
    "k8s_pytorchjob",
    "k8s_trainjob",
    "launch_sh",
    "readme",
    "slurm_sbatch",
]
