"""Benchmark: do the planner's picks run on a real GPU, and how close are its predictions? (on demand)

    python bench/gpu_plans.py [--requests NAME,...] [--steps 10] [--budget-s 45] [--out bench/out/gpu]

For each request below (one node of the GPU this runs on, vocabularies 32k-152k, hidden 1.5k-5k,
sequences 1k-8k, batches that push memory): calibrate on this GPU with the model's own blocks, plan
with that profile, and run the pick through its own launch bundle (`launch.sh`) for `--steps` steps;
then run a few configurations the planner did not pick, from both engines. Every run records
predicted and measured step time and peak memory (`torch.cuda.max_memory_reserved` over all steps),
or that it ran out of memory. The uncalibrated prediction of each pick is recorded too.

Results accumulate in `bench/results/gpu_plans.json` (one entry per request and configuration; a
re-run replaces its own entries), so the requests can be run in several sessions or device calls:
    {"device": str, "torch": str, "runs": [{"request", "config", "picked", "calibrated",
      "predicted_step_s", "measured_step_s", "predicted_peak_gib", "measured_peak_gib", "oom"}]}
`--summary` prints the table and the targets (0 OOM among picks; memory error mean <= 5%, max <= 8%;
calibrated step-time MAPE <= 8%) from that file without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from api.cli.validate_cmd import Measurement, RanOutOfMemory, run_validation
from contract.parallel_config import InductorConfig, ParallelConfig
from executor.launch.environment import static_defaults
from planner.calibration import CalibrationProfile
from planner.catalog.models import resolve_model
from planner.plan import Plan
from planner.search import make_plan, predict
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec

RESULTS = Path("bench/results/gpu_plans.json")


def _cut(name: str, layers: int) -> ModelSpec:
    """A catalog model with fewer blocks, so that one GPU holds it (dims, vocabulary unchanged)."""
    model = resolve_model(name)
    return model.model_copy(update={"name": f"{name}-{layers}l", "num_layers": layers})


def _qwen2(
    name: str, *, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int
) -> ModelSpec:
    return ModelSpec(
        name=name,
        architecture="llama",
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=ffn,
        max_seq_len=32768,
        qkv_bias=True,
        tie_word_embeddings=hidden < 2048,
        rope_theta=1_000_000.0,
    )


@dataclass(frozen=True)
class Request:
    name: str
    model: ModelSpec
    seq_len: int
    sequences: int
    """Sequences per step per GPU."""


REQUESTS = (
    # The request whose pick OOMed in issue 11: 2.8B params, 128k vocabulary.
    Request("llama3-8b-8l-s4096-b4", _cut("llama3-8b", 8), 4096, 4),
    Request("llama3-8b-4l-s8192-b8", _cut("llama3-8b", 4), 8192, 8),
    Request(
        "qwen2-1.5b-s4096-b8",
        _qwen2("qwen2-1.5b", hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, vocab=151936),
        4096,
        8,
    ),
    Request(
        "qwen2-7b-8l-s2048-b8",
        _qwen2("qwen2-7b-8l", hidden=3584, layers=8, heads=28, kv_heads=4, ffn=18944, vocab=152064),
        2048,
        8,
    ),
    Request("mistral-7b-12l-s8192-b2", _cut("mistral-7b", 12), 8192, 2),
    Request("llama2-7b-16l-s2048-b8", _cut("llama2-7b", 16), 2048, 8),
    Request(
        "llama2-13b-shape-6l-s4096-b4",
        ModelSpec(
            name="llama2-13b-6l",
            architecture="llama",
            vocab_size=32000,
            hidden_size=5120,
            num_layers=6,
            num_heads=40,
            intermediate_size=13824,
            max_seq_len=4096,
        ),
        4096,
        4,
    ),
    Request("gpt2-xl-s1024-b16", resolve_model("gpt2-xl"), 1024, 16),
)
SMOKE = Request("cpu-smoke", resolve_model("llama-debug"), 128, 4)
"""Not one of the benchmark's requests: `--requests cpu-smoke --gpu cpu --nproc 2 --precision fp32`
runs the whole loop on a machine without GPUs, to check the script before spending GPU time."""
NON_PICKED = 3
"""Configurations run beside each pick: the pick in the other engine, then the fastest alternatives."""


def calibrate(request: Request, out: Path, budget_s: float, nproc: int) -> CalibrationProfile:
    out.mkdir(parents=True, exist_ok=True)
    model_file = out / "model.json"
    model_file.write_text(request.model.model_dump_json())
    profile_file = out / "profile.json"
    subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "executor.profile.run", "-o", str(profile_file), "--budget-s", str(budget_s),
            "--model-json", str(model_file), "--seq-len", str(request.seq_len),
            "--micro-batches", "1,2", "--name", f"bench-{request.name}",
        ],
        env={**static_defaults(), **os.environ},  # the allocator the runs use (launch.sh sets it)
        check=True,
    )  # fmt: skip
    return CalibrationProfile.model_validate_json(profile_file.read_text())


def plan_request(request: Request, cluster: ClusterSpec, precision: str) -> PlanRequest:
    tokens = request.seq_len * request.sequences * cluster.world_size
    return PlanRequest(
        model=request.model,
        cluster=cluster,
        training=TrainingSpec(seq_len=request.seq_len, global_batch_tokens=tokens, precision=precision),
    )


def row(request: Request, plan: Plan, *, picked: bool, calibrated: bool, measured: Measurement | None,
        oom: bool) -> dict:  # fmt: skip
    p = plan.prediction
    return {
        "request": request.name,
        "config": plan.config.label(),
        "picked": picked,
        "calibrated": calibrated,
        "predicted_step_s": p.step_time_s,
        "measured_step_s": measured.step_time_s if measured else None,
        "predicted_peak_gib": p.peak_memory_gib,
        "measured_peak_gib": measured.peak_memory_gib if measured else None,
        "oom": oom,
    }


def non_picked(pick: Plan) -> list[ParallelConfig]:
    """The pick's configuration in the other engine, then the fastest alternatives, NON_PICKED in all."""
    other = pick.config.compile is False
    swapped = replace(
        pick.config,
        compile=other,
        blocks_per_unit=1,
        all_gather_bucket_mb=0.0,
        reduce_scatter_bucket_mb=0.0,
        inductor=InductorConfig(
            bucket_all_gathers=False,
            bucket_reduce_scatters=False,
            reorder_for_compute_comm_overlap=other and pick.config.sharding != "no_shard",
        ),
    )
    configs = [swapped]
    for alternative in pick.alternatives:
        if len(configs) == NON_PICKED:
            break
        if alternative.config.label() not in {c.label() for c in configs}:
            configs.append(alternative.config)
    return configs


