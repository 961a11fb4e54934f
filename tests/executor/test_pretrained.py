"""Pretrained weights: `train.py --init-from DIR` and `python -m executor.runtime.export`.

The tests write tiny Hugging Face checkpoints themselves (hidden 64, 2 layers, vocabulary 256 or
255, sequences of 32): a Llama (bf16 on disk: cast on load), a Qwen2-style model (q/k/v biases, head
tied to the embedding, odd vocabulary, sharded into several files with an index) and a GPT-2
(Conv1D weights stored transposed).

- one process: the loaded model's logits equal a reference forward written in the test from the
  Hugging Face formulas (`hf_checkpoint.py`, independent of the runtime's model code), and
  `transformers`' own model when that package is installed; config.json mismatches and broken
  checkpoints are refused with a message naming the field or tensor;
- 2 ranks (torchrun, gloo): FSDP2 and SimpleFSDP full_shard, and tensor parallelism (dp 1 x tp 2),
  each rank's local shards equal the matching boxes of the source tensors, each rank reads about
  its share of the bytes, and the first training step's loss equals the reference's;
- the trainer end to end: `--init-from` logs what it loaded, a checkpoint found by `--resume` wins
  over it, and the trained checkpoint exported to safetensors loads back (`--init-from`'s loader,
  and `transformers`) with exactly the checkpoint's weights.

Tolerances: the loaded weights are compared exactly (a bf16 -> fp32 cast is exact). Logits: the
runtime computes in float32, the reference in float64; float32 rounding over 2 blocks leaves
relative errors near 1e-6, so 1e-4 of the largest logit is far below what any mislaid weight gives
(a transposed, permuted or swapped tensor moves logits by tens of percent,
`test_a_wrong_rope_layout_is_caught` shows it).
"""

from __future__ import annotations

import array
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from contract.plan_document import RuntimePlan, parse_plan
from executor.runtime import export as export_cli
from executor.runtime.hf import check_config
from executor.runtime.materialize import clean_name, materialize
from executor.runtime.models import build_model
from executor.runtime.pretrained import load_pretrained
from executor.runtime.safetensors_io import SafetensorsCheckpoint, WeightsError
from tests.executor.conftest import REPO, explain, job_env, read_metrics, torchrun
from tests.executor.hf_checkpoint import (
    GPT2_CONFIG,
    LLAMA_CONFIG,
    MISTRAL_CONFIG,
    QWEN2_CONFIG,
    plan_model,
    random_weights,
    reference_logits,
    reference_loss,
    runtime_to_hf,
    write_checkpoint,
)
from tests.executor.plan_factory import debug_plan

SEQ = 32
CPU = torch.device("cpu")
WORKER = REPO / "tests" / "executor" / "workers" / "pretrained.py"
CHECKPOINTS = {
    # name: (config, dtype on disk, max shard bytes)
    "llama": (LLAMA_CONFIG, torch.bfloat16, None),
    "qwen2": (QWEN2_CONFIG, torch.float32, 60_000),
    "mistral": (MISTRAL_CONFIG, torch.float32, None),  # heads 24 wide at hidden 64 (config.json's head_dim)
    "gpt2": (GPT2_CONFIG, torch.float32, None),
}


def make_checkpoint(
    directory: Path, name: str, **config_changes: Any
) -> tuple[dict, dict[str, torch.Tensor]]:
    config, dtype, shard = CHECKPOINTS[name]
    config = {**config, **config_changes}
    tensors = random_weights(config, seed=len(name), dtype=dtype)
    write_checkpoint(directory, config, tensors, max_shard_bytes=shard)
    return config, tensors


def make_plan(config: dict, **kwargs: Any) -> RuntimePlan:
    return parse_plan(debug_plan(model=plan_model(config), seq_len=SEQ, gpus_per_node=1, **kwargs))


def loaded_model(directory: Path, plan: RuntimePlan) -> torch.nn.Module:
    model = build_model(plan.model, seq_len=SEQ)
    materialize(model, device=CPU, seed=0, init=False)
    load_pretrained(model, directory, cfg=plan.model, seq_len=SEQ)
    return model


