"""The search's pre-check: what the runtime would refuse, refused before any pricing, with advice.

A request that validates (planner/specs.py checks structure: types, bounds, whole sequences, catalog
names) may still not be plannable: GPT-2 cannot run past its learned positions, and the batch may
not split over the cluster. Those refusals name what to do instead; a batch refusal names batches
that split on this cluster and fit there (checked with the search's own memory test), or the
cluster and batch that would.
"""

from __future__ import annotations

from planner.cost.memory import memory_limit_gib
from planner.errors import PlanningError
from planner.infeasibility import (
    Prober,
    batches_near,
    cluster_name,
    data_parallel_cannot,
    smallest_cluster,
    what_fits,
)
from planner.search_setting import build_setting
from planner.specs import PlanRequest


def check_request(request: PlanRequest) -> None:
    """Refuse, before pricing anything, what the runtime would refuse (raises PlanningError)."""
    check_sequence_length(request)


def check_sequence_length(request: PlanRequest) -> None:
    """Refuse what the runtime cannot run: GPT-2 learns one embedding per position."""
    model = request.model
    seq_len = request.training.seq_len
    if model.architecture == "gpt2" and seq_len > model.max_seq_len:
        raise PlanningError(
            f"training.seq_len: {seq_len} is longer than {model.name}'s {model.max_seq_len} learned "
            f"positions (GPT-2 has one position embedding per token); use seq_len <= {model.max_seq_len}",
            field="training.seq_len",
        )


def batch_suggestion(request: PlanRequest) -> str:
    """What to say when the requested batch does not split over the cluster: batches that split
    and that the planner accepts there, nearest first, or, when none fits, the cluster and batch
    that would. `request` is the refused request (its batch is only read).

    Checked with the uncalibrated cost model: the request's calibration is not known where the
    batch is validated (planner/specs.py).
    """
    world = request.cluster.world_size
    requested = request.training.global_batch_sequences
    seq_len = request.training.seq_len
    options = batches_near(requested, world)
    plain = f"use a multiple of {world} sequences, e.g. " + " or ".join(
        f"{b} sequences = {b * seq_len} tokens" for b in options
    )
    try:
        check_sequence_length(request)
    except PlanningError as exc:
        return f"{plain}; and {exc.message}"  # no batch plans until seq_len does
    try:
        setting = build_setting(request)
        limit = memory_limit_gib(setting.params, request.search.memory_headroom)
        prober = Prober(request, setting, limit_gib=limit)
        nodes = request.cluster.num_nodes
        candidates = options if world in options else [*options, world]  # one sequence per GPU: least
        fitting = [b for b in candidates if prober.at(nodes, b).fits]
        if fitting:
            return f"use a multiple of {world} sequences that fits, e.g. " + " or ".join(
                f"{b} sequences = {b * seq_len} tokens" for b in fitting[:2]
            )
        advice = smallest_cluster(prober)
    except Exception:  # advice must never turn a refused input into a server error
        return plain
    where = cluster_name(request, request.cluster.num_nodes)
    text = (
        f"but {request.model.name} does not fit on {where} at any such batch "
        f"({', '.join(str(b) for b in candidates)} sequences). "
    )
    if advice.smallest is not None:
        return text + what_fits(request, advice)
    assert advice.largest_tried is not None
    return text + data_parallel_cannot(request, advice.largest_tried)
