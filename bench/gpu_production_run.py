"""Benchmark: issue 14's production run on a real GPU (on demand, not a test).

    python bench/gpu_production_run.py [--gpu H100] [--nproc 1] [--steps 40] [--out bench/out/production]
    python bench/gpu_production_run.py --summary

On the GPU this runs on: prepare a text corpus (made here, no downloads) into token shards with
`prepare-data`'s byte tokenizer, write a llama-shaped Hugging Face checkpoint (random bf16 weights,
safetensors in several files), plan it for this node, and run the plan's own launch bundle
(`launch.sh`) from that checkpoint on that data with periodic checkpoints; then start the same
command again for more steps, so that it resumes from the newest checkpoint. Records the plan's
predicted tokens/s/GPU and peak memory beside the measured ones, the first resumed step, and the
losses around the resume, in `bench/results/gpu_production_run.json` (a re-run replaces it).
CPU smoke: `--gpu cpu --nproc 2 --precision fp32 --layers 2 --hidden 256 --seq-len 256 --steps 8`.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from api.cli.validate_cmd import Measurement, run_validation
from executor.runtime.prepare_data import ByteTokenizer, prepare
from executor.runtime.safetensors_io import write_sharded
from planner.search import make_plan
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, SearchSpace, TrainingSpec

RESULTS = Path("bench/results/gpu_production_run.json")


def corpus(path: Path, *, tokens: int) -> Path:
    """About `tokens` bytes of varied English-like text, paragraph by paragraph (deterministic)."""
    words = ("shard", "gather", "reduce", "scatter", "token", "sequence", "layer", "block", "norm",
             "head", "loss", "step", "rank", "node", "memory", "bucket", "kernel", "stream", "overlap",
             "batch", "gradient", "optimizer", "checkpoint", "plan")
    with path.open("w", encoding="utf-8") as out:
        written, i = 0, 0
        while written < tokens:
            sentence = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 9))
            tail = f"then {words[i % len(words)]} number {i * 37 % 1000}"
            paragraph = f"Paragraph {i}. The {sentence}; {tail}.\n\n"
            written += out.write(paragraph)
            i += 1
    return path


def model_spec(args: argparse.Namespace) -> ModelSpec:
    heads = max(1, args.hidden // 64)
    return ModelSpec(
        name=f"llama-{args.layers}l-{args.hidden}h",
        architecture="llama",
        vocab_size=32000,  # holds the byte tokenizer's 257
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2),
        intermediate_size=args.hidden * 8 // 3 // 64 * 64,
        max_seq_len=max(2048, args.seq_len),
    )


def hf_checkpoint(directory: Path, spec: ModelSpec, *, seed: int = 0) -> Path:
    """config.json + random bf16 weights under Hugging Face Llama names, in ~200 MB files."""
    g = torch.Generator().manual_seed(seed)
    h, f, v, kv = spec.hidden_size, spec.ffn_size, spec.vocab_size, spec.kv_heads * spec.head_dim

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    ones = torch.ones(h, dtype=torch.bfloat16)
    tensors = {"model.embed_tokens.weight": normal(v, h), "model.norm.weight": ones}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": ones.clone(),
            p + "post_attention_layernorm.weight": ones.clone(),
            p + "self_attn.q_proj.weight": normal(h, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(f, h),
            p + "mlp.up_proj.weight": normal(f, h),
            p + "mlp.down_proj.weight": normal(h, f),
        }
    tensors["lm_head.weight"] = normal(v, h)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v, "hidden_size": h,
        "intermediate_size": f, "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.kv_heads, "max_position_embeddings": spec.max_seq_len,
        "rms_norm_eps": spec.norm_eps, "rope_theta": spec.rope_theta, "tie_word_embeddings": False,
        "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    write_sharded(directory, tensors, max_shard_bytes=200 * 2**20)
    return directory


def measured(m: Measurement) -> dict:
    return {"tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "step_time_s": m.step_time_s,
            "peak_memory_gib": m.peak_memory_gib, "steps": m.steps, "losses": m.losses,
            "timed_steps": list(m.timed_steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--sequences", type=int, default=16, help="global batch, in sequences")
    parser.add_argument("--steps", type=int, default=40, help="steps of the first run; the resume adds half")
    parser.add_argument("--out", type=Path, default=Path("bench/out/production"))
    parser.add_argument("--summary", action="store_true", help="print the recorded result and exit")
    args = parser.parse_args()
    if args.summary:
        print(RESULTS.read_text() if RESULTS.exists() else f"{RESULTS}: nothing recorded yet")
        return

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = model_spec(args)
    tokens_needed = int(1.5 * args.steps * 1.5 * args.sequences * (args.seq_len + 1))
    data = out / "data"
    if not (data / "index.json").exists():
        prepare([corpus(out / "corpus.txt", tokens=tokens_needed)], data, tokenizer=ByteTokenizer(),
                sample_by="paragraph", eval_fraction=0.01)
    weights = out / "hf"
    if not (weights / "config.json").exists():
        hf_checkpoint(weights, spec)
    request = PlanRequest(
        model=spec,
        cluster=ClusterSpec(num_nodes=1, gpus_per_node=args.nproc, gpu=args.gpu),
        training=TrainingSpec(seq_len=args.seq_len, global_batch_tokens=args.sequences * args.seq_len,
                              precision=args.precision),  # type: ignore[arg-type]
        search=SearchSpace(compile=[True, False]),
    )
    plan = make_plan(request)
    checkpoints = out / "checkpoints"
    common = ("--init-from", str(weights), "--checkpoint-dir", str(checkpoints), "--resume",
              "--checkpoint-every", str(max(1, args.steps // 2)), "--eval-every", str(args.steps))
    first = run_validation(plan, steps=args.steps, workdir=out / "run-1", data=data, trainer_args=common)
    resumed = run_validation(plan, steps=args.steps + args.steps // 2, workdir=out / "run-2", data=data,
                             trainer_args=common)
    record = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.machine(),
        "torch": torch.__version__,
        "model": spec.name, "params": plan.model.num_params, "config": plan.config.label(),
        "predicted": {"tokens_per_s_per_gpu": plan.prediction.tokens_per_s_per_gpu,
                      "step_time_s": plan.prediction.step_time_s,
                      "peak_memory_gib": plan.prediction.peak_memory_gib},
        "first_run": measured(first), "resumed_run": measured(resumed),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    p, m = record["predicted"], record["first_run"]
    print(f"{record['device']} torch {record['torch']}: {spec.name} ({plan.model.num_params / 1e6:.0f}M), "
          f"{plan.config.label()}\n  tokens/s/GPU predicted {p['tokens_per_s_per_gpu']:,.0f}, measured "
          f"{m['tokens_per_s_per_gpu']:,.0f}; peak predicted {p['peak_memory_gib']:.2f} GiB, measured "
          f"{m['peak_memory_gib']} GiB; resumed run: {resumed.steps} steps, losses {resumed.losses[:3]}")


if __name__ == "__main__":
    main()
