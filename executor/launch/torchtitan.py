"""The `torchtitan` launch target: a plan as a torchtitan 0.3.x job (a Python config module and the
torchrun / SLURM scripts that start `torchtitan.train` with it).

torchtitan 0.3.x expresses a job as a Python function returning `Trainer.Config`, found by
`--module <module> --config <function>` (its `ConfigManager` imports a fully qualified module too).
`job_values` maps the plan onto that config as plain data; the module is a fixed template fed those
values as literals (templates/torchtitan/job.py.j2), so no plan string becomes code. What torchtitan
cannot express is listed (`Mapping.not_expressed`) and the configuration torchtitan will run
(`Mapping.config`, the `torchtitan` engine) is re-priced, so the bundle's README shows what this
target reaches, not what this project's trainer would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import tomli_w

from contract.mesh import AXES
from contract.parallel_config import CheckpointingConfig, InductorConfig, ParallelConfig
from executor.launch import environment, render
from executor.launch.bundle import (
    DEFAULT_TORCHTITAN_SERIES,
    BundleFile,
    Placement,
    _prediction,
    context,
    kubernetes_files,
    plan_file,
    pod_placement,
)
from executor.launch.manifests import CHECKPOINT_MOUNT, WORK_DIR
from executor.launch.quoting import UnsafeValueError, slug
from executor.launch.templating import render_template
from planner.calibration import CalibrationProfile
from planner.plan import Plan
from planner.search import predict
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release the config module is written for (its `Trainer.Config` API)."""
TORCHTITAN_RELEASES = {"0.3": TORCHTITAN_VERSION, "0.2": "0.2.2"}
"""The torchtitan series a bundle can be written for, and the release of each it names: 0.3.x's
Python config module, or 0.2.x's TOML job config (`--job.config_file`, the JobConfig dataclasses of
torchtitan/config/job_config.py, the same in 0.2.0 to 0.2.2 for every field the bundle writes)."""
DEFAULT_SERIES = DEFAULT_TORCHTITAN_SERIES
JOB_TOML = "fsdp_planner_job.toml"
"""0.2.x's job config (`fsdp_planner_job.toml` in the bundle), torchtitan's `--job.config_file`."""
JOB_MODULE = "fsdp_planner_job"
"""The generated module (`fsdp_planner_job.py` in the bundle), torchtitan's `--module`."""
JOB_FUNCTION = "trainer_config"
"""Its function returning `Trainer.Config`, torchtitan's `--config`."""


class NotOnTorchtitanError(ValueError):
    """The plan cannot run on torchtitan (its model is not in torchtitan's registries); says why."""


@dataclass(frozen=True, slots=True)
class Flavor:
    """A model of torchtitan's registry: its module, flavor and the dims that identify it (dotted
    names reach into the model's parts: `moe.num_experts`)."""

    module: str
    flavor: str
    dims: dict[str, Any]

    def matches(self, model: object) -> bool:
        return all(_field(model, name) == value for name, value in self.dims.items())


def _field(model: object, name: str) -> Any:
    value = model
    for part in name.split("."):
        value = getattr(value, part, None)
    return value


_LLAMA3_SHARED = {"vocab_size": 128256, "num_kv_heads": 8}
FLAVORS: tuple[Flavor, ...] = (
    Flavor("llama3", "8B", {**_LLAMA3_SHARED, "hidden_size": 4096, "num_layers": 32, "num_heads": 32,
                            "intermediate_size": 14336}),
    Flavor("llama3", "70B", {**_LLAMA3_SHARED, "hidden_size": 8192, "num_layers": 80, "num_heads": 64,
                             "intermediate_size": 28672}),
    Flavor("llama3", "405B", {**_LLAMA3_SHARED, "hidden_size": 16384, "num_layers": 126, "num_heads": 128,
                              "intermediate_size": 53248}),
)
"""torchtitan 0.3.0's dense Llama 3 flavors (torchtitan/models/llama3/__init__.py), by their dims."""


