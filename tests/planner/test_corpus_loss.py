"""How a corpus run states its loss and how the pricing reads it: a chunked loss whose chunks run
compiled (torchtune's `compile_loss`) holds no fp32 copy of the logits, as a compiled whole loss does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.fidelity.pricing import price_as_run, run_config
from planner.fidelity.schema import Run, load_corpus

GIB = 2**30


def _torchtune_chunked() -> Run:
    return next(
        r
        for f in load_corpus()
        for r in f.runs
        if f.source.id == "torchtune-readme-optimization-flags-a100" and r.id.endswith("compile-chunked-ce")
    )


def test_a_compiled_chunked_loss_is_priced_without_the_fp32_copy() -> None:
    run = _torchtune_chunked()
    assert run.config.loss == "chunked" and run.config.loss_chunk_compiled
    assert run_config(run).loss == "compiled_fp32"
    document = run.model_dump(mode="json")
    document["config"]["loss_chunk_compiled"] = False
    eager = Run.model_validate(document)
    assert run_config(eager).loss == "chunked_fp32"

    compiled_peak = price_as_run(run).plan.prediction.memory_breakdown_gib
    eager_peak = price_as_run(eager).plan.prediction.memory_breakdown_gib
    assert compiled_peak.moment == eager_peak.moment == "backward start"
    # Backward start: the eager chunked loss holds one chunk's fp32 backward (12 bytes an element over
    # 8 chunks) beside the bf16 logits; the compiled one the bf16 logits' gradient only.
    elements = run.config.local_batch_size * run.config.seq_len * 128256
    assert eager_peak.logits - compiled_peak.logits == pytest.approx(elements * 12 / 8 / GIB, rel=1e-6)


def test_loss_chunk_compiled_needs_a_chunked_loss() -> None:
    document = _torchtune_chunked().model_dump(mode="json")
    document["config"]["loss"] = "unchunked"
    with pytest.raises(ValidationError, match=r"config\.loss_chunk_compiled"):
        Run.model_validate(document)
