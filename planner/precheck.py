"""The search's pre-check: what the runtime would refuse, refused before any pricing, with advice.

A request that validates (planner/specs.py checks structure only: types, bounds, whole sequences,
catalog names) may still not be plannable: GPT-2 cannot run past its learned positions, a pinned
tensor-parallel degree may not split the model, and the batch may not split over the data-parallel
ranks of any searched tensor-parallel degree. Those refusals name what to do instead; a batch
refusal names the batches nearest it that split on this cluster and plan there, or the cluster and
batch that would (planner/infeasibility.py `advise`, the one source of advice).

`read_request` is the structural validation for callers that take the batch as typed (the API, the
CLI, the dashboard form): a batch of partial sequences is refused there with the same advice (or,
asked to, without it: the service looks for it in its search pool, under the deadline per plan).
Advice probes configurations; with a deadline (`CpuDeadline`) it stops there and the refusal names
the batches nearest that split, unchecked for memory.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from contract.mesh import Mesh, mesh_problems, searched_axes
from planner.bounds import MAX_GLOBAL_BATCH_TOKENS
from planner.collector import collector_paused
from planner.cost.setting import Setting
from planner.deadline import CpuDeadline
from planner.enumeration import (
    check_async_tp,
    check_space,
    float8_recipes,
    pipeline_parallel_degrees,
    searched_degrees,
    splitting_degrees,
    tensor_parallel_degrees,
)
from planner.errors import PlanningError, SearchDeadlineError
from planner.infeasibility import (
    Prober,
    advise,
    cluster_name,
    data_parallel_cannot,
    roundings,
    suggested_batch,
    what_fits,
)
from planner.search_setting import build_setting
from planner.specs import PlanRequest

BATCH_FIELD = "training.global_batch_tokens"


def check_request(request: PlanRequest, setting: Setting, *, deadline: CpuDeadline | None = None) -> None:
    """Refuse, before pricing anything, what the runtime would refuse (raises PlanningError).

    `setting` is the search's own (calibrated when the search is): the batch advice prices with it,
    within `deadline`.
    """
    check_sequence_length(request)
    check_space(request)  # before anything is priced
    tensor_parallel_degrees(request)  # a pin the model cannot take is refused here, with why
    float8_recipes(request)
    if request.search.async_tp:
        check_async_tp(request, field="search.async_tp")
    if not splitting_degrees(request):
        raise batch_refusal(request, request.training.global_batch_tokens, setting, deadline=deadline)


def check_sequence_length(request: PlanRequest) -> None:
    """Refuse what the runtime cannot run at this sequence length whatever the mesh (contract.mesh's
    rules: GPT-2 learns one embedding per position)."""
    for problem in mesh_problems(Mesh(), request.model, request.training):  # one rank: no axis's rule
        field, _, _ = problem.partition(": ")
        raise PlanningError(problem, field=field)


class PartialSequencesError(PlanningError):
    """A batch of partial sequences, refused before looking for advice (`read_request(advise=False)`):
    `batch_refusal(nearby, tokens)` is the refusal with it, for a caller to price where it prices
    searches (the service's search pool)."""

    def __init__(self, nearby: PlanRequest, tokens: int) -> None:
        super().__init__(f"{BATCH_FIELD}: {_problem(nearby, tokens)}", field=BATCH_FIELD)
        self.nearby = nearby
        """The request with its batch rounded down to whole sequences."""
        self.tokens = tokens


def read_request(data: dict[str, Any], *, advise: bool = True) -> PlanRequest:
    """A PlanRequest from its fields (the training as a dict of what was typed), validated.

    Raises ValidationError for what is wrong in structure, and PlanningError (naming batches that
    split on this cluster and plan, priced uncalibrated: no profile is read yet) when the only
    problem is a batch of partial sequences, which the training alone cannot advise on; without
    `advise`, PartialSequencesError, having probed nothing. Raises SearchSpaceError for a search
    space too large to price (`check_space`).
    """
    try:
        request = PlanRequest.model_validate(data)
    except ValidationError:
        nearby = _whole_sequences(data)
        if nearby is None:
            raise
        tokens = data["training"]["global_batch_tokens"]
        if not advise:
            raise PartialSequencesError(nearby, tokens) from None
        raise batch_refusal(nearby, tokens) from None
    check_space(request)  # where the request is read (the web process): no search process is taken
    return request


def _whole_sequences(data: dict[str, Any]) -> PlanRequest | None:
    """The request with its batch rounded down to whole sequences, when that is all that was wrong."""
    training = data.get("training")
    if not isinstance(training, dict):
        return None
    seq_len, tokens = training.get("seq_len"), training.get("global_batch_tokens")
    if not (type(seq_len) is int and type(tokens) is int and seq_len > 0 and tokens % seq_len > 0):
        return None
    whole = {**training, "global_batch_tokens": max(seq_len, tokens // seq_len * seq_len)}
    try:
        return PlanRequest.model_validate({**data, "training": whole})
    except ValidationError:
        return None  # the fields' own errors say what is wrong


def batch_hint(request: PlanRequest, setting: Setting, *, deadline: CpuDeadline | None = None) -> str:
    """What the dashboard form says under the batch: how many sequences a step holds, or why the
    batch does not split here and what does (the pre-check's refusal, priced with `setting`, the
    search's, within `deadline`: so the hint names the batches a submission's refusal names)."""
    try:
        tensor_parallel_degrees(request)
    except PlanningError:
        return ""  # the pin's own error is shown beside its field on submit
    if splitting_degrees(request):
        return f"= {request.training.global_batch_sequences:,} sequences per step."
    return batch_refusal(request, request.training.global_batch_tokens, setting, deadline=deadline).message


def batch_refusal(
    request: PlanRequest, tokens: int, setting: Setting | None = None, *, deadline: CpuDeadline | None = None
) -> PlanningError:
    """The refusal of a batch of `tokens` that does not split over the cluster's data-parallel ranks
    (or is not whole sequences), with the advice, looked for within `deadline`. `request` carries the
    batch rounded down to whole sequences when `tokens` is not; `setting` defaults to the request's
    uncalibrated one."""
    tensor_parallel_degrees(request)  # a pin the model cannot take is refused first, with why
    if beyond := _pins_beyond_the_cluster(request):
        return PlanningError(beyond, field=beyond.partition(":")[0])
    with collector_paused():  # the advice probes configurations as a search does (planner/collector.py)
        advice = _what_plans(request, tokens, setting, deadline)
    return PlanningError(f"{BATCH_FIELD}: {_problem(request, tokens)}; {advice}", field=BATCH_FIELD)


def _pins_beyond_the_cluster(request: PlanRequest) -> str:
    """Why a pinned degree cannot run on the cluster at all (more ranks than it has GPUs), with a
    cluster it can run on; empty when every pin fits. Said before any batch: no batch splits then,
    and the batch is not what to change."""
    world = request.cluster.world_size
    for entry in searched_axes():
        pinned = getattr(request.search, entry.search_field or "") or []
        if entry.carved_from or not pinned or min(pinned) <= world:
            continue
        degree = min(pinned)
        nodes = -(-degree // request.cluster.gpus_per_node)
        return (
            f"search.{entry.search_field}: {entry.name}={degree} needs {degree} GPUs ({entry.what} ranks), "
            f"and {cluster_name(request, request.cluster.num_nodes)} has {world}; pin a degree of at most "
            f"{world}, or plan on at least {degree} GPUs, e.g. {cluster_name(request, nodes)}"
        )
    return ""


def _problem(request: PlanRequest, tokens: int) -> str:
    """Why a batch of `tokens` is refused (the refusal without its advice)."""
    seq_len, world = request.training.seq_len, request.cluster.world_size
    if tokens % seq_len:
        return (
            f"{tokens} is not a whole number of {seq_len}-token sequences (the batch must be a "
            "multiple of seq_len)"
        )
    degrees = tensor_parallel_degrees(request)
    pipelines = [pp for pp in searched_degrees(pipeline_parallel_degrees, request) if pp > 1]
    ranks = ", ".join(f"{world // tp} at tp={tp}" for tp in degrees)
    staged = ""
    if pipelines:
        # A pipeline divides the data-parallel ranks by its stages and needs a sequence per stage.
        staged = (f"; a pipeline of pp stages leaves 1/pp of them, each taking at least pp "
                  f"sequences (pp {', '.join(map(str, pipelines))} searched)")
    return (
        f"{tokens // seq_len} sequences of {seq_len} tokens cannot be split evenly over {world} GPUs "
        f"(every data-parallel rank takes the same whole number of sequences, and the "
        f"data-parallel ranks are the GPUs over the tensor-parallel degree: {ranks}{staged})"
    )


def _what_plans(
    request: PlanRequest, tokens: int, setting: Setting | None, deadline: CpuDeadline | None
) -> str:
    """The advice for a batch refusal: batches that plan here, or the cluster that plans one."""
    try:
        check_sequence_length(request)
    except PlanningError as exc:
        return f"no batch plans until seq_len does: {exc.message}"
    nodes = request.cluster.num_nodes
    where = cluster_name(request, nodes)
    near = roundings(request, nodes, tokens)
    if not near:
        return (
            f"no batch of at most {MAX_GLOBAL_BATCH_TOKENS} tokens splits over {where} at this seq_len; "
            "use fewer GPUs or a shorter seq_len"
        )
    setting = setting or build_setting(request)
    try:
        advice = advise(Prober(request, setting, deadline=deadline), tokens)
    except SearchDeadlineError as stopped:
        return (
            f"the batches nearest it that split over {where} are {', '.join(str(b) for b in near)} "
            f"sequences, not checked for memory: looking for one that fits stopped after "
            f"{stopped.time_limit_s:g} s of CPU time, the limit per plan"
        )
    if advice.batches and advice.batches[0].num_nodes == nodes:
        return f"use a batch that splits and fits on {where}, e.g. " + " or ".join(
            suggested_batch(request, probe) for probe in advice.batches
        )
    text = (
        f"but {request.model.name} does not fit on {where} at any such batch "
        f"({', '.join(str(b) for b in near)} sequences). "
    )
    if advice.batches:
        return text + what_fits(request, advice)
    assert advice.largest_tried is not None
    return text + data_parallel_cannot(request, advice.largest_tried)