def tokens_for(config: dict, batch: int = 2, length: int = SEQ) -> torch.Tensor:
    return torch.randint(0, config["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(5))


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    err = (ours.double() - ref.double()).abs().max().item()
    assert err <= 1e-4 * scale, f"logits differ by {err:.3g} (largest logit {scale:.3g})"


# --- one process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_logits_match_the_reference_forward(tmp_path: Path, name: str) -> None:
    config, tensors = make_checkpoint(tmp_path, name)
    model = loaded_model(tmp_path, make_plan(config))
    tokens = tokens_for(config)
    with torch.no_grad():
        ours = model(tokens)
    assert_logits_close(ours, reference_logits(config, tensors, tokens))


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_logits_match_transformers(tmp_path: Path, name: str) -> None:
    transformers = pytest.importorskip("transformers")
    config, tensors = make_checkpoint(tmp_path, name)
    model = loaded_model(tmp_path, make_plan(config))
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    tokens = tokens_for(config)
    with torch.no_grad():
        ours, theirs = model(tokens), theirs_model(tokens).logits
    assert_logits_close(ours, theirs)
    assert_logits_close(theirs, reference_logits(config, tensors, tokens))  # the reference is HF's maths


def test_a_wrong_rope_layout_is_caught(tmp_path: Path) -> None:
    """Checkpoints in Meta's interleaved q/k layout (what HF's conversion script permutes away)
    give other logits: the reference would catch a loader that permuted when it should not, or
    the reverse."""
    config, tensors = make_checkpoint(tmp_path / "ok", "llama")
    heads, kv, h = config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]
    d = h // heads

    def to_interleaved(w: torch.Tensor, n: int) -> torch.Tensor:  # inverse of HF's permute()
        return w.view(n, 2, d // 2, h).transpose(1, 2).reshape(n * d, h)

    permuted = dict(tensors)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        permuted[p + "q_proj.weight"] = to_interleaved(tensors[p + "q_proj.weight"], heads)
        permuted[p + "k_proj.weight"] = to_interleaved(tensors[p + "k_proj.weight"], kv)
    write_checkpoint(tmp_path / "meta", config, permuted)
    model = loaded_model(tmp_path / "meta", make_plan(config))
    tokens = tokens_for(config)
    with torch.no_grad():
        ours = model(tokens).double()
    ref = reference_logits(config, tensors, tokens)
    assert (ours - ref).abs().max().item() > 1e-2 * ref.abs().max().item()


def test_load_reports_and_casts(tmp_path: Path) -> None:
    config, tensors = make_checkpoint(tmp_path, "llama")
    plan = make_plan(config)
    model = build_model(plan.model, seq_len=SEQ)
    materialize(model, device=CPU, seed=0, init=False)
    report = load_pretrained(model, tmp_path, cfg=plan.model, seq_len=SEQ)
    assert report.tensors == len(tensors) == 2 * 9 + 3
    assert report.checkpoint_bytes == report.bytes_read == sum(t.numel() * 2 for t in tensors.values())
    assert report.cast == "bfloat16 -> float32"
    line = report.describe()
    assert "LlamaForCausalLM checkpoint" in line and "21 tensors from 1 file(s)" in line
    for name, (hf_name, _) in runtime_to_hf(config).items():
        assert torch.equal(dict(model.named_parameters())[name], tensors[hf_name].float()), name


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_key_value_heads": 4}, r"num_key_value_heads is 4, the plan's model.kv_heads is 2"),
        ({"tie_word_embeddings": True}, r"tie_word_embeddings is True, the plan's model.tie_word_embeddings"),
        ({"rope_theta": 500000.0}, r"rope_theta is 500000.0"),
        ({"rms_norm_eps": 1e-6}, r"rms_norm_eps is 1e-06"),
        ({"hidden_act": "gelu"}, r"hidden_act 'gelu'"),
        ({"attention_bias": True}, r"attention_bias"),
        ({"head_dim": 32}, r"head_dim is 32, the plan's model.head_dim is 16"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            r"rope_scaling 'llama3' \(the runtime computes unscaled RoPE",
        ),
        ({"architectures": ["FalconForCausalLM"]}, r"FalconForCausalLM is not supported"),
        ({"architectures": ["GPT2LMHeadModel"]}, r"a GPT2LMHeadModel checkpoint, but the plan's model"),
    ],
)
def test_config_mismatch_is_refused(tmp_path: Path, changes: dict, message: str) -> None:
    plan = make_plan(LLAMA_CONFIG)
    make_checkpoint(tmp_path, "llama", **changes)
    with pytest.raises(WeightsError, match=message) as info:
        loaded_model(tmp_path, plan)
    assert "fsdp-planner plan --hf-config" in str(info.value) or "not supported" in str(info.value)