def run(plan: Plan, *, steps: int, workdir: Path) -> tuple[Measurement | None, bool]:
    try:
        return run_validation(plan, steps=steps, warmup=3, workdir=workdir), False
    except RanOutOfMemory as exc:
        print(f"  OUT OF MEMORY: {exc}", flush=True)
        return None, True


def bench_request(request: Request, args: argparse.Namespace, cluster: ClusterSpec) -> list[dict]:
    out = args.out / request.name
    profile = calibrate(request, out, args.budget_s, cluster.world_size)
    spec = plan_request(request, cluster, args.precision)
    pick = make_plan(spec, calibration=profile, calibration_id=profile.content_id())
    uncalibrated = predict(spec, pick.config)
    print(f"[{request.name}] pick: {pick.config.label()}", flush=True)
    measured, oom = run(pick, steps=args.steps, workdir=out / "pick")
    rows = [
        row(request, pick, picked=True, calibrated=True, measured=measured, oom=oom),
        row(request, uncalibrated, picked=True, calibrated=False, measured=measured, oom=oom),
    ]
    for index, config in enumerate(non_picked(pick)):
        plan = predict(spec, config, calibration=profile, calibration_id=profile.content_id())
        print(f"[{request.name}] not picked: {plan.config.label()}", flush=True)
        measured, oom = run(plan, steps=args.steps, workdir=out / f"alt{index}")
        rows.append(row(request, plan, picked=False, calibrated=True, measured=measured, oom=oom))
    return rows


def summary(document: dict) -> str:
    runs = document["runs"]
    lines = [
        f"Device: {document['device']}, torch {document['torch']}.",
        "",
        "| request | configuration | picked | calibrated | predicted step s | measured step s | "
        "predicted GiB | measured GiB | memory error | OOM |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    memory_errors, time_errors = [], []
    for r in runs:
        error = ""
        if r["measured_peak_gib"]:
            e = (r["predicted_peak_gib"] - r["measured_peak_gib"]) / r["measured_peak_gib"]
            error = f"{e:+.1%}"
            if r["calibrated"]:
                memory_errors.append(abs(e))
        if r["calibrated"] and r["measured_step_s"]:
            time_errors.append(abs(r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"])
        lines.append(
            f"| {r['request']} | {r['config']} | {'yes' if r['picked'] else ''} | "
            f"{'yes' if r['calibrated'] else ''} | {r['predicted_step_s']:.3f} | "
            f"{r['measured_step_s'] or 0:.3f} | {r['predicted_peak_gib']:.2f} | "
            f"{r['measured_peak_gib'] or 0:.2f} | "
            f"{error} | {'OOM' if r['oom'] else ''} |"
        )
    picks_oom = sum(1 for r in runs if r["picked"] and r["calibrated"] and r["oom"])
    if memory_errors:
        lines.append(
            f"\nPicks that ran out of memory: {picks_oom}. Calibrated memory error: mean "
            f"{sum(memory_errors) / len(memory_errors):.1%}, max {max(memory_errors):.1%}. Calibrated "
            f"step-time MAPE {sum(time_errors) / max(len(time_errors), 1):.1%}."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", help="comma-separated request names (default: all)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=45.0, help="calibration time budget per request")
    parser.add_argument("--gpu", default="H100", help="catalog GPU this machine has (default H100)")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs (or CPU ranks) of this node to use")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--summary", action="store_true", help="print the table from --results and stop")
    args = parser.parse_args()
    document = json.loads(args.results.read_text()) if args.results.exists() else {"runs": []}
    if args.summary:
        print(summary(document))
        return
    import torch  # only where the benchmark runs: the summary needs no torch

    names = args.requests.split(",") if args.requests else [r.name for r in REQUESTS]
    known = {r.name: r for r in (*REQUESTS, SMOKE)}
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown request(s) {', '.join(unknown)}; known: {', '.join(known)}")
    cluster = ClusterSpec(num_nodes=1, gpus_per_node=args.nproc, gpu=args.gpu)
    document["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    document["torch"] = torch.__version__
    for name in names:
        rows = bench_request(known[name], args, cluster)
        document["runs"] = [r for r in document["runs"] if r["request"] != name] + rows
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(document, indent=2) + "\n")
    print(summary(document))


if __name__ == "__main__":
    main()