def _moe_dims(*, experts: int, top_k: int, expert: int, dense_layers: int = 0, **dims: Any) -> dict[str, Any]:
    return {
        **dims, "moe.num_experts": experts, "moe.experts_per_token": top_k,
        "moe.expert_intermediate_size": expert, "moe.first_dense_layers": dense_layers,
    }


_QWEN3_MOE = {"vocab_size": 151936, "num_kv_heads": 4, "qk_norm": True}
_GPT_OSS = {"vocab_size": 201088, "hidden_size": 2880, "num_heads": 64, "num_kv_heads": 8}
MOE_FLAVORS: tuple[Flavor, ...] = (
    Flavor("qwen3", "30B-A3B", _moe_dims(**_QWEN3_MOE, hidden_size=2048, num_layers=48, num_heads=32,
                                         experts=128, top_k=8, expert=768)),
    Flavor("qwen3", "235B-A22B", _moe_dims(**_QWEN3_MOE, hidden_size=4096, num_layers=94, num_heads=64,
                                           experts=128, top_k=8, expert=1536)),
    Flavor("deepseek_v3", "671B", _moe_dims(vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128,
                                            experts=256, top_k=8, expert=2048, dense_layers=3)),
    Flavor("gpt_oss", "20b", _moe_dims(**_GPT_OSS, num_layers=24, experts=32, top_k=4, expert=2880)),
    Flavor("gpt_oss", "120b", _moe_dims(**_GPT_OSS, num_layers=36, experts=128, top_k=4, expert=2880)),
)
"""torchtitan 0.3.0's mixture-of-experts flavors whose models the catalog has (its qwen3, deepseek_v3
and gpt_oss registries), by their dims. It has no Llama 4, Mixtral or Kimi K2 flavor, and its
DeepSeek 16B and 236B are DeepSeek-MoE / V2 models the planner does not read."""

HEAD, EMBEDDINGS, FINAL_NORM = "lm_head", "tok_embeddings", "norm"
"""torchtitan's decoder module names (its pipeline stages list them)."""
HEAD_02 = "output"
"""The output head's name in torchtitan 0.2.x's models."""
ALL_TOKENS_CHECKPOINTING = CheckpointingConfig(mode="full")


@dataclass(frozen=True, slots=True)
class Mapping:
    """A plan as torchtitan runs it."""

    flavor: Flavor
    values: dict[str, Any]
    """The config module's data (templates/torchtitan/job.py.j2)."""
    config: ParallelConfig
    """The configuration torchtitan runs, for the `torchtitan` engine (re-priced)."""
    not_expressed: tuple[str, ...]
    """What of the plan torchtitan cannot express, and what runs instead (README)."""


def flavor_of(plan: Plan, release: str = TORCHTITAN_VERSION) -> Flavor:
    """torchtitan's model for the plan's, or NotOnTorchtitanError saying why there is none (0.2.2's
    registries hold the same flavors under the same names)."""
    model = plan.model
    # A dense model matches no MoE flavor (its `moe.*` dims are None), nor an MoE model a dense one.
    dense = {"moe": None, "latent_attention": None, "qk_norm": False}
    for flavor in FLAVORS:
        if flavor.matches(model) and all(_field(model, name) == value for name, value in dense.items()):
            return flavor
    for flavor in MOE_FLAVORS:
        if flavor.matches(model):
            return flavor
    known = ", ".join(f"{f.module} {f.flavor}" for f in (*FLAVORS, *MOE_FLAVORS))
    raise NotOnTorchtitanError(
        f"target torchtitan: torchtitan {release}'s registry has no model with {model.name}'s "
        f"dims (hidden {model.hidden_size}, {model.num_layers} layers, {model.num_heads} heads); it has "
        f"{known}. Train it with this project's runtime (--target torchrun)"
    )


