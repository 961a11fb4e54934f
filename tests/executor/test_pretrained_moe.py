"""Pretrained weights of the mixture-of-experts and Qwen3 families, checked against `transformers`.

For each family the runtime reads (Qwen3 with query/key norms, Qwen3-MoE, Mixtral, DeepSeek-V3 with
latent attention, shared experts, a dense first block and a biased sigmoid router), a tiny random
model is built by `transformers` itself and written with `save_pretrained` (safetensors): the names,
the per-expert matrices and DeepSeek's interleaved rotary rows are transformers' own, not this
project's idea of them. The runtime loads it (`--init-from`'s loader) and its logits equal
transformers' (float32 both; 1e-4 of the largest logit: a mislaid expert or rotary row moves them by
tens of percent); the loaded model saved as a training checkpoint (DCP) and exported
(`executor.runtime.export`) gives back every tensor of the original files exactly, and an export
without the original config.json loads in transformers with the same logits. gpt-oss and Llama 4
checkpoints are refused naming what the runtime's model lacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from contract.plan_document import RuntimePlan, parse_plan
from executor.runtime import export as export_cli
from executor.runtime.hf import check_config
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model
from executor.runtime.pretrained import load_pretrained
from executor.runtime.safetensors_io import SafetensorsCheckpoint, WeightsError
from tests.executor.hf_checkpoint import plan_model
from tests.executor.plan_factory import debug_plan

transformers = pytest.importorskip("transformers")

SEQ = 16
CPU = torch.device("cpu")
_BASE = {
    "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", {**_BASE, "intermediate_size": 48, "head_dim": 8}),
    "qwen3_moe": ("Qwen3MoeConfig", {
        **_BASE, "num_hidden_layers": 4, "intermediate_size": 48, "moe_intermediate_size": 16,
        "num_experts": 6, "num_experts_per_tok": 2, "head_dim": 8, "norm_topk_prob": True,
        "decoder_sparse_step": 2,
    }),
    "mixtral": ("MixtralConfig", {
        **_BASE, "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
    }),
    "deepseek_v3": ("DeepseekV3Config", {
        **_BASE, "num_key_value_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
    }),
}


def hf_model(name: str, directory: Path, **changes: Any) -> Any:
    """A random transformers model of family `name` saved in `directory`, weights large enough (std 0.2,
    norms around 1, a non-zero router bias) that each one visibly moves the logits."""
    cls, kwargs = FAMILIES[name]
    config = getattr(transformers, cls)(**{**kwargs, **changes})
    torch.manual_seed(len(name))
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if key.endswith("norm.weight") or "layernorm" in key:
                tensor.copy_(1 + 0.2 * torch.randn_like(tensor))
            elif key.endswith("e_score_correction_bias"):
                tensor.copy_(0.1 * torch.randn_like(tensor))
            else:
                tensor.normal_(0, 0.2)
    model.save_pretrained(directory)
    return model


def make_plan(directory: Path) -> RuntimePlan:
    config = json.loads((directory / "config.json").read_text())
    return parse_plan(debug_plan(model=plan_model(config), seq_len=SEQ, gpus_per_node=1))


def loaded(directory: Path, plan: RuntimePlan) -> torch.nn.Module:
    model = build_model(plan.model, seq_len=SEQ)
    materialize(model, device=CPU, seed=0, init=False)
    load_pretrained(model, directory, cfg=plan.model, seq_len=SEQ)
    return model.eval()


def assert_logits_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = theirs.abs().max().item()
    err = (ours.double() - theirs.double()).abs().max().item()
    assert err <= 1e-4 * scale, f"logits differ by {err:.3g} (largest logit {scale:.3g})"


def tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(5))


def read_all(directory: Path) -> dict[str, torch.Tensor]:
    checkpoint = SafetensorsCheckpoint(directory)
    return {name: checkpoint.read(name).clone() for name in checkpoint.keys()}  # noqa: SIM118 (not a dict)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers(tmp_path: Path, name: str) -> None:
    theirs = hf_model(name, tmp_path)
    model = loaded(tmp_path, make_plan(tmp_path))
    batch = tokens(theirs.config.vocab_size)
    with torch.no_grad():
        assert_logits_close(model(batch), theirs(batch).logits)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_gives_back_every_tensor(tmp_path: Path, name: str) -> None:
    theirs = hf_model(name, tmp_path / "hf")
    plan = make_plan(tmp_path / "hf")
    model = loaded(tmp_path / "hf", plan)
    # The loaded model as the trainer checkpoints it ({"model": ..., "optim": ...}, flattened by DCP).
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    export_cli.export(tmp_path / "ckpt", plan, tmp_path / "out", hf_config=tmp_path / "hf")
    original, exported = read_all(tmp_path / "hf"), read_all(tmp_path / "out")
    assert sorted(exported) == sorted(original)
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key
    # Without the original config.json the export writes its own; transformers builds the same model.
    export_cli.export(tmp_path / "ckpt", plan, tmp_path / "bare")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bare", dtype=torch.float32).eval()
    assert type(again) is type(theirs)
    batch = tokens(theirs.config.vocab_size)
    with torch.no_grad():
        assert_logits_close(again(batch).logits, theirs(batch).logits)


def test_interleaved_rope_rows_matter(tmp_path: Path) -> None:
    """DeepSeek's rotary rows read without de-interleaving give other logits: the permutation is
    needed, and the test above would catch its absence."""
    theirs = hf_model("deepseek_v3", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_interleave": False}))
    model = loaded(tmp_path, make_plan(tmp_path))
    batch = tokens(theirs.config.vocab_size)
    with torch.no_grad():
        ours, ref = model(batch).double(), theirs(batch).logits.double()
    assert (ours - ref).abs().max().item() > 1e-2 * ref.abs().max().item()


def test_experts_land_in_their_slices(tmp_path: Path) -> None:
    """Expert e's gate/up/down matrices are slice e of the stacked w1/w3/w2, transposed."""
    hf_model("mixtral", tmp_path)
    model = loaded(tmp_path, make_plan(tmp_path))
    stored = read_all(tmp_path)
    experts = dict(model.named_parameters())
    for e in range(4):
        for ours, theirs in (("w1", "w1"), ("w3", "w3"), ("w2", "w2")):
            source = stored[f"model.layers.1.block_sparse_moe.experts.{e}.{theirs}.weight"]
            assert torch.equal(experts[f"layers.1.feed_forward.experts.{ours}"][e], source.t())


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("deepseek_v3", {"routed_scaling_factor": 2.5}, r"routed_scaling_factor 2\.5 \(the runtime's"),
        ("deepseek_v3", {"n_group": 2, "topk_group": 1}, r"group-limited routing \(topk_group 1 of n_group"),
        ("qwen3_moe", {"norm_topk_prob": False}, r"norm_topk_prob false"),
        ("qwen3_moe", {"num_experts": 8}, r"num_local_experts is 8, the plan's model.moe.num_experts is 6"),
        ("deepseek_v3", {"kv_lora_rank": 16}, r"kv_lora_rank is 16, the plan's model.latent_attention"),
    ],
)
def test_config_mismatch_is_refused(tmp_path: Path, name: str, changes: dict, message: str) -> None:
    plan = make_plan_for(name, tmp_path / "plan")
    hf_model(name, tmp_path / "hf", **changes)
    with pytest.raises(WeightsError, match=message):
        loaded(tmp_path / "hf", plan)


