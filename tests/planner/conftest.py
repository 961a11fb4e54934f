"""Builders shared by the planner tests."""

from __future__ import annotations

import pytest

from planner.catalog.models import resolve_model
from planner.specs import ClusterSpec, PlanRequest, TrainingSpec


def make_request(model: str, cluster: str, *, seq_len: int, sequences: int, **search) -> PlanRequest:
    return PlanRequest(
        model=resolve_model(model),
        cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
        **search,
    )


@pytest.fixture
def llama8b_request() -> PlanRequest:
    """The torchtitan anchor setting: Llama 3.1 8B, 8x H100, seq 8192, local batch 2."""
    return make_request("llama3.1-8b", "1x8xH100", seq_len=8192, sequences=16)