def release_of(series: str) -> str:
    """The torchtitan release a series' bundle is written for, or UnsafeValueError naming the option."""
    if series not in TORCHTITAN_RELEASES:
        raise UnsafeValueError(
            f"torchtitan_version {series!r}: choose one of {', '.join(TORCHTITAN_RELEASES)}",
            field="torchtitan_version",
        )
    return TORCHTITAN_RELEASES[series]


def mapping(plan: Plan, series: str = DEFAULT_SERIES) -> Mapping:
    """The plan's torchtitan job for a torchtitan series (`0.3`: the config module's values; `0.2`: the
    TOML job config's sections), the configuration as torchtitan runs it, and what it cannot express."""
    release = release_of(series)
    legacy = series == "0.2"
    flavor = flavor_of(plan, release)
    config = plan.config
    missing: list[str] = []
    if legacy:
        checkpointing, ac = _checkpointing_02(config.checkpointing, missing)
        float8, converters, quantize = _quantize_02(config)
    else:
        checkpointing, ac = _checkpointing(config.checkpointing, missing)
        float8, converters = _converters(config, missing)
        quantize = {}
    _fsdp_not_expressed(config, missing)
    if plan.model.moe is not None:
        _moe_not_expressed(config, missing, legacy=legacy)
    loss = "sliced"
    if legacy:
        # 0.2.x has no chunked loss: the plain cross-entropy over the micro-batch's whole logits (fused
        # by inductor when it compiles).
        loss = "compiled_fp32" if config.compile else "autograd_fp32"
        if config.loss_chunks > 1:
            missing.append(
                f"the loss over {config.loss_chunks} slices of the tokens: torchtitan {release} computes "
                "the cross-entropy over the whole micro-batch's logits at once (more memory)"
            )
    if plan.training.optimizer != "adamw":
        missing.append(f"the {plan.training.optimizer} optimizer: the config keeps torchtitan's AdamW")
    runs = dataclasses.replace(
        config,
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        prefetch_depth=1,
        checkpointing=checkpointing,
        reduce_dtype="float32",
        inductor=InductorConfig(
            bucket_all_gathers=False, bucket_reduce_scatters=False, reorder_for_compute_comm_overlap=False
        ),
        # torchtitan 0.3's ChunkedLossWrapper is this project's loss: the head and cross-entropy per
        # slice of the sequence, each slice's backward at once.
        loss=loss,
        loss_chunks=1 if legacy else config.loss_chunks,
        float8=float8,
        engine="torchtitan",
    )
    values: dict[str, Any] = {
        "version": release,
        "series": series,
        "module": flavor.module,
        "flavor": flavor.flavor,
        "training": _training(plan, legacy=legacy),
        "parallelism": _parallelism(config, legacy=legacy),
        "compile": {"enable": config.compile, "components": ["model", "loss"]},
        "activation_checkpoint": ac,
        "converters": converters,
    }
    if legacy:
        values["quantize"] = quantize
    else:
        values["compile"]["enable_async_tensor_parallel"] = config.async_tp
        values["loss_chunks"] = config.loss_chunks
    return Mapping(flavor=flavor, values=values, config=runs, not_expressed=tuple(missing))


def _fsdp_not_expressed(config: ParallelConfig, missing: list[str]) -> None:
    """What of the plan's FSDP torchtitan runs otherwise (every release): a unit per block, one
    collective per unit, eager overlap, one unit of prefetch, fp32 gradient reduction."""
    if config.blocks_per_unit > 1:
        missing.append(
            f"FSDP units of {config.blocks_per_unit} blocks: torchtitan wraps every block as its own unit"
        )
    if config.all_gather_bucket_mb or config.reduce_scatter_bucket_mb:
        missing.append(
            f"bucket caps (all-gather {config.all_gather_bucket_mb:g} MB, reduce-scatter "
            f"{config.reduce_scatter_bucket_mb:g} MB): torchtitan issues one collective per FSDP unit"
        )
    if config.compile and (config.inductor.bucket_all_gathers or config.inductor.bucket_reduce_scatters
                           or config.inductor.reorder_for_compute_comm_overlap):
        missing.append(
            "inductor's collective bucketing and reordering: torchtitan compiles each block, and FSDP2 "
            "overlaps its collectives eagerly"
        )
    if config.prefetch_depth > 1:
        missing.append(f"prefetch depth {config.prefetch_depth}: FSDP2 prefetches one unit ahead")
    if config.reduce_dtype != "float32":
        missing.append("bf16 gradient reduction: torchtitan reduces in fp32")