def make_plan_for(name: str, directory: Path) -> RuntimePlan:
    """The plan of family `name`'s test model as given (not of a changed checkpoint)."""
    hf_model(name, directory)
    return make_plan(directory)


@pytest.mark.parametrize(
    ("arch", "lacks"),
    [
        ("GptOssForCausalLM", "attention sinks"),
        ("Llama4ForCausalLM", "blocks without RoPE"),
        ("Llama4ForConditionalGeneration", "chunked attention"),
    ],
)
def test_families_the_runtime_cannot_compute_are_refused(tmp_path: Path, arch: str, lacks: str) -> None:
    plan = make_plan_for("mixtral", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    refused = rf"{arch} checkpoints are not supported by --init-from: .*{lacks}"
    with pytest.raises(WeightsError, match=refused):
        check_config({**config, "architectures": [arch]}, plan.model, seq_len=SEQ)


# --- 2 ranks: the experts sharded -----------------------------------------------------------------

DIST_CASES = [
    "qwen3_moe:full_shard:fsdp2",
    "deepseek_v3:full_shard:fsdp2",
    "qwen3_moe:no_shard:fsdp2:tp2",
    "qwen3_moe:full_shard:fsdp2:ep2",
    "deepseek_v3:full_shard:simple_fsdp:ep2",
]


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each family's checkpoint with its plan's model, the full tensors in the runtime's layout (as
    the one-process load, checked above against transformers, holds them), one global batch and
    transformers' loss on it."""
    tmp = tmp_path_factory.mktemp("pretrained_moe")
    batch = torch.randint(0, _BASE["vocab_size"], (4, SEQ + 1), generator=torch.Generator().manual_seed(11))
    expected, refs = {}, {}
    for name in {case.split(":")[0] for case in DIST_CASES}:
        theirs = hf_model(name, tmp / name)
        plan = make_plan(tmp / name)
        config = json.loads((tmp / name / "config.json").read_text())
        (tmp / name / "plan_model.json").write_text(json.dumps(plan_model(config)))
        model = loaded(tmp / name, plan)
        expected[str(tmp / name)] = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            logits = theirs(batch[:, :-1]).logits
        refs[name] = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()
    torch.save(expected, tmp / "expected.pt")
    torch.save(batch, tmp / "batch.pt")
    return {"dir": tmp, "refs": refs}


@pytest.mark.distributed
def test_sharded_experts_load_their_boxes(moe_files: dict[str, Any]) -> None:
    """FSDP2 shards the stacked experts on their first dim (each rank loads its experts' matrices
    only), tensor parallelism splits every expert's columns or rows, expert parallelism gives each
    rank half the experts; every rank's shards equal the source's boxes, it reads about half the
    bytes, and the first step's loss is transformers'."""
    from tests.executor.test_pretrained import check_ranks, load_sharded

    records = load_sharded(moe_files, 2, DIST_CASES)
    for case in DIST_CASES:
        ranks = records[case]
        check_ranks(ranks, moe_files["refs"][case.split(":")[0]], case)
        if not case.endswith("tp2"):  # the experts' dim split: rank 1 starts past rank 0's experts
            starts = [r["offsets"]["layers.1.feed_forward.experts.w1"][0] for r in ranks]
            assert starts[0] == 0 < starts[1], (case, starts)
        if case.endswith("ep2"):
            assert any("expert parallel: ep=2" in note for note in ranks[0]["notes"]), ranks[0]["notes"]
