"""Repeated blocks priced once: the same plans as pricing every group, in time that does not grow
with the number of identical blocks."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

from planner import search_setting
from planner.cost.estimate import Estimator
from planner.cost.model_costs import ModelCosts, model_costs
from planner.cost.repeats import Run, periodic_runs
from planner.cost.setting import Setting
from planner.enumeration import enumerate_choices
from planner.search import make_plan
from planner.search_setting import build_setting
from planner.specs import ClusterSpec, ModelSpec, PlanRequest, TrainingSpec
from tests.planner.conftest import make_request


def layer_graph(blocks: int, *, period: int = 1) -> ModelSpec:
    """A traced model: an embedding, `blocks` blocks cycling through `period` kinds, a head."""
    units: list[dict[str, Any]] = [
        {"name": "embed", "num_params": 50_000_000, "fwd_flops_per_token": 0,
         "activation_bytes_per_token": 8192, "is_block": False},
    ]
    for i in range(blocks):
        kind = i % period
        units.append({"name": f"layers.{i}", "num_params": 1_000_000 * (kind + 1),
                      "fwd_flops_per_token": 4e7 / (kind + 1),
                      "activation_bytes_per_token": 4096 * (kind + 1)})
    units.append({"name": "head", "num_params": 50_000_000, "fwd_flops_per_token": 1e8,
                  "activation_bytes_per_token": 8192, "is_block": False})
    return ModelSpec(name="traced", architecture="layer_graph", layer_graph=units)


def graph_request(blocks: int, cluster: str, *, period: int = 1, seq_len: int = 2048, sequences: int = 32,
                  **search_space: Any) -> PlanRequest:
    return PlanRequest(
        model=layer_graph(blocks, period=period),
        cluster=ClusterSpec.parse(cluster),
        training=TrainingSpec(seq_len=seq_len, global_batch_tokens=seq_len * sequences),
        **search_space,
    )


def every_block_its_own(costs: ModelCosts) -> ModelCosts:
    """The same model with every block a separate (equal) object: nothing is found to repeat, so
    every group is priced and simulated one by one, as before repeats were priced once."""
    return dataclasses.replace(costs, blocks=tuple(dataclasses.replace(b) for b in costs.blocks))


REQUESTS = {
    "uniform graph, 8 GPUs": graph_request(382, "1x8xH100"),
    "uniform graph, 4 nodes": graph_request(254, "4x8xH100", sequences=64),
    "alternating graph, k-th block checkpointing": graph_request(
        96, "2x8xH100", period=3, search={"checkpointing": ["selective", "full"]}
    ),
    "llama3-70b on 4x8": make_request("llama3-70b", "4x8xH100", seq_len=4096, sequences=64),
    "llama-debug on CPU": make_request("llama-debug", "1x2xcpu", seq_len=256, sequences=8),
}


@pytest.mark.parametrize("name", REQUESTS)
def test_every_configuration_times_as_when_every_group_is_simulated(name: str) -> None:
    request = REQUESTS[name]
    setting = build_setting(request)
    fast = Estimator(setting)
    reference = Estimator(dataclasses.replace(setting, model=every_block_its_own(setting.model)))
    for choice in enumerate_choices(request, setting):
        got, want = fast.timing(choice), reference.timing(choice)
        for field in ("step_time_s", "compute_s", "comm_s", "exposed_all_gather_s", "exposed_reduce_s"):
            assert math.isclose(getattr(got, field), getattr(want, field), rel_tol=1e-9, abs_tol=1e-15), (
                name, choice, field, getattr(got, field), getattr(want, field))


@pytest.mark.parametrize("depth", [0, 2, 3])
@pytest.mark.parametrize("name", ["uniform graph, 4 nodes", "alternating graph, k-th block checkpointing"])
def test_other_prefetch_depths_time_as_when_every_group_is_simulated(name: str, depth: int) -> None:
    # The search prefetches one group ahead; `predict` prices whatever depth a configuration names.
    request = REQUESTS[name]
    setting = build_setting(request)
    fast = Estimator(setting)
    reference = Estimator(dataclasses.replace(setting, model=every_block_its_own(setting.model)))
    for choice in itertools.islice(enumerate_choices(request, setting), 0, None, 7):
        choice = dataclasses.replace(choice, prefetch_depth=depth)
        got, want = fast.timing(choice), reference.timing(choice)
        assert math.isclose(got.step_time_s, want.step_time_s, rel_tol=1e-9), (choice, got, want)
        assert math.isclose(got.exposed_comm_s, want.exposed_comm_s, rel_tol=1e-9, abs_tol=1e-15)


def _assert_close(got: Any, want: Any, path: str = "plan") -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for key in want:
            _assert_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_close(a, b, f"{path}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (path, got, want)
    else:
        assert got == want, (path, got, want)


@pytest.mark.parametrize("name", ["uniform graph, 4 nodes", "alternating graph, k-th block checkpointing",
                                  "llama3-70b on 4x8"])
def test_the_plan_is_the_one_found_by_pricing_every_group(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    request = REQUESTS[name]
    fast = make_plan(request).model_dump(mode="json")
    monkeypatch.setattr(
        search_setting, "model_costs", lambda spec, seq_len: every_block_its_own(model_costs(spec, seq_len))
    )
    reference = make_plan(request).model_dump(mode="json")
    assert fast["config"] == reference["config"]
    _assert_close(fast, reference)


def test_a_maximal_uniform_graph_is_a_handful_of_runs() -> None:
    # 1,024 units (the documented limit): embedding, 1,022 identical blocks, head.
    request = graph_request(1022, "4x8xH100", sequences=64)
    setting: Setting = build_setting(request)
    estimator = Estimator(setting)
    for choice in enumerate_choices(request, setting):
        repeats = estimator.repeats(choice)
        # Reduction buckets span other numbers of blocks than gather groups do (every 128 blocks
        # with a 512 MB cap here), so a few distinct groups recur; still a few dozen of 1,024.
        assert sum(len(pattern) for pattern in repeats.patterns) <= 64, (choice, repeats.runs)


def test_periodic_runs_cover_the_sequence_with_the_longest_repetitions() -> None:
    assert periodic_runs("e" + "b" * 10 + "h") == (Run(0, 1, 1), Run(1, 1, 10), Run(11, 1, 1))
    assert periodic_runs("abababab") == (Run(0, 2, 4),)
    assert periodic_runs("xabcabcabcy") == (Run(0, 1, 1), Run(1, 3, 3), Run(10, 1, 1))
    assert periodic_runs("abcd") == tuple(Run(i, 1, 1) for i in range(4))
    assert periodic_runs("") == ()
    assert periodic_runs("aab" * 5 + "c" * 7) == (Run(0, 3, 5), Run(15, 1, 7))
