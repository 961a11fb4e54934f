"""Training data in the runtime: the prepared-dataset reader (deterministic, split-independent, epoch
by epoch, across shard boundaries, refusing what cannot feed the model), flat token files, and real
2-rank training from a dataset that `fsdp-planner prepare-data` wrote, with held-out evaluation;
and the rule that synthetic tokens run only when asked for by name."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from executor.runtime.data import (
    BatchIndex,
    DataError,
    SyntheticTokens,
    TokenDataset,
    open_dataset,
    permute,
)
from executor.runtime.prepare_data import ByteTokenizer, prepare
from tests.executor.conftest import REPO, explain, job_env, read_metrics, torchrun
from tests.executor.plan_factory import debug_plan

TRAIN = ["-m", "executor.runtime.train"]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
         "quietly", "judge", "boxing", "matches"]


def corpus(documents: int, seed: int = 0) -> list[str]:
    """Deterministic English-like documents of 20-60 words."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(documents):
        n = int(torch.randint(20, 61, (1,), generator=g))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g)) + ".")
    return out


def write_dataset(tmp: Path, *, documents: int = 60, shard_tokens: int = 1000, eval_fraction: float = 0.1,
                  name: str = "ds") -> Path:
    source = tmp / f"{name}.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(documents)))
    prepare([source], tmp / name, tokenizer=ByteTokenizer(), shard_tokens=shard_tokens,
            eval_fraction=eval_fraction)
    return tmp / name


def stream(directory: Path, split: str) -> torch.Tensor:
    index = json.loads((directory / "index.json").read_text())
    raw = b"".join((directory / s["file"]).read_bytes() for s in index["splits"][split]["shards"])
    return torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.int64)


def global_batch(data, step: int, *, dp: int, micro: int, accum: int, evaluate: int = 0) -> torch.Tensor:
    """The step's whole batch, in sequence order, as `dp` ranks x `accum` micro-batches of `micro`."""
    parts = []
    for m in range(accum):
        for r in range(dp):
            index = BatchIndex(step, m, r, dp, micro)
            parts.append(data.eval_batch(index, batches=evaluate) if evaluate else data.batch(index))
    return torch.cat(parts)


def test_permute_is_a_bijection_for_any_size() -> None:
    for n in (*range(1, 40), 255, 256, 257, 1000, 4097):
        images = [permute(x, n, key=12345) for x in range(n)]
        assert sorted(images) == list(range(n)), n
    assert [permute(x, 1000, key=1) for x in range(20)] != [permute(x, 1000, key=2) for x in range(20)]
    assert [permute(x, 1000, key=1) for x in range(20)] != list(range(20))  # shuffled
    with pytest.raises(ValueError):
        permute(5, 5, key=0)


