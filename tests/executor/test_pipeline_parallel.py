"""Pipeline parallelism in the runtime: the stage split and the refusals in one process, then pp 2
training on CPU (gloo) ranks against a one-process run, a pipeline-split checkpoint resumed, and
the schedules' bubble timed against the planner's price.

Two torchrun launches train (`workers/pipeline_parallel.py`, every case of a world size in one
launch), 4 AdamW steps of 4 micro-batches each:
  2 ranks  pp 2 under 1F1B (FSDP2; it also saves a checkpoint and resumes it pipeline-split under
           FSDP2 and SimpleFSDP and whole in one process), Interleaved1F1B and ZBVZeroBubble (two
           stages per rank, FSDP2), and 1F1B under eager SimpleFSDP
  4 ranks  pp 2 x dp 2 under FSDP2 and compiled SimpleFSDP (inductor), pp 2 x tp 2 under FSDP2
           (1F1B) and SimpleFSDP (Interleaved1F1B), pp 2 x cp 2 (context parallelism inside each
           stage) under FSDP2 (1F1B, with a checkpoint saved and resumed as above; ZBVZeroBubble)
           and eager SimpleFSDP (Interleaved1F1B)

Tolerances (fp32) are tensor parallelism's (`test_tensor_parallel.py`): 1e-5 for step-1
gradients, compared per parameter under the whole model's names, and 2e-5 for the losses. A
pipeline alone changes no arithmetic (the schedule divides the summed gradients by the 4
micro-batches where one process divides each micro-batch's loss: exact for a power of two), so the
pp-only cases match to the bit; a stage fed the wrong micro-batch or a gradient scaled twice moves
them by percents.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from contract.parallel_config import PipelineConfig
from contract.plan_document import PlanError, RuntimePlan, parse_plan
from executor.runtime.checkpoint import TRAIN_STATE, load_checkpoint, save_checkpoint
from executor.runtime.materialize import materialize
from executor.runtime.models import build_model
from executor.runtime.pipeline import check_pipeline, split_model
from planner.cost.pipeline import ChunkTimes, bubble_fraction
from tests.executor.conftest import REPO, explain, job_env, torchrun
from tests.executor.plan_factory import LLAMA_DEBUG, debug_plan
from tests.executor.test_parity import NO_GRAPH_CACHE
from tests.executor.workers.pipeline_parallel import GPT2_TIED, SPLITS

WORKERS = REPO / "tests" / "executor" / "workers"
GRAD_RTOL = 1e-5
LOSS_RTOL = 2e-5
PARAMETERS = 4 * 9 + 3  # llama-debug: 9 per block, embeddings, final norm, head
TIED_PARAMETERS = 2 + 4 * 12 + 2  # GPT-2 debug: wte, wpe, 12 per block, ln_f (the head is wte)
TWO_RANK_CASES = ["1F1B:fsdp2:eager", "Interleaved1F1B:fsdp2:eager", "ZBVZeroBubble:fsdp2:eager",
                  "1F1B:simple_fsdp:eager", "1F1B:fsdp2:eager:1,1:gpt2", "ZBVZeroBubble:fsdp2:eager:1,1:gpt2"]
PP_CP_CASES = ["1F1B:fsdp2:eager:1,1,2", "ZBVZeroBubble:fsdp2:eager:1,1,2",
               "Interleaved1F1B:simple_fsdp:eager:1,1,2"]
FOUR_RANK_CASES = ["1F1B:fsdp2:eager:2,1", "1F1B:simple_fsdp:inductor:2,1", "1F1B:fsdp2:eager:1,2",
                   "Interleaved1F1B:simple_fsdp:eager:1,2", "Interleaved1F1B:simple_fsdp:eager:2,1:gpt2",
                   *PP_CP_CASES]


def pp_plan(schedule: str = "1F1B", **overrides: object) -> dict:
    return debug_plan(gpus_per_node=2, grad_accum_steps=4, pipeline=SPLITS[schedule], **overrides)  # type: ignore[arg-type]


# ---- the split and the refusals, in one process ----


@pytest.mark.parametrize(("schedule", "stages"), [("1F1B", ([0], [1])), ("Interleaved1F1B", ([0, 2], [1, 3])),
                                                  ("ZBVZeroBubble", ([0, 3], [1, 2]))])
def test_each_rank_keeps_its_stages_under_the_whole_models_names(schedule: str, stages: tuple) -> None:
    plan = parse_plan(pp_plan(schedule))
    whole = {name: p.shape for name, p in build_model(plan.model, seq_len=64).named_parameters()}
    pipeline = PipelineConfig(**SPLITS[schedule])
    held: dict[str, torch.Size] = {}
    for rank in range(2):
        split = split_model(build_model(plan.model, seq_len=64), pipeline=pipeline, pp=2, pp_rank=rank)
        assert [index for index, _ in split.stages] == stages[rank]
        names = {name: p.shape for name, p in split.rank_model.named_parameters()}
        assert not names.keys() & held.keys()  # no parameter on two ranks
        held.update(names)
        # The views hold the rank model's own parameter objects, each stage its own blocks.
        mine = {id(p) for p in split.rank_model.parameters()}
        viewed = [{id(p) for p in view.parameters()} for _, view in split.stages]
        assert set().union(*viewed) == mine and sum(map(len, viewed)) == len(mine)
        for index, view in split.stages:
            assert (view.tok_embeddings is not None) == (index == 0)
            assert (view.output is not None) == (index == pipeline.num_stages - 1)
            assert list(view.layers) == [str(b) for b in split.blocks[index]]
    assert held == whole  # every parameter once, under the unsplit model's name and shape


GPT2_DEBUG = {**LLAMA_DEBUG, "name": "gpt2-debug", "architecture": "gpt2", "num_kv_heads": 8,
              "intermediate_size": 1024}


@pytest.mark.parametrize(
    ("schedule", "model"), [("Interleaved1F1B", LLAMA_DEBUG), ("ZBVZeroBubble", GPT2_DEBUG)]
)
def test_the_stages_in_order_compute_the_whole_models_loss(schedule: str, model: dict) -> None:
    """Token ids through stage 0, hidden states through the middle stages, the loss out of the last:
    the same loss as the unsplit model with the same weights."""
    plan = parse_plan(pp_plan(schedule, model=model, name=model["name"]))
    pipeline = plan.config.pipeline
    assert pipeline is not None
    torch.manual_seed(0)
    whole = _materialized(plan)
    tokens = torch.randint(0, plan.model.vocab_size, (2, 65))
    expected = whole(tokens[:, :-1], tokens[:, 1:])
    h = tokens[:, :-1]
    for stage in range(pipeline.num_stages):
        rank = pipeline.stage_ranks(2)[stage]
        copy = _materialized(plan)
        copy.load_state_dict(whole.state_dict())
        split = split_model(copy, pipeline=pipeline, pp=2, pp_rank=rank)
        h = dict(split.stages)[stage](h, tokens[:, 1:])
    torch.testing.assert_close(h, expected)


def _materialized(plan: RuntimePlan) -> torch.nn.Module:
    model = build_model(plan.model, seq_len=64).to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.reset_buffers()
    return model


def test_the_last_stages_copy_of_a_tied_weight_starts_as_the_embedding() -> None:
    plan = parse_plan(pp_plan(model=GPT2_TIED, name=GPT2_TIED["name"]))
    assert plan.config.pipeline is not None
    whole = build_model(plan.model, seq_len=64)
    materialize(whole, device=torch.device("cpu"), seed=3)
    last = split_model(build_model(plan.model, seq_len=64), pipeline=plan.config.pipeline, pp=2, pp_rank=1)
    head = last.rank_model.lm_head.weight
    assert head is not whole.lm_head.weight and "wte.weight" not in dict(last.rank_model.named_parameters())
    materialize(last.rank_model, device=torch.device("cpu"), seed=3)
    torch.testing.assert_close(last.rank_model.lm_head.weight, whole.wte.weight, rtol=0, atol=0)


def test_a_compiled_zero_bubble_run_is_refused_with_the_field_and_the_fix() -> None:
    # An eager plan run compiled (--engine simple_fsdp): the contract refuses compiled ZB-V plans.
    plan = parse_plan(pp_plan("ZBVZeroBubble"))
    with pytest.raises(PlanError, match=r"plan\.config\.pipeline\.schedule: ZBVZeroBubble") as refused:
        check_pipeline(plan, build_model(plan.model, seq_len=64), compiled=True)
    assert "make a plan with" in str(refused.value)  # and the fix


def test_context_parallelism_inside_the_stages_is_accepted() -> None:
    plan = parse_plan(debug_plan(gpus_per_node=4, cp=2, grad_accum_steps=4, pipeline=SPLITS["1F1B"]))
    check_pipeline(plan, build_model(plan.model, seq_len=64), compiled=False)


def test_a_user_model_is_refused() -> None:
    plan = parse_plan(pp_plan())
    with pytest.raises(PlanError, match="built-in llama and gpt2 models into stages, this model is a Linear"):
        check_pipeline(plan, torch.nn.Linear(2, 2), compiled=False)


def test_checkpoints_store_the_optimizer_by_parameter_name_and_older_ones_still_load(tmp_path: Path) -> None:
    # Pipeline ranks hold different parameter groups: the optimizer state is saved flattened
    # (`optim.param_groups.<name>.lr`); a checkpoint written before (nested) loads as it did.
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        saved = save_checkpoint(
            tmp_path / "new", step=1, model=model, optimizer=optimizer, train_state={}, keep=1
        )
        keys = dcp.FileSystemReader(str(saved)).read_metadata().state_dict_metadata
        assert "optim.param_groups.weight.lr" in keys and "optim.state.weight.exp_avg" in keys
        nested = tmp_path / "old" / "step-00000001"
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(nested))
        (nested / TRAIN_STATE).write_text(json.dumps({"step": 1}))
        for path in (saved, nested):
            again = torch.nn.Linear(4, 3)
            again_optimizer = torch.optim.AdamW(again.parameters(), lr=0.1)
            assert load_checkpoint(path, model=again, optimizer=again_optimizer)["step"] == 1
            torch.testing.assert_close(again.weight, model.weight)
            state = again_optimizer.state[again.weight]
            torch.testing.assert_close(state["exp_avg"], optimizer.state[model.weight]["exp_avg"])
    finally:
        dist.destroy_process_group()


# ---- training on gloo ranks against one process ----


def _launch(tmp: Path, world: int, cases: list[str]) -> dict[str, dict]:
    out = tmp / "pp.json"
    args = [str(WORKERS / "pipeline_parallel.py"), "--out", str(out), "--checkpoint-dir", str(tmp / "ckpt")]
    result = torchrun(world, [*args, "--steps", "4", *cases], env=job_env(**NO_GRAPH_CACHE), timeout=540)
    assert result.returncode == 0, explain(result)
    return {record["case"]: record for record in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _launch(tmp_path_factory.mktemp("pp2"), 2, TWO_RANK_CASES)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _launch(tmp_path_factory.mktemp("pp4"), 4, FOUR_RANK_CASES)


def assert_trains_like_one_process(record: dict) -> None:
    bad = {name: err for name, err in record["grad_errors"].items() if not err < GRAD_RTOL}
    assert not bad, f"{record['case']}: step-1 gradients differ from the one-process run: {bad}"
    expected = TIED_PARAMETERS if record["case"].endswith("gpt2") else PARAMETERS
    assert len(record["grad_errors"]) == expected, record["case"]  # every parameter was compared
    assert record["losses"] == pytest.approx(record["ref_losses"], rel=LOSS_RTOL), record["case"]
    assert record["ref_losses"][-1] < record["ref_losses"][0]  # it learns: the comparison means something
    assert any(n.startswith("pipeline: pp=2") for n in record["notes"]), record["notes"]


@pytest.mark.distributed
def test_pp2_trains_like_one_process_under_every_schedule(two_ranks: dict[str, dict]) -> None:
    for case in TWO_RANK_CASES:
        assert_trains_like_one_process(two_ranks[case])
        assert two_ranks[case]["dp"] == [[0, 1], [0, 1]]  # both stages read the same sequences
    one_f_one_b = two_ranks["1F1B:fsdp2:eager"]
    # Each rank compared only its own stage's parameters: the first stage's and the last's.
    first, last = one_f_one_b["compared_per_rank"]
    assert "tok_embeddings.weight" in first and "layers.1.ffn_norm.weight" in first
    assert "output.weight" in last and "layers.2.attention.wq.weight" in last
    assert len(first) + len(last) == PARAMETERS
    interleaved, zbv = two_ranks["Interleaved1F1B:fsdp2:eager"], two_ranks["ZBVZeroBubble:fsdp2:eager"]
    assert "this rank: stage(s) 0, 2 (blocks 0-0, 2-2)" in interleaved["notes"][0]  # looped
    assert "this rank: stage(s) 0, 3 (blocks 0-0, 3-3)" in zbv["notes"][0]  # a V
    assert "FSDP2 under pp: parameters gathered once per step" in one_f_one_b["notes"][-1]


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["1F1B:fsdp2:eager", "1F1B:fsdp2:eager:1,1:gpt2"])
def test_a_pipeline_split_checkpoint_resumes_to_the_same_loss(two_ranks: dict[str, dict], case: str) -> None:
    assert_resumes(two_ranks[case])


@pytest.mark.distributed
def test_a_pipeline_split_checkpoint_under_cp_resumes_to_the_same_loss(four_ranks: dict[str, dict]) -> None:
    assert_resumes(four_ranks["1F1B:fsdp2:eager:1,1,2"])


def assert_resumes(record: dict) -> None:
    last = record["losses"][-1]
    resumed = record["resumed_last_loss"]
    assert resumed["fsdp2"] == last
    assert resumed["simple_fsdp"] == pytest.approx(last, rel=1e-6)
    # The two stages' files together are the whole model (a tied weight under both its names, as
    # the unsplit model's state dict has it): one process loads them.
    assert resumed["unsharded"] == pytest.approx(last, rel=LOSS_RTOL)


@pytest.mark.distributed
def test_a_tied_head_and_embedding_train_like_one_weight(
    two_ranks: dict[str, dict], four_ranks: dict[str, dict]
) -> None:
    # GPT-2 ties its head to its embedding: the last stage holds a copy, and the copies' gradients
    # are summed after every step (across ranks for 1F1B, on rank 0 for ZB-V's V; with dp 2 over
    # each shard pair). Copies that drifted apart, or a norm that counted the weight twice, move
    # the losses from the second step on.
    for record in (two_ranks["1F1B:fsdp2:eager:1,1:gpt2"], two_ranks["ZBVZeroBubble:fsdp2:eager:1,1:gpt2"],
                   four_ranks["Interleaved1F1B:simple_fsdp:eager:2,1:gpt2"]):
        assert_trains_like_one_process(record)
        assert "tied embedding and head: a copy on the last stage, gradients summed" in record["notes"]
    first, last = two_ranks["1F1B:fsdp2:eager:1,1:gpt2"]["compared_per_rank"]
    assert "wte.weight" in first and "wte.weight" not in last  # compared once, as one weight


@pytest.mark.distributed
def test_pp2_with_dp2_or_tp2_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    for case in FOUR_RANK_CASES:
        assert_trains_like_one_process(four_ranks[case])
    # pp is outermost: ranks 0, 1 hold stage 0, ranks 2, 3 stage 1; a stage's dp ranks read
    # different sequences, its pipeline peers the same.
    with_dp, with_tp = four_ranks["1F1B:fsdp2:eager:2,1"], four_ranks["1F1B:fsdp2:eager:1,2"]
    assert with_dp["dp"] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert any("FSDP2 full_shard on mesh dp_shard=2" in n for n in with_dp["notes"]), with_dp["notes"]
    assert with_tp["dp"] == [[0, 1]] * 4
    assert "tensor parallel: tp=2 (sequence parallel, loss parallel)" in with_tp["notes"]


@pytest.mark.distributed
def test_compiled_simple_fsdp_pp2_dp2_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    record = four_ranks["1F1B:simple_fsdp:inductor:2,1"]
    assert_trains_like_one_process(record)
    assert any(n.startswith("torch.compile backend=inductor") for n in record["notes"]), record["notes"]
    # Each stage's compiled graph (forward + backward, run once per micro-batch) gathers its
    # parameters (one bucket, again in backward: resharded) and reduce-scatters their gradients:
    # SimpleFSDP pays its collectives every micro-batch, as the planner prices it.
    counts = record["collectives"]
    assert counts["all_gather_into_tensor"] == 2 and counts["reduce_scatter_tensor"] >= 1, counts


# ---- the bubble, timed ----

OWN_CPU = 0.85
"""A step counts when each rank's compute actions got at least 85% of a CPU: below it, other
processes shared the 2 cores, stretching compute and waits unevenly."""
BALANCED = 0.15
"""... and when its two ranks' compute differs by at most 15%: the stages are built alike (the
embeddings and head small), so more is another process taking one rank's core for a while."""
BUBBLE_ATOL = 0.1
"""The measured bubble fraction is within 0.1 of the priced one (medians of the counted steps).
On a 2-core machine that other jobs kept busy (so with the balance filter alone), 1F1B's median
over a run measured 0.18-0.27 in 11 of 12 runs and 0.47 in one, against 0.25 priced: the CPU
filter is what makes it a test. A schedule that lost its overlap measures near 1.
The other schedules are not timed here: they disagree, and are reported rather than asserted.
Interleaved1F1B (priced 0.125) measured medians of 0.09-0.30; ZBVZeroBubble (priced 0.00-0.03:
(pp - 1)(F + I - 2W), the weight gradients outlasting the rest) 0.03-0.19. Replaying their action
orders with the measured action times leaves 0.04-0.13 and 0.00-0.05: the price holds for the
schedules, and torch's multi-stage runtime around their actions costs what it leaves out."""
TIMED = ["1F1B"]