def test_config_checks_read_transformers_5_rope_parameters() -> None:
    """transformers 5 writes `rope_parameters` instead of rope_theta / rope_scaling."""
    model = make_plan(LLAMA_CONFIG).model
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "rope_theta"}
    check_config(
        {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, model, seq_len=SEQ
    )
    with pytest.raises(WeightsError, match=r"rope_theta is 500000\.0"):
        check_config(
            {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, model, seq_len=SEQ
        )
    scaled = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}
    with pytest.raises(WeightsError, match="rope_scaling 'llama3'"):
        check_config({**config, "rope_parameters": scaled}, model, seq_len=SEQ)


def test_gpt2_config_checks() -> None:
    model = make_plan(GPT2_CONFIG).model
    check_config(GPT2_CONFIG, model, seq_len=SEQ)
    with pytest.raises(WeightsError, match=r"n_positions is 1024, the plan's model.max_seq_len is 64"):
        check_config({**GPT2_CONFIG, "n_positions": 1024}, model, seq_len=SEQ)
    with pytest.raises(WeightsError, match=r"activation_function 'relu'"):
        check_config({**GPT2_CONFIG, "activation_function": "relu"}, model, seq_len=SEQ)


def test_mistral_sliding_window_shorter_than_the_sequence(tmp_path: Path) -> None:
    plan = make_plan(LLAMA_CONFIG)
    make_checkpoint(
        tmp_path, "llama", architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=16
    )
    with pytest.raises(WeightsError, match=r"sliding_window 16 shorter than the plan's seq_len 32"):
        loaded_model(tmp_path, plan)
    make_checkpoint(
        tmp_path, "llama", architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4096
    )
    loaded_model(tmp_path, plan)  # a window longer than the sequence changes nothing


def test_broken_checkpoints_are_refused(tmp_path: Path) -> None:
    plan = make_plan(LLAMA_CONFIG)
    config, tensors = make_checkpoint(tmp_path, "llama")
    # A missing tensor is named.
    del tensors["model.layers.1.mlp.up_proj.weight"]
    write_checkpoint(tmp_path, config, tensors)
    with pytest.raises(
        WeightsError, match=r"lacks 1 of the model's parameters: layers.1.feed_forward.w3.weight"
    ):
        loaded_model(tmp_path, plan)
    # A wrong shape is named.
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    write_checkpoint(tmp_path, config, tensors)
    with pytest.raises(WeightsError, match=r"up_proj.weight: shape \[64, 128\] in the checkpoint"):
        loaded_model(tmp_path, plan)
    # Truncated safetensors file.
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WeightsError, match="truncated"):
        loaded_model(tmp_path, plan)
    # No config.json.
    (tmp_path / "config.json").unlink()
    with pytest.raises(
        WeightsError, match=r"config.json: missing; --init-from needs a Hugging Face model directory"
    ):
        loaded_model(tmp_path, plan)


def test_extra_tensors_are_reported(tmp_path: Path) -> None:
    config, tensors = make_checkpoint(tmp_path, "llama")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # old checkpoints: skipped
    tensors["model.extra.weight"] = torch.ones(3)
    write_checkpoint(tmp_path, config, tensors)
    plan = make_plan(config)
    model = build_model(plan.model, seq_len=SEQ)
    materialize(model, device=CPU, seed=0, init=False)
    report = load_pretrained(model, tmp_path, cfg=plan.model, seq_len=SEQ)
    assert report.unused == ["model.extra.weight"]
    assert "warning: 1 checkpoint tensor(s) not used: model.extra.weight" in report.describe()


def test_user_factory_models_are_refused(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "llama")
    with pytest.raises(WeightsError, match="built-in llama and gpt2 models only"):
        load_pretrained(torch.nn.Linear(2, 2), tmp_path, cfg=make_plan(LLAMA_CONFIG).model, seq_len=SEQ)


# --- 2 ranks ----------------------------------------------------------------------------------------

DIST_CASES = [
    "llama:full_shard:fsdp2",
    "llama:full_shard:simple_fsdp",
    "llama:no_shard:simple_fsdp:tp2",
    "llama:no_shard:fsdp2:tp2",
    "qwen2:full_shard:fsdp2",
    "qwen2:full_shard:simple_fsdp",
    "gpt2:full_shard:fsdp2",
]


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three checkpoints, the expected full tensors in the runtime's layout, one global batch
    and each checkpoint's reference loss on it."""
    tmp = tmp_path_factory.mktemp("pretrained")
    expected, refs = {}, {}
    batch = torch.randint(0, 255, (4, SEQ + 1), generator=torch.Generator().manual_seed(11))
    for name in CHECKPOINTS:
        directory = tmp / name
        config, tensors = make_checkpoint(directory, name)
        (directory / "plan_model.json").write_text(json.dumps(plan_model(config)))
        expected[str(directory)] = {
            ours: (tensors[theirs].t() if transposed else tensors[theirs]).contiguous()
            for ours, (theirs, transposed) in runtime_to_hf(config).items()
        }
        refs[name] = reference_loss(config, tensors, batch)
    torch.save(expected, tmp / "expected.pt")
    torch.save(batch, tmp / "batch.pt")
    return {"dir": tmp, "refs": refs}


