"""The bundle's text files: launch.sh (torchrun), slurm.sbatch, k8s.yaml (TrainJob), k8s-pytorchjob.yaml,
README.md. Each renderer takes a LaunchContext whose fields are already validated or quoted."""

from __future__ import annotations

from dataclasses import dataclass

from executor.launch.quoting import comment, sh, yaml_str


@dataclass(frozen=True, slots=True)
class Mesh:
    """The plan's device mesh (validated positive degrees), laid out row-major over
    dp_replicate x dp_shard x tp: a tensor-parallel group is `tp` consecutive ranks."""

    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    def describe(self) -> str:
        """`dp_replicate 1 x dp_shard 32 x tp 8 = 256 ranks`."""
        return (f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x tp {self.tp} "
                f"= {self.world_size} ranks")


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
        return f"# mesh: {mesh.describe()} (data parallelism only)\n"
    return (
        f"# mesh: {mesh.describe()}\n"
        f"#   tp groups are {mesh.tp} consecutive ranks inside a node (tensor parallel with sequence + loss\n"
        f"#   parallel); FSDP shards over the data-parallel dims. Every node runs a multiple of {mesh.tp}.\n"
    )


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
    checkpoint_doc = (
        "\n#   CHECKPOINT_DIR  shared directory: checkpoints are saved there and runs resume from the newest"
        if entry.resumable
        else ""
    )
    return f"""#!/usr/bin/env bash
# torchrun launcher generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}#
#   {entry.usage}
# Environment (all optional):
#   NPROC_PER_NODE  processes on this node   (default {ctx.gpus_per_node}, the plan's GPUs per node)
#   NNODES          nodes in the job         (default {ctx.num_nodes}; else PET_NNODES or SLURM_NNODES)
#   MASTER_ADDR     rendezvous host (node 0) (default 127.0.0.1)
#   MASTER_PORT     rendezvous port          (default 29500)
#   MAX_RESTARTS    torchrun restarts        (default 0{restart_doc}){checkpoint_doc}
#   RDZV_ID         rendezvous id            (default: the plan hash)
#   PYTHON          interpreter with torch   (default python3){data_doc}
set -euo pipefail

HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NPROC_PER_NODE="${{NPROC_PER_NODE:-{ctx.gpus_per_node}}}"
NNODES="${{NNODES:-${{PET_NNODES:-${{SLURM_NNODES:-{ctx.num_nodes}}}}}}}"
MASTER_ADDR="${{MASTER_ADDR:-${{PET_MASTER_ADDR:-127.0.0.1}}}}"
MASTER_PORT="${{MASTER_PORT:-${{PET_MASTER_PORT:-29500}}}}"
MAX_RESTARTS="${{MAX_RESTARTS:-0}}"
RDZV_ID="${{RDZV_ID:-{sh(ctx.short_hash)}}}"
PYTHON="${{PYTHON:-python3}}"

for var in NPROC_PER_NODE NNODES MAX_RESTARTS MASTER_PORT; do
  if ! [[ "${{!var}}" =~ ^[0-9]+$ ]]; then
    echo "{entry.script}: $var must be a whole number, got '${{!var}}'" >&2
    exit 2
  fi
done{_tensor_parallel_check(ctx, entry.script)}
if [ "$((NPROC_PER_NODE * NNODES))" -ne {ctx.num_nodes * ctx.gpus_per_node} ]; then
  echo "{entry.script}: warning: $NNODES node(s) x $NPROC_PER_NODE process(es) is not the plan's" \\
       "{ctx.num_nodes} x {ctx.gpus_per_node}; the trainer will refuse a different world size" >&2
fi
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "{entry.script}: '$PYTHON' cannot import torch; set PYTHON to an interpreter that has it" >&2
  exit 2
fi

ARGS=({entry.args}){resume}{data}

if [ "$NNODES" -gt 1 ]; then
  # Multi-node: elastic c10d rendezvous hosted by the trainer on MASTER_ADDR:MASTER_PORT.
  RDZV=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"
        --rdzv-id "$RDZV_ID")
else
  # One node: a private rendezvous on a free port (several jobs can share a machine).
  RDZV=(--standalone --nnodes 1)
fi

export PYTHONPATH="$HERE${{PYTHONPATH:+:$PYTHONPATH}}"
# The plan's memory was priced for the caching allocator with expandable segments (little
# fragmentation); a setting exported by the caller wins.
export PYTORCH_CUDA_ALLOC_CONF="${{PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}}"
cd "$HERE"
exec "$PYTHON" -m torch.distributed.run "${{RDZV[@]}}" \\
  --nproc-per-node "$NPROC_PER_NODE" --max-restarts "$MAX_RESTARTS" \\
  -m {entry.module} "${{ARGS[@]}}" "$@"
"""


def slurm_sbatch(ctx: LaunchContext, entry: Entry = TRAIN) -> str:
    data_env = "DATA=/shared/dataset " if entry.reads_data else ""  # sbatch and srun pass it on
    gpu_line = f"#SBATCH --gpus-per-node={ctx.gpus_per_node}\n" if ctx.uses_gpus else ""
    return f"""#!/usr/bin/env bash
# SLURM batch script generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}#
#   {data_env}sbatch <this file> [options]   (options go to {entry.script})
#   e.g. {data_env}sbatch slurm.sbatch --steps 1000
# Submit from the unpacked bundle directory on a filesystem every node sees. Add partition,
# account and time limits on the command line (sbatch -p gpu -A myproj -t 4:00:00 slurm.sbatch).
#SBATCH --job-name={ctx.job_name}
#SBATCH --nodes={ctx.num_nodes}
#SBATCH --ntasks-per-node=1
{gpu_line}#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail

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
if ! [[ "$NPROC_PER_NODE" =~ ^[0-9]+$ ]]; then
  echo "sbatch: NPROC_PER_NODE must be a whole number, got '$NPROC_PER_NODE'" >&2
  exit 2
fi{_tensor_parallel_check(ctx, "sbatch")}
echo "job $SLURM_JOB_ID: $NNODES node(s) x $NPROC_PER_NODE, rendezvous $MASTER_ADDR:$MASTER_PORT"

# One torchrun per node; it starts NPROC_PER_NODE trainer processes.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$BUNDLE_DIR/{entry.script}" "$@"
"""


