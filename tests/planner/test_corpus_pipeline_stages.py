"""A corpus run whose pipeline has more stages than the model has blocks (Megatron counts its embedding
and loss as pipeline layers) is not priceable, said as such, not a bare error from the stage split."""

from __future__ import annotations

import pytest

from planner.fidelity.pricing import NotPriceable, price_as_run
from planner.fidelity.schema import Run, load_corpus


def _pipelined_run() -> Run:
    return next(r for f in load_corpus() for r in f.runs if r.config.mesh.pp > 1 and r.config.pipeline)


def test_more_stages_than_blocks_is_not_priceable() -> None:
    document = _pipelined_run().model_dump(mode="json")
    run = Run.model_validate(document)
    layers = price_as_run(run).plan.model.num_layers
    document["config"]["pipeline"]["stages_per_rank"] = layers  # pp x layers stages > layers blocks
    with pytest.raises(NotPriceable, match=r"config\.pipeline: \d+ stages .* for \d+ blocks"):
        price_as_run(Run.model_validate(document))