def test_dataset_sampling_is_deterministic_split_independent_and_covers_each_epoch(tmp_path: Path) -> None:
    # Small shards (300 tokens) so sequences cross shard boundaries.
    directory = write_dataset(tmp_path, shard_tokens=300)
    seq_len, per_step = 32, 8
    data = open_dataset(directory, vocab_size=2048, seq_len=seq_len, seed=7, sequences_per_step=per_step)
    assert data.has_eval and len(data.train.shards) > 5
    train = stream(directory, "train")
    assert data.train.num_tokens == len(train)
    # One step's global batch, whatever the split into ranks and micro-batches.
    a = global_batch(data, 3, dp=2, micro=2, accum=2)
    b = global_batch(data, 3, dp=4, micro=2, accum=1)
    c = global_batch(data, 3, dp=1, micro=1, accum=8)
    assert a.shape == (8, seq_len + 1) and a.dtype == torch.int64
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(a, global_batch(data, 3, dp=2, micro=2, accum=2))  # deterministic
    assert not torch.equal(a, global_batch(data, 4, dp=2, micro=2, accum=2))
    # Every row is the window of the train stream at a multiple of seq_len; over the first epoch
    # (steps covering N sequences) every window appears exactly once, then epoch 2 reshuffles.
    n = data.train_sequences
    assert n == (len(train) - 1) // seq_len
    starts = []
    for step in range(1, math.ceil(n / per_step) + 1):
        rows = global_batch(data, step, dp=2, micro=2, accum=2)
        for i, row in enumerate(rows):
            if (step - 1) * per_step + i >= n:
                break
            start = data.train_offset((step - 1) * per_step + i)
            assert start % seq_len == 0 and torch.equal(row, train[start : start + seq_len + 1])
            starts.append(start // seq_len)
    assert sorted(starts) == list(range(n)) and starts != sorted(starts)
    second = [data.train_offset(n + g) // seq_len for g in range(n)]
    assert sorted(second) == list(range(n)) and second != starts
    # Another seed, another order.
    other = open_dataset(directory, vocab_size=2048, seq_len=seq_len, seed=8, sequences_per_step=per_step)
    assert not torch.equal(a, global_batch(other, 3, dp=2, micro=2, accum=2))


def test_eval_batches_are_fixed_held_out_windows(tmp_path: Path) -> None:
    directory = write_dataset(tmp_path, shard_tokens=300, eval_fraction=0.2)
    data = open_dataset(directory, vocab_size=300, seq_len=16, seed=0, sequences_per_step=4)
    held_out = stream(directory, "eval")
    first = global_batch(data, 1, dp=2, micro=1, accum=2, evaluate=3)
    again = global_batch(data, 1, dp=4, micro=1, accum=1, evaluate=3)
    assert torch.equal(first, again)
    windows = {data.eval_offset(g, total=12) for g in range(12)}
    assert len(windows) == 12  # 12 distinct windows spread over the eval split
    for row in first:
        offset = next(o for o in windows if torch.equal(row, held_out[o : o + 17]))
        assert offset % 16 == 0
    # Synthetic eval sequences are not training ones.
    synthetic = SyntheticTokens(vocab_size=100, seq_len=16, seed=5)
    index = BatchIndex(1, 0, 0, 1, 4)
    assert not torch.equal(synthetic.eval_batch(index, batches=1), synthetic.batch(index))
    assert torch.equal(synthetic.eval_batch(index, batches=1), synthetic.eval_batch(index, batches=1))


def _rewrite_index(directory: Path, **changes) -> None:
    path = directory / "index.json"
    index = json.loads(path.read_text())
    index.update(changes)
    path.write_text(json.dumps(index))


def test_refusals_say_what_to_do(tmp_path: Path) -> None:
    directory = write_dataset(tmp_path, documents=20, shard_tokens=200, eval_fraction=0.1)
    kwargs = {"vocab_size": 2048, "seq_len": 16, "seed": 0, "sequences_per_step": 4}
    open_dataset(directory, **kwargs)
    open_dataset(directory / "index.json", **kwargs)  # the index file names its directory

    # The plan's model vocabulary is smaller than the tokenizer's.
    with pytest.raises(DataError, match=r"vocabulary 257\), larger than the plan's model vocabulary of 200"):
        open_dataset(directory, **{**kwargs, "vocab_size": 200})
    # A token id past the vocabulary: the error names the shard.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in directory.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    shard = bad / "train-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[0:2] = struct.pack("<H", 1000)
    shard.write_bytes(bytes(raw))
    data = open_dataset(bad, **kwargs)
    with pytest.raises(DataError, match=r"train-00001\.bin: token id 1000 at position 0 is not below the "
                                        r"vocab_size 257 in index.json"):
        for step in range(1, data.train_sequences // 4 + 2):  # an epoch reads every window
            data.batch(BatchIndex(step, 0, 0, 1, 4))
    # A sequence longer than a split.
    with pytest.raises(DataError, match=r"the eval split holds \d+ tokens, fewer than one sequence of "
                                        r"seq_len \+ 1 = 4097"):
        open_dataset(directory, **{**kwargs, "seq_len": 4096})
    # --data-dtype that contradicts the index.
    with pytest.raises(DataError, match="--data-dtype uint32 contradicts"):
        open_dataset(directory, dtype="uint32", **kwargs)
    # An index that says uint32 over uint16 shards: their sizes disagree.
    _rewrite_index(bad, dtype="uint32")
    with pytest.raises(DataError, match="truncated or from another preparation"):
        open_dataset(bad, **kwargs)
    _rewrite_index(bad, dtype="uint16")
    # A truncated shard, a missing one, a newer format, an unfinished directory.
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(DataError, match=r"train-00001\.bin: .* index.json says"):
        open_dataset(bad, **kwargs)
    shard.unlink()
    with pytest.raises(DataError, match=r"train-00001\.bin: missing"):
        open_dataset(bad, **kwargs)
    _rewrite_index(directory, version=2)
    with pytest.raises(DataError, match="format version 2 is newer"):
        open_dataset(directory, **kwargs)
    (directory / "index.json").unlink()
    with pytest.raises(DataError, match=r"no index\.json there.*prepare-data"):
        open_dataset(directory, **kwargs)
    with pytest.raises(DataError, match="no such file or directory"):
        open_dataset(tmp_path / "nowhere", **kwargs)


def test_flat_token_file(tmp_path: Path) -> None:
    tokens = list(range(1000))
    path = tmp_path / "tokens.bin"
    path.write_bytes(struct.pack("<1000H", *[t % 300 for t in tokens]))
    data = open_dataset(path, vocab_size=300, seq_len=20, seed=1, sequences_per_step=4)
    assert isinstance(data, TokenDataset) and data.train.num_tokens == 1000 and not data.has_eval
    batch = data.batch(BatchIndex(1, 0, 0, 1, 4))
    assert batch.shape == (4, 21)
    for row in batch:  # every row is a contiguous window of the file (i mod 300)
        assert torch.equal(row, (int(row[0]) + torch.arange(21)) % 300)
    assert len({int(row[0]) for row in batch}) > 1
    torch.testing.assert_close(batch, data.batch(BatchIndex(1, 0, 0, 1, 4)))
    small = open_dataset(path, vocab_size=10, seq_len=20, seed=1, sequences_per_step=4)
    with pytest.raises(DataError, match="is not below the model's vocab_size 10"):
        small.batch(BatchIndex(1, 0, 0, 1, 4))
    wide = tmp_path / "wide.bin"
    wide.write_bytes(struct.pack("<100I", *[70_000 + t for t in range(100)]))
    rows = open_dataset(wide, dtype="uint32", vocab_size=80_000, seq_len=9, seed=0, sequences_per_step=1)
    assert int(rows.batch(BatchIndex(1, 0, 0, 1, 1)).min()) >= 70_000
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="not a whole number"):
        open_dataset(odd, vocab_size=10, seq_len=4, seed=1, sequences_per_step=1)
    with pytest.raises(DataError, match="fewer than one sequence"):
        open_dataset(path, vocab_size=300, seq_len=5000, seed=1, sequences_per_step=1)


def _run_trainer(plan: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *TRAIN, "--plan", str(plan), *args], cwd=REPO, env=job_env(),
                          capture_output=True, text=True, timeout=120, check=False)


def test_no_data_is_a_clear_error_and_synthetic_must_be_asked_for(write_plan, tmp_path: Path) -> None:
    plan = write_plan(debug_plan(gpus_per_node=1))
    none = _run_trainer(plan, "--steps", "1")
    assert none.returncode == 2 and "Traceback" not in none.stderr
    message = " ".join(none.stderr.split())
    assert "no training data: pass --data DIR" in message and "fsdp-planner prepare-data" in message
    assert "--synthetic-data" in message and "DATA=DIR ./launch.sh" in message
    both = _run_trainer(plan, "--data", str(tmp_path), "--synthetic-data")
    assert both.returncode == 2 and "exclude each other" in both.stderr
    # --eval-every on data without an eval split.
    flat = tmp_path / "tokens.bin"
    flat.write_bytes(struct.pack("<1000H", *[t % 256 for t in range(1000)]))
    no_eval = _run_trainer(plan, "--data", str(flat), "--eval-every", "1", "--steps", "1")
    assert no_eval.returncode == 2 and "has no eval split" in no_eval.stderr, explain(no_eval)


@pytest.mark.distributed
def test_two_ranks_train_on_prepared_data_with_eval(tmp_path: Path, write_plan) -> None:
    directory = write_dataset(tmp_path, documents=80, shard_tokens=2000, eval_fraction=0.1)
    # shard_grad_op keeps FSDP2 units gathered after a forward without backward: evaluation must
    # leave training exactly as it was.
    two = write_plan(debug_plan(sharding="shard_grad_op", micro_batch_size=2, grad_accum_steps=1), "two.json")
    one = write_plan(debug_plan(gpus_per_node=1, micro_batch_size=2, grad_accum_steps=2), "one.json")
    common = ["--data", str(directory), "--steps", "4", "--lr", "2e-3", "--warmup", "1"]

    def run(plan: Path, name: str, nproc: int, *extra: str) -> tuple[list[dict], subprocess.CompletedProcess]:
        metrics = tmp_path / f"{name}.jsonl"
        args = [*TRAIN, "--plan", str(plan), *common, "--metrics-file", str(metrics), *extra]
        result = torchrun(nproc, args)
        assert result.returncode == 0, explain(result)
        return read_metrics(metrics), result

    evaluated, result = run(two, "eval", 2, "--eval-every", "2", "--eval-batches", "2")
    assert [r["step"] for r in evaluated] == [1, 2, 3, 4]
    assert [r["eval_loss"] is not None for r in evaluated] == [False, True, False, True]
    assert all(r["synthetic_data"] is False for r in evaluated)
    first, last = evaluated[1]["eval_loss"], evaluated[3]["eval_loss"]
    assert 1.0 < last < min(first, math.log(2048)), [(r["loss"], r["eval_loss"]) for r in evaluated]
    stdout = result.stdout
    assert "SYNTHETIC" not in stdout and f"data: {directory}" in stdout
    assert "| eval loss" in stdout and "eval every 2 steps on 2 batches" in stdout
    # Evaluation changes nothing in training.
    plain, _ = run(two, "plain", 2)
    assert [r["loss"] for r in plain] == [r["loss"] for r in evaluated]
    assert all(r["eval_loss"] is None for r in plain)
    # One rank taking the whole batch (2 micro-batches) sees the same data and the same eval set.
    # (With the optional trackers asked for: where their packages are missing, one warning each.)
    tensorboard = tmp_path / "tb"
    single, result = run(one, "one", 1, "--eval-every", "2", "--eval-batches", "2",
                         "--tensorboard", str(tensorboard), "--wandb-project", "fsdp-planner-test")
    if importlib.util.find_spec("tensorboard") is None:
        assert "warning: --tensorboard: TensorBoard is not installed here" in result.stderr
    else:
        assert any(tensorboard.glob("events.out.tfevents.*"))
    if importlib.util.find_spec("wandb") is None:
        assert "warning: --wandb-project: Weights & Biases is not installed here" in result.stderr
    assert [r["loss"] for r in single] == pytest.approx([r["loss"] for r in evaluated], rel=1e-4)
    assert [r["eval_loss"] is None for r in single] == [r["eval_loss"] is None for r in evaluated]
    assert [single[1]["eval_loss"], single[3]["eval_loss"]] == pytest.approx([first, last], rel=1e-4)


def test_trackers_log_when_installed_and_warn_when_not(tmp_path: Path, monkeypatch, capsys) -> None:
    import builtins
    import types

    from executor.runtime.loggers import open_trackers

    logged: list[tuple[dict, int]] = []
    runs: list[dict] = []

    class Run:
        def log(self, values: dict, step: int) -> None:
            logged.append((values, step))

        def finish(self) -> None:
            runs.append({"finished": True})

    def init(**kwargs):
        runs.append(kwargs)
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    (tracker,) = open_trackers(tensorboard=None, wandb_project="p", run_name="r", config={"a": 1})
    tracker.log({"train/loss": 2.5}, 3)
    tracker.close()
    assert runs == [{"project": "p", "name": "r", "config": {"a": 1}}, {"finished": True}]
    assert logged == [({"train/loss": 2.5}, 3)]

    real_import = builtins.__import__

    def missing(name, *args, **kwargs):
        if name in ("wandb", "torch.utils.tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", missing)
    assert open_trackers(tensorboard=tmp_path, wandb_project="p", run_name="r", config={}) == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "pip install tensorboard" in err[0] and "pip install wandb" in err[1]
