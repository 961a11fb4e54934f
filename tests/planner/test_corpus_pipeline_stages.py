"""A corpus run whose pipeline has more stages than the model has blocks (Megatron counts its embedding
and loss as pipeline layers) is not priceable, said as such, not a bare error from the stage split."""

from __future__ import annotations

import pytest

from planner.fidelity.pricing import NotPriceable, price_as_run
from planner.fidelity.schema import Run, load_corpus


def _pipelined_run() -> Run:
    """A pipelined corpus run whose stage split the planner chooses (no `stage_blocks` stated: a stated
    split is checked on its own, below), whichever source comes first."""
    return next(
        r for f in load_corpus() for r in f.runs
        if r.config.mesh.pp > 1 and r.config.pipeline and r.config.pipeline.stage_blocks is None
    )


def test_more_stages_than_blocks_is_not_priceable() -> None:
    document = _pipelined_run().model_dump(mode="json")
    run = Run.model_validate(document)
    layers = price_as_run(run).plan.model.num_layers
    document["config"]["pipeline"]["stages_per_rank"] = layers  # pp x layers stages > layers blocks
    with pytest.raises(NotPriceable, match=r"config\.pipeline: \d+ stages .* for \d+ blocks"):
        price_as_run(Run.model_validate(document))


def test_a_stated_split_is_priced_as_the_trainer_ran_it() -> None:
    # Megatron-Core's gpt-oss recipe splits its 36 blocks evenly over 4 stages (no embedding or loss
    # accounting): priced with that split, not the planner's time-balanced one.
    run = next(
        r for f in load_corpus() for r in f.runs
        if r.config.pipeline is not None and r.config.pipeline.stage_blocks is not None
    )
    assert price_as_run(run).plan.config.pipeline.stage_blocks == run.config.pipeline.stage_blocks  # type: ignore[union-attr]
    document = run.model_dump(mode="json")
    document["config"]["pipeline"]["stage_blocks"] = [*run.config.pipeline.stage_blocks[:-1], 1]  # type: ignore[union-attr]
    with pytest.raises(NotPriceable, match=r"config\.pipeline\.stage_blocks: .* is not \d+ stages holding"):
        price_as_run(Run.model_validate(document))
    document["config"]["pipeline"]["stage_blocks"] = None
    balanced = price_as_run(Run.model_validate(document)).plan.config.pipeline
    assert balanced is not None and balanced.stage_blocks != run.config.pipeline.stage_blocks  # type: ignore[union-attr]