@pytest.fixture(scope="module")
def bubbles(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("bubble") / "bubble.json"
    args = [str(WORKERS / "pipeline_bubble.py"), "--out", str(out), "--steps", "7", *TIMED]
    result = torchrun(2, args, timeout=420)
    assert result.returncode == 0, explain(result)
    return json.loads(out.read_text())


def measured_and_priced(records: list[dict], schedule: str) -> tuple[list[float], list[float]]:
    """Per counted step after the first: the busiest rank's wait over its compute (the step's wall
    time less its compute actions), and the planner's `bubble_fraction` for that rank's mean chunk
    times (forward, input gradient, weight gradient; a full backward counts as the input's)."""
    pipeline = PipelineConfig(**SPLITS[schedule])
    measured, priced = [], []
    for record in (r for r in records if r["schedule"] == schedule and r["step"] > 1):
        every = record["actions"]
        compute = [sum(sum(t) for name, t in actions.items() if name != "cpu") for actions in every]
        own_cpu = min(sum(actions["cpu"]) / seconds for actions, seconds in zip(every, compute, strict=True))
        if own_cpu < OWN_CPU or max(compute) > (1 + BALANCED) * min(compute):
            continue
        busiest = max(range(len(compute)), key=compute.__getitem__)
        actions = record["actions"][busiest]
        chunks = 4 * pipeline.stages_per_rank

        def mean(kinds: str, actions: dict = actions, chunks: int = chunks) -> float:
            return sum(t for name, times in actions.items() if name[0] in kinds for t in times) / chunks

        chunk = ChunkTimes(forward=mean("F"), input_grad=mean("BI"), weight_grad=mean("W"))
        measured.append((record["wall_s"] - compute[busiest]) / compute[busiest])
        priced.append(bubble_fraction(pipeline, pp=2, micro_batches=4, chunk=chunk))
    return measured, priced


@pytest.mark.distributed
@pytest.mark.parametrize("schedule", TIMED)
def test_the_measured_bubble_is_the_priced_one(bubbles: list[dict], schedule: str) -> None:
    measured, priced = measured_and_priced(bubbles, schedule)
    if len(measured) < 2:  # the median of one step is that step's noise
        pytest.skip(f"too busy a machine to time {schedule}'s bubble: fewer than 2 of its steps had "
                    f"{OWN_CPU:.0%} of a CPU per rank and its ranks' compute within {BALANCED:.0%}")
    got, want = statistics.median(measured), statistics.median(priced)
    assert got == pytest.approx(want, abs=BUBBLE_ATOL), (schedule, measured, priced)


@pytest.mark.distributed
def test_pp2_cp2_trains_like_one_process(four_ranks: dict[str, dict]) -> None:
    """Context parallelism inside each stage: the first stage keeps each cp rank's two chunks of the
    tokens, the stages pass the hidden states of 32 tokens a sequence (half of each), each stage's
    attention all-gathers K/V over its cp group, the last stage's loss is its cp group's mean."""
    for case in PP_CP_CASES:
        record = four_ranks[case]
        assert_trains_like_one_process(record)
        notes = record["notes"]
        assert any(n.startswith("context parallel: cp=2 (32 tokens") for n in notes), notes
        engine = "FSDP2" if ":fsdp2:" in case else "SimpleFSDP"
        assert any(f"{engine} full_shard on mesh dp_shard_cp=2" in n for n in notes), notes
        # pp outermost, cp inside: ranks 0, 1 hold stage 0 (cp ranks 0, 1), ranks 2, 3 stage 1; all
        # four read the same sequences (one data-parallel rank).
        assert record["dp"] == [[0, 1]] * 4
        assert len(record["compared_per_rank"][0]) + len(record["compared_per_rank"][2]) == PARAMETERS