def _env_yaml(entries: list[tuple[str, str]], indent: int) -> str:
    pad = " " * indent
    return "".join(f"{pad}- name: {name}\n{pad}  value: {yaml_str(value)}\n" for name, value in entries)


def _payload_env(ctx: LaunchContext, payload_b64: str) -> list[tuple[str, str]]:
    return [
        ("NNODES", str(ctx.num_nodes)),
        ("NPROC_PER_NODE", str(ctx.gpus_per_node)),
        ("RDZV_ID", ctx.k8s_name),
        ("FSDP_BUNDLE_B64", payload_b64),
    ]


def _resources_yaml(ctx: LaunchContext, indent: int) -> str:
    pad = " " * indent
    if ctx.uses_gpus:
        return f"{pad}limits:\n{pad}  nvidia.com/gpu: {ctx.gpus_per_node}\n"
    return f"{pad}requests:\n{pad}  cpu: {ctx.gpus_per_node}\n"


# The payload (launch.sh, plan.json, runtime) travels inside the manifest as a base64 tar.gz in an
# environment variable: no ConfigMap, volume or image build needed, and it works with every
# TrainJob / PyTorchJob API version (their volume override fields changed between releases).
_UNPACK = (
    "set -euo pipefail; mkdir -p /tmp/fsdp-bundle && cd /tmp/fsdp-bundle && "
    'printf %s "$FSDP_BUNDLE_B64" | base64 -d | tar -xzf - && exec ./launch.sh "$@"'
)


def k8s_trainjob(ctx: LaunchContext, *, payload_b64: str) -> str:
    env = _env_yaml(
        _payload_env(ctx, payload_b64),
        indent=6,
    )
    return f"""# Kubeflow Trainer (v2) TrainJob generated by fsdp-planner.
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}#
#   kubectl apply -f k8s.yaml            (needs the `torch-distributed` ClusterTrainingRuntime)
# Trainer options go in `args` (after the "launch" placeholder), e.g. ["launch", "--data", "/data/ds"].
# The runtime sets PET_NNODES / PET_MASTER_ADDR / PET_MASTER_PORT, which launch.sh reads.
# Set `image` to one with torch (and your --model-factory code if you use one).
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
{_resources_yaml(ctx, indent=6)}    env:
{env}"""


def k8s_pytorchjob(ctx: LaunchContext, *, payload_b64: str) -> str:
    env = _env_yaml(
        _payload_env(ctx, payload_b64),
        indent=16,
    )
    # The training operator sets MASTER_ADDR / MASTER_PORT; NNODES comes from the plan (its
    # WORLD_SIZE / RANK count pods or processes depending on the operator version: not used).
    unpack = _UNPACK

    def replica(kind: str, count: int) -> str:
        return f"""    {kind}:
      replicas: {count}
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: pytorch
              image: {yaml_str(ctx.image)}
              command: ["bash", "-c", {yaml_str(unpack)}]
              args: ["launch"]
              resources:
{_resources_yaml(ctx, indent=16)}              env:
{env}"""

    workers = replica("Worker", ctx.num_nodes - 1) if ctx.num_nodes > 1 else ""
    return f"""# Kubeflow Training Operator (v1) PyTorchJob generated by fsdp-planner (no Trainer v2).
# plan {ctx.short_hash}: {ctx.title}
# strategy: {ctx.label}
{_mesh_header(ctx)}#
#   kubectl apply -f k8s-pytorchjob.yaml
# Trainer options go in each replica's `args` after the "launch" placeholder.
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
{replica("Master", 1)}{workers}"""


def readme(ctx: LaunchContext, *, targets: list[str], prediction: str) -> str:
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
    if "slurm" in targets:
        sections.append(
            """
## SLURM

From the unpacked bundle on a shared filesystem:

    DATA=/shared/dataset sbatch -p <partition> -t 04:00:00 slurm.sbatch --steps 1000

Nodes come from the allocation; the first node hosts the rendezvous (`scontrol show hostnames`).
"""
        )
    if "k8s" in targets:
        sections.append(
            """
## Kubernetes

Edit `image` (an image with torch), then `kubectl apply -f k8s.yaml` (Kubeflow Trainer v2,
`torch-distributed` runtime) or `kubectl apply -f k8s-pytorchjob.yaml` (Training Operator v1).
The bundle rides inside the manifest; trainer options go into `args` after `"launch"`
(`["launch", "--data", "/data/ds"]`, a path the pods mount; or `"--synthetic-data"` for a rehearsal).
"""
        )
    return "".join(sections)


def _readme_mesh(ctx: LaunchContext, mesh: Mesh) -> str:
    if mesh.tp == 1:
        parallelism = (
            "Data parallelism only (tp 1): every rank runs whole layers; FSDP shards the parameters, "
            "gradients and optimizer states over dp_shard and replicates them over dp_replicate."
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

`{mesh.describe()}` (dp_replicate x dp_shard x tp, laid out row-major: tp innermost).

{parallelism}
"""


__all__ = [
    "LaunchContext",
    "Mesh",
    "comment",
    "k8s_pytorchjob",
    "k8s_trainjob",
    "launch_sh",
    "readme",
    "slurm_sbatch",
]