def _moe_not_expressed(config: ParallelConfig, missing: list[str], *, legacy: bool = False) -> None:
    """What of an MoE plan torchtitan runs otherwise: 0.3's ep borrows the tp ranks as well (0.2's
    `expert_tensor_parallel_degree` keeps tp inside the experts), and the linear converters leave the
    experts' grouped GEMMs in bf16."""
    mesh = config.mesh
    if mesh.experts_split_by_tp and not legacy:
        missing.append(
            f"tensor parallelism inside the experts: torchtitan {TORCHTITAN_VERSION}'s ep {mesh.ep} borrows "
            f"the tp ranks as well as dp_shard x cp (its experts are FSDP-sharded over dp_shard x cp x tp / "
            f"ep = {mesh.expert_shards_borrowing_tp} ranks), so each expert runs whole on "
            "its rank; the same share of the experts' weights per rank, other all-to-all and GEMM shapes"
        )
    if config.float8 != "none":
        missing.append(
            f"{config.float8} for the routed experts: the config converts linear layers only, so the "
            "experts' grouped GEMMs run in bf16"
        )


def _training(plan: Plan, *, legacy: bool = False) -> dict[str, Any]:
    """torchtitan's `TrainingConfig`: with a pipeline the local batch is the step's sequences per
    data-parallel rank, which the schedule splits into micro-batches; without one it is a micro-batch,
    and the global batch sets the accumulation steps."""
    config = plan.config
    local = config.micro_batch_size * (config.grad_accum_steps if config.pipeline is not None else 1)
    # torchtitan 0.3 captures the step in CUDA graphs, which it refuses under a pipeline, and under
    # expert parallelism with its default all-to-all dispatcher (which syncs with the CPU for sizes).
    # (0.2.x captures none.)
    no_graphs = not legacy and (config.pipeline is not None or config.mesh.ep > 1)
    graphs = {"disable_cuda_graphs": True} if no_graphs else {}
    return {
        **graphs,
        "local_batch_size": local,
        "global_batch_size": config.micro_batch_size * config.grad_accum_steps * config.mesh.dp,
        "seq_len": plan.training.seq_len,
        "dtype": "bfloat16" if plan.training.state_dtype == "bfloat16" else "float32",
        "mixed_precision_param": config.param_dtype,
        "mixed_precision_reduce": "float32",
    }


def _parallelism(config: ParallelConfig, *, legacy: bool = False) -> dict[str, Any]:
    """torchtitan's `ParallelismConfig` (0.2.x: its [parallelism] section): every mesh axis's degree
    through the registry, the reshard policy, and the pipeline's schedule, micro-batch and exact stage
    split. 0.2.x applies sequence parallelism with tp whenever it is on, takes async tp here (0.3 in
    its compile config) and keeps an MoE plan's tp inside the experts (`expert_tensor_parallel_degree`
    = tp: ep over the data-parallel ranks only, as the plan lays it)."""
    values: dict[str, Any] = {}
    for axis in AXES:
        degree = config.mesh.degree(axis.name)
        if not axis.torchtitan_degree:
            if degree > 1:
                raise NotOnTorchtitanError(
                    f"target torchtitan: the plan's {axis.name} degree is {degree}; this target cannot "
                    f"express {axis.what} parallelism yet"
                )
            continue
        values[axis.torchtitan_degree] = degree
    values["fsdp_reshard_after_forward"] = "always" if config.reshard_after_forward else "never"
    if legacy:
        values["enable_async_tensor_parallel"] = config.async_tp
        if config.mesh.experts_split_by_tp:
            values["expert_tensor_parallel_degree"] = config.mesh.tp
    elif config.mesh.tp > 1:
        values["enable_sequence_parallel"] = True  # the planner prices tp with sequence parallelism
    pipeline = config.pipeline
    if pipeline is not None:
        values["pipeline_parallel_schedule"] = pipeline.schedule
        values["pipeline_parallel_microbatch_size"] = config.micro_batch_size
        values["module_fqns_per_model_part"] = stage_modules(
            pipeline.stage_blocks, head=HEAD_02 if legacy else HEAD
        )
    return values


