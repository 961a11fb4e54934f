"""What the cost model prices: one point of the search space (`Choice`) in a fixed `Setting`.

`Choice` is the search's light-weight configuration (the Plan's `ParallelConfig` is built only for
the plans that are reported); `Setting` is what stays fixed across a search.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields

from contract.mesh import MODEL_PARALLEL_AXES, Mesh
from contract.parallel_config import PipelineConfig, config_family
from contract.training_config import Optimizer, Precision, StateDType
from planner.cost.model_costs import ModelCosts
from planner.cost.parameters import CostParameters

SINGLE_RANK = Mesh()
LAYOUT_FIELDS = ("blocks_per_unit", "all_gather_bucket_mb", "reduce_scatter_bucket_mb")
"""Choice fields that act on cost only through the collective layout (planner/cost/layout.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """One point of the search space. Its fields are named as the Plan's `ParallelConfig` fields
    (checkpointing there is `{mode, every_k}`), so that one converter maps between them
    (planner/document.py)."""

    sharding: str
    mesh: Mesh = SINGLE_RANK
    blocks_per_unit: int = 1
    all_gather_bucket_mb: float = 0.0
    reduce_scatter_bucket_mb: float = 0.0
    checkpointing: str = "none"
    every_k: int = 1
    """The checkpointing policy's number: k of `selective` (every k-th block), or n of `blocks` (the
    first n blocks); the Plan's `CheckpointingConfig` names them `every_k` and `blocks`."""
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    compile: bool = False
    prefetch_depth: int = 1
    loss_chunks: int = 1
    engine: str = "fsdp-planner"
    """The runtime priced (contract/parallel_config.py `Engine`)."""
    loss: str = "sliced"
    """How the loss runs (contract/parallel_config.py `LossImplementation`)."""
    reduce_dtype: str = "float32"
    """The dtype gradients are reduced in (the Plan's `reduce_dtype`)."""
    float8: str = "none"
    """The Float8 training recipe of the blocks' linears (contract/parallel_config.py `Float8Recipe`)."""
    async_tp: bool = False
    """Tensor-parallel collectives overlapped with the matmuls they feed (compiled, tp > 1)."""
    pipeline: PipelineConfig | None = None
    """The pipeline's schedule and stage split (mesh.pp > 1; contract/parallel_config.py)."""
    layout_key: tuple = field(init=False, repr=False, compare=False)
    """What the collective layout (planner/cost/layout.py) depends on."""
    compute_key: tuple = field(init=False, repr=False, compare=False)
    """What one micro-batch's compute (forward, backward, recompute, tp collectives) depends on."""
    activations_key: tuple = field(init=False, repr=False, compare=False)
    """What the saved activations per token depend on."""

    def __post_init__(self) -> None:
        # The cost model's caches look these up several times per choice, and the search prices
        # thousands of choices: computed once (a frozen dataclass sets them through object).
        compiled = self.simple_fsdp
        saves_gathers = self.checkpoint_saves_gathers
        tp, cp = self.mesh.tp, self.mesh.cp
        object.__setattr__(self, "layout_key", (
            tp,
            cp,
            compiled,
            1 if compiled else self.blocks_per_unit,
            self.all_gather_bucket_mb if compiled else 0.0,
            self.reduce_scatter_bucket_mb if compiled else 0.0,
            self.reduce_bytes,
            self.float8 if self.float8_all_gather else "none",
            self.mesh.ep,  # the routed experts a rank gathers (last: `Estimator.layout` keeps the rest)
        ))
        object.__setattr__(self, "compute_key", (
            tp, self.micro_batch_size, self.checkpointing, self.every_k, self.compile, self.engine,
            self.float8, self.async_tp, cp, saves_gathers, self.mesh.ep,
        ))
        object.__setattr__(self, "activations_key", (
            tp, cp, self.checkpointing, self.every_k, self.compile, self.engine, saves_gathers,
            self.mesh.ep,  # op-level checkpointing keeps the expert-parallel all-to-alls' outputs
        ))

    @property
    def family(self) -> str:
        """The sharding family this choice belongs to (strategy, hybrid shard group, compile), e.g.
        `hybrid_shard/8x2 compiled`: a grouping key of planner/ranking.py, shown through the member
        that stands for the family (`mesh_family`)."""
        shard = self.sharding
        if self.sharding == "hybrid_shard":
            shard += f"/{self.mesh.dp_shard}x{self.mesh.dp_replicate}"
        return f"{shard} {'compiled' if self.compile else 'eager'}"

    @property
    def mesh_family(self) -> str:
        """The configuration family as shown: sharding, whole mesh and compile mode, e.g.
        `hybrid_shard pp2 dp2x2 cp2 tp2 compiled` (contract/parallel_config.py `config_family`)."""
        return config_family(self.sharding, self.mesh, self.compile)

    @property
    def fsdp2_pipeline(self) -> bool:
        """Whether eager FSDP2 shards a pipeline's stages: torch's pipeline stages then turn
        gradient reduction off until the step's last micro-batch and keep parameters gathered after
        each backward (one reduce-scatter per step, the stage's unsharded parameters and fp32
        gradients held), where SimpleFSDP gathers and reduces in every micro-batch's graphs."""
        return self.pipeline is not None and not self.simple_fsdp and self.sharding != "no_shard"

    @property
    def simple_fsdp(self) -> bool:
        """Whether parameters are sharded SimpleFSDP-style inside the compiled graph (per-tensor
        collectives that inductor buckets and reorders, no FSDP2 hooks or buffers), rather than by
        eager FSDP2 units around the (possibly compiled) blocks."""
        return self.compile and self.engine == "fsdp-planner"

    @property
    def float8_all_gather(self) -> bool:
        """Whether FSDP all-gathers the float8-converted weights in float8 (one byte each): with
        tensorwise scaling, whose one scale per tensor survives sharding, through FSDP2's all-gather
        hooks (torchao's extension point; SimpleFSDP's gathers are DTensor redistributes that never
        call them, so compiled SimpleFSDP gathers the weights in the compute dtype and casts after)."""
        return self.float8 == "tensorwise" and self.sharding != "no_shard" and not self.simple_fsdp

    @property
    def float8_casts_whole_sequence(self) -> bool:
        """Whether each tensor-parallel rank casts the tensors gathered onto the whole sequence
        whole (`float8_share`): torchao's Float8 linears under torch's tensor-parallel styles do
        (this project's runtime, and torchtitan's rowwise recipes); torchtitan's tensorwise recipe
        uses torchao's float8 styles, which cast each rank's shard before gathering (in float8)."""
        return self.mesh.tp > 1 and not (self.float8 == "tensorwise" and self.engine == "torchtitan")

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element in reductions."""
        return 2 if self.reduce_dtype == "bfloat16" else 4

    @property
    def tp_family(self) -> str:
        """The model-parallel family this choice belongs to, e.g. `tp=2`, or `pp=4 cp=2 tp=2` when
        the blocks or the sequences are split too: a grouping key of planner/ranking.py, shown
        through the member that stands for the family (`mesh_family`)."""
        outer = self.mesh.degrees_above_one(tuple(axis for axis in MODEL_PARALLEL_AXES if axis != "tp"))
        return f"{outer} tp={self.mesh.tp}".lstrip()

    @property
    def sequences_per_step(self) -> int:
        """Sequences one data-parallel rank (one tensor-parallel group) processes per step."""
        return self.micro_batch_size * self.grad_accum_steps

    @property
    def priced_key(self) -> tuple:
        """The choice less what its collective layout's signature already stands for (the search
        prices choices equal in this and in their layout's signature once)."""
        return _PRICED_FIELDS(self)

    @property
    def growth_key(self) -> tuple:
        """The choice less its micro-batch split: choices equal in this hold more memory the larger
        their micro-batch (the search's memory prune)."""
        return _GROWTH_FIELDS(self)

    @property
    def reshards_after_forward(self) -> bool:
        return self.sharding in ("full_shard", "hybrid_shard")

    @property
    def checkpoint_policy_saves_communication(self) -> bool:
        """Whether checkpointed blocks recompute under a policy that keeps what collectives
        produced (executor/runtime/activation_checkpoint.py): op-level selective checkpointing on
        every engine (torchtitan's keeps reduce-scatter outputs too), and this project's compiled
        whole-block checkpointing. Eager whole-block checkpointing recomputes everything."""
        return self.checkpointing == "op_selective" or (self.simple_fsdp and self.checkpointing != "none")

    @property
    def checkpoint_saves_gathers(self) -> bool:
        """Whether those policies also keep all-gather outputs: this project's do when parameters
        stay gathered after forward (no resharding), and the sequence all-gathers of tensor
        parallelism go with them; otherwise backward re-gathers."""
        return (
            self.engine == "fsdp-planner"
            and not self.reshards_after_forward
            and self.checkpoint_policy_saves_communication
        )

    def is_checkpointed(self, block_index: int) -> bool:
        """Whether block `block_index` is recomputed whole in backward."""
        if self.checkpointing == "full":
            return True
        if self.checkpointing == "selective":
            return (block_index + 1) % self.every_k == 0
        if self.checkpointing == "blocks":
            return block_index < self.every_k
        return False


_CHOSEN = tuple(f.name for f in fields(Choice) if f.init)
"""The fields a choice is made of (the keys derived from them left out)."""
_GROWTH_FIELDS = operator.attrgetter(
    *(name for name in _CHOSEN if name not in ("micro_batch_size", "grad_accum_steps", "loss_chunks"))
)
_PRICED_FIELDS = operator.attrgetter(*(name for name in _CHOSEN if name not in LAYOUT_FIELDS))


@dataclass(frozen=True, slots=True)
class Setting:
    """What stays fixed across the search: model, hardware, precision, batch."""

    model: ModelCosts
    params: CostParameters
    precision: Precision
    optimizer: Optimizer
    world_size: int
    gpus_per_node: int
    num_nodes: int
    seq_len: int
    global_batch_sequences: int
    state_dtype: StateDType = "float32"
    """What the optimizer updates (contract/training_config.py): fp32 master parameters, gradients
    and states, or all of them in bf16 (pure bf16 training)."""
    scaleup_gpus: int = 0
    """GPUs per scale-up domain (ClusterSpec.scaleup_gpus: 72 on GB200 NVL72); 0: the host."""

    @property
    def domain_gpus(self) -> int:
        """GPUs one scale-up domain joins: what decides which link each group's collectives cross
        (contract/topology.py)."""
        return self.scaleup_gpus or self.gpus_per_node

    @property
    def param_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def state_bytes(self) -> int:
        """Bytes per element of the parameters, gradients and optimizer states the optimizer updates."""
        return 2 if self.state_dtype == "bfloat16" else 4

    @property
    def reduce_dtype(self) -> str:
        """The dtype gradients are reduced in: pure bf16 has no fp32 gradients to reduce into."""
        return "bfloat16" if self.state_dtype == "bfloat16" else "float32"

    @property
    def act_bytes(self) -> int:
        return self.param_bytes
