"""The cost model is total over the input bounds (planner/bounds.py): a request built from values at
every bound plans, or is refused with a typed PlanningError, never another exception (issue 22 item 2:
5e-324 bandwidths were a ZeroDivisionError, 1e308 FLOPs an OverflowError or NaN, inf a hashing error).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner import bounds
from planner.errors import PlanningError
from planner.gpu_spec import GpuSpec
from planner.hashing import plan_hash
from planner.plan import Plan
from planner.search import make_plan
from planner.specs import LayerUnit, ModelSpec, PlanRequest

TIME_LIMIT_S = 0.5
"""Of CPU time per search: a model at the largest bounds stops at the deadline, a typed refusal too."""

GPU_FIELDS: dict[str, tuple[float, float]] = {
    "memory_gib": (bounds.MIN_DEVICE_MEMORY_GIB, bounds.MAX_DEVICE_MEMORY_GIB),
    "peak_bf16_tflops": (bounds.MIN_DEVICE_TFLOPS, bounds.MAX_DEVICE_TFLOPS),
    "peak_fp32_tflops": (bounds.MIN_DEVICE_TFLOPS, bounds.MAX_DEVICE_TFLOPS),
    "memory_bandwidth_gbps": (bounds.MIN_MEMORY_BANDWIDTH_GBPS, bounds.MAX_DEVICE_GBPS),
    "intra_node_bandwidth_gbps": (bounds.MIN_LINK_GBPS, bounds.MAX_DEVICE_GBPS),
    "inter_node_bandwidth_gbps": (bounds.MIN_LINK_GBPS, bounds.MAX_DEVICE_GBPS),
}
H100 = {"memory_gib": 80.0, "peak_bf16_tflops": 989.0, "peak_fp32_tflops": 67.0,
        "memory_bandwidth_gbps": 3350.0, "intra_node_bandwidth_gbps": 450.0,
        "inter_node_bandwidth_gbps": 50.0}


def edge(low: float, high: float, typical: float) -> st.SearchStrategy[float]:
    return st.sampled_from([low, high, typical])


@st.composite
def gpus(draw: st.DrawFn) -> GpuSpec:
    return GpuSpec(name="edge-gpu", **{
        name: draw(edge(low, high, H100[name])) for name, (low, high) in GPU_FIELDS.items()
    })


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    if draw(st.booleans()):
        units = [
            LayerUnit(
                name=f"unit{i}",
                num_params=draw(st.sampled_from([0, 1, 10**6, bounds.MAX_UNIT_PARAMS])),
                fwd_flops_per_token=draw(edge(0.0, bounds.MAX_FLOPS_PER_TOKEN, 2e6)),
                activation_bytes_per_token=draw(edge(0.0, bounds.MAX_ACTIVATION_BYTES_PER_TOKEN, 4e3)),
                is_block=draw(st.booleans()),
            )
            for i in range(draw(st.integers(1, 3)))
        ]
        return ModelSpec(name="edge-graph", architecture="layer_graph", layer_graph=units)
    top = bounds.MAX_DIMENSION
    head_dim = draw(st.sampled_from([2, 128, 4096]))
    kv_heads = draw(st.sampled_from([1, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 4, 512]))
    return ModelSpec(
        name="edge-llama",
        architecture="llama",
        vocab_size=draw(st.sampled_from([1, 32_000, top])),
        hidden_size=min(heads * head_dim, top),
        num_layers=draw(st.sampled_from([1, 4, bounds.MAX_LAYERS])),
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=draw(st.sampled_from([None, 1, top])),
        max_seq_len=bounds.MAX_SEQ_LEN,
    )


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    link = st.sampled_from([None, bounds.MIN_LINK_GBPS, bounds.MAX_LINK_OVERRIDE_GBPS])
    custom = draw(st.booleans())
    cluster = {
        "num_nodes": draw(st.sampled_from([1, 2, bounds.MAX_NODES])),
        "gpus_per_node": draw(st.sampled_from([1, 8, bounds.MAX_GPUS_PER_NODE])),
        "gpu": "edge-gpu" if custom else draw(st.sampled_from(["H100", "cpu"])),
        "custom_gpu": draw(gpus()) if custom else None,
        "intra_node_bandwidth_gbps": draw(link),
        "inter_node_bandwidth_gbps": draw(link),
    }
    seq_len = draw(st.sampled_from([1, 2048, bounds.MAX_SEQ_LEN]))
    world = cluster["num_nodes"] * cluster["gpus_per_node"]
    sequences = min(world * draw(st.sampled_from([1, 4])), bounds.MAX_GLOBAL_BATCH_TOKENS // seq_len)
    return {
        "model": draw(models()),
        "cluster": cluster,
        "training": {"seq_len": seq_len, "global_batch_tokens": sequences * seq_len,
                     "precision": draw(st.sampled_from(["bf16", "fp32"])),
                     "optimizer": draw(st.sampled_from(["adamw", "sgd"]))},
        "search": {
            "max_micro_batch_size": draw(st.sampled_from([1, bounds.MAX_MICRO_BATCH])),
            "memory_headroom": draw(st.sampled_from([0.0, 0.5])),
            "max_peak_memory_gib": draw(st.sampled_from([None, 1e-3, 1e6])),
        },
        "top_k": draw(st.sampled_from([1, 50])),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=requests())
def test_a_request_at_the_bounds_plans_or_is_refused_with_a_typed_error(body: dict[str, Any]) -> None:
    try:
        request = PlanRequest.model_validate(body)
    except ValidationError:
        return  # a combination the specs refuse: named field by field, as any input
    plan_hash(request)  # every accepted input hashes (inf was a 500 there)
    try:
        plan = make_plan(request, time_limit_s=TIME_LIMIT_S)
    except PlanningError:
        return
    assert isinstance(plan, Plan)
    assert bounds.all_finite(plan.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("field", "value"),
    [(name, value) for name in GPU_FIELDS for value in (5e-324, 0.0, math.inf, math.nan)],
)
def test_a_gpu_datasheet_below_its_bound_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as caught:
        GpuSpec(name="edge-gpu", **{**H100, field: value})
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("fwd_flops_per_token", 1e308), ("activation_bytes_per_token", 1e308),
     ("activation_bytes_per_token", math.inf), ("fwd_flops_per_token", math.nan),
     ("num_params", 10**400)],
)
def test_a_layer_unit_beyond_its_bound_is_refused(field: str, value: float) -> None:
    unit = {"name": "u", "num_params": 1, "fwd_flops_per_token": 1.0, "activation_bytes_per_token": 1.0}
    with pytest.raises(ValidationError) as caught:
        LayerUnit.model_validate({**unit, field: value})
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]