def stage_modules(stage_blocks: tuple[int, ...], head: str = HEAD) -> list[list[str]]:
    """The modules of each pipeline stage as torchtitan names them: the plan's exact split, the
    embeddings in the first stage, the final norm and head in the last."""
    stages, first = [], 0
    for blocks in stage_blocks:
        stages.append([f"layers.{i}" for i in range(first, first + blocks)])
        first += blocks
    stages[0].insert(0, EMBEDDINGS)
    stages[-1].extend([FINAL_NORM, head])
    return stages


def _checkpointing_02(policy: CheckpointingConfig, missing: list[str]) -> tuple[CheckpointingConfig, dict]:
    """The checkpointing torchtitan 0.2.x runs and its [activation_checkpoint] section: every k-th
    block (`selective_ac_option` k), per-op SAC (`op`), every block or none."""
    if policy.mode == "none":
        return policy, {"mode": "none"}
    if policy.mode == "op_selective":
        return policy, {"mode": "selective", "selective_ac_option": "op"}
    if policy.mode == "selective" and policy.every_k > 1:
        return policy, {"mode": "selective", "selective_ac_option": str(policy.every_k)}
    if policy.mode == "blocks":
        missing.append(
            f"checkpointing the first {policy.blocks} blocks only: torchtitan checkpoints every block or "
            "every k-th, so every block is recomputed (less memory, more compute)"
        )
    return ALL_TOKENS_CHECKPOINTING, {"mode": "full"}