def load_sharded(hf_files: dict[str, Any], nproc: int, cases: list[str]) -> dict[str, list[dict]]:
    """One launch of the worker over `cases` (`checkpoint:sharding:engine[:tp2]`); records by case."""
    tmp: Path = hf_files["dir"]
    out = tmp / f"out-{nproc}.json"
    args = [
        str(WORKER),
        "--out",
        str(out),
        "--batch",
        str(tmp / "batch.pt"),
        "--expected",
        str(tmp / "expected.pt"),
    ]
    specs = [f"{tmp / case.split(':', 1)[0]}:{case.split(':', 1)[1]}" for case in cases]
    result = torchrun(nproc, [*args, *specs], timeout=400)
    assert result.returncode == 0, explain(result)
    records: dict[str, list[dict]] = {}
    for record in json.loads(out.read_text()):
        directory, rest = record["case"].split(":", 1)
        records.setdefault(f"{Path(directory).name}:{rest}", []).append(record)
    return records


@pytest.fixture(scope="module")
def two_ranks(hf_files: dict[str, Any]) -> dict[str, list[dict]]:
    return load_sharded(hf_files, 2, DIST_CASES)


def check_ranks(ranks: list[dict], ref_loss: float, case: str) -> None:
    """Every rank's shards equal the source's boxes; every rank holds and reads about 1/N of the
    model (no full copy anywhere); the first step's loss equals the reference forward's."""
    n = len(ranks)
    assert [r["rank"] for r in ranks] == list(range(n))
    total = sum(r["local_numel"] for r in ranks)
    for r in ranks:
        bad = {name: e for name, e in r["errors"].items() if e != 0.0}
        assert not bad, f"{case} rank {r['rank']}: local shards differ from the source: {bad}"
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-5), (case, r["report"])
        assert r["local_numel"] < 1.2 * total / n, case
        assert r["bytes_read"] < 1.2 * r["checkpoint_bytes"] / n, (case, r["report"])


