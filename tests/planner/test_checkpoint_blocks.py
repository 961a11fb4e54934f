"""Checkpointing any number of blocks (mode `blocks`: the first n of L, "50 of 80"): priced between none
and full, searched at a few counts when a request allows it, never in the default search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract.parallel_config import CheckpointingConfig, PipelineError
from planner.cost.memory import saved_activations
from planner.document import choice_from_config
from planner.enumeration import CHECKPOINT_BLOCK_SHARES, checkpointing_policies, enumerate_choices
from planner.fidelity.pricing import price_run, run_model
from planner.fidelity.schema import Run, load_corpus
from planner.search import make_plan, predict
from planner.search_setting import build_setting
from tests.planner.conftest import make_request


def _blocks(n: int) -> CheckpointingConfig:
    return CheckpointingConfig(mode="blocks", blocks=n)


def _with_modes(request, modes: list[str]):
    return request.model_copy(update={"search": request.search.model_copy(update={"checkpointing": modes})})


@pytest.mark.parametrize("compile_", [False, True])
def test_n_of_l_blocks_lies_between_none_and_full_and_l_of_l_is_full(compile_: bool) -> None:
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=32)
    base = replace(make_plan(request).config, compile=compile_)
    layers = request.model.num_layers  # 80

    def priced(checkpointing: CheckpointingConfig):
        return predict(request, replace(base, checkpointing=checkpointing)).prediction

    none, full = priced(CheckpointingConfig(mode="none")), priced(CheckpointingConfig(mode="full"))
    rows = [priced(_blocks(n)) for n in (20, 50, 60)]
    peaks = [none.peak_memory_gib, *(r.peak_memory_gib for r in rows), full.peak_memory_gib]
    steps = [none.step_time_s, *(r.step_time_s for r in rows), full.step_time_s]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # Each block checkpointed saves what one block keeps beyond its input: linear in n.
    setting = build_setting(request)
    kept = [saved_activations(setting, choice_from_config(replace(base, checkpointing=_blocks(n)))).saved
            for n in (10, 20, 50)]  # fmt: skip
    assert (kept[0] - kept[2]) / (kept[0] - kept[1]) == pytest.approx(40 / 10, rel=1e-9)
    every = priced(_blocks(layers))
    assert every.peak_memory_gib == pytest.approx(full.peak_memory_gib)
    assert every.step_time_s == pytest.approx(full.step_time_s)


def test_the_label_names_the_count() -> None:
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=32)
    config = replace(make_plan(request).config, checkpointing=_blocks(50))
    assert " AC=first50 " in config.label()
    plan = predict(request, config)
    assert plan.config.checkpointing == _blocks(50)
    assert "blocks" not in make_plan(request).config.hashed_document()["checkpointing"]  # hashes as before


def test_the_search_tries_a_few_counts_only_when_asked() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=16)
    setting = build_setting(request)
    assert not any(c.checkpointing == "blocks" for c in enumerate_choices(request, setting))
    asked = _with_modes(request, ["none", "full", "blocks"])
    counts = [k for mode, k in checkpointing_policies(asked) if mode == "blocks"]
    assert counts == [round(s * 32) for s in CHECKPOINT_BLOCK_SHARES] == [8, 16, 24]
    plan = make_plan(_with_modes(request, ["blocks"]))
    assert plan.config.checkpointing.mode == "blocks" and plan.config.checkpointing.blocks in counts
    considered = {c.config.checkpointing.blocks for c in plan.alternatives}
    assert considered <= set(counts)


def test_bad_counts_and_pipelines_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"checkpointing\.blocks"):
        CheckpointingConfig(mode="blocks")
    with pytest.raises(ValueError, match=r"checkpointing\.blocks"):
        CheckpointingConfig(mode="full", blocks=3)
    request = make_request("llama3-70b", "4x8xH100", seq_len=8192, sequences=64)
    piped = make_plan(request.model_copy(update={"search": request.search.model_copy(
        update={"pipeline_parallel_degrees": [2]})})).config  # fmt: skip
    assert piped.pipeline is not None
    with pytest.raises(PipelineError, match=r"checkpointing\.mode: `blocks`"):
        replace(piped, checkpointing=_blocks(40))
    # A request allowing `blocks` still plans pipelines, with the other policies.
    mixed = make_plan(request.model_copy(update={"search": request.search.model_copy(
        update={"pipeline_parallel_degrees": [2], "checkpointing": ["blocks", "full"]})}))  # fmt: skip
    assert mixed.config.checkpointing.mode == "full"


def test_the_corpus_states_n_of_l_checkpointing_and_prices_it_so() -> None:
    run = next(
        r for f in load_corpus() for r in f.runs
        if r.priceable and r.config.checkpointing.policy == "none" and r.config.mesh.pp == 1
        and r.config.precision == "bf16"
    )  # fmt: skip
    layers = run_model(run).num_layers
    document = run.model_dump(mode="json")
    document["config"]["checkpointing"] = {
        "as_published": f"{layers // 2} of {layers} blocks", "policy": "first_blocks", "blocks": layers // 2,
    }
    half = price_run(Run.model_validate(document))
    assert half.predicted_memory_gib < price_run(run).predicted_memory_gib
    document["config"]["checkpointing"] = {"as_published": "?", "policy": "first_blocks"}
    with pytest.raises(ValueError, match="blocks"):
        Run.model_validate(document)