def _quantize_02(config: ParallelConfig) -> tuple[str, list[str], dict[str, Any]]:
    """The Float8 recipe torchtitan 0.2.x runs, its model converters and its [quantize] section (every
    recipe of the plan has one there; the head stays in the compute precision, as the plan prices)."""
    recipe = config.float8
    if recipe == "none":
        return recipe, [], {}
    if recipe == "mxfp8":
        return recipe, ["quantize.linear.mx"], {
            "linear": {"mx": {"recipe_name": "mxfp8_cublas", "filter_fqns": [HEAD_02]}}
        }
    float8: dict[str, Any] = {"recipe_name": recipe, "filter_fqns": [HEAD_02]}
    if recipe == "tensorwise":
        # The plan all-gathers the sharded weights in float8 (torchtitan's recommendation for tensorwise).
        float8 |= {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
    return recipe, ["quantize.linear.float8"], {"linear": {"float8": float8}}


def toml_text(ctx: render.LaunchContext, values: dict[str, Any]) -> str:
    """The TOML file of torchtitan 0.2.x's job config: a comment header, then job_toml's data dumped by
    a TOML library (every value quoted by the dumper)."""
    header = render_template("torchtitan/job.toml.j2", ctx=ctx, values=values, job_toml=JOB_TOML)
    return header + tomli_w.dumps(job_toml(ctx, values))


def job_toml(ctx: render.LaunchContext, values: dict[str, Any]) -> dict[str, Any]:
    """torchtitan 0.2.x's job config for a `0.2` mapping's values, as the TOML document's data (its
    JobConfig sections: job, model, training, parallelism, activation_checkpoint, compile, quantize)."""
    doc: dict[str, Any] = {
        "job": {"description": f"fsdp-planner plan {ctx.short_hash}: {ctx.title}"},
        "model": {"name": values["module"], "flavor": values["flavor"], "converters": values["converters"]},
        "training": values["training"],
        "parallelism": values["parallelism"],
        "activation_checkpoint": values["activation_checkpoint"],
        "compile": values["compile"],
    }
    if values["quantize"]:
        doc["quantize"] = values["quantize"]
    return doc


def _checkpointing(policy: CheckpointingConfig, missing: list[str]) -> tuple[CheckpointingConfig, str]:
    """The checkpointing torchtitan runs and its name in the config module (`none`, `full`, `selective`:
    torchtitan 0.3's per-op SAC)."""
    if policy.mode == "none":
        return policy, "none"
    if policy.mode == "op_selective":
        return policy, "selective"
    if policy.mode == "selective" and policy.every_k > 1:
        missing.append(
            f"checkpointing every {policy.every_k}-th block: torchtitan {TORCHTITAN_VERSION} checkpoints "
            "every block or none, so every block is recomputed (less memory, more compute)"
        )
    elif policy.mode == "blocks":
        missing.append(
            f"checkpointing the first {policy.blocks} blocks only: torchtitan checkpoints every block, so "
            "every block is recomputed (less memory, more compute)"
        )
    return ALL_TOKENS_CHECKPOINTING, "full"


def _converters(config: ParallelConfig, missing: list[str]) -> tuple[str, list[list[Any]]]:
    """The Float8 recipe torchtitan runs and its model converters, as (name, keyword arguments)."""
    recipe = config.float8
    if recipe == "none":
        return recipe, []
    if recipe == "mxfp8":
        # The blocks' linear layers only: the head stays in the compute precision, as the plan prices.
        return recipe, [["mxfp8", {"fqns": ["layers"], "model_compile_enabled": config.compile}]]
    if recipe == "tensorwise":
        missing.append(
            f"Float8 tensorwise scaling: torchtitan {TORCHTITAN_VERSION} has rowwise recipes only, so "
            "the layers run rowwise Float8 (slower GEMMs, weights all-gathered in bf16)"
        )
        recipe = "rowwise"
    kwargs = {
        "recipe_name": recipe,
        # The head stays in the compute precision, as the plan prices (torchtitan skips layers whose
        # dims 16 does not divide by itself; its `auto_filter_small_kn` filters nn.Linear modules,
        # which 0.3's model configs are not, so it would convert nothing).
        "filter_fqns": [HEAD],
        "model_compile_enabled": config.compile,
    }
    return recipe, [["float8", kwargs]]


def request_of(plan: Plan) -> PlanRequest:
    """The request the plan answered (its model, cluster and training, without the derived counts)."""
    def spec(model_cls: type, value: Any) -> Any:
        return model_cls.model_validate(value.model_dump(include=set(model_cls.model_fields)))

    return PlanRequest(
        model=spec(ModelSpec, plan.model),
        cluster=spec(ClusterSpec, plan.cluster),
        training=spec(TrainingSpec, plan.training),
    )


def repriced(plan: Plan, runs: ParallelConfig, *, calibration: CalibrationProfile | None = None) -> Plan:
    """The plan's request priced for the configuration torchtitan runs (the `torchtitan` engine), under
    the plan's calibration profile when it is given."""
    calibration_id = plan.calibration_id if calibration is not None else None
    return predict(request_of(plan), runs, calibration=calibration, calibration_id=calibration_id)


TRAIN = render.Entry(
    script="launch.sh",
    module="torchtitan.train",
    args=f"--module {JOB_MODULE} --config {JOB_FUNCTION}",
    usage="./launch.sh [torchtitan options]   e.g. ./launch.sh --hf_assets_path ./assets/hf/<model> "
          "--training.steps 1000",
    resumable=False,
    example_options="--hf_assets_path /shared/tokenizer --training.steps 1000",
    carries=f"launch.sh, plan.json, {JOB_MODULE}.py",
    k8s_options="--hf_assets_path /shared/tokenizer --checkpoint.enable "
                f"--checkpoint.folder {CHECKPOINT_MOUNT} --checkpoint.keep_latest_k 2",
    checkpoints=f"torchtitan saves there and resumes from the newest with `--checkpoint.enable "
                f"--checkpoint.folder {CHECKPOINT_MOUNT}`",
    requirement=f"torchtitan=={TORCHTITAN_VERSION}",
    requirement_module="torchtitan",
)
TRAIN_02 = dataclasses.replace(
    TRAIN,
    args=f'--job.config_file "$HERE/{JOB_TOML}"',
    usage="./launch.sh [torchtitan options]   e.g. ./launch.sh --model.hf_assets_path ./assets/hf/<model> "
          "--training.steps 1000",
    example_options="--model.hf_assets_path /shared/tokenizer --training.steps 1000",
    carries=f"launch.sh, plan.json, {JOB_TOML}",
    k8s_options=TRAIN.k8s_options.replace("--hf_assets_path", "--model.hf_assets_path"),
    requirement=f"torchtitan=={TORCHTITAN_RELEASES['0.2']}",
)
"""torchtitan 0.2.x's launch: `torchtitan.train --job.config_file` with the TOML job config."""


def bundle_files(
    plan: Plan,
    *,
    calibration: CalibrationProfile | None = None,
    placement: Placement | None = None,
    series: str = DEFAULT_SERIES,
) -> list[BundleFile]:
    """The torchtitan bundle: plan.json, the config module, launch.sh (torchrun), slurm.sbatch, the
    Kubernetes manifests (the torchrun target's, whose pods run this launch.sh; `placement`: their
    checked options, default the plan's vendor's PyTorch image) and a README with the mapping, what
    torchtitan cannot express and the prediction re-priced (under `calibration`, the plan's profile,
    where the caller has it). `series` `0.2` writes the job config as 0.2.x's TOML instead of the
    config module."""
    job = mapping(plan, series)
    legacy = series == "0.2"
    entry = TRAIN_02 if legacy else TRAIN
    placement = placement or pod_placement(plan)
    ctx = context(plan, image=placement.image)
    priced = repriced(plan, job.config, calibration=calibration)
    if legacy:
        config = BundleFile(JOB_TOML, toml_text(ctx, job.values).encode())
    else:
        module = render_template(
            "torchtitan/job.py.j2", ctx=ctx, values=job.values, job_module=JOB_MODULE,
            job_function=JOB_FUNCTION, model=slug(plan.model.name, limit=60),
        )
        config = BundleFile(f"{JOB_MODULE}.py", module.encode())
    core = [
        plan_file(plan),
        config,
        BundleFile("launch.sh", render.launch_sh(ctx, entry).encode(), executable=True),
    ]
    # The pods unpack these three from a ConfigMap and run launch.sh (manifests.unpack_command).
    kube, manifests = kubernetes_files(plan, ctx, core, placement, entry)
    readme = render_template(
        "torchtitan/README.md.j2",
        ctx=ctx,
        job=job,
        values=job.values,
        job_module=JOB_MODULE,
        job_function=JOB_FUNCTION,
        job_toml=JOB_TOML,
        legacy=legacy,
        planned=plan.config.label(),
        runs=job.config.label(),
        planned_prediction=_prediction(plan),
        prediction=_prediction(priced),
        # A calibrated plan re-priced without its profile: the two predictions differ by more than the
        # engine, and the README says so.
        uncalibrated=plan.calibration_id if plan.calibration_id is not None and calibration is None else None,
        model=slug(plan.model.name, limit=60),
        # The Kubernetes section (templates/parts/readme_kubernetes.md.j2), as the torchrun bundle's.
        entry=entry,
        example_args=render.k8s_example_args(entry),
        kube=kube,
        work_dir=WORK_DIR,
        checkpoint_mount=CHECKPOINT_MOUNT,
        termination_grace_s=environment.TERMINATION_GRACE_S,
    )
    return [
        *core,
        BundleFile("slurm.sbatch", render.slurm_sbatch(ctx, entry).encode(), executable=True),
        *manifests,
        BundleFile("README.md", readme.encode()),
    ]