@pytest.mark.distributed
@pytest.mark.parametrize("case", DIST_CASES)
def test_sharded_load_matches_the_source(two_ranks: dict, hf_files: dict, case: str) -> None:
    ranks = two_ranks[case]
    name = case.split(":")[0]
    check_ranks(ranks, hf_files["refs"][name], case)
    offsets = ranks[1]["offsets"]
    if case.endswith("tp2"):
        # Column-parallel rows and row-parallel columns: rank 1 holds the second half.
        assert offsets["layers.0.attention.wq.weight"] == [32, 0]
        assert offsets["layers.0.attention.wk.weight"] == [16, 0]
        assert offsets["layers.0.attention.wo.weight"] == [0, 32]
        assert offsets["layers.0.feed_forward.w2.weight"] == [0, 64]
        assert offsets["output.weight"] == [128, 0]
        assert ranks[0]["dp"] == ranks[1]["dp"] == [0, 1]
    else:
        first = "wte.weight" if name == "gpt2" else "tok_embeddings.weight"
        vocab = 255 if name == "qwen2" else 256
        assert offsets[first] == [(vocab + 1) // 2, 0]  # torch.chunk: rank 0 takes the larger half
        assert [r["dp"] for r in ranks] == [[0, 2], [1, 2]]


@pytest.mark.distributed
def test_dp2_tp2_strided_shards(hf_files: dict[str, Any]) -> None:
    """4 ranks, dp_shard 2 x tp 2: a data-parallel shard of a tensor-parallel shard
    (`_StridedShard`), under FSDP2 and SimpleFSDP."""
    cases = ["llama:full_shard:fsdp2:tp2", "llama:full_shard:simple_fsdp:tp2"]
    records = load_sharded(hf_files, 4, cases)
    for case in cases:
        ranks = records[case]
        check_ranks(ranks, hf_files["refs"]["llama"], case)
        assert "_StridedShard" in ranks[0]["placements"]["layers.0.attention.wq.weight"]
        # tp innermost: ranks (dp, tp) = (0,0) (0,1) (1,0) (1,1); rows of wq by tp half, then dp quarter.
        assert [r["offsets"]["layers.0.attention.wq.weight"][0] for r in ranks] == [0, 32, 16, 48]
        assert [r["offsets"]["output.weight"][0] for r in ranks] == [0, 128, 64, 192]


# --- the trainer and export, end to end ---------------------------------------------------------------


def _optional(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        return None


def write_tokens(path: Path, vocab: int, count: int = 20_000) -> Path:
    g = torch.Generator().manual_seed(3)
    path.write_bytes(array.array("H", torch.randint(0, vocab, (count,), generator=g).tolist()).tobytes())
    return path


@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_trainer_init_from_resume_and_export_round_trip(tmp_path: Path) -> None:
    config, tensors = make_checkpoint(tmp_path / "hf", "llama")
    plan_doc = debug_plan(model=plan_model(config, "tiny-llama"), seq_len=SEQ, micro_batch_size=2)
    (tmp_path / "plan.json").write_text(json.dumps(plan_doc))
    tokens = write_tokens(tmp_path / "tokens.bin", config["vocab_size"])
    common = [
        "-m", "executor.runtime.train", "--plan", str(tmp_path / "plan.json"),
        "--data", str(tokens), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--init-from", str(tmp_path / "hf"), "--lr", "1e-3", "--warmup", "1",
    ]  # fmt: skip
    first = torchrun(2, [*common, "--steps", "2", "--metrics-file", str(tmp_path / "m1.jsonl")])
    assert first.returncode == 0, explain(first)
    assert (
        "weights: LlamaForCausalLM checkpoint" in first.stdout and "21 tensors from 1 file(s)" in first.stdout
    )
    assert "(cast bfloat16 -> float32)" in first.stdout
    losses = [m["loss"] for m in read_metrics(tmp_path / "m1.jsonl") if "loss" in m]
    assert len(losses) == 2
    # Resuming: the checkpoint wins over --init-from, and says so.
    second = torchrun(2, [*common, "--steps", "3", "--resume"])
    assert second.returncode == 0, explain(second)
    assert "not loaded: resuming from" in second.stdout and "resumed from" in second.stdout
    assert "weights: LlamaForCausalLM" not in second.stdout

    # Export step 2 through the CLI (sharded files: a 100 kB cap), then as bf16 in-process.
    step2 = tmp_path / "ckpt" / "step-00000002"
    out = tmp_path / "export"
    export_args = ["--checkpoint", str(step2), "--plan", str(tmp_path / "plan.json"), "--out", str(out)]
    export_args += ["--max-shard-gb", "0.0001", "--hf-config", str(tmp_path / "hf")]
    cli = subprocess.run(
        [sys.executable, "-m", "executor.runtime.export", *export_args],
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "exported" in cli.stdout and "21 tensors" in cli.stdout
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 1 and (out / "model.safetensors.index.json").is_file()
    exported_config = json.loads((out / "config.json").read_text())
    assert exported_config["torch_dtype"] == "float32" and exported_config["num_key_value_heads"] == 2

    # The checkpoint's weights, read by DCP itself into the unsharded model.
    plan = parse_plan(plan_doc)
    trained = build_model(plan.model, seq_len=SEQ)
    materialize(trained, device=CPU, seed=0)
    state = {"model": trained.state_dict()}
    dcp.load(state, checkpoint_id=str(step2), no_dist=True)
    trained.load_state_dict(state["model"])
    # Round trip: --init-from's loader on the export gives exactly those weights.
    reloaded = loaded_model(out, plan)
    for name, param in reloaded.named_parameters():
        assert torch.equal(param, dict(trained.named_parameters())[clean_name(name)]), name
    hf_names = runtime_to_hf(config)
    moved = (
        (trained.tok_embeddings.weight - tensors[hf_names["tok_embeddings.weight"][0]].float()).abs().max()
    )
    assert moved > 0  # training changed the weights: the comparison means something
    tokens_in = tokens_for(config)
    transformers = _optional("transformers")
    if transformers is not None:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        with torch.no_grad():
            assert_logits_close(reloaded(tokens_in), theirs(tokens_in).logits)

    # bf16 export of the newest checkpoint (step 3, from the resumed run), one file.
    bf16 = tmp_path / "export-bf16"
    root_args = ["--checkpoint", str(tmp_path / "ckpt"), "--plan", str(tmp_path / "plan.json")]
    code = export_cli.main([*root_args, "--out", str(bf16), "--dtype", "bfloat16"])
    assert code == 0 and sorted(p.name for p in bf16.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((bf16 / "config.json").read_text())["torch_dtype"] == "bfloat16"
    step3 = build_model(plan.model, seq_len=SEQ)
    materialize(step3, device=CPU, seed=0)
    state = {"model": step3.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt" / "step-00000003"), no_dist=True)
    written = SafetensorsCheckpoint(bf16)
    for name, (hf_name, _) in hf_names.items():
        assert torch.equal(written.read(hf_name), state["model"][name].to(torch.bfloat16)), name
