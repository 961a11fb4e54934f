"""The runtime's plan check on a plan whose scale-up domain spans nodes (a rack): a tp the domain takes
runs, one it does not is refused naming the domain as a domain (not as GPUs per node), with the fix."""

from __future__ import annotations

import pytest

from contract.plan_document import PlanError, parse_plan
from tests.executor.plan_factory import debug_plan


def rack_plan(*, domain: int, tp: int) -> dict:
    # llama-debug: 8 heads, 4 kv heads, ffn 768, vocab 2048, seq 64: tp 4 splits them all.
    document = debug_plan(nodes=6, gpus_per_node=2, tp=tp)
    document["cluster"]["scaleup_domain_gpus"] = domain
    return document


def test_a_tp_that_tiles_the_domain_runs_over_its_nodes() -> None:
    plan = parse_plan(rack_plan(domain=12, tp=4))
    assert (plan.config.mesh.tp, plan.cluster.domain_gpus) == (4, 12)


def test_a_tp_the_domain_does_not_take_names_the_domain_and_the_fix() -> None:
    with pytest.raises(PlanError) as err:
        parse_plan(rack_plan(domain=6, tp=4))
    said = str(err.value)
    assert "scaleup_domain_gpus 6 (one NVLink or Infinity Fabric domain of 3 nodes of 2: a rack)" in said
    assert "stays inside a scale-up domain" in said and "gpus_per_node" not in said
    assert "pick a common divisor: tp 2; or, for tp 4, describe domains of 4 GPUs" in said


def test_part_of_a_rack_is_one_domain_of_its_ranks() -> None:
    """A plan document that states a domain of 20 GPUs (which tp 4 does not tile) for 12 ranks: those
    ranks share one fabric, so their tp groups of 4 stay on it, as the planner priced them."""
    plan = parse_plan(rack_plan(domain=20, tp=4))
    assert (plan.config.mesh.tp, plan.cluster.domain_gpus) == (4, 12)
